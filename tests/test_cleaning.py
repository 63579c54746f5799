"""Corpus cleaning (`transformer.data.cleaning`): on a corpus built from the Multi30k slice with
planted noise, each preset removes exactly the planted pairs it is meant to, counted under
the first filter that removes them, in one chunk or in chunks of 7; duplicates across chunks;
the length ratio's bounds; the config values and their one-line errors; language
identification in two processes as in one; and a missing py3langid."""

from __future__ import annotations

import sys
import unicodedata

import numpy as np
import pytest

from transformer.data import cleaning
from transformer.data.cleaning import (
    FILTER_PRESETS,
    REASONS,
    CorpusCleaner,
    Filters,
    format_cleaning_table,
)
from transformer.data.tokenizer import Tokenizer
from transformer.errors import ConfigError, MissingDependency

# Multi30k's training lines 101-104 (0-based 100-103) in French and Czech: the slice in
# tests/data holds English and German only. They describe the same images as the slice's
# English lines 100-103.
FRENCH = [
    "Un tout petit avec un chapeau rouge se tient à un garde-corps.",
    "Trois chiens se tiennent dans un champ herbeux alors qu'une personne est agenouillée à "
    "proximité.",
    "Un homme est debout face à un gratte-ciel",
    "Une femme promène son bébé dans une poussette dans le parc local.",
]
CZECH = [
    "Chlapec v batolecím věku v červeném klobouku držící se nějakých tyčí.",
    "Tři psi stojí v travnatém poli, zatímco osoba klečí nedaleko.",
    "Muž stojí před mrakodrapem.",
    "Žena se prochází se svým dítětem v kočárku v místním parku.",
]
BASE = range(40)  # the slice's first 40 training pairs: the clean part of the corpus


def repeated(line: str, times: int, *, mixed_case: bool = False) -> str:
    """The line with its second word written `times` times in a row."""
    words = line.split()
    run = [words[1].upper() if mixed_case and k % 2 else words[1] for k in range(times)]
    return " ".join([words[0], *run, *words[2:]])


def planted_pairs(en: list[str], de: list[str]) -> list[tuple[str, str, str | None, str | None]]:
    """(source, target, reason under strict, reason under basic): the noise, in the order it
    is planted (a repeat comes after what it repeats), and clean pairs that look like noise
    (reasons None)."""
    joined = [" ".join(de[i:i + 4]) for i in (50, 55)]  # four German sentences for one
    long = [", ".join(d.rstrip(" .") for d in de[i:i + 4]) for i in (60, 65)]  # one sentence
    return [
        (en[40], en[40], "copies", "copies"),  # English on the German side
        (en[41], "  " + en[41].upper().replace(" ", "   "), "copies", "copies"),
        (de[42], de[42], "copies", "copies"),  # German on both sides
        (en[43], "", "empty", "empty"),
        ("   ", de[44], "empty", "empty"),
        (en[45], de[45][:6] + "\x1b" + de[45][6:], "empty", "empty"),  # an escape
        (en[46] + "\x85", de[46], "empty", "empty"),  # C1 control NEL (str.strip removes it)
        (en[47], repeated(de[47], 4), "max_repeat", None),
        (repeated(en[48], 4, mixed_case=True), de[48], "max_repeat", None),
        (en[49], repeated(de[49], 3), None, None),  # three in a row: at the limit, kept
        (en[100], FRENCH[0], "langid", None),
        (en[101], FRENCH[1], "langid", None),
        (en[102], CZECH[2], "langid", None),
        (en[103], CZECH[3], "langid", None),
        (FRENCH[2], de[102], "langid", None),  # the source side in the wrong language
        (CZECH[0], de[100], "langid", None),
        (en[50], joined[0], "sentences", "max_ratio"),
        (en[55], joined[1], "sentences", "max_ratio"),
        (en[60], long[0], "max_ratio", "max_ratio"),
        (en[65], long[1], "max_ratio", "max_ratio"),
        (en[54], de[54].replace(" ", " \u200d", 1), None, None),  # a zero-width joiner (Cf)
        (en[59].replace(" ", "\t", 1), de[59], None, None),  # a tab
        (en[3], de[3] + " ", None, None),  # not an exact duplicate of pair 3
        (en[3], de[3], "duplicates", "duplicates"),
        (en[10], de[10], "duplicates", "duplicates"),
        (en[20], de[20], "duplicates", "duplicates"),
        (en[40], en[40], "copies", "copies"),  # a repeat of a removed pair: its reason
        (en[100], FRENCH[0], "langid", "duplicates"),  # ... kept by basic: a duplicate
        (en[50], joined[0], "sentences", "duplicates"),  # max_ratio comes after duplicates
    ]


