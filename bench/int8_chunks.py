"""Benchmark: our int8 engine's beam search with the output projection's logits computed per
row chunk (`ops.rows_per_call`: whole sentences, as many rows as the int8 layer takes in one
call) against one joined (rows, vocabulary) tensor per step (the layer then joins its own
chunks), on a trained model: the same outputs, and the speed of each.

The two are timed in pairs of passes over the test set in one process, the order alternating
from pair to pair; what counts is the median of the pairs' ratios, which a machine whose
speed drifts from minute to minute disturbs less than the best pass of each.

    python bench/int8_chunks.py --checkpoint CKPT --data-root DIR [--join 4] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from engines import add_input_arguments, cpu_description, hold_to_isa, inputs  # bench/engines.py
from paired import paired_passes  # bench/paired.py

import transformer.decoding.search as search
from transformer.decoding.translator import Translator
from transformer.model import layers as ops

VARIANTS = {"joined": lambda layer: None, "chunked": ops.rows_per_call}


def chunking(translator: Translator, sources: list[str], name: str
             ) -> Callable[[], list[str]]:
    """A pass over `sources` with the logits computed as variant `name` says."""
    def translate() -> list[str]:
        search.rows_per_call = VARIANTS[name]
        try:
            return translator.translate(sources, beam_size=5)
        finally:
            search.rows_per_call = ops.rows_per_call
    return translate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_input_arguments(parser)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=8, help="pairs of passes")
    args = parser.parse_args()
    hold_to_isa(args.isa)
    sources = inputs(args, "en")
    print(cpu_description())
    translator = Translator.load(args.checkpoint, device="cpu", quantize="int8")
    for threads in args.threads:
        torch.set_num_threads(threads)
        translator.translate(sources[:50], beam_size=5)  # warm up
        times, outputs = paired_passes(
            {name: chunking(translator, sources, name) for name in VARIANTS}, args.rounds)
        ratios = [joined / chunked
                  for joined, chunked in zip(times["joined"], times["chunked"], strict=True)]
        same = sum(a == b for a, b in zip(outputs["joined"], outputs["chunked"], strict=True))
        print(f"{len(sources)} inputs of {args.join} line(s), beam 5, int8, {threads} thread(s): "
              f"joined {len(sources) / statistics.median(times['joined']):.1f} sent/s, chunked "
              f"{len(sources) / statistics.median(times['chunked']):.1f} sent/s; chunked / "
              f"joined speed, median of {args.rounds} pairs {statistics.median(ratios):.3f}x "
              f"(pairs {min(ratios):.3f}x-{max(ratios):.3f}x); the same output on "
              f"{same}/{len(sources)} inputs")


if __name__ == "__main__":
    main()
