"""`transformer attention-maps`, run from a checkout as `python scripts/attention_maps.py`.

The command lives in the package (`transformer.cli.attention_maps`; `--help` lists its
options); this file keeps the form the repository's documents and benchmarks use working.
"""

import sys

from transformer.cli.attention_maps import main

if __name__ == "__main__":
    sys.exit(main())
