"""`transformer prune-heads`, run from a checkout as `python scripts/prune_heads.py`.

The command lives in the package (`transformer.cli.prune_heads`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.prune_heads import main

if __name__ == "__main__":
    sys.exit(main())
