"""Cleaning a training corpus: which pairs are dropped before it is encoded, and why.

Web-crawled parallel text holds pairs that teach a model the wrong thing: untranslated
copies, text in a third language, boilerplate repeated thousands of times, sentences glued
to the wrong partner. Such noise hurts neural translation far more than it hurts statistical
translation; copies and wrong-language targets are among the most harmful kinds (Khayrallah
and Koehn, "On the Impact of Various Types of Noise on Neural Machine Translation", WNGT
2018). Simple rules remove most of it: in mozilla/translations' data-cleaning experiments
(2024, github.com/mozilla/translations/pull/517) their plain rules (length, length ratio,
copies, duplicates, language) did as well as or slightly better than the elaborate filter
sets of OpusCleaner, and automatically tuned thresholds, with or without LASER and
Bicleaner-AI scores, did not beat them (a trained classifier such as Bicleaner-AI is the
step beyond, which this package leaves to other tools). So the package offers these rules,
each one switchable (a `Filters`), applied in the order of `REASONS`; a removed pair is
counted under the first filter that removes it:

- `empty`: a side that is empty or whitespace only, or that holds a control character
  (Unicode category Cc other than tab: left-overs of binary data or broken conversions).
  Format characters (Cf, e.g. the zero-width joiner of emoji and Indic scripts) are text
  and stay.
- `copies`: the source equals the target, ignoring case and whitespace: an untranslated
  pair teaches the model to copy.
- `max_repeat`: a side with one word repeated more than N times in a row ("the the the the"
  with N = 3, case ignored): stuttering crawls and extraction errors; a model trained on
  them loops.
- `sentences`: the two sides hold different numbers of sentences (a boundary: `.`, `!` or
  `?`, then whitespace and more text): a second sentence glued to one side only, which a
  length ratio cannot tell from one long sentence when both are short.
- `langid`: a side that py3langid puts, with probability >= the threshold (its normalized
  probabilities over all of its languages), in a language other than the corpus's. A low
  probability is not evidence (short lines, names, numbers), so only a confident verdict
  removes a pair.
- `duplicates`: a pair (exact source and target) seen earlier in the same corpus; the first
  occurrence is kept. Repeated boilerplate would otherwise dominate the gradient. Only pairs
  still kept enter the set of seen pairs, which is held as sorted 64-bit hashes (8 bytes a
  pair), so a corpus of any size is deduplicated in bounded memory.
- `max_ratio`: one side has more than this many times the other side's SentencePiece pieces
  (`max(ls, lt) / max(1, min(ls, lt))`): a misaligned pair, or one side holding two
  sentences. Measured on pieces, after encoding, so it is the one filter that needs the
  tokenizer (`CorpusCleaner.length_mask`).

Presets (`FILTER_PRESETS`): `none` (nothing removed), `basic` (empty, copies, duplicates,
max_ratio 3: cheap, and safe on any corpus), `strict` (basic plus max_repeat 3, sentences,
langid 0.5 and max_ratio 2.5). Measured on Multi30k (`bench/corpora.py --arms noise`):
strict removes 0.38% of the clean training pairs (sentences 0.32%: captions of two
sentences on one side only; langid 0.02%: short German captions taken for Luxembourgish;
max_ratio 2.5 0.03%, where 2.0 would take 0.18%) and, of 29,000 planted noise pairs, all
copies and duplicates, 99.4-99.8% of French or Czech lines on the German side and 99.5% of
targets holding a second sentence (a length ratio alone catches half of those: two short
sentences look like one long one).

Cleaning happens once, when a training corpus's store is built; its counts are reported
per corpus (`format_cleaning_table`): the pairs read, each removed pair under the one
reason that removed it (`empty` also takes the pairs with an empty side under `none`;
`max_len`, the pairs longer than `data.max_len`), the pairs kept. Validation and test sets
are never cleaned: they are scored as given (a side longer than `data.max_len` read cut to
it).
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from ..errors import ConfigError, require

__all__ = ["FILTER_PRESETS", "REASONS", "Filters", "CorpusCleaner", "format_cleaning_table"]

FILTER_PRESETS = ("none", "basic", "strict")
# The filters in the order they apply; a removed pair is counted under the first that removes it.
REASONS = ("empty", "copies", "max_repeat", "sentences", "langid", "duplicates", "max_ratio")
TEXT_REASONS = REASONS[:-1]  # decided on the text (`CorpusCleaner.text_mask`)

# Unicode category Cc is exactly U+0000-U+001F and U+007F-U+009F; tab (U+0009) is allowed.
CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")
# A boundary between two sentences of one line: end punctuation (closing quotes or brackets
# after it allowed), whitespace, then more text.
SENTENCE_BOUNDARY = re.compile("[.!?\u3002\uff01\uff1f]+[\"'\u201d\u2019)\\]]*\\s+(?=\\S)")

LANGID_FEATURE = "language identification (filters.langid)"


# ---- which filters ---------------------------------------------------------------------------

def _number(value: Any) -> bool:
    """An int or float, not a bool (YAML's `true` is no threshold)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _checked(name: str, value: Any, key: str) -> Any:
    """`value` as the filter `name` holds it (thresholds as float); ConfigError naming
    `key`.`name` when it is of the wrong kind or out of range."""
    where = f"{key}.{name}"
    if name in ("empty", "copies", "sentences", "duplicates"):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if value is None:
        return None
    if name == "max_repeat":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where} must be an integer >= 1 or null, got {value!r}")
        return int(value)
    if name == "langid":
        if not _number(value) or not 0 < value <= 1:
            raise ConfigError(f"{where} must be a probability in (0, 1] or null, got {value!r}")
        return float(value)
    if not _number(value) or not math.isfinite(value) or value < 1:  # max_ratio
        raise ConfigError(f"{where} must be a number >= 1 or null, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Filters:
    """Which pairs a corpus's cleaning removes (see the module docstring): the switches
    `empty`, `copies`, `duplicates`, and the thresholds `max_repeat` (words in a row),
    `langid` (probability of another language), `max_ratio` (pieces), each None when off."""

    empty: bool = False
    copies: bool = False
    max_repeat: int | None = None
    sentences: bool = False
    langid: float | None = None
    duplicates: bool = False
    max_ratio: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _checked(f.name, getattr(self, f.name), "filters"))

    @classmethod
    def preset(cls, name: str) -> Filters:
        """The filters of a preset of `FILTER_PRESETS`; ConfigError for another name."""
        if name == "none":
            return cls()
        basic = cls(empty=True, copies=True, duplicates=True, max_ratio=3.0)
        if name == "basic":
            return basic
        if name == "strict":
            return replace(basic, max_repeat=3, sentences=True, langid=0.5, max_ratio=2.5)
        raise ConfigError(f"unknown filter preset {name!r} (presets: {', '.join(FILTER_PRESETS)})")

    @classmethod
    def parse(cls, value: object, key: str) -> Filters:
        """Filters from a config value: a preset name, or a mapping of single filters with
        an optional "preset" as the base (default "none"), e.g. {"preset": "basic",
        "langid": 0.6}. Errors are one-line ConfigErrors naming `key`."""
        if isinstance(value, str):
            return cls._preset_at(value, key)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a preset name ({', '.join(FILTER_PRESETS)}) or a "
                              f"mapping of filters, got {value!r}")
        base = cls._preset_at(value.get("preset", "none"), f"{key}.preset")
        changes = {}
        for name, setting in value.items():
            if name == "preset":
                continue
            if name not in REASONS:
                raise ConfigError(f"{key}: unknown filter {name!r} (filters: "
                                  f"{', '.join(REASONS)}; or preset)")
            changes[name] = _checked(name, setting, key)
        return replace(base, **changes)

    @classmethod
    def _preset_at(cls, name: object, key: str) -> Filters:
        """`preset(name)` with errors naming `key`."""
        if not isinstance(name, str) or name not in FILTER_PRESETS:
            raise ConfigError(f"{key}: unknown filter preset {name!r} "
                              f"(presets: {', '.join(FILTER_PRESETS)})")
        return cls.preset(name)

    def to_dict(self) -> dict[str, Any]:
        """Plain values in `REASONS` order (for meta.json and store keys)."""
        return {name: getattr(self, name) for name in REASONS}

    def is_none(self) -> bool:
        """Whether nothing is filtered."""
        return self == Filters()

    def needs_text(self) -> bool:
        """Whether any filter decided on the text is on (all but max_ratio)."""
        return replace(self, max_ratio=None) != Filters()


