"""What do the cleaning filters remove of a noisy corpus, what does noise cost a model with and
without them, and can one model translate into three languages?

    python bench/corpora.py --root ../shared/data/multi30k --out runs/corpora \\
        --updates 2400 --arms noise clean noisy cleaned multilingual

Arms (`--arms`, run one after another, never two trainings at once):
- `noise`: no training: what each preset of the filters removes of planted noise and of
  clean pairs (below);
- `clean`: Multi30k en->de as it is (`data=multi30k`);
- `noisy`: Multi30k plus 29,000 noise pairs (below: copies, French or Czech German sides,
  joined sentences, duplicates) as one corpus, `filters: none`;
- `cleaned`: the same corpus with `filters: strict`;
- `shuffled`, `shuffled_cleaned`: Multi30k plus 29,000 misaligned pairs, none / strict;
- `multilingual`: one model for en->de, en->fr and en->cs (a corpus each, target-language
  tags, equal weights), validated on each pair; its outputs' languages checked by
  py3langid (share of lines whose most likely language is not the target language, beside
  the same share for the references: py3langid's own error on such short lines).

Every trained arm trains the recipe (`transformer train`, the Multi30k experiment) for the
same number of updates of the same size (`recipe`), then translates test_2016_flickr with
the average of its last 5 checkpoints (beam 5) and scores it with cased sacreBLEU. A
finished arm (its checkpoints/checkpoint_last.pt at the number of updates) is scored again
without training. Results go to OUT/results.json and are printed as a table.

The noisy corpora (OUT/noise, or `--noise DIR`; made once, by the first arm that needs
them): the whole Multi30k training set, its 29,000 clean pairs, plus 29,000 noise pairs,
shuffled together (seed 0), with one label a line (`labels.txt`: "clean" or the noise
kind). The noise kinds, 5,800 pairs each:
  copy            the English line on the German side too
  wrong_lang_fr   the German side replaced by the same pair's French line
  wrong_lang_cs   ... by its Czech line
  joined          two pairs' German lines joined on the German side, one's English only
  duplicate       an exact copy of a clean pair (whichever comes first counts as clean)
and, in NOISE/shuffled/, the 29,000 clean pairs plus 29,000 misaligned ones (the German
side of another pair): noise that no simple filter is meant to catch.

The `noise` arm cleans them with each preset (`transformer.data.cleaning.CorpusCleaner`,
the length ratio on the pieces of a SentencePiece model trained as the package trains one,
on the clean pairs) and prints, per preset, the share of each noise kind removed, of all
the noise and of the clean pairs, the cleaning's pairs/s (strict with 1 and `--workers`
language identification processes), and the check of strict against its target (>= 99% of
the noise removed, < 0.5% of the clean pairs); then what the presets remove of the
misaligned pairs. Before that, the sweeps strict's thresholds were chosen from (language
identification, length ratio), and what each filter alone removes of the clean Multi30k.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import sacrebleu
from timing import load_average, timed

from transformer.data.cleaning import FILTER_PRESETS, CorpusCleaner, Filters, format_cleaning_table
from transformer.data.tokenizer import Tokenizer
from transformer.training.schedule import Budget, batch_row

HERE = Path(__file__).resolve().parent
LANGS = ("de", "fr", "cs")
TRAINED = ("clean", "noisy", "cleaned", "shuffled", "shuffled_cleaned", "multilingual")
ARMS = ("noise", *TRAINED)
SETTINGS = ("wu", "budget", "budget_2048")
SMALL_BATCH_TOKENS = 2048  # `budget_2048`: the batches the recipe chooses at 4,000 updates


# ---- training and scoring an arm --------------------------------------------------------------


def recipe(updates: int, settings: str = "wu") -> list[str]:
    """The overrides every arm shares: the recipe cut to `updates`, validated at the end of
    every epoch in the last 400 updates of 8,192 tokens (and every third of the run).

    `wu`: Wu et al.'s batch size, dropout and lr (not the ones the budget would choose) and
    a linear cooldown over the last third in updates (`optim.cooldown_updates`, the
    schedule the arms of docs/results.md's "Several corpora and cleaning" and "One
    multilingual model" trained with, before the recipe fitted its settings to the
    budget). `budget`: the recipe as it is, its settings and schedule chosen for a
    budget of `updates` updates (`schedule.budget_settings`, the model too).
    `budget_2048`: the recipe as it is for a budget of `updates` x 2,048 target tokens
    (`trainer.max_target_tokens`; the updates end first): from 5,000 updates `budget`
    takes batches of 4,096 tokens or more, this keeps the 4,000 updates' batches and
    settings in a longer run."""
    tokens = recipe_budget(updates, settings).max_target_tokens or "null"
    limits = [f"trainer.max_updates={updates}", "trainer.max_time=null",
              f"trainer.max_target_tokens={tokens}"]
    if settings == "wu":
        limits += ["model=tiny", "data.max_tokens=8192", "model.dropout=0.3", "optim.lr=0.005",
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
    if settings in ("budget", "budget_2048"):
        return batch_row(recipe_budget(updates, settings)).update_tokens
    raise SystemExit(f"unknown settings {settings!r}: one of {', '.join(SETTINGS)}")


def recipe_budget(updates: int, settings: str) -> Budget:
    """The budget `recipe(updates, settings)` trains to: `updates` updates, and for
    `budget_2048` their target tokens at 2,048 a batch, whose row of settings the recipe
    then chooses (`wu` fixes its settings itself)."""
    if settings == "budget_2048":
        return Budget(max_updates=updates, max_target_tokens=updates * SMALL_BATCH_TOKENS)
    return Budget(max_updates=updates)


def validation_window(tokens: int) -> int:
    """The last updates the recipe validates in: 400 of 8,192 tokens, the same tokens at
    any batch size."""
    return 400 * 8192 // tokens


def add_settings_option(parser: argparse.ArgumentParser, default: str) -> None:
    """`--settings`: `recipe`'s choice, shared by the benches that train it."""
    parser.add_argument("--settings", choices=SETTINGS, default=default,
                        help="wu: Wu et al.'s batch size, dropout and lr with a cooldown over "
                             "the last third; budget: the ones the recipe chooses for "
                             "--updates updates; budget_2048: the ones it chooses for "
                             f"--updates x 2,048 target tokens (default {default}: the numbers "
                             "in docs/results.md)")


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


