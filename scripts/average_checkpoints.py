"""Average the parameters of several checkpoints into one (for translation).

    python scripts/average_checkpoints.py RUN_DIR/checkpoints --last 5 -o averaged.pt
    python scripts/average_checkpoints.py a.pt b.pt c.pt -o averaged.pt

With a directory, the newest `--last` numbered checkpoints (checkpoint_<updates>.pt, kept by
trainer.keep_last) are averaged; checkpoint_last/best are not included.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from transformer.checkpoint import (CheckpointError, average_checkpoints, numbered_checkpoints,
                                    save_checkpoint)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", type=Path,
                        help="checkpoint files, or one checkpoints/ directory")
    parser.add_argument("--last", type=int, default=5,
                        help="with a directory: how many of the newest numbered checkpoints")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    paths = args.inputs
    if len(paths) == 1 and paths[0].is_dir():
        paths = numbered_checkpoints(paths[0])[-args.last:]
        if len(paths) < args.last:
            print(f"note: only {len(paths)} numbered checkpoints in {args.inputs[0]}",
                  file=sys.stderr)
    try:
        averaged = average_checkpoints(paths)
    except (CheckpointError, ValueError) as e:
        sys.exit(f"error: {e}")
    averaged.pop("format_version")  # save_checkpoint adds it
    save_checkpoint(averaged, args.output)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) "
          f"-> {args.output}")


if __name__ == "__main__":
    main()
