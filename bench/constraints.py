"""Terminology: lexically constrained beam search, with constraints drawn from the reference.

    python bench/constraints.py --checkpoint RUN_DIR --src test_2016_flickr.en \\
        --ref test_2016_flickr.de [--seed 1] [--beam-size 5] [--threads 1] [--rounds 2]

As Post & Vilar (2018) evaluate: each line gets one or two phrases of its reference (a word
or two consecutive words, punctuation at their edges cut) that its unconstrained translation
lacks, chosen by `--seed`; a line whose reference offers none gets none. Printed: the share
of constraints that appear in the constrained translations, cased sacreBLEU on the
constrained lines without and with them, and the same for random constraints (a word of
another line's reference that neither this line's reference nor its translation has: the
cost to fluency of a term that does not belong). Timing: the whole test set without and
with the reference constraints, in turn for `--rounds` rounds (`paired_passes`), one engine
in this one process; the target: at most 3x.
"""

from __future__ import annotations

import argparse
import random
import statistics
import string
from pathlib import Path

import sacrebleu
import torch
from timing import cpu_description, paired_passes

from transformer.decoding.translator import Translator

EDGES = string.punctuation + "„“”«»"


def reference_phrases(ref: str, output: str, rng: random.Random) -> list[str]:
    """One or two phrases of `ref` (a word or two consecutive words, their edges' punctuation
    cut) that `output` does not contain, not overlapping; [] if it has none."""
    words = ref.split()
    spans = [(i, n) for n in (1, 2) for i in range(len(words) - n + 1)]
    candidates = []
    for i, n in spans:
        phrase = " ".join(words[i:i + n]).strip(EDGES)
        if phrase and phrase not in output:
            candidates.append((i, n, phrase))
    rng.shuffle(candidates)
    wanted, chosen, used = rng.choice((1, 2)), [], set()
    for i, n, phrase in candidates:
        if len(chosen) == wanted:
            break
        if used.isdisjoint(range(i, i + n)):
            chosen.append(phrase)
            used.update(range(i, i + n))
    return chosen


def random_phrase(ref: str, output: str, words: list[str], rng: random.Random) -> list[str]:
    """A word of another reference (`words`: all references' words of 4+ letters) that
    neither `ref` nor `output` contains."""
    while True:
        word = rng.choice(words)
        if word not in ref and word not in output:
            return [word]


def bleu(hyps: list[str], refs: list[str]) -> float:
    return sacrebleu.corpus_bleu(hyps, [refs]).score


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", nargs="+", required=True,
                   help="a checkpoint or run directory (several: an ensemble)")
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--ref", type=Path, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lines, refs = args.src.read_text().splitlines(), args.ref.read_text().splitlines()
    translator = Translator.load(args.checkpoint, device="cpu",
                                 ensemble=len(args.checkpoint) > 1)
    print(f"{cpu_description()}; {args.threads} thread(s), beam {args.beam_size}, "
          f"{len(lines)} lines")
    plain = translator.translate(lines, beam_size=args.beam_size)
    rng = random.Random(args.seed)
    drawn = [reference_phrases(r, o, rng) for r, o in zip(refs, plain, strict=True)]
    words = sorted({w.strip(EDGES) for r in refs for w in r.split() if len(w.strip(EDGES)) > 3})
    wrong = [random_phrase(r, o, words, rng) if d else []
             for r, o, d in zip(refs, plain, drawn, strict=True)]
    lines_with = [i for i, phrases in enumerate(drawn) if phrases]
    print(f"reference constraints: {sum(map(len, drawn))} phrases on {len(lines_with)} lines "
          f"(seed {args.seed})")
    for name, constraints in (("reference", drawn), ("random", wrong)):
        found = translator.translations(lines, beam_size=args.beam_size,
                                        constraints=constraints)
        texts = [hyps[0].text for hyps in found]
        appear = sum(phrase in text for phrases, text in zip(constraints, texts, strict=True)
                     for phrase in phrases)
        total = sum(map(len, constraints))
        unmet = sum(not hyps[0].constraints_met for hyps in found)
        sub_refs = [refs[i] for i in lines_with]
        before, after = (bleu([t[i] for i in lines_with], sub_refs) for t in (plain, texts))
        print(f"{name:>9} constraints: {appear}/{total} appear ({100 * appear / total:.2f}%), "
              f"{unmet} lines met none within the length limit; BLEU on those "
              f"{len(lines_with)} lines {before:.2f} -> {after:.2f} ({after - before:+.2f}); "
              f"whole test set {bleu(plain, refs):.2f} -> {bleu(texts, refs):.2f}", flush=True)
    passes = {"unconstrained": lambda: translator.translate(lines, beam_size=args.beam_size),
              "constrained": lambda: translator.translate(lines, beam_size=args.beam_size,
                                                          constraints=drawn)}
    seconds, _ = paired_passes(passes, args.rounds)
    ratios = [c / u for u, c in zip(seconds["unconstrained"], seconds["constrained"],
                                    strict=True)]
    print(f"time: unconstrained {statistics.median(seconds['unconstrained']):.2f} s, "
          f"constrained {statistics.median(seconds['constrained']):.2f} s; median "
          f"{statistics.median(ratios):.2f}x (rounds {' '.join(f'{r:.2f}x' for r in ratios)});"
          f" target: <= 3x")


if __name__ == "__main__":
    main()