# ---- the text filters, one pair at a time ----------------------------------------------------

def _empty(src: str, tgt: str) -> bool:
    """A side empty, whitespace only, or holding a control character."""
    return (not src.strip() or not tgt.strip()
            or CONTROL.search(src) is not None or CONTROL.search(tgt) is not None)


def _normalized(text: str) -> str:
    """Case folded, whitespace runs as one space, no leading or trailing space."""
    return " ".join(text.casefold().split())


def _copy(src: str, tgt: str) -> bool:
    """Source and target equal up to case and whitespace."""
    return _normalized(src) == _normalized(tgt)


def sentence_count(text: str) -> int:
    """How many sentences a line holds (boundaries inside it, plus one)."""
    return 1 + len(SENTENCE_BOUNDARY.findall(text.strip()))


def _sentences_differ(src: str, tgt: str) -> bool:
    """One side holds more sentences than the other (e.g. two joined on one side only)."""
    return sentence_count(src) != sentence_count(tgt)


def longest_repeat(text: str) -> int:
    """The longest run of one word (case ignored) repeated in a row; 0 for no words."""
    longest = run = 0
    previous = None
    for word in text.casefold().split():
        run = run + 1 if word == previous else 1
        longest = max(longest, run)
        previous = word
    return longest


# ---- language identification: one identifier per process -----------------------------------

