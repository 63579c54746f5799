"""Average the parameters of several checkpoints into one (for translation).

    transformer average-checkpoints RUN_DIR/checkpoints --last 5 -o averaged.pt
    transformer average-checkpoints a.pt b.pt c.pt -o averaged.pt

With a directory, the newest `--last` numbered checkpoints (checkpoint_<updates>.pt, kept by
trainer.keep_last) are averaged; checkpoint_last/best are not included. The checkpoints must
come from one training run (same model, tokenizers and run id): those of independent runs are
refused, as the mean of their weights translates badly; independently trained models
decode together instead (`transformer translate --ensemble`). The result keeps their
tokenizer and run id, and the first checkpoint's training config and decoding settings
(`checkpoint.average_checkpoints`). `python scripts/average_checkpoints.py` is the same
command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import CheckpointError, ConfigError
from ..run.checkpoint import average_checkpoints, numbered_checkpoints, save_checkpoint
from . import command_parser, report_errors


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__)
    p.add_argument("inputs", nargs="+", type=Path,
                   help="checkpoint files, or one checkpoints/ directory")
    p.add_argument("--last", type=int, default=5,
                   help="with a directory: how many of the newest numbered checkpoints")
    p.add_argument("-o", "--output", type=Path, required=True,
                   help="the averaged checkpoint to write (.pt)")
    return p


def run(args: argparse.Namespace) -> None:
    if args.last < 1:
        raise ConfigError(f"--last must be >= 1, got {args.last}")
    paths = args.inputs
    if len(paths) == 1 and paths[0].is_dir():
        paths = numbered_checkpoints(paths[0])[-args.last:]
        if not paths:
            raise CheckpointError(f"no checkpoint_<updates>.pt files in {args.inputs[0]}")
        if len(paths) < args.last:
            print(f"note: only {len(paths)} numbered checkpoints in {args.inputs[0]}",
                  file=sys.stderr)
    save_checkpoint(average_checkpoints(paths), args.output)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) "
          f"-> {args.output}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return report_errors(lambda: run(args))
