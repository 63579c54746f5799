"""Plot validation BLEU against training time from runs' TensorBoard logs.

    python scripts/plot_curves.py RUN_DIR [RUN_DIR ...] [--labels A B ...] -o docs/bleu.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from transformer.plots import plot_bleu_vs_time


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (hydra.run.dir)")
    p.add_argument("--labels", nargs="+", help="legend entries, one per run")
    p.add_argument("-o", "--output", type=Path, required=True, help="PNG file to write")
    p.add_argument("--title", default="Validation BLEU (greedy) vs. training time")
    args = p.parse_args(argv)
    try:
        plot_bleu_vs_time(args.runs, args.output, args.labels, args.title)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
