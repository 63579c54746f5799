"""Typed configuration: the schema of `transformer train`'s configuration (`TrainConfig` and
its groups `ModelSettings`, `OptimConfig`, `TrainerConfig`; the `data` group is
`data_config.DataConfig`), and the decoding settings every translator starts from.

Hydra composes the presets onto `TrainConfig` (`compose.py`), so a misspelled key or a value
of the wrong type fails while composing, with the key named (and for a misspelled key the
closest real one), and `compose.load_config` turns the result into these dataclasses, whose
`validate()` checks value ranges (`ConfigError: optim.lr must be > 0 or null, got -1.0`)
before anything is trained. A checkpoint stores its run's config as plain values
(`TrainConfig.to_dict`), read back once at load by `TrainConfig.from_dict`.

Each field is documented by its attribute docstring, the string on the line after it: the
one text of what the key means, which `config_docs` reads for `transformer train --help`
and the configuration reference of docs/USAGE.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..data.tokenizer import SpecialIds
from ..errors import ConfigError
from ..model.transformer import Hyperparameters, ModelConfig
from .data_config import DataConfig
from .values import check, is_finite, is_int, known_fields

if TYPE_CHECKING:
    pass

__all__ = ["AUTO_MODEL", "SHAPE", "ModelSettings", "OptimConfig", "TrainerConfig", "TrainConfig",
           "DecodingSettings"]


OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("inverse_sqrt", "constant")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
AUTO_MODEL = "auto"  # model=auto: the budget chooses the model preset (schedule.MODEL_ROWS)
SHAPE = ("num_hiddens", "ffn_num_hiddens", "num_heads", "num_encoder_layers",
         "num_decoder_layers")  # the keys a model preset sets (configs/model/*.yaml)


@dataclass
class ModelSettings(Hyperparameters):
    """The `model` group: a preset's name and the architecture (`transformer.Hyperparameters`,
    the one place where each architectural hyperparameter and its default are defined).
    Vocabulary sizes come from the tokenizer and `share_embeddings` from `data.joint_vocab`
    at run time (see `to_model_config`). Under `model=auto` the shape (`SHAPE`) is null
    until the budget chooses the preset."""

    num_hiddens: int | None = Hyperparameters.num_hiddens
    ffn_num_hiddens: int | None = Hyperparameters.ffn_num_hiddens
    num_heads: int | None = Hyperparameters.num_heads
    num_encoder_layers: int | None = Hyperparameters.num_encoder_layers
    num_decoder_layers: int | None = Hyperparameters.num_decoder_layers
    name: str = "base"
    """The preset's name (configs/model/NAME.yaml), as the training log reports it; `auto`
    (model=auto, the default preset): the budget chooses the preset (`schedule.MODEL_ROWS`)
    and fills in the shape keys that are null (num_hiddens, ffn_num_hiddens, num_heads,
    num_encoder_layers, num_decoder_layers); a key set on top of auto is kept."""
    dropout: float | None = None
    """Dropout on the embeddings (with their positions) and on each sublayer's output before
    its residual connection; null: chosen by the budget (`schedule.DROPOUT_ROWS`)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """ModelConfig's own checks (they name `model.<field>`); a null dropout is checked
        when the budget fills it in, and so is a null shape key, which only model=auto
        leaves to it."""
        unset = [key for key in SHAPE if getattr(self, key) is None]
        if unset and self.name != AUTO_MODEL:
            raise ConfigError(f"model.{unset[0]} is null, which only model={AUTO_MODEL} leaves "
                              f"to the budget; set it, or choose model={AUTO_MODEL}")
        filled = dict.fromkeys(unset, 1)  # a null key passes; set keys are checked
        if "num_hiddens" in filled and is_int(self.num_heads) and self.num_heads > 0:
            filled["num_hiddens"] = self.num_heads  # the heads must divide the width
        if self.dropout is None:
            filled["dropout"] = 0.0
        ModelConfig(src_vocab_size=8, tgt_vocab_size=8, share_embeddings=True,
                    **(_architecture(self) | filled))

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
        check(self.name in OPTIMIZERS, f"optim.name must be one of {OPTIMIZERS}, "
                                        f"got {self.name!r}")
        check(self.lr is None or (is_finite(self.lr) and self.lr > 0),
               f"optim.lr must be > 0 or null, got {self.lr}")
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
               f"optim.betas must be two values in [0, 1), got {list(self.betas)}")
        check(is_finite(self.eps) and self.eps > 0, f"optim.eps must be > 0, got {self.eps}")
        check(is_finite(self.weight_decay) and self.weight_decay >= 0,
               f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        check(self.schedule in SCHEDULES, f"optim.schedule must be one of {SCHEDULES}, "
                                           f"got {self.schedule!r}")
        check(is_int(self.warmup_updates) and self.warmup_updates >= 0,
               f"optim.warmup_updates must be >= 0, got {self.warmup_updates}")
        check(is_int(self.cooldown_updates) and self.cooldown_updates >= 0,
               f"optim.cooldown_updates must be >= 0, got {self.cooldown_updates}")
        check(self.warmup_fraction is None or (is_finite(self.warmup_fraction)
                                                and 0 < self.warmup_fraction <= 1),
               f"optim.warmup_fraction must be in (0, 1] or null, got {self.warmup_fraction}")
        check(is_finite(self.cooldown) and 0 <= self.cooldown <= 1,
               f"optim.cooldown must be a share of the budget in [0, 1], got {self.cooldown}")
        check(not (self.cooldown and self.cooldown_updates),
               f"optim.cooldown={self.cooldown} and optim.cooldown_updates="
               f"{self.cooldown_updates}: set one of them (the other to 0)")
        check(0 <= self.label_smoothing < 1,
               f"optim.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        check(is_finite(self.clip_norm) and self.clip_norm >= 0,
               f"optim.clip_norm must be >= 0, got {self.clip_norm}")
        check(is_int(self.update_freq) and self.update_freq >= 1,
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
    """Source tokens per decoding batch at validation; null: data.max_tokens's, shared by the
    batches searched at once (one per CPU thread)."""
    decode_max_len_a: float = 1.5
    """Validation's translations have at most `a * source length + b` tokens: a."""
    decode_max_len_b: int = 10
    """Validation's translations have at most `a * source length + b` tokens: b."""
    num_samples: int = 4
    """Sample translations shown in TensorBoard per validation."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check(self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
               f"trainer.device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        check(self.precision in PRECISIONS,
               f"trainer.precision must be one of {PRECISIONS}, got {self.precision!r}")
        for key in ("max_epochs", "max_updates", "max_target_tokens", "bleu_max_sentences",
                    "decode_max_tokens"):
            value = getattr(self, key)
            check(value is None or (is_int(value) and value > 0),
                   f"trainer.{key} must be a positive integer or null, got {value!r}")
        check(self.max_time is None or (is_finite(self.max_time) and self.max_time > 0),
               f"trainer.max_time must be > 0 seconds or null, got {self.max_time}")
        for key in ("validate_every_updates", "validate_after_updates", "patience", "keep_last",
                    "num_samples", "save_every_updates", "prefetch_batches"):
            value = getattr(self, key)
            check(is_int(value) and value >= 0, f"trainer.{key} must be >= 0, got {value!r}")
        check(is_finite(self.validate_after_budget) and 0 <= self.validate_after_budget < 1,
               "trainer.validate_after_budget must be a share of the budget in [0, 1), got "
               f"{self.validate_after_budget}")
        check(isinstance(self.validate_every_epoch, bool),
               f"trainer.validate_every_epoch must be true or false, got "
               f"{self.validate_every_epoch!r}")
        check(self.validate_every_epoch or self.validate_every_updates > 0,
               "trainer.validate_every_epoch=false needs trainer.validate_every_updates > 0 "
               "(the run would never validate)")
        for key in ("log_every_updates", "max_bad_updates"):
            value = getattr(self, key)
            check(is_int(value) and value >= 1, f"trainer.{key} must be >= 1, got {value!r}")
        check(is_finite(self.decode_max_len_a) and self.decode_max_len_a >= 0
               and is_int(self.decode_max_len_b) and self.decode_max_len_b >= 1,
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
        check(is_int(self.seed), f"seed must be an integer, got {self.seed!r}")
        check(self.init_from is None or (isinstance(self.init_from, str) and self.init_from),
               f"init_from must be a checkpoint path or null, got {self.init_from!r}")
        check(self.data.max_len <= self.model.max_positions,
               f"data.max_len ({self.data.max_len}) must be <= model.max_positions "
               f"({self.model.max_positions})")
        cooldown, max_updates = self.optim.cooldown_updates, self.trainer.max_updates
        check(cooldown == 0 or (max_updates is not None and cooldown <= max_updates),
               f"optim.cooldown_updates={cooldown} needs trainer.max_updates >= it (the "
               f"cooldown ends there), got trainer.max_updates={max_updates}")
        t, o = self.trainer, self.optim
        check(t.max_time is None or o.cooldown or o.cooldown_updates,
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
            return cls(**{name: group(**known_fields(group, values.get(name) or {}))
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
        check(is_int(self.beam_size) and is_int(self.max_len_b) and is_finite(self.alpha)
               and is_finite(self.max_len_a),
               f"need integers beam_size and max_len_b and numbers alpha and max_len_a, "
               f"got {self}")
        check(self.beam_size >= 1 and self.alpha >= 0 and self.max_len_a >= 0
               and self.max_len_b >= 1,
               f"need beam_size >= 1, alpha >= 0, max_len_a >= 0 and max_len_b >= 1, "
               f"got {self}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DecodingSettings:
        """Settings stored as plain values (a checkpoint's `decoding`, an export's), over the
        defaults; other keys (e.g. the validation BLEU they were chosen by) are left out."""
        try:
            return cls(**known_fields(cls, values))
        except TypeError as e:
            raise ConfigError(f"invalid decoding settings {dict(values)}: {e}") from e


