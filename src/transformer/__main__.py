"""`python -m transformer COMMAND ...`: the `transformer` command (`transformer.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
