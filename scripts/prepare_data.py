"""`transformer prepare-data`, run from a checkout as `python scripts/prepare_data.py`.

The command lives in the package (`transformer.cli.prepare_data`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.prepare_data import main

if __name__ == "__main__":
    sys.exit(main())