def read_results(out: Path) -> dict:
    """What earlier runs of a benchmark recorded in OUT/results.json (empty: none)."""
    path = out / "results.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def save_results(out: Path, results: dict) -> None:
    """OUT/results.json, written again whole (after each arm: a stopped run keeps them)."""
    (out / "results.json").write_text(json.dumps(results, indent=1))


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
    seconds, _ = timed(lambda: run(["transformer", "train", f"hydra.run.dir={run_dir}",
                                    f"data.root={root}", *recipe(updates, settings),
                                    *overrides], log))
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
    """Cased sacreBLEU and chrF, rounded to 2 decimals, with BLEU's brevity penalty and the
    length ratio (the output's tokens / the reference's)."""
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    return {"bleu": round(bleu.score, 2),
            "chrf": round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2),
            "bp": round(bleu.bp, 3), "ratio": round(bleu.sys_len / max(bleu.ref_len, 1), 3)}


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


# ---- the noisy corpora -----------------------------------------------------------------------

NOISE_LANGS = ("en", "de", "fr", "cs")
NOISE_KINDS = ("copy", "wrong_lang_fr", "wrong_lang_cs", "joined", "duplicate")
NOISE_SEED = 0
NOISE_VOCAB = 8000  # the SentencePiece model whose pieces the length ratio counts
CHUNK_PAIRS = 10_000  # pairs per chunk given to the cleaner, as a store is written
TARGET_NOISE = 0.99  # strict removes at least this share of the planted noise
TARGET_CLEAN = 0.005  # and less than this share of the clean pairs

