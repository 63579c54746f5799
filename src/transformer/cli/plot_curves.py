"""Plot runs' validation BLEU and loss against training time, target tokens and updates.

    transformer plot-curves RUN_DIR [RUN_DIR ...] [--labels A B ...] -o docs/bleu.png

The curves are read from each run's TensorBoard logs.
`python scripts/plot_curves.py` is the same command.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..tools.plots import plot_validation_curves
from . import command_parser, report_errors


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__)
    p.add_argument("runs", nargs="+", type=Path, help="run directories (hydra.run.dir)")
    p.add_argument("--labels", nargs="+", help="legend entries, one per run")
    p.add_argument("-o", "--output", type=Path, required=True, help="PNG file to write")
    p.add_argument("--title", default="Validation (greedy BLEU, loss)",
                   help="the figure's title")
    return p


def run(args: argparse.Namespace) -> None:
    plot_validation_curves(args.runs, args.output, args.labels, args.title)
    print(f"wrote {args.output}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return report_errors(lambda: run(args))
