"""Benchmark: what the corpus-cleaning filters remove of planted noise and of clean pairs.

    python bench/noise.py [--root DIR] [--out DIR] [--seed 0] [--with-shuffled] [--workers 2]

Builds a noisy English-German corpus from the whole Multi30k training set: its 29,000 clean
pairs plus 29,000 noise pairs, shuffled together, with one label a line (`labels.txt`:
"clean" or the noise kind). The noise kinds, 5,800 pairs each:
  copy            the English line on the German side too
  wrong_lang_fr   the German side replaced by the same pair's French line
  wrong_lang_cs   ... by its Czech line
  joined          two pairs' German lines joined on the German side, one's English only
  duplicate       an exact copy of a clean pair (whichever comes first counts as clean)
`--with-shuffled` also writes (to OUT/shuffled/) 29,000 clean pairs plus 29,000 misaligned
ones (the German side of another pair): noise that no simple filter is meant to catch,
reported for what the length ratio happens to remove of it.

Then it cleans the corpus with each preset (`transformer.data.cleaning.CorpusCleaner`, the
length ratio on the pieces of a SentencePiece model trained as the package trains one, on
the clean pairs) and prints, per preset, the share of each noise kind removed, of all the
noise and of the clean pairs, the cleaning's pairs/s, and the check of strict against its
target (>= 99% of the noise removed, < 0.5% of the clean pairs). Before that, the sweeps
strict's thresholds were chosen from (language identification, length ratio), and what each
filter alone removes of the clean Multi30k. With `--out` the corpus files stay there.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import os
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from transformer.data.cleaning import (
    FILTER_PRESETS,
    CorpusCleaner,
    Filters,
    format_cleaning_table,
)
from transformer.data.tokenizer import Tokenizer

LANGS = ("en", "de", "fr", "cs")
NOISE_KINDS = ("copy", "wrong_lang_fr", "wrong_lang_cs", "joined", "duplicate")
TARGET_NOISE = 0.99  # strict removes at least this share of the planted noise
TARGET_CLEAN = 0.005  # and less than this share of the clean pairs


# ---- the corpora ----------------------------------------------------------------------------

def read_multi30k(root: Path) -> dict[str, list[str]]:
    """The training set's lines per language (line-aligned)."""
    lines = {lang: gzip.decompress((root / f"train.{lang}.gz").read_bytes())
             .decode("utf-8").split("\n")[:-1] for lang in LANGS}
    assert len({len(v) for v in lines.values()}) == 1, "train files of unequal length"
    return lines


