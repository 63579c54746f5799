"""`transformer head-importance`, run from a checkout as `python scripts/head_importance.py`.

The command lives in the package (`transformer.cli.head_importance`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.head_importance import main

if __name__ == "__main__":
    sys.exit(main())
