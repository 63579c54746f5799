"""`transformer export`, run from a checkout as `python scripts/export.py`.

The command lives in the package (`transformer.cli.export`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
