"""`transformer distill`, run from a checkout as `python scripts/distill.py`.

The command lives in the package (`transformer.cli.distill`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.distill import main

if __name__ == "__main__":
    sys.exit(main())