@pytest.fixture(scope="module")
def corpus(multi30k_lines, multi30k_small_tokenizer_path):
    """The planted corpus: clean pairs with a planted pair after each of the first ones;
    its source, target, piece counts and the reason each pair is removed, per preset."""
    en, de = multi30k_lines("train.en.gz"), multi30k_lines("train.de.gz")
    planted = planted_pairs(en, de)
    rows = []
    for k, i in enumerate(BASE):
        rows.append((en[i], de[i], None, None))
        if k < len(planted):
            rows.append(planted[k])
    rows += planted[len(BASE):]
    src, tgt, strict, basic = (list(column) for column in zip(*rows, strict=True))
    tokenizer = Tokenizer.load(multi30k_small_tokenizer_path)
    lens = [np.array([len(ids) for ids in tokenizer.encode_batch(side)]) for side in (src, tgt)]
    return {"src": src, "tgt": tgt, "lens": lens,
            "reasons": {"strict": strict, "basic": basic, "none": [None] * len(src)}}


def clean(cleaner: CorpusCleaner, src: list[str], tgt: list[str],
          lens: list[np.ndarray] | None = None, chunk: int = 1000) -> np.ndarray:
    """The corpus through `cleaner` in chunks, as a store is built: text_mask, then
    length_mask on the pairs it kept; the keep-mask of the whole corpus."""
    keep = np.zeros(len(src), dtype=bool)
    for a in range(0, len(src), chunk):
        kept = a + np.flatnonzero(cleaner.text_mask(src[a:a + chunk], tgt[a:a + chunk]))
        if lens is not None:
            kept = kept[cleaner.length_mask(lens[0][kept], lens[1][kept])]
        keep[kept] = True
    return keep


# ---- what each preset removes -----------------------------------------------------------------

@pytest.mark.parametrize("chunk", [1000, 7])
@pytest.mark.parametrize("preset", FILTER_PRESETS)
def test_presets_remove_exactly_the_planted_pairs(corpus, preset, chunk):
    reasons = corpus["reasons"][preset]
    with CorpusCleaner(Filters.preset(preset), "en", "de", workers=1) as cleaner:
        keep = clean(cleaner, corpus["src"], corpus["tgt"], corpus["lens"], chunk)
    removed = [i for i, reason in enumerate(reasons) if reason is not None]
    assert np.flatnonzero(~keep).tolist() == removed
    assert cleaner.counts == {reason: reasons.count(reason) for reason in REASONS}
    assert cleaner.seen == len(corpus["src"])


def test_the_planted_categories_are_what_they_claim(corpus):
    """Each kind of noise is planted as intended: strict removes every kind at least twice,
    and the joined lines' piece ratio is above basic's threshold while every other pair's is
    at most strict's (so no pair is noise of two kinds by accident)."""
    strict = corpus["reasons"]["strict"]
    assert all(strict.count(reason) >= 2 for reason in REASONS)
    src_lens, tgt_lens = corpus["lens"]
    ratio = np.maximum(src_lens, tgt_lens) / np.maximum(1, np.minimum(src_lens, tgt_lens))
    joined = np.array([reason == "max_ratio" for reason in strict])
    assert ratio[joined].min() > Filters.preset("basic").max_ratio
    pairs = list(zip(corpus["src"], corpus["tgt"], strict=True))
    joined_text = {pair for pair, one in zip(pairs, joined, strict=True) if one}
    others = [pair not in joined_text and reason not in ("empty", "sentences")
              for pair, reason in zip(pairs, strict, strict=True)]
    assert ratio[others].max() <= Filters.preset("strict").max_ratio


def test_each_filter_alone_and_the_order_of_the_counts(corpus):
    """Language identification alone also removes the copies (English on the German side);
    with copies on as well, those count as copies, the filter that comes first."""
    src, tgt = corpus["src"], corpus["tgt"]
    strict = corpus["reasons"]["strict"]
    at = lambda *reasons: [i for i, r in enumerate(strict) if r in reasons]
    with CorpusCleaner(Filters(langid=0.5), "en", "de", workers=1) as cleaner:
        keep = clean(cleaner, src, tgt)
    assert np.flatnonzero(~keep).tolist() == at("copies", "langid")
    with CorpusCleaner(Filters(copies=True, langid=0.5), "en", "de", workers=1) as cleaner:
        keep = clean(cleaner, src, tgt)
    assert np.flatnonzero(~keep).tolist() == at("copies", "langid")
    assert (cleaner.counts["copies"], cleaner.counts["langid"]) == (4, 7)


