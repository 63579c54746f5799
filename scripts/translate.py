"""`transformer translate`, run from a checkout as `python scripts/translate.py`.

The command lives in the package (`transformer.cli.translate`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
