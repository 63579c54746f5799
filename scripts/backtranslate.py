"""`transformer backtranslate`, run from a checkout as `python scripts/backtranslate.py`.

The command lives in the package (`transformer.cli.backtranslate`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.backtranslate import main

if __name__ == "__main__":
    sys.exit(main())
