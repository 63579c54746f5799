"""`transformer plot-curves`, run from a checkout as `python scripts/plot_curves.py`.

The command lives in the package (`transformer.cli.plot_curves`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.plot_curves import main

if __name__ == "__main__":
    sys.exit(main())
