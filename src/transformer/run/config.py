"""Typed configuration: every schema behind the package's `configs/*.yaml`, in one module,
and the decoding settings every translator starts from.

Hydra composes `configs/config.yaml` (package data, `CONFIG_DIR`; `--config-dir DIR` adds a
user's own directory, searched after it, so its presets take new names) with one option per
group (`model/`, `data/`, `optim/`, `trainer/`, `experiment/`) onto `TrainConfig`,
registered in Hydra's ConfigStore as `train_schema`. So a misspelled key or a value of the
wrong type fails while composing, with the key named (and for a misspelled key the closest
real one: `unknown_key_error`), and `load_config` turns the result into dataclasses whose
`validate()` checks value ranges (`ConfigError: optim.lr must be > 0 or null, got -1.0`)
before anything is trained. A checkpoint stores its run's config as plain values
(`TrainConfig.to_dict`), read back once at load by `TrainConfig.from_dict`.

Each field is documented by its attribute docstring, the string on the line after it: the
one text of what the key means, which `config_docs` reads for `transformer train --help`
and the configuration reference of docs/USAGE.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data import multi30k
from ..data.cleaning import Filters
from ..data.tokenizer import SPM_MODEL_TYPES, TAG, SpecialIds
from ..errors import ConfigError
from ..model.transformer import Hyperparameters, ModelConfig

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["ModelSettings", "CorpusConfig", "EvalSetConfig", "DataConfig", "lang_tag",
           "OptimConfig", "TrainerConfig", "TrainConfig", "DecodingSettings", "load_config",
           "compose_config", "register_configs", "SchemaKey", "schema_keys",
           "unknown_key_error", "override_error", "CONFIG_DIR"]

# The package data: config.yaml and the groups' presets.
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("inverse_sqrt", "constant")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
SPLITS = ("train", "valid", "test")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _known_fields(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `values` that are fields of the dataclass `cls` (a stored config may
    come from another version of the package, with keys this one does not know)."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"expected the fields of {cls.__name__} as a mapping, got {values!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in values.items() if k in names}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    """A real number, not NaN or infinite (Hydra parses `inf` and `nan` as floats)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class ModelSettings(Hyperparameters):
    """The `model` group: a preset's name and the architecture (`model.Hyperparameters`,
    the one place where each architectural hyperparameter and its default are defined).
    Vocabulary sizes come from the tokenizer and `share_embeddings` from `data.joint_vocab`
    at run time (see `to_model_config`)."""

    name: str = "base"
    """The preset's name (configs/model/NAME.yaml), as the training log reports it."""
    dropout: float | None = None
    """Dropout on the embeddings (with their positions) and on each sublayer's output before
    its residual connection; null: chosen by the budget (`schedule.DROPOUT_ROWS`)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """ModelConfig's own checks (they name `model.<field>`); a null dropout is checked
        when the budget fills it in."""
        settings = self if self.dropout is not None else dataclasses.replace(self, dropout=0.0)
        settings.to_model_config(src_vocab_size=8, tgt_vocab_size=8, share_embeddings=True)

    def to_model_config(self, src_vocab_size: int, tgt_vocab_size: int,
                        share_embeddings: bool,
                        special_ids: SpecialIds = SpecialIds()) -> ModelConfig:
        """The model's config: this architecture, and what the tokenizers decide."""
        return ModelConfig(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
                           share_embeddings=share_embeddings, pad_id=special_ids.pad,
                           start_id=special_ids.start, eos_id=special_ids.eos,
                           **_architecture(self))

    @classmethod
    def of(cls, config: ModelConfig, name: str) -> ModelSettings:
        """The `model` group that describes `config`'s architecture."""
        return cls(name=name, **_architecture(config))


