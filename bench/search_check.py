"""Check: our fast beam search (cached, batched, parallel) gives the hypotheses and scores of
the plain reference search (tests/reference_search.py: one sentence at a time, no cache) on
Multi30k test_2016_flickr, for beam 1, beam 5 and beam 5 with 3-best lists.

    python bench/search_check.py [--checkpoint RUN_OR_PT] [--data-root DIR] [--sentences N]

Prints, per setting, how many hypotheses have identical tokens, the largest score and
log-prob differences, and the time of each search (the reference is slow: minutes).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from reference_search import reference_beam_search  # noqa: E402

from transformer.data.multi30k import DEFAULT_ROOT, download_multi30k  # noqa: E402
from transformer.data.text import read_lines  # noqa: E402
from transformer.decoding.corpus import search_corpus  # noqa: E402
from transformer.decoding.request import DecodingRequest  # noqa: E402
from transformer.decoding.search import max_output_lengths  # noqa: E402
from transformer.decoding.translator import Translator  # noqa: E402

DEFAULT_CHECKPOINT = str(ROOT.parent / "runs/ref/checkpoints/checkpoint_best.pt")
SETTINGS = {"beam 1": (1, 1), "beam 5": (5, 1), "beam 5, 3-best": (5, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT)
    parser.add_argument("--data-root", default=DEFAULT_ROOT)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    download_multi30k(args.data_root, ("en", "de"))
    lines = read_lines(Path(args.data_root).expanduser() / "test_2016_flickr.en.gz")
    translator = Translator.load(args.checkpoint, device="cpu")
    model, alpha = translator.model, translator.decoding.alpha
    sources = [s for s in translator._encode(lines[:args.sentences], 0) if s]
    limits = max_output_lengths(torch.tensor([len(s) for s in sources]), 1.5, 10,
                                model.config.max_positions).tolist()
    print(f"{args.checkpoint}: {len(sources)} sentences, alpha {alpha:g}")
    for name, (beam_size, nbest) in SETTINGS.items():
        start = time.perf_counter()
        fast = search_corpus(model, sources,
                             DecodingRequest(beam_size=beam_size, nbest=nbest, alpha=alpha))
        fast_s = time.perf_counter() - start
        start = time.perf_counter()
        with torch.no_grad():
            reference = [reference_beam_search(model.eval(), src, beam_size=beam_size,
                                               nbest=nbest, alpha=alpha, max_len=limit)
                         for src, limit in zip(sources, limits, strict=True)]
        reference_s = time.perf_counter() - start
        pairs = [(f, r) for fs, rs in zip(fast, reference, strict=True)
                 for f, r in zip(fs, rs, strict=True)]
        same = sum(f.tokens == r.tokens for f, r in pairs)
        score = max(abs(f.score - r.score) for f, r in pairs)
        log_prob = max(abs(f.log_prob - r.log_prob) for f, r in pairs)
        print(f"{name}: identical tokens {same}/{len(pairs)} hypotheses; max |score diff| "
              f"{score:.1e}, max |log-prob diff| {log_prob:.1e}; fast {fast_s:.1f}s, "
              f"reference {reference_s:.0f}s")


if __name__ == "__main__":
    main()
