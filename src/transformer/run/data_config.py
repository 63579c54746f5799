"""The `data` group of the training configuration: `DataConfig`, with its entries
`CorpusConfig` (`data.corpora`) and `EvalSetConfig` (`data.valid_sets`, `data.test_sets`),
and the one reading of them: which corpora an epoch trains on (`training_corpora`), which
sets validation and testing read (`evaluation_sets`), and the tags in front of the sources
(`source_tags`, `reserved_tags`, `lang_tag`). Each field is documented by its attribute
docstring (`config_docs`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..data import multi30k
from ..data.cleaning import Filters
from ..data.tokenizer import SPM_MODEL_TYPES, TAG
from ..errors import ConfigError
from .values import check, is_finite, is_int

__all__ = ["CorpusConfig", "EvalSetConfig", "DataConfig", "lang_tag", "SPLITS"]

SPLITS = ("train", "valid", "test")
NAME = re.compile(r"[\w.-]+")  # corpus and evaluation set names (in logs, TensorBoard, files)
SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")


def lang_tag(lang: str) -> str:
    """The target-language tag a multilingual model reads in front of its source: <2de>."""
    return f"<2{lang}>"


def _positive_int_or_none(value: Any) -> bool:
    return value is None or (is_int(value) and value > 0)


def _check_lang(value: Any, key: str) -> None:
    check(value is None or (isinstance(value, str) and NAME.fullmatch(value) is not None),
           f"{key} must be a language name such as de (letters, digits, '_', '-', '.'), "
           f"got {value!r}")


@dataclass
class CorpusConfig:
    """One training corpus of `data.corpora`: its files, its share of every epoch, its tag
    and its cleaning. Languages left null are the data group's (`data.src_lang`/`tgt_lang`)."""

    name: str = ""
    """Required: names the corpus in logs, reports and errors."""
    src: str | None = None
    """Required: the source file, one sentence per line, plain or .gz."""
    tgt: str | None = None
    """Required: the target file, line-aligned with src."""
    weight: float = 1.0
    """Sampling weight: the corpus's share of an epoch is `weight * size^(1/T)` (T:
    data.mix_temperature), normalized over the corpora."""
    tag: str | None = None
    """A reserved piece, e.g. `<bt>`, put in front of every source of the corpus; null:
    none."""
    filters: Any = "basic"
    """The cleaning: none, basic or strict, or a mapping of single filters."""
    max_pairs: int | None = None
    """Use only the first N pairs (after cleaning); null: all."""
    src_lang: str | None = None
    """The source language; null: data.src_lang."""
    tgt_lang: str | None = None
    """The target language (corpora into several make a multilingual model); null:
    data.tgt_lang."""

    def __post_init__(self) -> None:
        self.validate()

    @property
    def key(self) -> str:
        """How errors name this entry: data.corpora[<name>]."""
        return f"data.corpora[{self.name}]"

    def validate(self) -> None:
        """One line naming the corpus and the key for the first bad value."""
        _check_entry(self, "data.corpora")
        check(is_finite(self.weight) and self.weight > 0,
               f"{self.key}.weight must be a positive number, got {self.weight!r}")
        check(self.tag is None or (isinstance(self.tag, str) and TAG.fullmatch(self.tag)
                                    is not None and self.tag not in SPECIAL_PIECES),
               f"{self.key}.tag must look like <name> (no spaces, not one of "
               f"{', '.join(SPECIAL_PIECES)}), got {self.tag!r}")
        check(_positive_int_or_none(self.max_pairs),
               f"{self.key}.max_pairs must be a positive integer or null, got {self.max_pairs!r}")
        self.cleaning()

    def cleaning(self) -> Filters:
        """The filters this corpus's store is cleaned with."""
        return Filters.parse(self.filters, f"{self.key}.filters")


@dataclass
class EvalSetConfig:
    """A named validation or test set of `data.valid_sets` / `data.test_sets` (never
    cleaned). Languages left null are the data group's."""

    name: str = ""
    """Required: names the set in logs, TensorBoard and errors."""
    src: str | None = None
    """Required: the source file, one sentence per line, plain or .gz."""
    tgt: str | None = None
    """Required: the reference file, line-aligned with src."""
    src_lang: str | None = None
    """The source language; null: data.src_lang."""
    tgt_lang: str | None = None
    """The language the set is translated into; null: data.tgt_lang."""

    def validate(self, group: str) -> None:
        """One line naming the set and the key (`DataConfig` calls it with its group)."""
        _check_entry(self, group)