def _architecture(config: Hyperparameters) -> dict[str, Any]:
    """The `Hyperparameters` fields of a model config or setting."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(Hyperparameters)}


NAME = re.compile(r"[\w.-]+")  # corpus and evaluation set names (in logs, TensorBoard, files)
SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")


def lang_tag(lang: str) -> str:
    """The target-language tag a multilingual model reads in front of its source: <2de>."""
    return f"<2{lang}>"


def _positive_int_or_none(value: Any) -> bool:
    return value is None or (_is_int(value) and value > 0)


def _check_lang(value: Any, key: str) -> None:
    _check(value is None or (isinstance(value, str) and NAME.fullmatch(value) is not None),
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
        _check(_is_finite(self.weight) and self.weight > 0,
               f"{self.key}.weight must be a positive number, got {self.weight!r}")
        _check(self.tag is None or (isinstance(self.tag, str) and TAG.fullmatch(self.tag)
                                    is not None and self.tag not in SPECIAL_PIECES),
               f"{self.key}.tag must look like <name> (no spaces, not one of "
               f"{', '.join(SPECIAL_PIECES)}), got {self.tag!r}")
        _check(_positive_int_or_none(self.max_pairs),
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
    _check(isinstance(entry.name, str) and NAME.fullmatch(entry.name) is not None,
           f"{group}: every entry needs a name (letters, digits, '_', '-', '.'), "
           f"got {entry.name!r}")
    for key in ("src", "tgt"):
        value = getattr(entry, key)
        _check(isinstance(value, str) and value != "",
               f"{group}[{entry.name}].{key} must be a file path, got {value!r}")
    for key in ("src_lang", "tgt_lang"):
        _check_lang(getattr(entry, key), f"{group}[{entry.name}].{key}")


def _entries(cls: type, values: Any, key: str) -> list[Any]:
    """A list of `cls` entries from dataclasses or plain mappings (a stored config)."""
    _check(isinstance(values, (list, tuple)), f"{key} must be a list, got {values!r}")
    out = []
    for value in values:
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)})
            _check(not unknown, f"{key}: {unknown[0] if unknown else ''} is not a key of an "
                                f"entry (the keys: "
                                f"{', '.join(f.name for f in dataclasses.fields(cls))})")
            value = cls(**value)
        _check(isinstance(value, cls), f"{key} entries must be mappings, got {value!r}")
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
    (`run_tokenizers.vocab_size_for`)."""
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
        _check(self.mix_temperature is None
               or (_is_finite(self.mix_temperature) and self.mix_temperature > 0),
               f"data.mix_temperature must be a positive number or null, "
               f"got {self.mix_temperature!r}")
        for group, entries in (("data.corpora", self.corpora),
                               ("data.valid_sets", self.valid_sets),
                               ("data.test_sets", self.test_sets)):
            names = [entry.name for entry in entries]
            for entry in entries:
                _check(names.count(entry.name) == 1, f"{group}[{entry.name}]: the name "
                                                     "is used twice")
                if group != "data.corpora":
                    entry.validate(group)
        lang_tags = {lang_tag(lang) for lang in self.target_languages()}
        for corpus in self.corpora:
            _check(corpus.tag is None or corpus.tag not in lang_tags,
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


@dataclass
class OptimConfig:
    """The `optim` group: optimizer, learning-rate schedule, loss and gradient handling."""

    name: str = "adam"
    """The optimizer: adam or adamw (decoupled weight decay)."""
    lr: float | None = None
    """The peak learning rate, reached at the end of warmup; null: chosen by the budget, with
    the warmup's share (`schedule.BATCH_ROWS`)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    """Adam's decay rates of its averages of the gradient and of its square: two values in
    [0, 1)."""
    eps: float = 1e-8
    """Adam's epsilon, added to the denominator of each step."""
    weight_decay: float = 0.0
    """Weight decay of the linear layers' weight matrices only
    (`optimizer.decayed_parameters`); 0: none."""
    schedule: str = "inverse_sqrt"
    """The learning rate after the linear warmup: inverse_sqrt or constant."""
    warmup_updates: int = 2000
    """Updates of linear warmup from 0 to the peak learning rate."""
    warmup_fraction: float | None = None
    """The warmup takes at most this share of the updates the budget allows (planned); null:
    no such bound."""
    cooldown: float = 0.2
    """The last share of the budget (updates, tokens or time), over which the learning rate
    decays linearly to 0 when the budget runs out; 0: none (`schedule.py`), refused with a
    time limit (it would stop the run at the learning rate of that moment)."""
    cooldown_updates: int = 0
    """The last N of trainer.max_updates decay linearly to ~0, instead of cooldown; 0:
    none."""
    label_smoothing: float = 0.1
    """Label smoothing of the cross-entropy loss, in [0, 1)."""
    clip_norm: float = 0.0
    """The largest gradient norm; 0: no clipping (the norm is still logged)."""
    update_freq: int = 1
    """Batches accumulated per update."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        _check(self.name in OPTIMIZERS, f"optim.name must be one of {OPTIMIZERS}, "
                                        f"got {self.name!r}")
        _check(self.lr is None or (_is_finite(self.lr) and self.lr > 0),
               f"optim.lr must be > 0 or null, got {self.lr}")
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
               f"optim.betas must be two values in [0, 1), got {list(self.betas)}")
        _check(_is_finite(self.eps) and self.eps > 0, f"optim.eps must be > 0, got {self.eps}")
        _check(_is_finite(self.weight_decay) and self.weight_decay >= 0,
               f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        _check(self.schedule in SCHEDULES, f"optim.schedule must be one of {SCHEDULES}, "
                                           f"got {self.schedule!r}")
        _check(_is_int(self.warmup_updates) and self.warmup_updates >= 0,
               f"optim.warmup_updates must be >= 0, got {self.warmup_updates}")
        _check(_is_int(self.cooldown_updates) and self.cooldown_updates >= 0,
               f"optim.cooldown_updates must be >= 0, got {self.cooldown_updates}")
        _check(self.warmup_fraction is None or (_is_finite(self.warmup_fraction)
                                                and 0 < self.warmup_fraction <= 1),
               f"optim.warmup_fraction must be in (0, 1] or null, got {self.warmup_fraction}")
        _check(_is_finite(self.cooldown) and 0 <= self.cooldown <= 1,
               f"optim.cooldown must be a share of the budget in [0, 1], got {self.cooldown}")
        _check(not (self.cooldown and self.cooldown_updates),
               f"optim.cooldown={self.cooldown} and optim.cooldown_updates="
               f"{self.cooldown_updates}: set one of them (the other to 0)")
        _check(0 <= self.label_smoothing < 1,
               f"optim.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        _check(_is_finite(self.clip_norm) and self.clip_norm >= 0,
               f"optim.clip_norm must be >= 0, got {self.clip_norm}")
        _check(_is_int(self.update_freq) and self.update_freq >= 1,
               f"optim.update_freq must be >= 1, got {self.update_freq}")


@dataclass
class TrainerConfig:
    """The `trainer` group: device, precision, limits, validation, checkpoints, logging."""

    device: str = "auto"
    """Where to train: auto (CUDA if present, else CPU), cpu, cuda or cuda:N."""
    precision: str = "auto"
    """auto (bf16 on CUDA and on CPUs with native bf16, else fp32), fp32, bf16, or fp16
    (CUDA, with loss scaling)."""
    compile: bool = False
    """`torch.compile` the model for training (pays off in long runs)."""
    tf32: bool = True
    """CUDA: float32 matrix products on TF32 tensor cores (no effect on CPU)."""
    cudnn_attention: bool = True
    """CUDA: let SDPA choose its cuDNN kernel (false: flash or memory-efficient only; cuDNN
    builds a graph per shape)."""
    max_epochs: int | None = None
    """A limit in epochs; null: none. Training stops at the first limit reached; the
    schedule is fitted to the others (the budget), not to this one."""
    max_updates: int | None = None
    """A limit in updates; null: none. A run with no limit in updates, target tokens or
    time trains for the default budget (schedule.default_budget: 100 epochs, at most 61M
    target tokens and 5,300 s)."""
    max_time: float | None = None
    """A limit in seconds of training, summed over resumed runs; null: none (see
    max_updates)."""
    max_target_tokens: int | None = None
    """A limit in target tokens trained on (all ranks), summed over resumed runs; null:
    none (see max_updates)."""
    validate_every_updates: int = 0
    """Also validate every N updates; 0: only after epochs."""
    validate_after_updates: int = 0
    """No epoch-end validation (nor numbered checkpoints) before this many updates; epochs
    still write checkpoint_last.pt; 0: from the start."""
    validate_after_budget: float = 0.0
    """No epoch-end validation either before this share of the budget (the first limit:
    updates, tokens or time) is used; 0: from the start."""
    validate_every_epoch: bool = True
    """Validate (and save numbered checkpoints) after each epoch; false for corpora whose
    epochs take hours."""
    save_every_updates: int = 0
    """Also write checkpoint_last.pt every N updates; 0: only at validations and epoch
    ends."""
    patience: int = 0
    """Stop after N validations without a better BLEU; 0: never."""
    keep_last: int = 5
    """Numbered checkpoints kept besides last/best; 0: none written."""
    resume: bool = False
    """Require checkpoints/checkpoint_last.pt in the run directory (it is used anyway if
    present)."""
    log_every_updates: int = 50
    """The train.log/TensorBoard interval, in updates."""
    prefetch_batches: int = 2
    """Updates' batches collated ahead on a background thread (and pinned for a GPU); 0:
    collate on the training thread."""
    max_bad_updates: int = 5
    """Stop after N non-finite losses/gradients in a row."""
    bleu_max_sentences: int | None = None
    """Decode only the first N validation sentences for BLEU; null: all."""
    decode_max_tokens: int | None = None
    """Source tokens per decoding batch at validation; null: data.max_tokens's."""
    decode_max_len_a: float = 1.5
    """Validation's translations have at most `a * source length + b` tokens: a."""
    decode_max_len_b: int = 10
    """Validation's translations have at most `a * source length + b` tokens: b."""
    num_samples: int = 4
    """Sample translations shown in TensorBoard per validation."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        _check(self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
               f"trainer.device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        _check(self.precision in PRECISIONS,
               f"trainer.precision must be one of {PRECISIONS}, got {self.precision!r}")
        for key in ("max_epochs", "max_updates", "max_target_tokens", "bleu_max_sentences",
                    "decode_max_tokens"):
            value = getattr(self, key)
            _check(value is None or (_is_int(value) and value > 0),
                   f"trainer.{key} must be a positive integer or null, got {value!r}")
        _check(self.max_time is None or (_is_finite(self.max_time) and self.max_time > 0),
               f"trainer.max_time must be > 0 seconds or null, got {self.max_time}")
        for key in ("validate_every_updates", "validate_after_updates", "patience", "keep_last",
                    "num_samples", "save_every_updates", "prefetch_batches"):
            value = getattr(self, key)
            _check(_is_int(value) and value >= 0, f"trainer.{key} must be >= 0, got {value!r}")
        _check(_is_finite(self.validate_after_budget) and 0 <= self.validate_after_budget < 1,
               "trainer.validate_after_budget must be a share of the budget in [0, 1), got "
               f"{self.validate_after_budget}")
        _check(isinstance(self.validate_every_epoch, bool),
               f"trainer.validate_every_epoch must be true or false, got "
               f"{self.validate_every_epoch!r}")
        _check(self.validate_every_epoch or self.validate_every_updates > 0,
               "trainer.validate_every_epoch=false needs trainer.validate_every_updates > 0 "
               "(the run would never validate)")
        for key in ("log_every_updates", "max_bad_updates"):
            value = getattr(self, key)
            _check(_is_int(value) and value >= 1, f"trainer.{key} must be >= 1, got {value!r}")
        _check(_is_finite(self.decode_max_len_a) and self.decode_max_len_a >= 0
               and _is_int(self.decode_max_len_b) and self.decode_max_len_b >= 1,
               "trainer.decode_max_len_a must be >= 0 and trainer.decode_max_len_b >= 1, got "
               f"{self.decode_max_len_a}, {self.decode_max_len_b}")


@dataclass
class TrainConfig:
    """Everything `transformer.training.trainer.train` needs (configs/config.yaml)."""

    model: ModelSettings = field(default_factory=ModelSettings)
    """The architecture: a preset of configs/model/ and its keys."""
    data: DataConfig = field(default_factory=DataConfig)
    """The corpora, evaluation sets, tokenizer and batches: a preset of configs/data/."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer, learning-rate schedule, loss and gradients: a preset of
    configs/optim/."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Device, precision, limits, validation, checkpoints, logging: a preset of
    configs/trainer/."""
    seed: int = 1
    """Model initialization and dropout (data.seed shuffles the batches)."""
    init_from: str | None = None
    """A checkpoint file or run directory to start from (fine-tuning, e.g. an imported
    OPUS-MT model): its weights, architecture and tokenizers, with a fresh optimizer and
    schedule; null: a new model."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Checks across groups (each group validated itself already)."""
        _check(_is_int(self.seed), f"seed must be an integer, got {self.seed!r}")
        _check(self.init_from is None or (isinstance(self.init_from, str) and self.init_from),
               f"init_from must be a checkpoint path or null, got {self.init_from!r}")
        _check(self.data.max_len <= self.model.max_positions,
               f"data.max_len ({self.data.max_len}) must be <= model.max_positions "
               f"({self.model.max_positions})")
        cooldown, max_updates = self.optim.cooldown_updates, self.trainer.max_updates
        _check(cooldown == 0 or (max_updates is not None and cooldown <= max_updates),
               f"optim.cooldown_updates={cooldown} needs trainer.max_updates >= it (the "
               f"cooldown ends there), got trainer.max_updates={max_updates}")
        t, o = self.trainer, self.optim
        _check(t.max_time is None or o.cooldown or o.cooldown_updates,
               f"optim.cooldown=0 with trainer.max_time={t.max_time}: a time limit stops the "
               "run wherever this machine's speed puts it, at the learning rate of that "
               "moment; give the cooldown a share of the budget (e.g. optim.cooldown=0.2) or "
               "limit the run by trainer.max_updates or trainer.max_target_tokens instead")

    def to_dict(self) -> dict[str, Any]:
        """Plain values only (stored in checkpoints)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """The config `to_dict` stored (in a checkpoint or an export), validated: each
        group's known keys over its defaults. Keys this version does not know are left out,
        so checkpoints of other versions still load; a bad value raises ConfigError."""
        groups = {"model": ModelSettings, "data": DataConfig, "optim": OptimConfig,
                  "trainer": TrainerConfig}
        try:
            return cls(**{name: group(**_known_fields(group, values.get(name) or {}))
                          for name, group in groups.items()}, seed=values.get("seed", 1),
                       init_from=values.get("init_from"))
        except (TypeError, AttributeError) as e:  # a value of the wrong kind
            raise ConfigError(f"invalid stored config: {e}") from e


@dataclass(frozen=True)
class DecodingSettings:
    """How to decode: the defaults of every translator, `transformer translate` and the
    server. A checkpoint written by `transformer tune-decoding` stores its own (chosen on
    validation data), which `Translator.load` reads."""

    beam_size: int = 5
    """Hypotheses kept at each step of beam search."""
    alpha: float = 1.0
    """The GNMT length penalty; the best value depends on the model."""
    max_len_a: float = 1.5
    """Outputs have at most `a * source length + b` tokens: a."""
    max_len_b: int = 10
    """Outputs have at most `a * source length + b` tokens: b."""

    def __post_init__(self) -> None:
        _check(_is_int(self.beam_size) and _is_int(self.max_len_b) and _is_finite(self.alpha)
               and _is_finite(self.max_len_a),
               f"need integers beam_size and max_len_b and numbers alpha and max_len_a, "
               f"got {self}")
        _check(self.beam_size >= 1 and self.alpha >= 0 and self.max_len_a >= 0
               and self.max_len_b >= 1,
               f"need beam_size >= 1, alpha >= 0, max_len_a >= 0 and max_len_b >= 1, "
               f"got {self}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DecodingSettings:
        """Settings stored as plain values (a checkpoint's `decoding`, an export's), over the
        defaults; other keys (e.g. the validation BLEU they were chosen by) are left out."""
        try:
            return cls(**_known_fields(cls, values))
        except TypeError as e:
            raise ConfigError(f"invalid decoding settings {dict(values)}: {e}") from e


# -- the schema's keys, and the one closest to a mistyped key --

@dataclass(frozen=True)
class SchemaKey:
    """One key of the training config: its dotted name ("optim.lr"; a key of the entries of
    a list-valued key: "data.corpora[].weight"), the dataclass that declares it, its field."""

    key: str
    schema: type
    field: dataclasses.Field


def schema_keys(schema: type = TrainConfig, prefix: str = "") -> list[SchemaKey]:
    """Every key of `schema`, in its fields' order: a group's keys (a field that is itself a
    dataclass) in the group's place, and after a list of dataclass entries (`data.corpora`)
    the keys of an entry. What the configuration's documentation lists and a mistyped key
    is matched against."""
    keys = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            keys += schema_keys(kind, f"{prefix}{f.name}.")
            continue
        keys.append(SchemaKey(f"{prefix}{f.name}", schema, f))
        entry = typing.get_args(kind)[0] if typing.get_origin(kind) is list else None
        if dataclasses.is_dataclass(entry):
            keys += schema_keys(entry, f"{prefix}{f.name}[].")
    return keys


def _general(key: str) -> str:
    """A key with its list positions as "[]": data.corpora[0].name -> data.corpora[].name."""
    return re.sub(r"\[[^\]]*\]", "[]", key)


def _closest_keys(key: str) -> list[str]:
    """The keys a mistyped `key` most likely meant: in its group (the group's name itself
    corrected: "optimm.lr" -> "optim.lr"), the key of that name, else the keys of that name
    in other groups ("lr" -> "optim.lr"), else the closest name of its group ("optim.lrr"
    -> "optim.lr"; the top level includes the config groups: "optimm" -> "optim"), else the
    keys of the closest name in any group; none when nothing is close."""
    keys = [k.key for k in schema_keys()]
    config_groups = {p.name for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name[0] != "_"}
    names: dict[str, list[str]] = {"": sorted({k.split(".")[0] for k in keys} | config_groups)}
    for k in keys:
        group, _, name = k.rpartition(".")
        if group:
            names.setdefault(group, []).append(name)
    group, _, name = _general(key).rpartition(".")
    if group not in names:
        found = difflib.get_close_matches(group, [g for g in names if g], n=1)
        group = found[0] if found else None
    if group and name in names[group]:
        return [f"{group}.{name}"]
    by_name: dict[str, list[str]] = {}
    for k in keys:
        if "[]" not in k:  # an entry's keys are set within their list
            by_name.setdefault(k.rpartition(".")[2], []).append(k)
    if name in by_name:
        return by_name[name][:3]
    found = difflib.get_close_matches(name, names[group], n=1) if group is not None else []
    if found:
        return [f"{group}.{found[0]}" if group else found[0]]
    found = difflib.get_close_matches(name, by_name, n=1)
    return by_name[found[0]][:3] if found else []


def _keys_under(group: str) -> tuple[str, list[str]]:
    """(the innermost group of `group` the schema has, the names of its keys): ("optim",
    ["betas", ...]); ("", the top-level keys) when `group` is none of the schema's."""
    prefix = f"{_general(group)}." if group else ""
    names = sorted({re.split(r"[.\[]", k.key[len(prefix):])[0] for k in schema_keys()
                    if k.key.startswith(prefix)})
    if names or not group:
        return group, names
    return _keys_under(group.rpartition(".")[0])


def unknown_key_error(key: str) -> ConfigError:
    """ConfigError for a key the schema lacks, on one line naming it and the closest real
    key (`optim.lrr is not a config key; did you mean optim.lr?`), or, when none is close,
    the keys of its group."""
    found = _closest_keys(key)
    if found:
        alternatives = " or ".join([", ".join(found[:-1]), found[-1]] if found[1:] else found)
        return ConfigError(f"{key} is not a config key; did you mean {alternatives}?")
    group, names = _keys_under(key.rpartition(".")[0])
    return ConfigError(f"{key} is not a config key (the keys of {group or 'the config'}: "
                       f"{', '.join(names)})")


# Hydra and OmegaConf are imported where they are used: translating, serving and exporting
# read configs as dataclasses and never need them.

def register_configs() -> None:
    """Register the schema that configs/config.yaml names in its defaults list (before
    Hydra composes; `compose_config` and the training commands call it)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def load_config(cfg: DictConfig | TrainConfig) -> TrainConfig:
    """A composed Hydra config -> validated `TrainConfig` (ConfigError naming the key: an
    unknown key, a value of the wrong type or out of range)."""
    if isinstance(cfg, TrainConfig):
        cfg.validate()
        return cfg
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _check_known_keys(cfg, TrainConfig)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg)  # types
        return OmegaConf.to_object(merged)  # runs every validate()
    except OmegaConfBaseException as e:
        raise _omegaconf_error(e, _rejected_key(cfg)) from None


def _leaves(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested mapping ("optim.lr", 0.1)."""
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _rejected_key(cfg: Mapping[str, Any]) -> str | None:
    """The first key of `cfg` whose value alone the schema rejects (for OmegaConf's errors
    that do not say which key, e.g. a mapping given where a list belongs)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for key, value in _leaves(cfg):
        single = OmegaConf.create()
        OmegaConf.update(single, key, value, force_add=True)
        try:
            OmegaConf.merge(OmegaConf.structured(TrainConfig), single)
        except OmegaConfBaseException:
            return key
    return None


def _check_known_keys(values: Mapping[str, Any], schema: type, prefix: str = "") -> None:
    """Raise ConfigError naming the first key of `values` that `schema` (a dataclass, its
    groups recursively) does not have: a key added with Hydra's `+key=value` would
    otherwise be carried along unused."""
    fields = typing.get_type_hints(schema)
    for key, value in values.items():
        if key not in fields:
            raise unknown_key_error(f"{prefix}{key}")
        if dataclasses.is_dataclass(fields[key]) and isinstance(value, Mapping):
            _check_known_keys(value, fields[key], f"{prefix}{key}.")


def _omegaconf_error(error: Exception, key: str | None = None) -> ConfigError:
    """OmegaConf's error about a value -> one line naming the key (`full_key`, else `key`:
    the key given, whose value holds the error); about a key the schema lacks ->
    `unknown_key_error`."""
    if _is_missing_key(error):
        missing = _missing_key(key, getattr(error, "full_key", None))
        if missing is not None:
            return unknown_key_error(missing)
    key = getattr(error, "full_key", None) or key
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return ConfigError(f"{key}: {reason}" if key else reason)


def override_error(error: Exception) -> ConfigError:
    """Hydra's error about an override (a parse error, a missing preset, a value OmegaConf
    rejects, a key the schema lacks) -> ConfigError on one line naming the override and its
    key, and for a mistyped key or preset the closest real one (`compose_config` and the
    Hydra commands report them so)."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(error, OverrideParseException):
        reason = error.message.splitlines()[0]
        return ConfigError(f"invalid override {error.override!r}: {reason}")
    if isinstance(error, MissingConfigException):
        return _missing_preset_error(error)
    message = str(error)
    deleted = re.search(r"Could not delete from config. '([^']+)' does not exist", message)
    missing = _missing_key(None, deleted[1]) if deleted else None
    if missing is not None and missing not in {k.key for k in schema_keys()}:
        return unknown_key_error(missing)  # ~optim.lrr
    first = message.strip().splitlines()[0].rstrip(".") if message.strip() else repr(error)
    cause = error.__cause__
    if cause is None:
        return ConfigError(first)
    overridden = re.match(r"Could not override '([^']+)'", message)
    if overridden and _is_missing_key(cause):
        missing = _missing_key(overridden[1], getattr(cause, "full_key", None))
        if missing is not None:
            return unknown_key_error(missing)
    return ConfigError(f"{first}: {_omegaconf_error(cause)}")