def test_language_identification_runs_only_on_pairs_still_kept(corpus, monkeypatch):
    classified = []

    def recording(src, tgt, *args):
        classified.extend(zip(src, tgt, strict=True))
        return np.zeros(len(src), dtype=bool)

    monkeypatch.setattr(cleaning, "wrong_language", recording)
    with CorpusCleaner(Filters.preset("strict"), "en", "de", workers=1) as cleaner:
        cleaner.text_mask(corpus["src"], corpus["tgt"])
    before = [(s, t) for s, t, r in zip(corpus["src"], corpus["tgt"], corpus["reasons"]["strict"],
                                         strict=True)
              if r not in ("empty", "copies", "max_repeat", "sentences")]
    assert classified == before


def test_duplicates_across_chunks_keep_the_first_occurrence(multi30k_lines):
    """The slice's pairs, then every third of them again (and pair 5 a third time), in
    chunks of 7: exactly the later occurrences go, as a set of seen pairs would say."""
    en, de = multi30k_lines("train.en.gz"), multi30k_lines("train.de.gz")
    order = list(range(len(en))) + list(range(0, len(en), 3)) + [5]
    src, tgt = [en[i] for i in order], [de[i] for i in order]
    seen, expected = set(), []
    for pair in zip(src, tgt, strict=True):
        expected.append(pair not in seen)
        seen.add(pair)
    with CorpusCleaner(Filters(duplicates=True), "en", "de") as cleaner:
        keep = clean(cleaner, src, tgt, chunk=7)
    assert keep.tolist() == expected
    assert cleaner.counts["duplicates"] == len(src) - len(seen) >= 1001
    with CorpusCleaner(Filters(duplicates=True), "en", "de") as whole:
        assert clean(whole, src, tgt, chunk=len(src)).tolist() == expected


def test_length_ratio_on_piece_counts():
    cleaner = CorpusCleaner(Filters(max_ratio=2.0), "en", "de")
    src = np.array([10, 10, 20, 21, 0, 0, 1, 2, 3])
    tgt = np.array([20, 21, 10, 10, 0, 2, 3, 0, 1])
    assert cleaner.length_mask(src, tgt).tolist() == [
        True, False, True, False, True, True, False, True, False]
    assert cleaner.length_mask(np.array([5]), np.array([11])).tolist() == [False]
    assert cleaner.counts == {**dict.fromkeys(REASONS, 0), "max_ratio": 5}
    assert cleaner.seen == 0
    off = CorpusCleaner(Filters(empty=True), "en", "de")
    assert off.length_mask(src, tgt).all() and off.counts["max_ratio"] == 0


def test_control_characters_are_unicode_category_cc_except_tab():
    every = "".join(map(chr, range(sys.maxunicode + 1)))
    expected = [c for c in every if unicodedata.category(c) == "Cc" and c != "\t"]
    assert cleaning.CONTROL.findall(every) == expected


# ---- language identification in worker processes ----------------------------------------------

def test_language_identification_in_two_processes_as_in_one(corpus, multi30k_lines):
    src = corpus["src"] + multi30k_lines("train.en.gz")[200:500]
    tgt = corpus["tgt"] + multi30k_lines("train.de.gz")[200:500]
    masks, counts = [], []
    for workers in (1, 2):
        with CorpusCleaner(Filters.preset("strict"), "en", "de", workers=workers) as cleaner:
            masks.append(clean(cleaner, src, tgt, chunk=150))
            counts.append(cleaner.counts)
            assert (cleaner._pool is not None) == (workers == 2)
        assert cleaner._pool is None
    assert masks[0].tolist() == masks[1].tolist()
    assert counts[0] == counts[1] and counts[0]["langid"] >= 6


def test_a_missing_py3langid_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "py3langid", None)
    monkeypatch.setattr(cleaning, "_IDENTIFIER", None)
    with pytest.raises(MissingDependency) as error:
        CorpusCleaner(Filters(langid=0.5), "en", "de")
    message = str(error.value)
    assert "\n" not in message and "transformer[clean]" in message and "py3langid" in message
    assert "filters.langid" in message
    with CorpusCleaner(Filters.preset("basic"), "en", "de") as cleaner:  # needs no py3langid
        assert cleaner.text_mask(["A dog."], ["Ein Hund."]).tolist() == [True]