def _check_entry(entry: CorpusConfig | EvalSetConfig, group: str) -> None:
    """What corpora and evaluation sets share: a name, two file paths, two languages."""
    check(isinstance(entry.name, str) and NAME.fullmatch(entry.name) is not None,
           f"{group}: every entry needs a name (letters, digits, '_', '-', '.'), "
           f"got {entry.name!r}")
    for key in ("src", "tgt"):
        value = getattr(entry, key)
        check(isinstance(value, str) and value != "",
               f"{group}[{entry.name}].{key} must be a file path, got {value!r}")
    for key in ("src_lang", "tgt_lang"):
        _check_lang(getattr(entry, key), f"{group}[{entry.name}].{key}")


def _entries(cls: type, values: Any, key: str) -> list[Any]:
    """A list of `cls` entries from dataclasses or plain mappings (a stored config)."""
    check(isinstance(values, (list, tuple)), f"{key} must be a list, got {values!r}")
    out = []
    for value in values:
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)})
            check(not unknown, f"{key}: {unknown[0] if unknown else ''} is not a key of an "
                                f"entry (the keys: "
                                f"{', '.join(f.name for f in dataclasses.fields(cls))})")
            value = cls(**value)
        check(isinstance(value, cls), f"{key} entries must be mappings, got {value!r}")
        out.append(value)
    return out