_IDENTIFIER = None  # py3langid's LanguageIdentifier, loaded once per process


def _identifier() -> Any:
    """py3langid's identifier with normalized probabilities (loading it takes ~1 s)."""
    global _IDENTIFIER
    if _IDENTIFIER is None:
        require("py3langid", "clean", LANGID_FEATURE)
        langid = require("py3langid.langid", "clean", LANGID_FEATURE)
        _IDENTIFIER = langid.LanguageIdentifier.from_model_file(langid.MODEL_FILE,
                                                                norm_probs=True)
    return _IDENTIFIER


def _load_identifier() -> None:
    """A worker's initializer: load the identifier before the first chunk arrives."""
    _identifier()


def wrong_language(src: Sequence[str], tgt: Sequence[str], src_lang: str, tgt_lang: str,
                   threshold: float) -> np.ndarray:
    """Per pair: is a side in another language than its own, with probability >=
    `threshold`?"""
    identifier = _identifier()

    def wrong(text: str, lang: str) -> bool:
        found, probability = identifier.classify(text)
        return found != lang and probability >= threshold

    pairs = zip(src, tgt, strict=True)
    return np.fromiter((wrong(s, src_lang) or wrong(t, tgt_lang) for s, t in pairs),
                       dtype=bool, count=len(src))


# ---- duplicates: the hashes of the pairs seen so far ----------------------------------------