def write_corpus(out_dir: Path, src: list[str], tgt: list[str], labels: list[str]) -> None:
    """out_dir/train.en, train.de, labels.txt: one line each per pair."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, lines in (("train.en", src), ("train.de", tgt), ("labels.txt", labels)):
        (out_dir / name).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def shuffled_together(pairs: list[tuple[str, str, str]], rng: np.random.Generator
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


def make_noisy_corpus(root: Path, out_dir: Path, seed: int
                      ) -> tuple[list[str], list[str], list[str]]:
    """Write out_dir/train.en, train.de, labels.txt: Multi30k's clean training pairs plus as
    many noise pairs (`NOISE_KINDS`, equal shares), shuffled; returns (src, tgt, labels)."""
    lines = read_multi30k(root)
    en, de = lines["en"], lines["de"]
    n = len(en)
    rng = np.random.default_rng(seed)
    pairs = [(s, t, "clean") for s, t in zip(en, de, strict=True)]
    shares = np.diff(np.linspace(0, n, len(NOISE_KINDS) + 1).astype(int))
    for kind, share in zip(NOISE_KINDS, shares, strict=True):
        picked = rng.choice(n, share, replace=False)
        others = (picked + rng.integers(1, n, share)) % n  # another pair, never the same
        for i, j in zip(picked.tolist(), others.tolist(), strict=True):
            tgt = {"copy": en[i], "wrong_lang_fr": lines["fr"][i],
                   "wrong_lang_cs": lines["cs"][i], "joined": f"{de[i]} {de[j]}",
                   "duplicate": de[i]}[kind]
            pairs.append((en[i], tgt, kind))
    src, tgt, labels = shuffled_together(pairs, rng)
    write_corpus(out_dir, src, tgt, labels)
    return src, tgt, labels


def make_shuffled_corpus(root: Path, out_dir: Path, seed: int
                         ) -> tuple[list[str], list[str], list[str]]:
    """Write out_dir/train.en, train.de, labels.txt: Multi30k's clean training pairs plus as
    many misaligned ones ("shuffled": each English line with another pair's German line),
    shuffled together; returns (src, tgt, labels)."""
    lines = read_multi30k(root)
    en, de = lines["en"], lines["de"]
    n = len(en)
    rng = np.random.default_rng(seed)
    others = (np.arange(n) + rng.integers(1, n, n)) % n
    pairs = [(s, t, "clean") for s, t in zip(en, de, strict=True)]
    pairs += [(en[i], de[j], "shuffled") for i, j in enumerate(others.tolist())]
    src, tgt, labels = shuffled_together(pairs, rng)
    write_corpus(out_dir, src, tgt, labels)
    return src, tgt, labels


# ---- cleaning and reporting -----------------------------------------------------------------

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
          + f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
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
    start = time.perf_counter()
    verdicts = {lang: [identifier.classify(line) for line in lines[lang]] for lang in LANGS}
    per_line = (time.perf_counter() - start) / sum(len(v) for v in verdicts.values())
    thresholds = (0.3, 0.5, 0.7, 0.9)
    print("\nlangid on the German side: share of each language's lines judged not German "
          "(the English and German lines also: not their own language)")
    print(f"  {'lines':<8}" + "".join(f"{f'>= {t}':>9}" for t in thresholds))
    for lang in LANGS:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("../shared/data/multi30k"),
                        help="folder of Multi30k's train.{en,de,fr,cs}.gz")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the noisy corpus here and keep it (default: a temporary "
                             "folder)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--with-shuffled", action="store_true",
                        help="also the corpus with misaligned pairs (OUT/shuffled/)")
    parser.add_argument("--workers", type=int, default=2,
                        help="language identification processes (also timed with 1)")
    parser.add_argument("--chunk-pairs", type=int, default=10_000)
    parser.add_argument("--vocab-size", type=int, default=8000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        run(args, out)


def run(args: argparse.Namespace, out: Path) -> None:
    lines = read_multi30k(args.root)
    src, tgt, labels = make_noisy_corpus(args.root, out, args.seed)
    print(f"noisy corpus: {len(src):,} pairs ({Counter(labels)['clean']:,} clean) in {out}")
    start = time.perf_counter()
    tokenizer = Tokenizer.train(itertools.chain(lines["en"], lines["de"]), out / "spm.model",
                                vocab_size=args.vocab_size, model_type="unigram")
    print(f"SentencePiece unigram {args.vocab_size} on the clean pairs: "
          f"{time.perf_counter() - start:.1f} s")
    lens = piece_lengths(tokenizer, src), piece_lengths(tokenizer, tgt)
    label_array = np.array(labels)
    langid_sweep(lines)
    ratio_sweep(*lens, label_array)
    clean_multi30k_alone(lines, (piece_lengths(tokenizer, lines["en"]),
                                 piece_lengths(tokenizer, lines["de"])), args.chunk_pairs)
    worker_counts = sorted({1, args.workers})
    results = {name: report_preset(name, src, tgt, label_array, lens, NOISE_KINDS,
                                   workers=worker_counts if name == "strict" else [1],
                                   chunk_pairs=args.chunk_pairs)
               for name in FILTER_PRESETS}
    noise, clean_share = results["strict"]
    verdict = "PASS" if noise >= TARGET_NOISE and clean_share < TARGET_CLEAN else "FAIL"
    print(f"\nstrict: {noise:.2%} of the noise removed (target >= {TARGET_NOISE:.0%}), "
          f"{clean_share:.2%} of the clean pairs (target < {TARGET_CLEAN:.1%}): {verdict}")
    if args.with_shuffled:
        s_src, s_tgt, s_labels = make_shuffled_corpus(args.root, out / "shuffled", args.seed)
        s_lens = piece_lengths(tokenizer, s_src), piece_lengths(tokenizer, s_tgt)
        print(f"\nshuffled corpus: {len(s_src):,} pairs in {out / 'shuffled'}")
        for name in FILTER_PRESETS[1:]:
            report_preset(name, s_src, s_tgt, np.array(s_labels), s_lens, ("shuffled",),
                          workers=[args.workers], chunk_pairs=args.chunk_pairs)


if __name__ == "__main__":
    main()
