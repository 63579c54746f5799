"""What does a change gain? Our engine against the package of another checkout, in pairs of
passes in one process, for changes smaller than the machine's drift.

    python bench/paired.py --baseline-src DIR [--checkpoint CKPT] [--data-root DIR]
                           [--join 4] [--lines N] [--threads 1] [--rounds 8]
                           [--quantize int8] [--isa AVX2|AVX512]

`bench/engines.py --baseline-src` compares each row's best run in fresh processes; on a
machine whose speed drifts by 10-25% within the hour, a change of a few percent shows only
in pairs of passes run back to back.

The package in DIR/src is imported a second time under another name (`transformer_baseline`,
from a copy in a temporary folder; a checkout of either layout of the package:
`timing.package_name`), both load the same checkpoint, and the two translate the same
inputs in turn, the order flipped every round. Printed: the median of the rounds' ratios
(the baseline's time over ours: above 1x, ours is faster), every ratio, smallest first, and
whether the outputs are the same. `--lines N`: a pass translates requests of N lines, one
`translate` call each, as `bench/engines.py --lines` cuts them (`SIZE_LINES` lines a pass
below that size: one line is 200 calls), instead of every input in one call; the two
packages take each request in turn (`paired_requests`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from engines import SIZE_LINES, add_input_arguments, inputs
from timing import cpu_description, hold_to_isa, package_name, paired_passes, ratio_summary

from transformer.decoding.translator import Translator

BASELINE = "transformer_baseline"


def import_baseline(src: Path, folder: Path) -> type:
    """The `Translator` of the package in `src` (a checkout's src/), imported as
    `transformer_baseline` from a copy in `folder` (its imports within the package are
    relative, so the copy imports itself)."""
    shutil.copytree(src / "transformer", folder / BASELINE)
    sys.path.insert(0, str(folder))
    return package_name("decoding.translator", "Translator", package=BASELINE)


def paired_requests(translators: dict, requests: list[list[str]], rounds: int
                    ) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
    """Each translator's seconds for all `requests` in every round, and its outputs: the
    translators take each request in turn, the order flipped from one request (and round)
    to the next, so a pass of many small calls is paired call by call, not only pass by
    pass."""
    seconds = {name: [0.0] * rounds for name in translators}
    outputs: dict[str, list[str]] = {name: [] for name in translators}
    for r in range(rounds):
        for i, request in enumerate(requests):
            names = list(translators)[::-1] if (r + i) % 2 else list(translators)
            taken, texts = paired_passes(
                {name: lambda t=translators[name], lines=request: t.translate(lines)
                 for name in names}, 1)
            for name in names:
                seconds[name][r] += taken[name][0]
                if r == 0:  # every round translates the same requests alike
                    outputs[name] += texts[name]
    return seconds, outputs


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_input_arguments(parser)
    parser.add_argument("--baseline-src", metavar="DIR", required=True,
                        help="a checkout of the package (e.g. a git worktree), its src/ read")
    parser.add_argument("--lines", type=int, default=None, metavar="N",
                        help="requests of N lines, one call each (default: every input in "
                             "one call)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--quantize", choices=["int8"], default=None)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    hold_to_isa(args.isa)
    torch.set_num_threads(args.threads)
    sources = inputs(args, "en")
    size = args.lines or len(sources)
    requests = [sources[i:i + size] for i in range(0, len(sources), size)]
    requests = requests[:max(1, SIZE_LINES // size)]
    sources = [line for request in requests for line in request]
    with tempfile.TemporaryDirectory() as folder:
        baseline = import_baseline(Path(args.baseline_src) / "src", Path(folder))
        options = {"quantize": args.quantize} if args.quantize else {}  # where asked only:
        # an older baseline's `load` may not take it
        translators = {name: cls.load(args.checkpoint, device="cpu", **options)
                       for name, cls in (("ours", Translator), ("baseline", baseline))}
        for translator in translators.values():
            translator.translate(sources[:50])  # warm up
        seconds, outputs = paired_requests(translators, requests, args.rounds)
    same = sum(a == b for a, b in zip(outputs["ours"], outputs["baseline"], strict=True))
    print(cpu_description())
    calls = f" in {len(requests)} calls" if len(requests) > 1 else ""
    print(f"{len(sources)} inputs of {args.join} line(s){calls}, {args.threads} thread(s)"
          f"{', int8' if args.quantize else ''}: ours {len(sources) / min(seconds['ours']):.1f}, "
          f"baseline {len(sources) / min(seconds['baseline']):.1f} sentences/s (best passes)")
    print(f"ours / baseline, paired: {ratio_summary(seconds['ours'], seconds['baseline'])}; "
          f"the same output on {same}/{len(sources)} inputs")


if __name__ == "__main__":
    main()
