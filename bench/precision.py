"""Benchmark: inference in float32 vs under bf16 autocast on this CPU, for one checkpoint.

Training under bf16 pays on a CPU with native bf16 (`trainer.precision=auto`); inference
(translation, the server, validation) would use it only if it is faster *and* scores the
same. For each precision, alternately over --rounds, it times beam search over the test set
(sentences/s, best round) and reports cased sacreBLEU, and the teacher-forced validation
loss (`loss.evaluate_loss`), all in one run:

    python bench/precision.py [--checkpoint RUN_OR_PT] [--data-root DIR] [--threads 1]
                              [--beam-size 5] [--sentences 1000] [--rounds 2]

Prints one row per precision and the ratios bf16 / float32. Autocast is thread-local and
our engine decodes batches on worker threads when it has more than one CPU thread
(`search.decode_batches`), which autocast does not reach: hence one thread by default.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import sacrebleu
import torch

from transformer.data.batching import eval_batches
from transformer.data.multi30k import DEFAULT_ROOT
from transformer.data.store import ParallelCorpus
from transformer.decoding.translator import Translator
from transformer.model.loss import evaluate_loss
from transformer.tools.evaluation import evaluation_text

DEFAULT_CHECKPOINT = str(Path(__file__).resolve().parents[2]
                         / "runs/ref/checkpoints/checkpoint_best.pt")


def precision(name: str):
    """The context to run inference in: nothing for float32, CPU autocast for bf16."""
    if name == "float32":
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT)
    parser.add_argument("--data-root", default=str(DEFAULT_ROOT))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    translator = Translator.load(args.checkpoint)
    config = translator.training_config
    text = evaluation_text(config, data="test", data_root=args.data_root,
                           max_sentences=args.sentences)
    sources, refs = text.src, text.tgt
    valid = ParallelCorpus.encode(evaluation_text(config, data="valid",
                                                  data_root=args.data_root),
                                  translator.tokenizers)
    batches = eval_batches(valid.src_lens, valid.tgt_lens, 4096)
    names = ("float32", "bf16")
    speed = dict.fromkeys(names, 0.0)
    hyps: dict[str, list[str]] = {}
    for _ in range(args.rounds):
        for name in names:
            with precision(name):
                start = time.perf_counter()
                hyps[name] = translator.translate(sources, beam_size=args.beam_size)
                speed[name] = max(speed[name], len(sources) / (time.perf_counter() - start))
    print(f"{args.checkpoint}: {len(sources)} test sentences, beam {args.beam_size}, "
          f"{args.threads} threads, best of {args.rounds} rounds")
    print("| precision | sentences/s | test BLEU (cased) | validation loss / nll |")
    print("| --- | --- | --- | --- |")
    bleu = {}
    for name in names:
        bleu[name] = sacrebleu.corpus_bleu(hyps[name], [refs]).score
        with precision(name):
            report = evaluate_loss(translator.model, map(valid.collate, batches), 0.1)
        print(f"| {name} | {speed[name]:.0f} | {bleu[name]:.2f} | "
              f"{report.loss:.5f} / {report.nll:.5f} |")
    same = sum(a == b for a, b in zip(hyps["float32"], hyps["bf16"], strict=True))
    print(f"bf16 / float32: speed {speed['bf16'] / speed['float32']:.2f}x, BLEU "
          f"{bleu['bf16'] - bleu['float32']:+.2f}; identical translations {same}/{len(sources)}")


if __name__ == "__main__":
    main()
