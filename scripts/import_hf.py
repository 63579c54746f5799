"""`transformer import-hf`, run from a checkout as `python scripts/import_hf.py`.

The command lives in the package (`transformer.cli.import_hf`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.import_hf import main

if __name__ == "__main__":
    sys.exit(main())
