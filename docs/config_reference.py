"""Write the configuration reference of docs/USAGE.md from the schema's docstrings.

    python docs/config_reference.py           # rewrite the block in USAGE.md in place
    python docs/config_reference.py --check   # only say whether it is up to date (exit 1)

The block lies between the markers `transformer.run.config_docs.REFERENCE_BEGIN` and
`REFERENCE_END`; its tables are `config_docs.markdown_reference()`, read from the attribute
docstrings of `transformer.run.config`'s dataclasses. tests/test_config_help.py fails while the
block and the schema differ.
"""

import argparse
import sys
from pathlib import Path

from transformer.run.config_docs import with_reference

USAGE = Path(__file__).resolve().parent / "USAGE.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if the reference is out of date")
    args = parser.parse_args(argv)
    text = USAGE.read_text(encoding="utf-8")
    updated = with_reference(text)
    if updated == text:
        print(f"{USAGE}: the configuration reference is up to date")
        return 0
    if args.check:
        print(f"{USAGE}: the configuration reference is out of date; run "
              "python docs/config_reference.py", file=sys.stderr)
        return 1
    USAGE.write_text(updated, encoding="utf-8")
    print(f"{USAGE}: configuration reference rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
