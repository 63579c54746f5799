"""Benchmark: our engine against the package of another checkout, in pairs of passes in one
process, for changes smaller than the machine's drift. `bench/engines.py --baseline-src`
compares each row's best run in fresh processes; on a machine whose speed drifts by 10-25%
within the hour, a change of a few percent shows only in pairs of passes run back to back.

The package in DIR/src is imported a second time under another name (`transformer_baseline`,
from a copy in a temporary folder), both load the same checkpoint, and the two translate the
same inputs in turn, the order flipped every round. Printed: the median of the rounds'
ratios (the baseline's time over ours: above 1x, ours is faster), every ratio, smallest
first, and whether the outputs are the same.

    python bench/paired.py --baseline-src DIR [--checkpoint CKPT] [--data-root DIR]
                           [--join 4] [--threads 1] [--rounds 8] [--quantize int8]
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from engines import add_input_arguments, cpu_description, hold_to_isa, inputs  # bench/engines.py

from transformer.decoding.translator import Translator

BASELINE = "transformer_baseline"


def import_baseline(src: Path, folder: Path) -> type:
    """The `Translator` of the package in `src` (a checkout's src/), imported as
    `transformer_baseline` from a copy in `folder` (its imports within the package are
    relative, so the copy imports itself)."""
    shutil.copytree(src / "transformer", folder / BASELINE)
    sys.path.insert(0, str(folder))
    layout = "decoding.translator" if (src / "transformer" / "decoding").is_dir() else "translator"
    return importlib.import_module(f"{BASELINE}.{layout}").Translator


def paired_passes(passes: dict[str, Callable[[], list[str]]], rounds: int
                  ) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
    """Seconds of each named pass (a translation of the same inputs), the passes in turn,
    the order flipped every round; and each pass's outputs."""
    seconds: dict[str, list[float]] = {name: [] for name in passes}
    outputs: dict[str, list[str]] = {}
    for r in range(rounds):
        for name in list(passes)[::1 if r % 2 == 0 else -1]:
            start = time.perf_counter()
            outputs[name] = passes[name]()
            seconds[name].append(time.perf_counter() - start)
    return seconds, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_input_arguments(parser)
    parser.add_argument("--baseline-src", metavar="DIR", required=True,
                        help="a checkout of the package (e.g. a git worktree), its src/ read")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--quantize", choices=["int8"], default=None)
    args = parser.parse_args()
    hold_to_isa(args.isa)
    torch.set_num_threads(args.threads)
    sources = inputs(args, "en")
    with tempfile.TemporaryDirectory() as folder:
        baseline = import_baseline(Path(args.baseline_src) / "src", Path(folder))
        options = {"quantize": args.quantize} if args.quantize else {}  # where asked only:
        # an older baseline's `load` may not take it
        translators = {name: cls.load(args.checkpoint, device="cpu", **options)
                       for name, cls in (("ours", Translator), ("baseline", baseline))}
        for translator in translators.values():
            translator.translate(sources[:50])  # warm up
        seconds, outputs = paired_passes(
            {name: lambda t=translator: t.translate(sources)
             for name, translator in translators.items()}, args.rounds)
    ratios = sorted(b / o for o, b in zip(seconds["ours"], seconds["baseline"], strict=True))
    same = sum(a == b for a, b in zip(outputs["ours"], outputs["baseline"], strict=True))
    print(cpu_description())
    print(f"{len(sources)} inputs of {args.join} line(s), {args.threads} thread(s)"
          f"{', int8' if args.quantize else ''}: ours {len(sources) / min(seconds['ours']):.1f}, "
          f"baseline {len(sources) / min(seconds['baseline']):.1f} sentences/s (best passes)")
    print(f"ours / baseline, paired: median {statistics.median(ratios):.3f}x "
          f"(rounds {' '.join(f'{x:.2f}' for x in ratios)}); the same output on "
          f"{same}/{len(sources)} inputs")


if __name__ == "__main__":
    main()
