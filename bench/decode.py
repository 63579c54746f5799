"""Benchmark: translation speed and peak memory on Multi30k test_2016_flickr (en -> de), CPU.

Rows (each in its own subprocess, so peak RSS is per row):
  beam5 cached batched      the default: key/value cache, batches of --max-tokens
  beam5 uncached batched    the decoder re-reads the whole prefix at every step
  beam5 cached one-by-one   one sentence per batch
  greedy cached batched     beam size 1 (identical to greedy search)

Without --checkpoint the model has random weights of the `small` shape (256 hidden, 1024 FFN,
4 heads, 3+3 layers, joint vocabulary 8000 from a SentencePiece model trained here on
Multi30k train). A random model does not end its sentences, so EOS is suppressed and every
hypothesis runs to the length limit, set to `source tokens + 5` (EOS then forced): all rows
do the same, fixed amount of decoding. With --checkpoint (a trained model) the usual limit
`1.5 * source + 10` and natural EOS apply.

The slow rows translate the first --slow-sentences sentences only; ratios against row 1 use
row 1's speed on those same sentences. One thread by default: on a shared machine a second
OpenMP thread that loses its core stalls every operation (--threads 2 on a quiet machine).

    python bench/decode.py [--sentences 1000] [--slow-sentences 200] [--threads 1]
                           [--checkpoint RUN_OR_PT] [--data-root DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from memory import reset_peak_rss, status_mib  # bench/memory.py

from transformer.data.multi30k import DEFAULT_ROOT, download_multi30k
from transformer.data.text import read_lines
from transformer.data.tokenizer import EOS_ID, Tokenizer, TokenizerPair
from transformer.decoding.corpus import DEFAULT_MAX_TOKENS
from transformer.decoding.translator import Translator
from transformer.model.transformer import ModelConfig, Transformer

SMALL = dict(num_hiddens=256, ffn_num_hiddens=1024, num_heads=4, num_encoder_layers=3,
             num_decoder_layers=3)
ROWS = {  # name: (translate options, uses the full sentence count)
    "beam5 cached batched": (dict(beam_size=5), True),
    "beam5 uncached batched": (dict(beam_size=5, use_cache=False), False),
    "beam5 cached one-by-one": (dict(beam_size=5, max_tokens=1), False),
    "greedy cached batched": (dict(beam_size=1), True),
}
TARGET_CACHE_SPEEDUP = 3.0


def read_gz(root: str, name: str) -> list[str]:
    """Lines of a Multi30k file in `root` (downloaded, checksummed, if missing)."""
    download_multi30k(root, ("en", "de"))
    return read_lines(Path(root).expanduser() / name)


def random_translator(spm_path: str) -> Translator:
    """Random `small` model whose decoder never picks EOS (a large negative EOS logit)."""
    tokenizer = Tokenizer.load(spm_path)
    torch.manual_seed(0)
    vocab = tokenizer.vocab_size
    model = Transformer(ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, **SMALL))
    with torch.no_grad():  # the final LayerNorm's bias, along the EOS output row
        w = model.output_projection.weight[EOS_ID]
        model.decoder.blks[-1].addnorm3.ln.bias.copy_(-50.0 * w / w.norm() ** 2)
    return Translator(model, TokenizerPair(tokenizer, tokenizer), device="cpu")


def child(args: argparse.Namespace) -> None:
    """One row: time the translation of the first `count` sentences, report peak RSS (and,
    for a full row, the time of the slow rows' subset)."""
    torch.set_num_threads(args.threads)
    options, full = ROWS[args.child]
    count = args.sentences if full else min(args.sentences, args.slow_sentences)
    if args.checkpoint:
        translator = Translator.load(args.checkpoint, device="cpu")
    else:
        translator = random_translator(args.spm)
        options = dict(options, max_len_a=1.0, max_len_b=5)  # output = source + 5 tokens
    options.setdefault("max_tokens", args.max_tokens)
    lines = read_gz(args.data_root, "test_2016_flickr.en.gz")[:count]
    translator.translate(lines[:8], **options)  # warm-up
    before = reset_peak_rss()
    start = time.perf_counter()
    translator.translate(lines, **options)
    seconds = time.perf_counter() - start
    result = {"sentences": count, "seconds": seconds, "peak_rss_mib": status_mib("VmHWM"),
              "growth_mib": status_mib("VmHWM") - before}
    if full:
        start = time.perf_counter()
        translator.translate(lines[:args.slow_sentences], **options)
        result["subset_seconds"] = time.perf_counter() - start
    print(json.dumps(result))


def run_row(name: str, args: argparse.Namespace, spm: str) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--spm", spm, "--data-root",
           args.data_root, "--sentences",
           str(args.sentences), "--slow-sentences", str(args.slow_sentences),
           "--max-tokens", str(args.max_tokens), "--threads", str(args.threads)]
    if args.checkpoint:
        cmd += ["--checkpoint", args.checkpoint]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--slow-sentences", type=int, default=200,
                        help="sentences for the slow rows (uncached, one-by-one)")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint", help="a trained model instead of random weights")
    parser.add_argument("--data-root", default=DEFAULT_ROOT,
                        help="folder of the Multi30k files (default: the download cache)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--spm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    with tempfile.TemporaryDirectory() as tmp:
        spm = str(Path(tmp) / "spm.model")
        if not args.checkpoint:
            start = time.perf_counter()
            Tokenizer.train(read_gz(args.data_root, "train.en.gz")
                            + read_gz(args.data_root, "train.de.gz"), spm,
                            vocab_size=8000)
            print(f"SentencePiece (vocab 8000, Multi30k train) trained in "
                  f"{time.perf_counter() - start:.1f}s")
        model = (f"checkpoint {args.checkpoint}" if args.checkpoint else
                 "random weights, small shape (256/1024/4 heads/3+3 layers, vocab 8000), "
                 "EOS suppressed: every output = source tokens + 5")
        print(f"torch {torch.__version__}, {args.threads} thread(s), float32 CPU; "
              f"{model}; --max-tokens {args.max_tokens}")
        results = {name: run_row(name, args, spm) for name in ROWS}

    speed = {name: r["sentences"] / r["seconds"] for name, r in results.items()}
    row1 = results["beam5 cached batched"]
    subset = min(args.sentences, args.slow_sentences)
    base = {True: speed["beam5 cached batched"], False: subset / row1["subset_seconds"]}
    print(f"{'row':<26}{'sentences':>10}{'seconds':>9}{'sent/s':>9}{'vs row 1':>9}"
          f"{'peak RSS MiB':>14}{'growth':>8}")
    for name, r in results.items():
        ratio = speed[name] / base[ROWS[name][1]]
        print(f"{name:<26}{r['sentences']:>10}{r['seconds']:>9.1f}{speed[name]:>9.1f}"
              f"{ratio:>9.2f}{r['peak_rss_mib']:>14.0f}{r['growth_mib']:>8.0f}")
    print(f"row 1 on the first {subset} sentences: {base[False]:.1f} sent/s ('vs row 1' of the "
          f"rows that translate {subset})")
    cache_speedup = base[False] / speed["beam5 uncached batched"]
    print(f"cache speed-up (beam 5, batched): {cache_speedup:.1f}x; batching speed-up: "
          f"{base[False] / speed['beam5 cached one-by-one']:.1f}x; greedy vs beam 5: "
          f"{speed['greedy cached batched'] / base[True]:.1f}x")
    print(f"{'PASS' if cache_speedup >= TARGET_CACHE_SPEEDUP else 'FAIL'}  cached >= "
          f"{TARGET_CACHE_SPEEDUP:.0f}x uncached (sentences/s, beam 5)")


if __name__ == "__main__":
    main()
