"""Own data: the default plan against fixed settings and a hand sweep, on corpora other than
Multi30k.

Two public en->de corpora, cut from Helsinki-NLP/OPUS-MT-testsets (a git checkout; fetch it
with `git clone https://github.com/Helsinki-NLP/OPUS-MT-testsets`):
- `tatoeba`: Tatoeba's eng-deu test collection v2021-08-07, 17,565 short everyday sentence
  pairs; 1,000 pairs held out for validation and 1,000 for test, whole groups of the same
  English sentence at a time (seeded), the other 15,565 for training;
- `news`: the WMT news test sets en->de as training text: news-test2008, newssyscomb2009 and
  newstest2009-2017 (27,748 pairs, ~20 words a sentence) for training, the first 1,000 of
  newstest2018 for validation, newstest2019 (1,997 pairs) for test;
- `multi30k`: Multi30k's raw files given as `data=files` (`--multi30k DIR`).

    python bench/own_data.py prepare --testsets OPUS-MT-testsets --out runs/own
    python bench/own_data.py train --out runs/own --corpus tatoeba --tokens 3000000 \\
        --arms default multi30k batch_2k_d0.2 batch_4k_d0.1 small_1k_d0.1

Every arm trains `transformer train data=files` on the corpus's files for the same budget of
target tokens (`trainer.max_target_tokens`: the same training on every machine), then
translates the test set with its last checkpoint (beam 5, alpha 1.0): cased sacreBLEU and
chrF. `default` is the package's plan (nothing set); `multi30k` the Multi30k preset's
settings on the same files (`experiment=multi30k`); `multi30k_preset` (for the corpus
`multi30k` only) the Multi30k preset itself on Multi30k's own files (`data=multi30k
data.root=DIR`); the other arms set values by hand (`ARMS`). A finished arm is scored
again without training. Results: OUT/results.json and a table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import sacrebleu

HERE = Path(__file__).resolve().parent
NEWS_TRAIN = ["news-test2008", "newssyscomb2009", *[f"newstest{y}" for y in range(2009, 2018)]]
TATOEBA = "tatoeba-test-v2021-08-07"
HELD_OUT = 1000  # Tatoeba pairs for validation, and again for test


def sweep(batch: int, dropout: float, lr: float, model: str = "tiny") -> list[str]:
    return [f"model={model}", f"data.max_tokens={batch}", f"model.dropout={dropout}",
            f"optim.lr={lr}"]


# Hand-set arms: each sets the model (Transformer-Tiny unless it says small), batch size,
# dropout and peak lr; the warmup is 15% of the planned updates, at most 2,000, as in the plan.
ARMS = {
    "default": [],
    "multi30k": ["experiment=multi30k"],
    "multi30k_preset": [],  # the corpus multi30k only: the preset itself, data=multi30k
    "batch_512_d0.1": sweep(512, 0.1, 0.001),
    "batch_1k_d0.1": sweep(1024, 0.1, 0.0014),
    "batch_1k_d0.2": sweep(1024, 0.2, 0.0014),
    "batch_2k_d0.1": sweep(2048, 0.1, 0.002),
    "batch_2k_d0.2": sweep(2048, 0.2, 0.002),
    "batch_2k_d0.1_lr0.001": sweep(2048, 0.1, 0.001),
    "batch_2k_d0.1_lr0.003": sweep(2048, 0.1, 0.003),
    "batch_4k_d0.1": sweep(4096, 0.1, 0.003),
    "small_1k_d0.1": sweep(1024, 0.1, 0.0007, model="small"),
    "small_2k_d0.1": sweep(2048, 0.1, 0.001, model="small"),
}
PLANNED = ("default", "multi30k", "multi30k_preset")  # the arms that set nothing by hand
# What every hand-set arm shares with the plan: warmup 15% of the planned updates (at most
# 2,000), the cooldown over the last 20% of the budget.
SWEEP_SCHEDULE = ["optim.warmup_updates=2000", "optim.warmup_fraction=0.15", "optim.cooldown=0.2"]


# ---- preparing the corpora ----------------------------------------------------------------


def git_lines(repo: Path, path: str) -> list[str]:
    """A file of the test-set checkout, from its work tree or (a bare mirror) from HEAD."""
    if (repo / path).is_file():
        return (repo / path).read_text(encoding="utf-8").rstrip("\n").split("\n")
    git = ["git", "--git-dir", str(repo)]
    mode = subprocess.run([*git, "ls-tree", "HEAD", path], check=True, capture_output=True,
                          text=True).stdout.split(" ", 1)[0]
    text = subprocess.run([*git, "show", f"HEAD:{path}"], check=True, capture_output=True,
                          text=True).stdout
    if mode == "120000":  # a symbolic link: its text is the target's path
        return git_lines(repo, os.path.normpath(os.path.join(os.path.dirname(path), text)))
    return text.rstrip("\n").split("\n")


def write_pairs(out: Path, split: str, pairs: list[tuple[str, str]]) -> None:
    for side, lang in ((0, "en"), (1, "de")):
        (out / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs),
                                             encoding="utf-8")


def prepare_tatoeba(repo: Path, out: Path) -> None:
    base = f"testsets/eng-deu/{TATOEBA}"
    pairs = list(zip(git_lines(repo, f"{base}.eng"), git_lines(repo, f"{base}.deu"),
                     strict=True))
    groups: dict[str, list[tuple[str, str]]] = {}
    for pair in pairs:
        groups.setdefault(pair[0], []).append(pair)
    keys = sorted(groups)
    random.Random(1).shuffle(keys)
    held: dict[str, list[tuple[str, str]]] = {"test": [], "valid": []}
    train = []
    for key in keys:
        for split in ("test", "valid"):
            if len(held[split]) < HELD_OUT:
                held[split].extend(groups[key])
                break
        else:
            train.extend(groups[key])
    for split in ("test", "valid"):
        train.extend(held[split][HELD_OUT:])  # a group's pairs beyond the 1,000
        held[split] = held[split][:HELD_OUT]
    write_pairs(out, "train", train)
    write_pairs(out, "valid", held["valid"])
    write_pairs(out, "test", held["test"])


def prepare_news(repo: Path, out: Path) -> None:
    def pairs(name: str) -> list[tuple[str, str]]:
        base = f"testsets/en-de/{name}"
        return list(zip(git_lines(repo, f"{base}.en"), git_lines(repo, f"{base}.de"),
                        strict=True))

    write_pairs(out, "train", [p for name in NEWS_TRAIN for p in pairs(name)])
    write_pairs(out, "valid", pairs("newstest2018")[:HELD_OUT])
    write_pairs(out, "test", pairs("newstest2019"))


def prepare_multi30k(root: Path, out: Path) -> None:
    for split, stem in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
        for lang in ("en", "de"):
            with gzip.open(root / f"{stem}.{lang}.gz", "rt", encoding="utf-8") as f:
                (out / f"{split}.{lang}").write_text(f.read(), encoding="utf-8")


def prepare(args: argparse.Namespace) -> None:
    for name, make, source in (("tatoeba", prepare_tatoeba, args.testsets),
                               ("news", prepare_news, args.testsets),
                               ("multi30k", prepare_multi30k, args.multi30k)):
        if source is None:
            continue
        out = args.out / "data" / name
        out.mkdir(parents=True, exist_ok=True)
        make(source, out)
        sizes = {split: len((out / f"{split}.en").read_text(encoding="utf-8").splitlines())
                 for split in ("train", "valid", "test")}
        words = sum(len(line.split()) for lang in ("en", "de") for line in
                    (out / f"train.{lang}").read_text(encoding="utf-8").splitlines())
        print(f"{name}: {sizes} pairs; {words / sizes['train'] / 2:.1f} words a sentence")


# ---- training the arms --------------------------------------------------------------------


def run(command: list[str], log: Path | None = None) -> None:
    print("+", " ".join(command), flush=True)
    with open(log, "a") if log else open(os.devnull, "w") as out:
        subprocess.run(command, check=True, stdout=out if log else None,
                       stderr=subprocess.STDOUT if log else None)


def stopped(run_dir: Path) -> str | None:
    """The train.log line of a run that used its budget, or None."""
    log = run_dir / "train.log"
    lines = log.read_text().splitlines() if log.is_file() else []
    return next((line for line in reversed(lines) if "stopped (max_target_tokens)" in line),
                None)


def files(data: Path) -> list[str]:
    return ["data=files", f"data.train_src={data}/train.en", f"data.train_tgt={data}/train.de",
            f"data.valid_src={data}/valid.en", f"data.valid_tgt={data}/valid.de"]


def score(run_dir: Path, data: Path) -> dict:
    """Test BLEU and chrF of the last checkpoint, beam 5, alpha 1.0."""
    hyp = run_dir / "test.hyp.de"
    run([sys.executable, "-m", "transformer", "translate", "--checkpoint",
         str(run_dir / "checkpoints/checkpoint_last.pt"), "--input", str(data / "test.en"),
         "--output", str(hyp), "--beam-size", "5", "--alpha", "1.0"])
    hyps = hyp.read_text(encoding="utf-8").split("\n")[:-1]
    refs = (data / "test.de").read_text(encoding="utf-8").split("\n")[:-1]
    return {"bleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2),
            "chrf": round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)}


def chosen(run_dir: Path) -> str:
    """The settings line the run logged (what its plan chose), if any."""
    log = run_dir / "train.log"
    lines = log.read_text().splitlines() if log.is_file() else []
    return next((line.split("| INFO | ", 1)[-1] for line in lines
                 if "settings for" in line or "the plan chose" in line), "")


def train(args: argparse.Namespace) -> None:
    data = (args.out / "data" / args.corpus).resolve()
    out = (args.out / args.corpus / f"{args.tokens // 1000}k").resolve()
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for arm in args.arms:
        run_dir = out / arm
        overrides = ARMS[arm] if arm in PLANNED else [*ARMS[arm], *SWEEP_SCHEDULE]
        source = files(data)
        if arm == "multi30k_preset":  # Multi30k's own preset on its own files
            source = [f"data.root={args.multi30k.resolve()}"]
        seconds = results.get(arm, {}).get("seconds")
        if stopped(run_dir) is None:
            start = time.time()
            run([sys.executable, "-m", "transformer", "train", f"hydra.run.dir={run_dir}",
                 *source, f"trainer.max_target_tokens={args.tokens}",
                 "trainer.max_updates=null", "trainer.max_time=null", "trainer.max_epochs=null",
                 f"trainer.validate_every_updates={args.validate_every}",
                 "trainer.validate_every_epoch=false", "trainer.validate_after_budget=0",
                 "trainer.patience=0", *overrides, *args.extra], out / f"{arm}.log")
            seconds = round(time.time() - start)
        results[arm] = {"tokens": args.tokens, "overrides": overrides, "seconds": seconds,
                        "stopped": stopped(run_dir), "chosen": chosen(run_dir),
                        "test": score(run_dir, data)}
        results_path.write_text(json.dumps(results, indent=1))
        print(arm, json.dumps(results[arm]["test"]), f"{seconds} s", flush=True)
    print(f"\n{args.corpus}, {args.tokens:,} target tokens")
    print("arm                       BLEU   chrF  seconds")
    for arm, r in sorted(results.items(), key=lambda item: -item[1]["test"]["bleu"]):
        print(f"{arm:<24} {r['test']['bleu']:>6.2f} {r['test']['chrf']:>6.2f} "
              f"{r['seconds'] or 0:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare", help="cut the corpora into OUT/data/<corpus>/")
    p.add_argument("--testsets", type=Path, help="a checkout of Helsinki-NLP/OPUS-MT-testsets")
    p.add_argument("--multi30k", type=Path, default=HERE.parent.parent / "shared/data/multi30k",
                   help="Multi30k's raw files (train.en.gz, ...)")
    p.add_argument("--out", type=Path, default=Path("runs/own"))
    t = commands.add_parser("train", help="train and score arms of one corpus at one budget")
    t.add_argument("--out", type=Path, default=Path("runs/own"))
    t.add_argument("--corpus", choices=["tatoeba", "news", "multi30k"], required=True)
    t.add_argument("--tokens", type=int, required=True, help="the budget in target tokens")
    t.add_argument("--arms", nargs="+", default=["default", "multi30k"], choices=list(ARMS))
    t.add_argument("--validate-every", type=int, default=500,
                   help="validation every N updates (greedy BLEU on the validation set)")
    t.add_argument("--extra", nargs="*", default=[], help="more overrides for every arm")
    t.add_argument("--multi30k", type=Path, default=HERE.parent.parent / "shared/data/multi30k",
                   help="Multi30k's raw files, for the arm multi30k_preset")
    args = parser.parse_args()
    prepare(args) if args.command == "prepare" else train(args)


if __name__ == "__main__":
    main()
