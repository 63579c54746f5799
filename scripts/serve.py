"""`transformer serve`, run from a checkout as `python scripts/serve.py`.

The command lives in the package (`transformer.cli.serve`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.serve import main

if __name__ == "__main__":
    sys.exit(main())
