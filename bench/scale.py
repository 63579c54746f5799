"""How does the package scale with its corpus: how long do 29,000 to 5,000,000 pairs take to
prepare and to start training on, in how much memory, and how soon are the first epoch's
batches ready, cold and cached?

    python bench/scale.py [--data-root ../shared/data/multi30k] [--sizes 29000 500000 5000000]
                          [--work /tmp/transformer-bench-scale] [--updates 50]
    python bench/scale.py --first-epoch [--data-root DIR] [--max-tokens 4096] [--repeats 3]

For each size N: a deterministic parallel corpus of N pairs (N = 29,000 is Multi30k's own
training split; larger ones are built from it by replacing two words per side with words
drawn from that side's word frequencies, so lengths and vocabulary stay Multi30k's and
>= 95% of the lines on each side are distinct); then, each in a fresh process:

- preparation (`scripts/prepare_data.py data=files ...`: SentencePiece on a sample of at
  most data.spm_max_sentences pairs, streaming into the memory-mapped store): wall time, peak
  RSS, bytes per token on disk;
- training the default model (`data=files`, Transformer-Tiny, 4,096-token batches) for
  `--updates` updates on the store: start-up time (process start to the first update), peak
  RSS, and target tokens/s over the updates after the first 10.

Peak RSS is each child's own (VmHWM): it counts the store's mapped pages the process
touched, which the page cache shares between processes. The targets (TARGETS below) are
checked at the end against the N = 29,000 run of the same benchmark run.

`--first-epoch`: the time to the first epoch's batches of Multi30k's training set (data.root
= --data-root, a SentencePiece unigram model of 8,000 pieces, --max-tokens per batch), in
this process: SentencePiece's training (apart), the cold build (read, check, encode every
split, batch epoch 0), the cached build (check the files against the stores, open them, read
the evaluation sets' text, batch epoch 0; the best of --repeats), the padding ratio, and
the checks against their targets (cached <= 2 s, padding <= 10%).
"""

from __future__ import annotations

import time

START = time.perf_counter()  # a training child's start-up counts from here

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from timing import peak_rss_mib, timed

from transformer.data import multi30k
from transformer.data.text import read_lines

if TYPE_CHECKING:
    from transformer.run.data_config import DataConfig

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30
TARGETS = {"prepare_s": 600, "prepare_rss": 2 * GIB, "bytes_per_token": 3.0,
           "startup_s": 30, "train_rss_ratio": 1.25, "tokens_per_s_ratio": 0.9}
FIRST_EPOCH_TARGETS = {"cached_s": 2.0, "padding": 0.10}  # --first-epoch


# ---- the synthetic corpus ------------------------------------------------------------------


def synthesize(lines: list[str], n: int, seed: int, out: Path, chunk: int = 200_000) -> float:
    """Write n lines built from `lines`: line i is lines[i % len(lines)] with two of its words
    replaced by words drawn from the corpus's word frequencies (seeded). Returns the fraction
    of distinct lines."""
    counts = Counter(w for line in lines for w in line.split())
    vocab = np.array(list(counts))
    probs = np.array(list(counts.values()), dtype=np.float64)
    probs /= probs.sum()
    words = [line.split() for line in lines]
    rng = np.random.default_rng(seed)
    hashes = np.empty(n, dtype=np.int64)
    with open(out, "w", encoding="utf-8") as f:
        for start in range(0, n, chunk):
            ids = np.arange(start, min(n, start + chunk))
            base = ids % len(lines)
            positions = rng.random((len(ids), 2))
            draws = vocab[rng.choice(len(vocab), size=(len(ids), 2), p=probs)]
            block = []
            for k, b in enumerate(base):
                sentence = list(words[b])
                if sentence and start + k >= len(lines):  # the first copy stays the original
                    for j in range(2):
                        sentence[int(positions[k, j] * len(sentence))] = draws[k, j]
                block.append(" ".join(sentence))
            hashes[ids] = [hash(s) for s in block]
            f.write("\n".join(block) + "\n")
    return len(np.unique(hashes)) / n


def corpus(args: argparse.Namespace, n: int) -> dict[str, Path]:
    """The files of the size-n corpus (built once, kept in --work)."""
    root = Path(args.data_root)
    folder = Path(args.work) / f"n{n}"
    folder.mkdir(parents=True, exist_ok=True)
    files = {"train_src": folder / "train.en", "train_tgt": folder / "train.de",
             "valid_src": multi30k.split_file(root, "valid", "en"),
             "valid_tgt": multi30k.split_file(root, "valid", "de")}
    done = folder / "distinct.json"
    if not done.is_file():
        start = time.perf_counter()
        distinct = {}
        for key, lang, seed in (("train_src", "en", 1), ("train_tgt", "de", 2)):
            lines = read_lines(multi30k.split_file(root, "train", lang))
            distinct[lang] = synthesize(lines, n, seed, files[key])
        done.write_text(json.dumps(distinct))
        print(f"  built {n:,} pairs in {time.perf_counter() - start:.0f} s")
    distinct = json.loads(done.read_text())
    print(f"  distinct lines: en {distinct['en']:.1%}, de {distinct['de']:.1%}")
    return files


