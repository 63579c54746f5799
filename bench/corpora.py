"""Experiments with several corpora on Multi30k: noise and cleaning, and one model for three
language pairs. Every arm trains the recipe (`transformer train`, the Multi30k experiment)
for the same number of updates of the same size, then translates test_2016_flickr with the
average of its last 5 checkpoints (beam 5) and scores it with cased sacreBLEU.

Arms (`--arms`, run one after another, never two trainings at once):
- `clean`: Multi30k en->de as it is (`data=multi30k`);
- `noisy`: Multi30k plus 29,000 noise pairs (`bench/noise.py`: copies, French or Czech
  German sides, joined sentences, duplicates) as one corpus, `filters: none`;
- `cleaned`: the same corpus with `filters: strict`;
- `shuffled`, `shuffled_cleaned`: Multi30k plus 29,000 misaligned pairs, none / strict;
- `multilingual`: one model for en->de, en->fr and en->cs (a corpus each, target-language
  tags, equal weights), validated on each pair; its outputs' languages checked by
  py3langid (share of lines whose most likely language is not the target language, beside
  the same share for the references: py3langid's own error on such short lines).

    python bench/corpora.py --root ../shared/data/multi30k --out runs/corpora \
        --updates 2400 --arms clean noisy cleaned multilingual

A finished arm (its checkpoints/checkpoint_last.pt at the number of updates) is scored
again without training. Results go to OUT/results.json and are printed as a table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import sacrebleu

from transformer.training.schedule import Budget, budget_settings

HERE = Path(__file__).resolve().parent
LANGS = ("de", "fr", "cs")


SETTINGS = ("wu", "budget")


def recipe(updates: int, settings: str = "wu") -> list[str]:
    """The overrides every arm shares: the recipe cut to `updates`, validated at the end of
    every epoch in the last 400 updates of 8,192 tokens (and every third of the run).

    `wu`: Wu et al.'s batch size, dropout and lr (not the ones the budget would choose) and
    a linear cooldown over the last third in updates (`optim.cooldown_updates`, the
    schedule every arm in docs/RESULTS.md trained with before the recipe fitted its settings
    to the budget). `budget`: the recipe as it is, its settings and schedule chosen for a
    budget of `updates` updates (`schedule.budget_settings`)."""
    limits = [f"trainer.max_updates={updates}", "trainer.max_time=null",
              "trainer.max_target_tokens=null"]
    if settings == "wu":
        limits += ["data.max_tokens=8192", "model.dropout=0.3", "optim.lr=0.005",
                   f"optim.cooldown_updates={updates // 3}", "optim.cooldown=0",
                   "optim.warmup_fraction=null"]
    window = validation_window(update_tokens(updates, settings))
    return [*limits, "trainer.validate_after_budget=0",
            f"trainer.validate_after_updates={max(0, updates - window)}",
            f"trainer.validate_every_updates={max(1, updates // 3)}"]


def update_tokens(updates: int, settings: str) -> int:
    """The tokens of one update of `recipe(updates, settings)`."""
    if settings == "wu":
        return 8192
    if settings == "budget":
        return budget_settings(Budget(max_updates=updates)).update_tokens
    raise SystemExit(f"unknown settings {settings!r}: one of {', '.join(SETTINGS)}")


def validation_window(tokens: int) -> int:
    """The last updates the recipe validates in: 400 of 8,192 tokens, the same tokens at
    any batch size."""
    return 400 * 8192 // tokens


def add_settings_option(parser: argparse.ArgumentParser, default: str) -> None:
    """`--settings`: `recipe`'s choice, shared by the benches that train it."""
    parser.add_argument("--settings", choices=SETTINGS, default=default,
                        help="wu: Wu et al.'s batch size, dropout and lr with a cooldown over "
                             "the last third; budget: the ones the recipe chooses for "
                             f"--updates updates (default {default}: the numbers in "
                             "docs/RESULTS.md)")


def corpus_entry(name: str, src: Path, tgt: Path, **extra: str) -> str:
    fields = {"name": name, "src": str(src), "tgt": str(tgt), **extra}
    return "{" + ",".join(f"{k}:{v}" for k, v in fields.items()) + "}"


def arm_overrides(arm: str, root: Path, noise: Path) -> list[str]:
    """The data overrides of one arm."""
    if arm == "clean":
        return []
    if arm in ("noisy", "cleaned", "shuffled", "shuffled_cleaned"):
        folder = noise / "shuffled" if arm.startswith("shuffled") else noise
        filters = "strict" if arm.endswith("cleaned") else "none"
        entry = corpus_entry(arm, folder / "train.en", folder / "train.de", filters=filters)
        return [f"data.corpora=[{entry}]"]
    if arm == "multilingual":
        corpora = [corpus_entry(f"en-{lang}", root / "train.en.gz", root / f"train.{lang}.gz",
                                tgt_lang=lang, filters="none") for lang in LANGS]
        valid = [corpus_entry(f"en-{lang}", root / "val.en.gz", root / f"val.{lang}.gz",
                              tgt_lang=lang) for lang in LANGS]
        return [f"data.corpora=[{','.join(corpora)}]", f"data.valid_sets=[{','.join(valid)}]"]
    raise SystemExit(f"unknown arm {arm!r}")


def run(command: list[str], log: Path | None = None) -> None:
    print("+", " ".join(command), flush=True)
    with open(log, "a") if log else open("/dev/null", "w") as out:
        subprocess.run(command, check=True, stdout=out if log else None,
                       stderr=subprocess.STDOUT if log else None)


def finished(run_dir: Path, updates: int) -> bool:
    """Whether RUN/train.log says the run stopped after `updates` updates (its line is
    written with checkpoints/checkpoint_last.pt at that update)."""
    log = run_dir / "train.log"
    return log.is_file() and f"after {updates} updates" in log.read_text()


