"""`transformer tune-decoding`, run from a checkout as `python scripts/tune_decoding.py`.

The command lives in the package (`transformer.cli.tune_decoding`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.tune_decoding import main

if __name__ == "__main__":
    sys.exit(main())
