"""Plot validation BLEU and loss against training time, target tokens and updates from runs'
TensorBoard logs.

    transformer plot-curves RUN_DIR [RUN_DIR ...] [--labels A B ...] -o docs/bleu.png

`python scripts/plot_curves.py` is the same command.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..plots import plot_validation_curves
from . import report_errors


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (hydra.run.dir)")
    p.add_argument("--labels", nargs="+", help="legend entries, one per run")
    p.add_argument("-o", "--output", type=Path, required=True, help="PNG file to write")
    p.add_argument("--title", default="Validation (greedy BLEU, loss)")
    return p


def run(args: argparse.Namespace) -> None:
    plot_validation_curves(args.runs, args.output, args.labels, args.title)
    print(f"wrote {args.output}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return report_errors(lambda: run(args))
