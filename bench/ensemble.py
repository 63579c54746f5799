"""Ensembles: BLEU of N models decoding together against each member alone, and the time.

    python bench/ensemble.py --checkpoints runs/seed1 runs/seed2 runs/seed3 runs/seed4 \\
        --src test_2016_flickr.en --ref test_2016_flickr.de [--beam-size 5] [--threads 1]

Each member (a checkpoint or run directory: models sharing their tokenizers, e.g. one
recipe trained with different seeds) translates the test set alone, then all of them
together (`Translator.load(..., ensemble=True)`); cased sacreBLEU and chrF of each. Timing:
the first member alone and the ensemble, each warmed up, in turn for `--rounds` rounds
(`paired_passes`: the machine's drift falls on both alike), one engine in this one process;
the ensemble's time over the member's, against N x 1.15.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import sacrebleu
import torch
from timing import cpu_description, paired_passes

from transformer.decoding.translator import Translator


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoints", nargs="+", required=True, help="the members, at least 2")
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--ref", type=Path, required=True)
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lines, refs = args.src.read_text().splitlines(), args.ref.read_text().splitlines()
    print(f"{cpu_description()}; {args.threads} thread(s), beam {args.beam_size}, "
          f"{len(lines)} lines")
    members = [Translator.load(path, device="cpu") for path in args.checkpoints]
    ensemble = Translator.load(args.checkpoints, device="cpu", ensemble=True)
    print(f"{'model':<44}{'BLEU':>7}{'chrF':>7}")
    bleus = []
    for path, translator in [*zip(args.checkpoints, members, strict=True),
                             (f"ensemble of {len(members)}", ensemble)]:
        hyps = translator.translate(lines, beam_size=args.beam_size)
        bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
        chrf = sacrebleu.corpus_chrf(hyps, [refs]).score
        bleus.append(bleu)
        print(f"{str(path)[-43:]:<44}{bleu:>7.2f}{chrf:>7.2f}", flush=True)
    gain = bleus[-1] - max(bleus[:-1])
    print(f"ensemble - best member: {gain:+.2f} BLEU (target: >= +1.0)")
    passes = {name: (lambda t=t: t.translate(lines, beam_size=args.beam_size))
              for name, t in (("member", members[0]), ("ensemble", ensemble))}
    for translate in passes.values():  # warm up: the first pass makes kernels and buffers
        translate()
    seconds, _ = paired_passes(passes, args.rounds)
    ratios = [e / m for m, e in zip(seconds["member"], seconds["ensemble"], strict=True)]
    n = len(members)
    print(f"time: member {statistics.median(seconds['member']):.2f} s, ensemble "
          f"{statistics.median(seconds['ensemble']):.2f} s; ensemble / member median "
          f"{statistics.median(ratios):.2f}x (rounds {' '.join(f'{r:.2f}x' for r in ratios)}); "
          f"target: <= {n} x 1.15 = {n * 1.15:.2f}x")


if __name__ == "__main__":
    main()