# ---- measured child processes ----------------------------------------------------------------


def overrides(files: dict[str, Path], run_dir: Path) -> list[str]:
    return ["data=files", *(f"data.{k}={v}" for k, v in files.items()), "model=tiny",
            "data.max_tokens=4096", f"hydra.run.dir={run_dir}"]


def prepare(files: dict[str, Path], run_dir: Path) -> dict[str, float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "prepare", "--",
           *overrides(files, run_dir)]
    wall, stdout = run_measured_child(cmd)
    report = json.loads(stdout.strip().splitlines()[-1])
    report["prepare_s"] = wall
    return report


def train(files: dict[str, Path], run_dir: Path, updates: int) -> dict[str, float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "train", "--updates",
           str(updates), "--", *overrides(files, run_dir)]
    _, stdout = run_measured_child(cmd)
    return json.loads(stdout.strip().splitlines()[-1])


def run_measured_child(command: list[str]) -> tuple[float, str]:
    """Run a child of this script; (wall seconds, its stdout). Each child reports its own
    peak RSS (RUSAGE_CHILDREN would be a maximum over all children)."""
    seconds, result = timed(lambda: subprocess.run(command, cwd=REPO, capture_output=True,
                                                   text=True))
    if result.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{result.stderr[-3000:]}")
    return seconds, result.stdout


# ---- what the children do ----------------------------------------------------------------------


def child_peak_rss() -> float:
    """This process's peak RSS in bytes."""
    return peak_rss_mib() * 2**20


def compose(argv: list[str]):
    from transformer.run.compose import compose_config
    return compose_config([a for a in argv if not a.startswith("hydra.run.dir=")])


def run_dir_of(argv: list[str]) -> Path:
    return Path(next(a for a in argv if a.startswith("hydra.run.dir=")).split("=", 1)[1])


def child_prepare(argv: list[str]) -> None:
    """Prepare the data as scripts/prepare_data.py does (`load_data`), report as JSON."""
    from transformer.run.data import load_data
    data = load_data(compose(argv).data, run_dir_of(argv))
    train = data.train.corpora[0]
    tokens = len(train.src_ids) + len(train.tgt_ids)
    print(json.dumps({"pairs": len(train), "tokens": tokens,
                      "bytes_per_token": train.disk_bytes() / tokens,
                      "prepare_rss": child_peak_rss()}))


def child_train(argv: list[str], updates: int, started: float) -> None:
    """Train `updates` updates (no validation) and report start-up, peak RSS and tokens/s."""
    import torch  # noqa: F401  (imports count as start-up)

    from transformer.runtime import DistEnv
    from transformer.training.trainer import Trainer

    marks: list[tuple[float, int]] = []

    class TimedTrainer(Trainer):
        def train_step(self, batches):
            marks.append((time.perf_counter(), self.state.target_tokens))
            return super().train_step(batches)

    cfg = compose(argv + [f"trainer.max_updates={updates}", "trainer.log_every_updates=1000"])
    trainer = TimedTrainer(cfg, run_dir_of(argv), DistEnv())
    try:
        reason = trainer.run_epoch()
        marks.append((time.perf_counter(), trainer.state.target_tokens))
    finally:
        trainer.close()
    assert reason == "max_updates", f"the first epoch ended before {updates} updates"
    (t0, k0), (t1, k1) = marks[10], marks[-1]
    print(json.dumps({"startup_s": marks[0][0] - started, "train_rss": child_peak_rss(),
                      "tokens_per_s": (k1 - k0) / (t1 - t0), "pairs": len(trainer.data.train)}))


# ---- the first epoch's batches ---------------------------------------------------------------


def first_epoch_build(cfg: DataConfig, run_dir: Path) -> tuple[float, float, int]:
    """`load_data` and epoch 0's batches -> (seconds, padding ratio, number of batches)."""
    from transformer.data.batching import padding_ratio
    from transformer.run.data import load_data

    def build():
        data = load_data(cfg, run_dir)
        return data, data.train_batches(epoch=0)

    seconds, (data, batches) = timed(build)
    return seconds, padding_ratio(data.train.src_lens, data.train.tgt_lens, batches), len(batches)


