"""Benchmark: time to the first epoch's batches on Multi30k train, cold and cached.

    python bench/data.py [--root DIR] [--max-tokens 4096]

Prints SentencePiece training time (separate), the cold build (read + validate + encode all
splits + batch epoch 0), the cached build (hash files + load cached tensors + read valid/test
text + batch epoch 0), the padding ratio, and checks against the targets
(cached <= 2 s, padding <= 10%).
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse
import itertools
import shutil
import tempfile
from pathlib import Path

from transformer.data.batching import padding_ratio
from transformer.data.multi30k import DEFAULT_ROOT
from transformer.data.text import read_parallel
from transformer.data.tokenizer import Tokenizer
from transformer.run.data import load_data, resolve_files
from transformer.run.data_config import DataConfig

IMPORT_S = time.perf_counter() - START
CACHED_TARGET_S = 2.0
PADDING_TARGET = 0.10


def build(cfg: DataConfig, run_dir: Path) -> tuple[float, float, int]:
    """load_data + epoch-0 batches: (seconds, padding ratio, number of batches)."""
    start = time.perf_counter()
    data = load_data(cfg, run_dir)
    batches = data.train_batches(epoch=0)
    seconds = time.perf_counter() - start
    return seconds, padding_ratio(data.train.src_lens, data.train.tgt_lens, batches), len(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=DEFAULT_ROOT,
                        help="folder of the Multi30k files (default: the download cache)")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--model-type", default="unigram", choices=["unigram", "bpe"])
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3, help="cached builds (best is shown)")
    args = parser.parse_args()
    cfg = DataConfig(
        root=args.root, src_lang=args.src_lang, tgt_lang=args.tgt_lang,
        vocab_size=args.vocab_size, spm_model_type=args.model_type, max_tokens=args.max_tokens,
    )
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        files = resolve_files(cfg)["train"]
        text = read_parallel(files.src, files.tgt, split="train")
        start = time.perf_counter()
        Tokenizer.train(
            itertools.chain(text.src, text.tgt), run_dir / "spm.model",
            vocab_size=cfg.vocab_size, model_type=cfg.spm_model_type,
        )
        spm_s = time.perf_counter() - start

        cold_s, padding, num_batches = build(cfg, run_dir)
        cached_s = min(build(cfg, run_dir)[0] for _ in range(args.repeats))
        shutil.rmtree(run_dir / "cache")
        cold_s = min(cold_s, build(cfg, run_dir)[0])  # second cold run: warm OS file cache

    print(f"Multi30k train {cfg.src_lang}->{cfg.tgt_lang}, {len(text)} pairs, "
          f"SentencePiece {cfg.spm_model_type} {cfg.vocab_size}, max_tokens={cfg.max_tokens}")
    print(f"{'step':<44}{'value':>10}")
    print(f"{'import torch + transformer (not counted)':<44}{IMPORT_S:>9.2f}s")
    print(f"{'SentencePiece training (separate)':<44}{spm_s:>9.2f}s")
    print(f"{'cold: read+validate+encode+batch epoch 0':<44}{cold_s:>9.2f}s")
    print(f"{'cached: load cache+batch epoch 0':<44}{cached_s:>9.2f}s")
    print(f"{'batches in epoch 0':<44}{num_batches:>10d}")
    print(f"{'padding ratio (both sides)':<44}{padding:>10.2%}")
    for name, value, target, unit in [
        ("cached start", cached_s, CACHED_TARGET_S, "s"),
        ("padding", padding, PADDING_TARGET, ""),
    ]:
        verdict = "PASS" if value <= target else "FAIL"
        shown = f"{value:.3f}{unit} / {target}{unit}" if unit else f"{value:.2%} / {target:.0%}"
        print(f"{name}: {shown} = ratio {value / target:.2f} (target <= 1.00) {verdict}")


if __name__ == "__main__":
    main()
