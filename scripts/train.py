"""`transformer train`, run from a checkout as `python scripts/train.py`.

The command lives in the package (`transformer.cli.train`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