def first_epoch(args: argparse.Namespace) -> None:
    """`--first-epoch`: SentencePiece's training, then the cold and the cached builds of the
    first epoch's batches, printed with the checks against `FIRST_EPOCH_TARGETS`."""
    from transformer.run.data import corpus_files
    from transformer.run.data_config import DataConfig
    from transformer.run.tokenizers import train_tokenizers

    import_s = time.perf_counter() - START
    cfg = DataConfig(root=args.data_root, vocab_size=8000, max_tokens=args.max_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        corpora = [(files, c.max_pairs, c.name) for c, files in corpus_files(cfg)]
        spm_s, tokenizers = timed(lambda: train_tokenizers(cfg, corpora, run_dir))
        cold_s, padding, batches = first_epoch_build(cfg, run_dir)  # the tokenizer: run_dir's
        cached_s = min(first_epoch_build(cfg, run_dir)[0] for _ in range(args.repeats))
        shutil.rmtree(run_dir / "cache")
        cold_s = min(cold_s, first_epoch_build(cfg, run_dir)[0])  # the files in the OS cache
    print(f"Multi30k train {cfg.src_lang}->{cfg.tgt_lang}, SentencePiece {cfg.spm_model_type} "
          f"{tokenizers.src.vocab_size}, max_tokens={cfg.max_tokens}")
    for step, value in (("import torch + transformer (not counted)", f"{import_s:.2f}s"),
                        ("SentencePiece training (apart)", f"{spm_s:.2f}s"),
                        ("cold: read+check+encode+batch epoch 0", f"{cold_s:.2f}s"),
                        ("cached: open the stores+batch epoch 0", f"{cached_s:.2f}s"),
                        ("batches in epoch 0", f"{batches}"),
                        ("padding ratio (both sides)", f"{padding:.2%}")):
        print(f"{step:<44}{value:>10}")
    for name, value, target in (("cached start", cached_s, FIRST_EPOCH_TARGETS["cached_s"]),
                                ("padding", padding, FIRST_EPOCH_TARGETS["padding"])):
        print(f"{'PASS' if value <= target else 'FAIL'}  {name} <= {target:g}: {value:.3f}")


# ---- the report -------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=str(REPO.parent / "shared/data/multi30k"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[29_000, 500_000, 5_000_000])
    parser.add_argument("--work", default="/tmp/transformer-bench-scale")
    parser.add_argument("--updates", type=int, default=50)
    parser.add_argument("--first-epoch", action="store_true",
                        help="time the first epoch's batches of Multi30k, cold and cached, "
                             "instead of the sizes")
    parser.add_argument("--max-tokens", type=int, default=4096,
                        help="--first-epoch: tokens per batch and side")
    parser.add_argument("--repeats", type=int, default=3,
                        help="--first-epoch: cached builds (the best counts)")
    parser.add_argument("--child", choices=["prepare", "train"], help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "prepare":
        return child_prepare(args.rest)
    if args.child == "train":
        return child_train(args.rest, args.updates, START)
    if args.first_epoch:
        return first_epoch(args)

    rows = []
    for n in args.sizes:
        print(f"N = {n:,}")
        files = corpus(args, n)
        run_dir = Path(args.work) / f"n{n}" / "run"
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
        row = {"n": n, **prepare(files, run_dir)}
        print(f"  prepared in {row['prepare_s']:.0f} s, peak RSS "
              f"{row['prepare_rss'] / GIB:.2f} GiB, {row['bytes_per_token']:.2f} bytes/token")
        row.update(train(files, run_dir, args.updates))
        print(f"  training: start-up {row['startup_s']:.1f} s, peak RSS "
              f"{row['train_rss'] / GIB:.2f} GiB, {row['tokens_per_s']:,.0f} tokens/s")
        rows.append(row)
    report(rows)


def report(rows: list[dict]) -> None:
    print("\n| pairs | prepare s | prepare peak RSS GiB | bytes/token | train start-up s "
          "| train peak RSS GiB | tokens/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['n']:,} | {r['prepare_s']:.0f} | {r['prepare_rss'] / GIB:.2f} | "
              f"{r['bytes_per_token']:.2f} | {r['startup_s']:.1f} | {r['train_rss'] / GIB:.2f} "
              f"| {r['tokens_per_s']:,.0f} |")
    base, big = rows[0], rows[-1]
    checks = [
        (f"prepare {big['n']:,} pairs <= {TARGETS['prepare_s']} s", big["prepare_s"],
         big["prepare_s"] <= TARGETS["prepare_s"]),
        ("prepare peak RSS <= 2 GiB", big["prepare_rss"] / GIB,
         big["prepare_rss"] <= TARGETS["prepare_rss"]),
        ("bytes per token <= 3", big["bytes_per_token"],
         big["bytes_per_token"] <= TARGETS["bytes_per_token"]),
        ("training start-up <= 30 s", big["startup_s"], big["startup_s"] <= TARGETS["startup_s"]),
        (f"train peak RSS vs {base['n']:,} pairs <= 1.25x", big["train_rss"] / base["train_rss"],
         big["train_rss"] / base["train_rss"] <= TARGETS["train_rss_ratio"]),
        (f"tokens/s vs {base['n']:,} pairs >= 0.9x", big["tokens_per_s"] / base["tokens_per_s"],
         big["tokens_per_s"] / base["tokens_per_s"] >= TARGETS["tokens_per_s_ratio"]),
    ]
    print()
    for name, value, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {value:.2f}")


if __name__ == "__main__":
    main()