@dataclass
class DataConfig:
    """The `data` config group (configs/data/*.yaml have exactly these keys).

    `max_len` is the longest training sequence the model sees, counting the added EOS
    (source) or BOS (target): pairs with more than `max_len - 1` pieces on either side are
    dropped from training. `max_tokens` bounds each batch per side, padding included.
    """

    name: str = "multi30k"
    """The dataset: multi30k (the named dataset, in data.root) or files (the `train_*`,
    `valid_*` and `test_*` paths)."""
    root: str = multi30k.DEFAULT_ROOT
    """The Multi30k folder; missing files are downloaded into it."""
    src_lang: str = "en"
    """The source language (Multi30k: en, de, fr or cs)."""
    tgt_lang: str = "de"
    """The target language (Multi30k: en, de, fr or cs)."""
    train_src: str | None = None
    """data=files: the training source file, one sentence per line, plain or .gz (not with
    data.corpora)."""
    train_tgt: str | None = None
    """data=files: the training target file, line-aligned with train_src."""
    valid_src: str | None = None
    """data=files: the validation source file (not with data.valid_sets)."""
    valid_tgt: str | None = None
    """data=files: the validation reference file, line-aligned with valid_src."""
    test_src: str | None = None
    """data=files: the test source file, optional, set with test_tgt (not with
    data.test_sets)."""
    test_tgt: str | None = None
    """data=files: the test reference file, line-aligned with test_src."""
    base_url: str = multi30k.URL
    """The Multi30k download prefix: `<base_url><stem>.<lang>.gz`."""
    tokenized: bool = False
    """Multi30k's lowercased, Moses-tokenized files (`ROOT/tok/*.lc.norm.tok.LANG`), as
    published results trained and scored on."""
    vocab_size: int | None = None
    """SentencePiece pieces; null: chosen by the corpus's size
    (`run/tokenizers.vocab_size_for`)."""
    spm_model_type: str = "unigram"
    """The SentencePiece model type: unigram or bpe."""
    joint_vocab: bool = True
    """One SentencePiece model for both sides (false: one per side)."""
    spm_model: str | None = None
    """An existing SentencePiece .model to use instead of training one (needs
    joint_vocab)."""
    max_len: int = 256
    """The longest training sequence, counting the added EOS (source) or BOS (target): pairs
    with more than max_len - 1 pieces on either side are dropped from training."""
    max_tokens: int | None = None
    """Tokens per batch and side, padding included; null: chosen by the budget."""
    seed: int = 1
    """Shuffles the batches and seeds SentencePiece's training sample."""
    max_train_pairs: int | None = None
    """Use only the first N training pairs (smoke runs); null: all."""
    spm_max_sentences: int = 500_000
    """SentencePiece trains on a seeded sample of at most N pairs."""
    cache_dir: str | None = None
    """Where the encoded stores go; null: `<run dir>/cache`."""
    corpora: list[CorpusConfig] = field(default_factory=list)
    """Several training corpora (each entry's keys: `data.corpora[].*`), mixed by weight,
    replacing the train split of multi30k / files; see `CorpusConfig` and
    `training_corpora`."""
    filters: Any = "none"
    """The cleaning of the one-corpus forms' train split: none, basic or strict, or a mapping
    of single filters."""
    mix_temperature: float | None = None
    """T: the corpora's shares are ~ `weight * size^(1/T)`; null: the weights only."""
    valid_sets: list[EvalSetConfig] = field(default_factory=list)
    """Named validation sets (each entry's keys: `data.valid_sets[].*`), replacing
    `valid_*`; their mean BLEU selects the best checkpoint."""
    test_sets: list[EvalSetConfig] = field(default_factory=list)
    """Named test sets (each entry's keys: `data.test_sets[].*`), replacing `test_*`."""

    def __post_init__(self) -> None:
        self.corpora = _entries(CorpusConfig, self.corpora, "data.corpora")
        self.valid_sets = _entries(EvalSetConfig, self.valid_sets, "data.valid_sets")
        self.test_sets = _entries(EvalSetConfig, self.test_sets, "data.test_sets")
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the first bad key."""
        self._validate_files()
        self._validate_corpora()

    def _validate_corpora(self) -> None:
        Filters.parse(self.filters, "data.filters")
        check(self.mix_temperature is None
               or (is_finite(self.mix_temperature) and self.mix_temperature > 0),
               f"data.mix_temperature must be a positive number or null, "
               f"got {self.mix_temperature!r}")
        for group, entries in (("data.corpora", self.corpora),
                               ("data.valid_sets", self.valid_sets),
                               ("data.test_sets", self.test_sets)):
            names = [entry.name for entry in entries]
            for entry in entries:
                check(names.count(entry.name) == 1, f"{group}[{entry.name}]: the name "
                                                     "is used twice")
                if group != "data.corpora":
                    entry.validate(group)
        lang_tags = {lang_tag(lang) for lang in self.target_languages()}
        for corpus in self.corpora:
            check(corpus.tag is None or corpus.tag not in lang_tags,
                   f"{corpus.key}.tag {corpus.tag!r} is also a target-language tag")

    # -- what the run trains and validates on --

    def training_corpora(self) -> list[CorpusConfig]:
        """The corpora of an epoch, languages filled in: `data.corpora`, or the one corpus
        of the train split (named "train", cleaned by `data.filters`)."""
        if self.corpora:
            return [dataclasses.replace(c, src_lang=c.src_lang or self.src_lang,
                                        tgt_lang=c.tgt_lang or self.tgt_lang)
                    for c in self.corpora]
        src, tgt = self._split_paths("train")
        return [CorpusConfig(name="train", src=src, tgt=tgt, filters=self.filters,
                             max_pairs=self.max_train_pairs, src_lang=self.src_lang,
                             tgt_lang=self.tgt_lang)]

    def evaluation_sets(self, split: str) -> list[EvalSetConfig]:
        """The named sets of "valid" or "test", languages filled in: `data.valid_sets` /
        `data.test_sets`, or the one split named like it (none for an unset test split)."""
        named = self.valid_sets if split == "valid" else self.test_sets
        if named:
            return [dataclasses.replace(e, src_lang=e.src_lang or self.src_lang,
                                        tgt_lang=e.tgt_lang or self.tgt_lang) for e in named]
        src, tgt = self._split_paths(split)
        if src is None:
            return []
        return [EvalSetConfig(name=split, src=src, tgt=tgt, src_lang=self.src_lang,
                              tgt_lang=self.tgt_lang)]

    def _split_paths(self, split: str) -> tuple[str | None, str | None]:
        if self.name == "multi30k":
            return (str(multi30k.split_file(self.root, split, self.src_lang, self.tokenized)),
                    str(multi30k.split_file(self.root, split, self.tgt_lang, self.tokenized)))
        return getattr(self, f"{split}_src"), getattr(self, f"{split}_tgt")

    def target_languages(self) -> list[str]:
        """The languages the model translates into, sorted."""
        return sorted({c.tgt_lang or self.tgt_lang for c in self.corpora} or {self.tgt_lang})

    @property
    def lang_tags(self) -> bool:
        """Whether sources carry a target-language tag: with more than one target language."""
        return len(self.target_languages()) > 1

    def source_tags(self, tag: str | None, tgt_lang: str) -> list[str]:
        """The tags in front of a source: the target language's (multilingual models),
        then the corpus's."""
        return ([lang_tag(tgt_lang)] if self.lang_tags else []) + ([tag] if tag else [])

    def reserved_tags(self) -> list[str]:
        """Every tag the tokenizer reserves a piece for, sorted."""
        tags = {c.tag for c in self.corpora if c.tag}
        if self.lang_tags:
            tags |= {lang_tag(lang) for lang in self.target_languages()}
        return sorted(tags)

    def languages(self) -> list[str]:
        """Every language of the corpora and evaluation sets (Multi30k downloads them)."""
        langs = {self.src_lang, self.tgt_lang}
        for entry in [*self.corpora, *self.valid_sets, *self.test_sets]:
            langs |= {entry.src_lang or self.src_lang, entry.tgt_lang or self.tgt_lang}
        return sorted(langs)

    def _validate_files(self) -> None:
        for key in ("vocab_size", "max_len", "max_tokens", "spm_max_sentences"):
            value = getattr(self, key)
            if value is None and key in ("vocab_size", "max_tokens"):
                continue  # chosen by the corpus and the budget when training starts
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"data.{key} must be a positive integer, got {value!r}")
        if self.max_train_pairs is not None and (
            isinstance(self.max_train_pairs, bool) or not isinstance(self.max_train_pairs, int)
            or self.max_train_pairs <= 0
        ):
            raise ConfigError(
                f"data.max_train_pairs must be a positive integer or null, "
                f"got {self.max_train_pairs!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"data.seed must be an integer, got {self.seed!r}")
        if self.max_tokens is not None and self.max_tokens < self.max_len:
            raise ConfigError(
                f"data.max_tokens ({self.max_tokens}) must be >= data.max_len "
                f"({self.max_len}) so that every training pair fits in a batch"
            )
        if self.spm_model_type not in SPM_MODEL_TYPES:
            raise ConfigError(
                f"data.spm_model_type must be one of {SPM_MODEL_TYPES}, got {self.spm_model_type!r}"
            )
        if not isinstance(self.joint_vocab, bool):
            raise ConfigError(f"data.joint_vocab must be true or false, got {self.joint_vocab!r}")
        if not isinstance(self.tokenized, bool):
            raise ConfigError(f"data.tokenized must be true or false, got {self.tokenized!r}")
        if self.tokenized and self.name != "multi30k":
            raise ConfigError(f"data.tokenized=true is for data.name=multi30k (its tok/ "
                              f"files), got data.name={self.name!r}")
        if self.spm_model is not None and not self.joint_vocab:
            raise ConfigError("data.spm_model needs a joint vocabulary (data.joint_vocab=true)")
        file_keys = [f"{s}_{side}" for s in SPLITS for side in ("src", "tgt")]
        if self.name == "multi30k":
            for key in ("src_lang", "tgt_lang"):
                if getattr(self, key) not in multi30k.LANGS:
                    raise ConfigError(
                        f"data.{key} must be one of {multi30k.LANGS} for Multi30k, "
                        f"got {getattr(self, key)!r}"
                    )
            if self.src_lang == self.tgt_lang:
                raise ConfigError(f"data.src_lang and data.tgt_lang are both {self.src_lang!r}")
            for key in file_keys:
                if getattr(self, key) is not None:
                    raise ConfigError(f"data.{key} is only used with data.name=files")
        elif self.name == "files":
            needed = (file_keys[:2] if not self.corpora else []) + (
                file_keys[2:4] if not self.valid_sets else [])
            for key in needed:
                if not getattr(self, key):
                    raise ConfigError(f"data.{key} must be set when data.name=files")
            if (self.test_src is None) != (self.test_tgt is None):
                raise ConfigError("data.test_src and data.test_tgt must be set together")
        else:
            raise ConfigError(f"data.name must be 'multi30k' or 'files', got {self.name!r}")