def train(run_dir: Path, root: Path, updates: int, overrides: list[str],
          log: Path, settings: str = "wu") -> float | None:
    """Train one arm (`recipe(updates, settings)`, then `overrides`) into `run_dir` unless
    it is finished -> the seconds it took, or None when it was finished already."""
    if finished(run_dir, updates):
        return None
    start = time.time()
    run(["transformer", "train", f"hydra.run.dir={run_dir}", f"data.root={root}",
         *recipe(updates, settings), *overrides], log)
    seconds = time.time() - start
    print(f"{run_dir.name}: trained in {seconds:.0f} s", flush=True)
    return seconds


def read_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def average(run_dir: Path) -> Path:
    """RUN/avg5.pt, the average of the run's last 5 numbered checkpoints (made once)."""
    avg = run_dir / "avg5.pt"
    if not avg.is_file():
        run(["transformer", "average-checkpoints", str(run_dir / "checkpoints"), "--last", "5",
             "-o", str(avg)])
    return avg


def test_source(root: Path, folder: Path, lang: str = "en") -> Path:
    """FOLDER/test.LANG: test_2016_flickr's LANG side as plain text (`transformer
    translate --input`)."""
    source = folder / f"test.{lang}"
    source.write_text("\n".join(read_gz(root / f"test_2016_flickr.{lang}.gz")) + "\n",
                      encoding="utf-8")
    return source


def translate(checkpoint: Path, source: Path, hyp: Path, *options: str) -> list[str]:
    """`transformer translate` of `source` into `hyp` with `options` -> the translations."""
    run(["transformer", "translate", "--checkpoint", str(checkpoint), "--input", str(source),
         "--output", str(hyp), *options])
    return hyp.read_text(encoding="utf-8").split("\n")[:-1]


def bleu_chrf(hyps: list[str], refs: list[str]) -> dict:
    """Cased sacreBLEU and chrF, rounded to 2 decimals."""
    return {"bleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2),
            "chrf": round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)}


def score(run_dir: Path, root: Path, langs: tuple[str, ...], multilingual: bool) -> dict:
    """Average the last 5 checkpoints; translate the test set into each language; BLEU,
    chrF and (multilingual) the share of outputs py3langid puts in another language."""
    avg = average(run_dir)
    source = test_source(root, run_dir)
    out = {}
    for lang in langs:
        options = ["--beam-size", "5"] + (["--target-lang", lang] if multilingual else [])
        hyps = translate(avg, source, run_dir / f"test.{lang}.hyp", *options)
        refs = read_gz(root / f"test_2016_flickr.{lang}.gz")
        result = bleu_chrf(hyps, refs)
        result["off_target"] = off_target(hyps, lang)
        result["off_target_reference"] = off_target(refs, lang)  # py3langid's own error
        result["off_target_p50"] = off_target(hyps, lang, 0.5)  # as filters.langid: 0.5
        if multilingual:  # among the model's own languages: which one it answered in
            among = ("en", *langs)
            result["off_target_among"] = off_target(hyps, lang, among=among)
            result["off_target_among_reference"] = off_target(refs, lang, among=among)
        out[lang] = result
    return out


def off_target(lines: list[str], lang: str, confidence: float = 0.0,
               among: tuple[str, ...] | None = None) -> float:
    """Share of lines whose most likely language by py3langid (normalized probabilities)
    is not `lang`, counting only verdicts of at least `confidence`; with `among`, the
    verdict is one of those languages only (py3langid's `set_languages`)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier
    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    if among:
        identifier.set_languages(list(among))
    verdicts = [identifier.classify(line) for line in lines if line.strip()]
    wrong = sum(top != lang and p >= confidence for top, p in verdicts)
    return round(wrong / max(1, len(lines)), 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=HERE.parent.parent / "shared/data/multi30k")
    parser.add_argument("--out", type=Path, default=Path("runs/corpora"))
    parser.add_argument("--noise", type=Path, default=None,
                        help="the noisy corpus of bench/noise.py --out (made when missing)")
    parser.add_argument("--updates", type=int, default=2400)
    parser.add_argument("--arms", nargs="+", default=["clean", "noisy", "cleaned"])
    add_settings_option(parser, "wu")
    args = parser.parse_args()
    root, out = args.root.resolve(), args.out.resolve()
    noise = (args.noise or out / "noise").resolve()
    out.mkdir(parents=True, exist_ok=True)
    if any(a != "clean" and a != "multilingual" for a in args.arms) and not (
            noise / "shuffled" / "train.de").is_file():
        run([sys.executable, str(HERE / "noise.py"), "--root", str(root), "--out", str(noise),
             "--with-shuffled"], out / "noise.log")
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for arm in args.arms:
        run_dir = out / arm
        train(run_dir, root, args.updates, arm_overrides(arm, root, noise), out / f"{arm}.log",
              args.settings)
        multilingual = arm == "multilingual"
        results[arm] = {"updates": args.updates,
                        "test": score(run_dir, root, LANGS if multilingual else ("de",),
                                      multilingual),
                        "cleaning": (run_dir / "cleaning.txt").read_text()}
        results_path.write_text(json.dumps(results, indent=1))
        print(arm, json.dumps(results[arm]["test"]), flush=True)
    print("\narm                lang   BLEU   chrF  off-target  (references)")
    for arm, result in results.items():
        for lang, r in result["test"].items():
            print(f"{arm:<18} {lang:<5} {r['bleu']:>5.2f} {r['chrf']:>6.2f} "
                  f"{r['off_target']:>10.2%}  ({r.get('off_target_reference', 0):.2%})")


if __name__ == "__main__":
    main()