Pairs = list[tuple[str, str, str]]  # (source, target, label)


def read_multi30k(root: Path) -> dict[str, list[str]]:
    """The training set's lines per language (line-aligned)."""
    lines = {lang: gzip.decompress((root / f"train.{lang}.gz").read_bytes())
             .decode("utf-8").split("\n")[:-1] for lang in NOISE_LANGS}
    assert len({len(v) for v in lines.values()}) == 1, "train files of unequal length"
    return lines


def shuffled_together(pairs: Pairs, rng: np.random.Generator
                      ) -> tuple[list[str], list[str], list[str]]:
    """(src, tgt, label) triples in a random order, as three lists; among identical pairs the
    "clean" labels go to the earliest, so a duplicate is the later copy."""
    order = rng.permutation(len(pairs))
    src, tgt, labels = (list(column) for column in zip(*(pairs[i] for i in order), strict=True))
    positions: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, pair in enumerate(zip(src, tgt, strict=True)):
        positions[pair].append(i)
    for at in positions.values():
        if len(at) > 1:
            group = sorted((labels[i] for i in at), key=lambda label: label != "clean")
            for i, label in zip(at, group, strict=True):
                labels[i] = label
    return src, tgt, labels


def planted_noise(lines: dict[str, list[str]], rng: np.random.Generator) -> Pairs:
    """As many noise pairs as Multi30k has pairs, the `NOISE_KINDS` in equal shares."""
    en, de = lines["en"], lines["de"]
    n = len(en)
    shares = np.diff(np.linspace(0, n, len(NOISE_KINDS) + 1).astype(int))
    pairs = []
    for kind, share in zip(NOISE_KINDS, shares, strict=True):
        picked = rng.choice(n, share, replace=False)
        others = (picked + rng.integers(1, n, share)) % n  # another pair, never the same
        for i, j in zip(picked.tolist(), others.tolist(), strict=True):
            tgt = {"copy": en[i], "wrong_lang_fr": lines["fr"][i],
                   "wrong_lang_cs": lines["cs"][i], "joined": f"{de[i]} {de[j]}",
                   "duplicate": de[i]}[kind]
            pairs.append((en[i], tgt, kind))
    return pairs


def misaligned(lines: dict[str, list[str]], rng: np.random.Generator) -> Pairs:
    """Each English line with another pair's German line ("shuffled")."""
    en, de = lines["en"], lines["de"]
    n = len(en)
    others = (np.arange(n) + rng.integers(1, n, n)) % n
    return [(en[i], de[j], "shuffled") for i, j in enumerate(others.tolist())]


def mixed_corpus(lines: dict[str, list[str]], noise: Callable[..., Pairs], out_dir: Path
                 ) -> tuple[list[str], list[str], list[str]]:
    """OUT_DIR/train.en, train.de, labels.txt (one line each per pair): Multi30k's clean
    training pairs plus `noise(lines, rng)`, shuffled together (`NOISE_SEED`) -> (src, tgt,
    labels)."""
    rng = np.random.default_rng(NOISE_SEED)
    pairs = [(s, t, "clean") for s, t in zip(lines["en"], lines["de"], strict=True)]
    src, tgt, labels = shuffled_together(pairs + noise(lines, rng), rng)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, column in (("train.en", src), ("train.de", tgt), ("labels.txt", labels)):
        (out_dir / name).write_text("".join(f"{line}\n" for line in column), encoding="utf-8")
    return src, tgt, labels


def noise_corpora(root: Path, noise: Path) -> None:
    """NOISE/ (planted noise) and NOISE/shuffled/ (misaligned pairs), made once."""
    if not (noise / "shuffled" / "train.de").is_file():
        lines = read_multi30k(root)
        mixed_corpus(lines, planted_noise, noise)
        mixed_corpus(lines, misaligned, noise / "shuffled")