def pair_hashes(src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
    """64-bit BLAKE2b hashes of the pairs (uint64; a collision among a billion pairs has
    probability ~3%, among ten million ~3e-6)."""
    digests = b"".join(
        hashlib.blake2b(f"{len(s)}\n{s}\n{t}".encode("utf-8", "surrogatepass"),
                        digest_size=8).digest()
        for s, t in zip(src, tgt, strict=True))
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


class SeenHashes:
    """A set of uint64 hashes as a few sorted arrays, each at least twice the size of the
    next (a log-structured merge): adding a chunk costs time in proportion to the chunk,
    amortized, not to the corpus so far; 8 bytes a hash (16 while two arrays merge)."""

    def __init__(self) -> None:
        self.runs: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(len(run) for run in self.runs)

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        """Per hash: is it in the set?"""
        found = np.zeros(len(hashes), dtype=bool)
        for run in self.runs:
            at = np.searchsorted(run, hashes).clip(max=len(run) - 1)
            found |= run[at] == hashes
        return found

    def add(self, hashes: np.ndarray) -> None:
        """Add hashes not in the set yet (sorted, no repeats)."""
        if len(hashes) == 0:
            return
        self.runs.append(hashes)
        while len(self.runs) > 1 and len(self.runs[-2]) <= 2 * len(self.runs[-1]):
            last = self.runs.pop()
            self.runs[-1] = np.union1d(self.runs[-1], last)


# ---- one corpus's cleaning ------------------------------------------------------------------

class CorpusCleaner:
    """Streams one corpus's chunks through its filters; keeps the per-filter counts.

    `text_mask` takes each chunk's text, `length_mask` the piece counts of the pairs it kept;
    `counts` (REASONS -> pairs removed) and `seen` (pairs given to `text_mask`) add up over
    the chunks. With language identification on and `workers` > 1, the identification runs in
    that many processes (spawned, each loading the identifier once); `close` stops them.
    """

    def __init__(self, filters: Filters, src_lang: str, tgt_lang: str, *, name: str = "",
                 workers: int = 2) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        self.filters, self.src_lang, self.tgt_lang = filters, src_lang, tgt_lang
        self.name, self.workers = name, workers
        self.counts: dict[str, int] = dict.fromkeys(REASONS, 0)
        self.seen = 0
        self._hashes = SeenHashes()
        self._pool: ProcessPoolExecutor | None = None
        if filters.langid is not None:
            self._check_languages()

    def _check_languages(self) -> None:
        """py3langid is installed and knows both languages (before any work)."""
        known = set(_identifier().labels)
        corpus = f"corpus {self.name}: " if self.name else ""
        for lang in (self.src_lang, self.tgt_lang):
            if lang not in known:
                raise ConfigError(f"{corpus}py3langid does not know language {lang!r} "
                                  "(filters.langid needs the corpus's ISO 639-1 codes)")

    # ---- the masks ----------------------------------------------------------------------

    def text_mask(self, src: list[str], tgt: list[str]) -> np.ndarray:
        """The keep-mask of one chunk of aligned lines: the text filters in `REASONS` order,
        each on the pairs still kept."""
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} source lines but {len(tgt)} target lines")
        keep = np.ones(len(src), dtype=bool)
        self.seen += len(src)
        for reason in TEXT_REASONS:
            if not self._on(reason):
                continue
            kept = np.flatnonzero(keep)
            removed = self._removed(reason, [src[i] for i in kept], [tgt[i] for i in kept])
            keep[kept[removed]] = False
            self.counts[reason] += int(removed.sum())
        return keep

    def length_mask(self, src_lens: np.ndarray, tgt_lens: np.ndarray) -> np.ndarray:
        """The keep-mask on piece counts (max_ratio) of the pairs `text_mask` kept."""
        src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
        if src_lens.shape != tgt_lens.shape:
            raise ValueError(f"{src_lens.shape} source lengths but {tgt_lens.shape} target "
                             "lengths")
        if self.filters.max_ratio is None:
            return np.ones(len(src_lens), dtype=bool)
        longer = np.maximum(src_lens, tgt_lens)
        shorter = np.maximum(1, np.minimum(src_lens, tgt_lens))
        keep = longer <= self.filters.max_ratio * shorter
        self.counts["max_ratio"] += int((~keep).sum())
        return keep

    def _on(self, reason: str) -> bool:
        value = getattr(self.filters, reason)
        return value is not None and value is not False

    def _removed(self, reason: str, src: list[str], tgt: list[str]) -> np.ndarray:
        """Which of these pairs (all still kept) the filter `reason` removes."""
        if reason == "empty":
            return np.fromiter(map(_empty, src, tgt), dtype=bool, count=len(src))
        if reason == "copies":
            return np.fromiter(map(_copy, src, tgt), dtype=bool, count=len(src))
        if reason == "max_repeat":
            limit = self.filters.max_repeat
            return np.fromiter((longest_repeat(s) > limit or longest_repeat(t) > limit
                                for s, t in zip(src, tgt, strict=True)),
                               dtype=bool, count=len(src))
        if reason == "sentences":
            return np.fromiter(map(_sentences_differ, src, tgt), dtype=bool, count=len(src))
        if reason == "langid":
            return self._wrong_language(src, tgt)
        return self._duplicates(src, tgt)

    def _duplicates(self, src: list[str], tgt: list[str]) -> np.ndarray:
        """Pairs seen before, in an earlier chunk or earlier in this one; the others are
        added to the seen pairs."""
        hashes = pair_hashes(src, tgt)
        unique, first = np.unique(hashes, return_index=True)
        new = ~self._hashes.contains(unique)
        self._hashes.add(unique[new])
        removed = np.ones(len(src), dtype=bool)
        removed[first[new]] = False
        return removed

    def _wrong_language(self, src: list[str], tgt: list[str]) -> np.ndarray:
        """`wrong_language` over the pairs, split among the worker processes."""
        args = (self.src_lang, self.tgt_lang, self.filters.langid)
        if self.workers == 1 or len(src) < 2:
            return wrong_language(src, tgt, *args)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_load_identifier)
        bounds = np.linspace(0, len(src), self.workers + 1).astype(int)
        parts = [self._pool.submit(wrong_language, src[a:b], tgt[a:b], *args)
                 for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        return np.concatenate([part.result() for part in parts])

    # ---- the worker processes -----------------------------------------------------------

    def close(self) -> None:
        """Stop the worker processes (if any were started)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> CorpusCleaner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- the report -----------------------------------------------------------------------------

TABLE_COLUMNS = ("read", *REASONS, "max_len", "kept")


def format_cleaning_table(rows: dict[str, dict[str, int]]) -> str:
    """A plain-text table of each corpus's counts: pairs read, removed by each filter and by
    the length limit (`max_len`), kept; numbers right-aligned with thousands separators."""
    header = ["corpus", *TABLE_COLUMNS]
    lines = [[name, *(f"{counts.get(column, 0):,}" for column in TABLE_COLUMNS)]
             for name, counts in rows.items()]
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]

    def row(cells: list[str]) -> str:
        numbers = zip(cells[1:], widths[1:], strict=True)
        return "  ".join([cells[0].ljust(widths[0]), *(c.rjust(w) for c, w in numbers)])

    return "\n".join(row(cells) for cells in [header, *lines]) + "\n"