def test_a_language_py3langid_does_not_know_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^corpus web: py3langid does not know language 'xx'"):
        CorpusCleaner(Filters(langid=0.5), "en", "xx", name="web")
    CorpusCleaner(Filters(copies=True), "en", "xx").close()  # no language check without it


# ---- Filters ----------------------------------------------------------------------------------

def test_presets():
    assert Filters.preset("none") == Filters() and Filters().is_none()
    basic = Filters(empty=True, copies=True, duplicates=True, max_ratio=3.0)
    assert Filters.preset("basic") == basic
    strict = Filters.preset("strict")
    assert strict.to_dict() == {"empty": True, "copies": True, "max_repeat": 3,
                                "sentences": True, "langid": 0.5, "duplicates": True,
                                "max_ratio": 2.5}
    assert list(strict.to_dict()) == list(REASONS)
    assert not strict.is_none() and strict.needs_text() and basic.needs_text()
    assert not Filters(max_ratio=2.0).needs_text() and not Filters(max_ratio=2.0).is_none()
    assert Filters(max_repeat=1).needs_text() and Filters(langid=1).langid == 1.0


def test_parse_presets_and_mappings():
    key = "data.corpora[web].filters"
    for name in FILTER_PRESETS:
        assert Filters.parse(name, key) == Filters.preset(name)
    assert Filters.parse({"preset": "basic", "langid": 0.6}, key) == Filters(
        empty=True, copies=True, duplicates=True, max_ratio=3.0, langid=0.6)
    assert Filters.parse({"copies": True}, key) == Filters(copies=True)
    assert Filters.parse({}, key) == Filters()
    assert Filters.parse({"preset": "strict", "langid": None, "max_repeat": None,
                          "empty": False, "max_ratio": 2}, key) == Filters(
        copies=True, duplicates=True, sentences=True, max_ratio=2.0)


@pytest.mark.parametrize(("value", "names"), [
    ("clean", ["'clean'", "none, basic, strict"]),
    ({"preset": "loose"}, [".preset", "'loose'", "none, basic, strict"]),
    ({"preset": None}, [".preset", "None"]),
    ({"copy": True}, ["'copy'", ", ".join(REASONS)]),
    ({"empty": 1}, [".empty", "true or false"]),
    ({"copies": "yes"}, [".copies", "true or false"]),
    ({"duplicates": None}, [".duplicates", "true or false"]),
    ({"max_repeat": 0}, [".max_repeat", ">= 1"]),
    ({"max_repeat": 2.5}, [".max_repeat", "integer"]),
    ({"max_repeat": True}, [".max_repeat", "True"]),
    ({"langid": 0}, [".langid", "(0, 1]"]),
    ({"langid": 1.5}, [".langid", "(0, 1]"]),
    ({"langid": True}, [".langid", "True"]),
    ({"langid": "0.5"}, [".langid", "'0.5'"]),
    ({"max_ratio": 0.5}, [".max_ratio", ">= 1"]),
    ({"max_ratio": float("inf")}, [".max_ratio", "inf"]),
    ({"max_ratio": float("nan")}, [".max_ratio", "nan"]),
    ({"max_ratio": False}, [".max_ratio", "False"]),
    (["basic"], ["preset name", "mapping"]),
    (None, ["preset name", "None"]),
])
def test_parse_errors_are_one_line_naming_the_key_and_filter(value, names):
    key = "data.corpora[web].filters"
    with pytest.raises(ConfigError) as error:
        Filters.parse(value, key)
    message = str(error.value)
    assert "\n" not in message and message.startswith(key)
    for name in names:
        assert name in message, message


# ---- the report -------------------------------------------------------------------------------

def test_cleaning_table():
    rows = {"multi30k": {"read": 29_000, "duplicates": 3, "max_len": 12, "kept": 28_985},
            "web-crawl": {"read": 1_234_567, "empty": 1, "copies": 20, "max_repeat": 3,
                          "langid": 12_345, "duplicates": 200_000, "max_ratio": 4_000,
                          "max_len": 0, "kept": 1_018_198}}
    assert format_cleaning_table(rows) == (
        "corpus          read  empty  copies  max_repeat  sentences  langid  duplicates  "
        "max_ratio  max_len       kept\n"
        "multi30k      29,000      0       0           0          0       0           3  "
        "        0       12     28,985\n"
        "web-crawl  1,234,567      1      20           3          0  12,345     200,000  "
        "    4,000        0  1,018,198\n")