# ---- what the filters remove ------------------------------------------------------------------


def clean(filters: Filters, src: list[str], tgt: list[str], src_lens: np.ndarray,
          tgt_lens: np.ndarray, *, workers: int, chunk_pairs: int
          ) -> tuple[np.ndarray, dict[str, int], float]:
    """The corpus through a CorpusCleaner in chunks, as a store is built: (keep-mask,
    counts, seconds of text_mask + length_mask, the worker processes' start included)."""
    keep = np.zeros(len(src), dtype=bool)
    start = time.perf_counter()
    with CorpusCleaner(filters, "en", "de", name="noisy", workers=workers) as cleaner:
        for a in range(0, len(src), chunk_pairs):
            b = min(a + chunk_pairs, len(src))
            kept = a + np.flatnonzero(cleaner.text_mask(src[a:b], tgt[a:b]))
            keep[kept[cleaner.length_mask(src_lens[kept], tgt_lens[kept])]] = True
        counts = dict(cleaner.counts)
    return keep, counts, time.perf_counter() - start


def describe(filters: Filters) -> str:
    on = [name if value is True else f"{name} {value}"
          for name, value in filters.to_dict().items() if value not in (None, False)]
    return ", ".join(on) or "nothing"


def removal_table(labels: np.ndarray, keep: np.ndarray, kinds: tuple[str, ...]) -> list[str]:
    """Lines: per noise kind, all noise, clean: pairs, removed, share removed."""
    rows = [(kind, labels == kind) for kind in kinds]
    rows += [("all noise", labels != "clean"), ("clean", labels == "clean")]
    lines = [f"  {'pairs':<14}{'planted':>9}{'removed':>9}{'share':>9}"]
    for name, rows_of in rows:
        total, removed = int(rows_of.sum()), int((rows_of & ~keep).sum())
        lines.append(f"  {name:<14}{total:>9,}{removed:>9,}{removed / max(total, 1):>9.2%}")
    return lines


def report_preset(name: str, src: list[str], tgt: list[str], labels: np.ndarray,
                  lens: tuple[np.ndarray, np.ndarray], kinds: tuple[str, ...], *,
                  workers: list[int], chunk_pairs: int) -> tuple[float, float]:
    """Clean with the preset (once per worker count, the masks compared), print its table;
    returns (share of the noise removed, share of the clean pairs removed)."""
    filters = Filters.preset(name)
    print(f"\n== {name}: {describe(filters)}")
    keep = None
    speeds = []
    for count in workers:
        mask, counts, seconds = clean(filters, src, tgt, *lens, workers=count,
                                      chunk_pairs=chunk_pairs)
        assert keep is None or np.array_equal(mask, keep), "masks differ between worker counts"
        keep = mask
        where = (f"with {count} worker{'s' if count > 1 else ''}" if filters.langid is not None
                 else "in this process")
        speeds.append(f"{len(src) / seconds:,.0f} pairs/s {where} ({seconds:.2f} s)")
    print("\n".join(removal_table(labels, keep, kinds)))
    row = {"read": len(src), **counts, "max_len": 0, "kept": int(keep.sum())}
    print("  " + format_cleaning_table({"noisy": row}).rstrip("\n").replace("\n", "\n  "))
    print("  cleaning: " + "; ".join(speeds)
          + f"; load average {load_average():.1f} on {os.cpu_count()} cores")
    noise, clean_pairs = labels != "clean", labels == "clean"
    return ((noise & ~keep).sum() / noise.sum(), (clean_pairs & ~keep).sum() / clean_pairs.sum())


def piece_lengths(tokenizer: Tokenizer, lines: list[str]) -> np.ndarray:
    return np.array([len(ids) for ids in tokenizer.encode_batch(lines)], dtype=np.int64)