def _is_missing_key(error: BaseException | None) -> bool:
    """Whether OmegaConf's `error` says a key is not in the schema."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    return (isinstance(error, (ConfigKeyError, ConfigAttributeError))
            and re.match(r"Key '[^']*' (is )?not in", str(error)) is not None)


def _missing_key(given: str | None, missing: str | None) -> str | None:
    """The dotted key the schema lacks, from the key given on the command line or in a
    config (`given`) and the one OmegaConf names (`missing`): "optimm.lr" of `optimm.lr=3`
    ("optimm" missing), "optim.lrr" of `optim={lrr: 1}`, "data.corpora[].nme" of
    `data.corpora=[{nme: a}]` ("nme" missing); None for Hydra's own keys (hydra.*)."""
    if not given or not missing or given == missing or given.startswith(f"{missing}."):
        key = given or missing
    elif missing.startswith(f"{given}."):
        key = missing
    elif any(k.key.startswith(f"{given}[].") for k in schema_keys()):
        key = f"{given}[].{missing}"
    else:
        key = f"{given}.{missing}"
    return None if not key or key == "hydra" or key.startswith("hydra.") else key


def _missing_preset_error(error: Exception) -> ConfigError:
    """Hydra's MissingConfigException about a group's option -> one line naming the option,
    the closest preset and the group's presets (`data=filez is not a preset; did you mean
    data=files? (the presets of data: files, multi30k, multi30k_tok)`)."""
    reason = str(error).splitlines()[0]
    options = list(getattr(error, "options", None) or [])
    group, _, name = (getattr(error, "missing_cfg_file", None) or "").rpartition("/")
    if not options or not group:
        return ConfigError(f"{reason}; the options are: {', '.join(options)}" if options
                           else reason)
    within = re.match(r"In '([^']+)'", reason)
    where = f"in {within[1]}: " if within and within[1] != "config" else ""
    close = difflib.get_close_matches(name, options, n=1)
    hint = f"; did you mean {group}={close[0]}?" if close else ""
    return ConfigError(f"{where}{group}={name} is not a preset{hint} (the presets of {group}: "
                       f"{', '.join(options)})")


def compose_config(overrides: Sequence[str] = (), config_dir: Path = CONFIG_DIR) -> TrainConfig:
    """Compose `config_dir` (the package's configs) with command-line style `overrides` (as
    `transformer train` would, but without starting a Hydra app: for tests and notebooks)
    -> validated `TrainConfig`. Every bad override raises ConfigError naming it."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        try:
            cfg = compose("config", overrides=list(overrides))
        except (HydraException, OmegaConfBaseException) as e:
            raise override_error(e) from None
    return load_config(cfg)
