"""`transformer average-checkpoints`, run from a checkout: scripts/average_checkpoints.py.

The command lives in the package (`transformer.cli.average_checkpoints`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.average_checkpoints import main

if __name__ == "__main__":
    sys.exit(main())