def ratio_sweep(src_lens: np.ndarray, tgt_lens: np.ndarray, labels: np.ndarray) -> None:
    """The length ratio alone: share of the joined pairs and of the clean pairs above each
    threshold."""
    ratio = np.maximum(src_lens, tgt_lens) / np.maximum(1, np.minimum(src_lens, tgt_lens))
    print("\nmax_ratio alone (pieces): share removed")
    print(f"  {'max_ratio':<10}{'joined':>9}{'clean':>9}{'clean pairs':>13}")
    for threshold in (1.5, 1.75, 2.0, 2.25, 2.5, 3.0):
        removed = ratio > threshold
        joined, clean_pairs = removed[labels == "joined"], removed[labels == "clean"]
        print(f"  {threshold:<10}{joined.mean():>9.2%}{clean_pairs.mean():>9.2%}"
              f"{int(clean_pairs.sum()):>13,}")


def langid_sweep(lines: dict[str, list[str]]) -> None:
    """py3langid on each language's training lines put on the German side: share judged not
    German at each threshold (for German itself: the clean lines a threshold would remove)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    seconds, verdicts = timed(lambda: {lang: [identifier.classify(line) for line in lines[lang]]
                                       for lang in NOISE_LANGS})
    per_line = seconds / sum(len(v) for v in verdicts.values())
    thresholds = (0.3, 0.5, 0.7, 0.9)
    print("\nlangid on the German side: share of each language's lines judged not German "
          "(the English and German lines also: not their own language)")
    print(f"  {'lines':<8}" + "".join(f"{f'>= {t}':>9}" for t in thresholds))
    for lang in NOISE_LANGS:
        expected = lang if lang in ("en", "de") else "de"
        shares = [np.mean([found != expected and p >= t for found, p in verdicts[lang]])
                  for t in thresholds]
        print(f"  {lang:<8}" + "".join(f"{share:>9.2%}" for share in shares))
    print(f"  classification: {per_line * 1e6:.0f} µs a line in this process")


def clean_multi30k_alone(lines: dict[str, list[str]], lens: tuple[np.ndarray, np.ndarray],
                         chunk_pairs: int) -> None:
    """What each filter alone, and each preset, removes of the clean Multi30k."""
    en, de = lines["en"], lines["de"]
    strict = Filters.preset("strict")
    single = {"empty": Filters(empty=True), "copies": Filters(copies=True),
              "max_repeat": Filters(max_repeat=strict.max_repeat),
              "sentences": Filters(sentences=True),
              "langid": Filters(langid=strict.langid), "duplicates": Filters(duplicates=True),
              f"max_ratio {Filters.preset('basic').max_ratio}": Filters(
                  max_ratio=Filters.preset("basic").max_ratio),
              f"max_ratio {strict.max_ratio}": Filters(max_ratio=strict.max_ratio),
              "basic": Filters.preset("basic"), "strict": strict}
    print(f"\nthe clean Multi30k alone ({len(en):,} pairs): removed by each filter alone")
    for name, filters in single.items():
        keep, _, _ = clean(filters, en, de, *lens, workers=1, chunk_pairs=chunk_pairs)
        removed = int((~keep).sum())
        print(f"  {name:<16}{removed:>7,}{removed / len(en):>9.2%}")


def noise_report(root: Path, noise: Path, workers: int) -> None:
    """The `noise` arm: the noisy corpora (made again, to the same files) cleaned by each
    preset; the sweeps and each filter alone on the clean Multi30k; strict's check."""
    lines = read_multi30k(root)
    src, tgt, labels = mixed_corpus(lines, planted_noise, noise)
    print(f"noisy corpus: {len(src):,} pairs ({Counter(labels)['clean']:,} clean) in {noise}")
    seconds, tokenizer = timed(lambda: Tokenizer.train(
        itertools.chain(lines["en"], lines["de"]), noise / "spm.model", vocab_size=NOISE_VOCAB,
        model_type="unigram"))
    print(f"SentencePiece unigram {NOISE_VOCAB} on the clean pairs: {seconds:.1f} s")
    lens = piece_lengths(tokenizer, src), piece_lengths(tokenizer, tgt)
    langid_sweep(lines)
    ratio_sweep(*lens, np.array(labels))
    clean_multi30k_alone(lines, (piece_lengths(tokenizer, lines["en"]),
                                 piece_lengths(tokenizer, lines["de"])), CHUNK_PAIRS)
    results = {name: report_preset(name, src, tgt, np.array(labels), lens, NOISE_KINDS,
                                   workers=sorted({1, workers}) if name == "strict" else [1],
                                   chunk_pairs=CHUNK_PAIRS)
               for name in FILTER_PRESETS}
    noise_share, clean_share = results["strict"]
    verdict = "PASS" if noise_share >= TARGET_NOISE and clean_share < TARGET_CLEAN else "FAIL"
    print(f"\nstrict: {noise_share:.2%} of the noise removed (target >= {TARGET_NOISE:.0%}), "
          f"{clean_share:.2%} of the clean pairs (target < {TARGET_CLEAN:.1%}): {verdict}")
    s_src, s_tgt, s_labels = mixed_corpus(lines, misaligned, noise / "shuffled")
    s_lens = piece_lengths(tokenizer, s_src), piece_lengths(tokenizer, s_tgt)
    print(f"\nshuffled corpus: {len(s_src):,} pairs in {noise / 'shuffled'}")
    for name in FILTER_PRESETS[1:]:
        report_preset(name, s_src, s_tgt, np.array(s_labels), s_lens, ("shuffled",),
                      workers=[workers], chunk_pairs=CHUNK_PAIRS)


# ---- the arms ---------------------------------------------------------------------------------


def train_arm(arm: str, args: argparse.Namespace, root: Path, out: Path, noise: Path) -> dict:
    """One trained arm, trained unless finished, and scored -> its results."""
    if arm not in ("clean", "multilingual"):
        noise_corpora(root, noise)
    run_dir = out / arm
    train(run_dir, root, args.updates, arm_overrides(arm, root, noise), out / f"{arm}.log",
          args.settings)
    multilingual = arm == "multilingual"
    return {"updates": args.updates,
            "test": score(run_dir, root, LANGS if multilingual else ("de",), multilingual),
            "cleaning": (run_dir / "cleaning.txt").read_text()}


def print_table(results: dict) -> None:
    print("\narm                lang   BLEU   chrF  off-target  (references)")
    for arm, result in results.items():
        for lang, r in result["test"].items():
            print(f"{arm:<18} {lang:<5} {r['bleu']:>5.2f} {r['chrf']:>6.2f} "
                  f"{r['off_target']:>10.2%}  ({r.get('off_target_reference', 0):.2%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=HERE.parent.parent / "shared/data/multi30k")
    parser.add_argument("--out", type=Path, default=Path("runs/corpora"))
    parser.add_argument("--noise", type=Path, default=None,
                        help="the noisy corpora's folder (default OUT/noise; made when missing)")
    parser.add_argument("--updates", type=int, default=2400)
    parser.add_argument("--arms", nargs="+", default=["clean", "noisy", "cleaned"], choices=ARMS,
                        metavar="ARM", help=f"run in this order: {', '.join(ARMS)}")
    parser.add_argument("--workers", type=int, default=2,
                        help="the noise arm's language identification processes (also timed "
                             "with 1)")
    add_settings_option(parser, "wu")
    args = parser.parse_args()
    root, out = args.root.resolve(), args.out.resolve()
    noise = (args.noise or out / "noise").resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = read_results(out)
    for arm in args.arms:
        if arm == "noise":
            noise_report(root, noise, args.workers)
            continue
        results[arm] = train_arm(arm, args, root, out, noise)
        save_results(out, results)
        print(arm, json.dumps(results[arm]["test"]), flush=True)
    if any(arm in TRAINED for arm in args.arms):
        print_table(results)


if __name__ == "__main__":
    main()
