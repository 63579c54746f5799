"""The learning-rate schedule of a run, fitted to its budget.

    schedule = Schedule(cfg)                             # optim.* and the trainer's limits
    # before each update, where the run is (updates and tokens done, seconds so far):
    schedule.observe(num_updates, target_tokens, seconds)   # the plan, at its points
    lr = schedule.set_lr(optimizer, num_updates, progress)  # this update's lr

A run's **budget** is the first of its limits to run out: `trainer.max_updates`,
`trainer.max_target_tokens` or `trainer.max_time` (`Budget`). Its **progress** is the share
of the budget used so far, on the budget's own axis: updates, target tokens or seconds
(`Budget.progress`, the largest of the three shares). The learning rate is `optim.lr` times
a factor of the update number and the progress:

1. warmup: linear from 0 to 1 over W updates; W = `optim.warmup_updates`, and with
   `optim.warmup_fraction` at most that share of the updates the run is expected to make;
2. then `optim.schedule`: `constant`, or `inverse_sqrt` (1 at the end of warmup);
3. cooldown (`optim.cooldown` > 0, a share of the budget): over the last share, the factor
   is multiplied by (1 - progress) / cooldown, so it falls linearly to 0 exactly when the
   budget runs out. `optim.cooldown: 1.0` with `constant` is linear decay to zero over the
   whole run (Li et al., "Budgeted Training", 2020); 0.2 with either is a warmup-stable-decay
   schedule (Hägele et al., 2024).

The cooldown is measured on the budget's axis, not in updates, so when a time-limited run
speeds up or slows down it still ends at the limit, at a learning rate near zero. What needs
an update count (the warmup's length, and the log's forecast of where the run will end) comes
from the **plan** (`Plan`): the updates the budget allows at the speed measured so far,
measured after a few updates and again every `REPLAN_EVERY` updates. The plan is saved in
checkpoints, so a resumed run keeps its warmup.

`optim.cooldown_updates` (a fixed number of updates before `trainer.max_updates`, holding the
factor the schedule had there) is the older form of a cooldown, kept as it was
(`lr_lambda`).

**A budget for every run** (`default_budget`): a run whose config sets no limit trains for
`DEFAULT_EPOCHS` passes over its corpus, at most the recipe's 61M target tokens and at most
`DEFAULT_MAX_TIME` seconds, and stops; the trainer logs which.

**Settings fitted to the budget and the corpus** (`budget_settings`): a small budget is better
spent on more, smaller updates with a lower peak, a large one on Wu et al.'s 8,192-token
batches and lr 0.005 (`BATCH_ROWS`, by the target tokens the budget allows); a budget that
goes through its corpus many times needs more dropout than one that sees each pair once or
twice (`DROPOUT_ROWS`, by epochs: the target tokens the budget allows over those of one
epoch). Where the config leaves `data.max_tokens`, `model.dropout` or `optim.lr` null (the
presets do), the trainer fills them in (for a time budget, at the speed it measures before
the first update), logs the choice and why, and keeps it when resumed (`fit_to_budget`). A
value given in the config is kept. The model follows the budget too (`MODEL_ROWS`): under
`model=auto`, the default, a small budget trains the small model at half the peak lr, a
larger one Transformer-Tiny. The vocabulary size follows the corpus the same way
(`run/tokenizers.vocab_size_for`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from ..data.mixture import Mixture
from ..run.compose import model_preset
from ..run.config import AUTO_MODEL, TrainConfig
from .log import format_duration

__all__ = ["Budget", "BatchRow", "BATCH_ROWS", "DROPOUT_ROWS", "ModelRow", "MODEL_ROWS",
           "model_row", "lr_scale", "BudgetSettings", "Plan",
           "Schedule", "batch_row", "dropout_for", "budget_settings", "explain_settings",
           "default_budget",
           "with_budget", "run_budget", "epoch_tokens", "epoch_limit_note",
           "describe_settings", "probe_settings", "fit_to_budget", "lr_lambda", "null_settings",
           "needs_budget_settings", "DEFAULT_EPOCHS", "DEFAULT_MAX_TOKENS", "DEFAULT_MAX_TIME",
           "PLAN_AFTER", "REPLAN_EVERY"]

log = logging.getLogger(__name__)

PLAN_AFTER = 10  # updates measured before the first plan of a token or time budget
SPEED_FROM = 2  # a process's first update (allocation, compilation) is left out of the speed
REPLAN_EVERY = 50  # updates between two measurements of the speed
LOGGED_CHANGE = 0.1  # a plan is logged again when its updates differ this much from the last


def lr_lambda(schedule: str, warmup_updates: int, max_updates: int | None = None,
              cooldown_updates: int = 0) -> Callable[[int], float]:
    """Factor of the peak lr for the update after `num_updates` updates: linear warmup to 1,
    then constant or 1/sqrt(update) decay (1 at the end of warmup); with `cooldown_updates`,
    the last that many of `max_updates` decay linearly from there to ~0."""
    warmup = max(1, warmup_updates)
    if cooldown_updates and max_updates is None:
        raise ValueError("a cooldown needs max_updates")

    def base(step: int) -> float:
        if step < warmup:
            return step / warmup
        return 1.0 if schedule == "constant" else math.sqrt(warmup / step)

    def factor(num_updates: int) -> float:
        step = num_updates + 1  # 1-based number of the update about to be made
        if cooldown_updates:
            start = max_updates - cooldown_updates  # last update at the full schedule
            if step > start:
                return base(max(start, 1)) * (max_updates + 1 - step) / (cooldown_updates + 1)
        return base(step)

    return factor


@dataclass(frozen=True)
class Budget:
    """A run's limits that a schedule can be fitted to (None: not limited by it)."""

    max_updates: int | None = None
    max_target_tokens: int | None = None
    max_time: float | None = None  # seconds of training, resumed runs included

    @classmethod
    def of(cls, cfg: TrainConfig) -> Budget:
        t = cfg.trainer
        return cls(t.max_updates, t.max_target_tokens, t.max_time)

    @property
    def limited(self) -> bool:
        return any(v is not None for v in asdict(self).values())

    @property
    def updates_only(self) -> bool:
        """Limited by updates alone: the plan is known before the first update."""
        return self == Budget(max_updates=self.max_updates) and self.max_updates is not None

    def progress(self, num_updates: int, target_tokens: float, seconds: float) -> float:
        """The share of the budget used: the largest share of any limit (0 without one)."""
        shares = [used / limit for used, limit in ((num_updates, self.max_updates),
                                                   (target_tokens, self.max_target_tokens),
                                                   (seconds, self.max_time))
                  if limit is not None]
        return max(shares, default=0.0)

    def updates_left(self, num_updates: int, target_tokens: float, seconds: float,
                     tokens_per_update: float | None,
                     seconds_per_update: float | None) -> float | None:
        """How many more updates the budget allows at the given speed (None: unknown, or
        no limit)."""
        left = []
        if self.max_updates is not None:
            left.append(self.max_updates - num_updates)
        if self.max_target_tokens is not None and tokens_per_update:
            left.append((self.max_target_tokens - target_tokens) / tokens_per_update)
        if self.max_time is not None and seconds_per_update:
            left.append((self.max_time - seconds) / seconds_per_update)
        return max(0.0, min(left)) if left else None

    def expected_tokens(self, update_tokens: int,
                        tokens_per_second: float | None) -> float | None:
        """The target tokens the run will train on at most: the token limit, the updates
        limit times `update_tokens` (full batches), the time limit at `tokens_per_second`
        (None: no limit, or only a time limit at an unknown speed)."""
        limits = []
        if self.max_target_tokens is not None:
            limits.append(float(self.max_target_tokens))
        if self.max_updates is not None:
            limits.append(float(self.max_updates * update_tokens))
        if self.max_time is not None and tokens_per_second:
            limits.append(self.max_time * tokens_per_second)
        return min(limits, default=None)

    def describe(self) -> str:
        parts = []
        if self.max_updates is not None:
            parts.append(f"{self.max_updates:,} updates")
        if self.max_target_tokens is not None:
            parts.append(f"{self.max_target_tokens:,} target tokens")
        if self.max_time is not None:
            parts.append(f"{self.max_time:,.0f} s")
        return " or ".join(parts) if parts else "none"


@dataclass(frozen=True)
class BatchRow:
    """A batch size and the peak lr (with its warmup share) that go with it, for budgets from
    `from_tokens` target tokens on."""

    from_tokens: int  # the smallest budget (target tokens) this row is for
    update_tokens: int  # target-side tokens per update, padding included: data.max_tokens
    #                     per batch x optim.update_freq x ranks
    lr: float
    warmup_fraction: float | None  # the warmup's share of the planned updates, at most
    #                                optim.warmup_updates; None: optim.warmup_updates


# The batch size and peak lr follow the number of updates the budget buys: measured on
# Multi30k with Transformer-Tiny at 3M, 5.5M, 20M and 61M target tokens and on two other
# corpora (docs/results.md, "Quality by budget" and "Your own data"). Each row starts at the
# budget it was measured at: below it, its larger batches and higher peak lose badly, while
# the smaller batches of the row below only make more updates.
BATCH_ROWS = (
    BatchRow(0, 1024, lr=0.0014, warmup_fraction=0.15),
    BatchRow(5_500_000, 2048, lr=0.002, warmup_fraction=0.15),
    BatchRow(20_000_000, 4096, lr=0.003, warmup_fraction=0.15),
    BatchRow(61_000_000, 8192, lr=0.005, warmup_fraction=None),  # Wu et al.'s
)

# Dropout follows the epochs: how many times the budget goes through the corpus. A model
# that sees its pairs more often needs more regularization: (from epochs, dropout), measured
# on Multi30k at 12, 42 and 129 epochs and on two other corpora (docs/results.md, "Quality by
# budget" and "Your own data").
DROPOUT_ROWS = ((0.0, 0.1), (40.0, 0.2), (125.0, 0.3))


@dataclass(frozen=True)
class ModelRow:
    """A model preset (configs/model/NAME.yaml) and the share of `BATCH_ROWS`' peak lr it
    trains at, for budgets from `from_tokens` target tokens on."""

    from_tokens: int  # the smallest budget (target tokens) this row is for
    model: str
    lr_scale: float  # the peak lr: the batch row's times this


# The model follows the target tokens of the budget (under model=auto): at a few million
# target tokens the small model learns more from the same tokens than Transformer-Tiny, at
# half the peak lr; from 5.5M on, Transformer-Tiny is Wu et al.'s recipe (docs/results.md,
# "Quality by budget" and "Your own data").
MODEL_ROWS = (
    ModelRow(0, "small", lr_scale=0.5),
    ModelRow(5_500_000, "tiny", lr_scale=1.0),
)

# The budget of a run that sets no limit (trainer.max_updates, max_target_tokens and max_time
# all null): DEFAULT_EPOCHS passes over its corpus, at most the recipe's 61M target tokens
# (Wu et al.'s budget) and at most DEFAULT_MAX_TIME seconds, whichever comes first.
DEFAULT_EPOCHS = 100
DEFAULT_MAX_TOKENS = 61_000_000
DEFAULT_MAX_TIME = 5300.0


@dataclass(frozen=True)
class BudgetSettings:
    """What a run's budget chose: the batch size, dropout, peak lr and warmup share (saved in
    checkpoints, so a resumed run keeps them)."""

    from_tokens: int  # the smallest budget of the batch row (`BatchRow.from_tokens`)
    update_tokens: int
    dropout: float
    lr: float
    warmup_fraction: float | None
    epochs: float | None = None  # the passes over the corpus the budget was expected to make
    model: str | None = None  # the model preset chosen (`MODEL_ROWS`); None: the config's


def batch_row(budget: Budget, tokens_per_second: float | None = None) -> BatchRow:
    """The row of `BATCH_ROWS` for the budget: the one with the largest batches whose
    `from_tokens` the budget reaches at those batches (and at `tokens_per_second` for a
    time limit). A run without a limit in tokens gets the last row."""
    for row in reversed(BATCH_ROWS):
        expected = budget.expected_tokens(row.update_tokens, tokens_per_second)
        if expected is None or expected >= row.from_tokens:
            return row
    return BATCH_ROWS[0]


def model_row(expected_tokens: float | None) -> ModelRow:
    """The row of `MODEL_ROWS` for a budget of `expected_tokens` target tokens (None: no
    limit in tokens, the last row)."""
    return next(row for row in reversed(MODEL_ROWS)
                if expected_tokens is None or expected_tokens >= row.from_tokens)


def lr_scale(model: str) -> float:
    """The share of `BATCH_ROWS`' peak lr that the model preset `model` trains at: its
    `MODEL_ROWS` entry's, else 1 (the rows' lr were measured on Transformer-Tiny)."""
    return next((row.lr_scale for row in MODEL_ROWS if row.model == model), 1.0)


def dropout_for(epochs: float) -> float:
    """The dropout of `DROPOUT_ROWS` for a budget of `epochs` passes over the corpus."""
    return next(dropout for start, dropout in reversed(DROPOUT_ROWS) if epochs >= start)


def budget_settings(budget: Budget, epoch_tokens: int, tokens_per_second: float | None = None,
                    model: str = AUTO_MODEL) -> BudgetSettings:
    """The settings for `budget` on a corpus of `epoch_tokens` target tokens an epoch: the
    batch size and peak lr by the tokens the budget allows (`batch_row`), the model preset
    by them too where `model` (the config's preset) is `auto` (`model_row`), the peak lr
    scaled for the model (`lr_scale`), the dropout by the epochs they make (`dropout_for`;
    a budget without a limit in tokens: the last row)."""
    row = batch_row(budget, tokens_per_second)
    expected = budget.expected_tokens(row.update_tokens, tokens_per_second)
    chosen = model_row(expected).model if model == AUTO_MODEL else None
    epochs = None if expected is None else expected / max(epoch_tokens, 1)
    dropout = DROPOUT_ROWS[-1][1] if epochs is None else dropout_for(epochs)
    return BudgetSettings(row.from_tokens, row.update_tokens, dropout,
                          row.lr * lr_scale(chosen or model), row.warmup_fraction, epochs,
                          chosen)


def explain_settings(settings: BudgetSettings, keys: list[str]) -> str:
    """What `budget_settings` chose for the config's open `keys` (`null_settings`), and by
    which row of which table."""
    tokens = _tokens_span([row.from_tokens for row in BATCH_ROWS], settings.from_tokens)
    model_from = next((row.from_tokens for row in MODEL_ROWS if row.model == settings.model), 0)
    reasons = {
        "model": f"the {settings.model} model (for "
                 f"{_tokens_span([row.from_tokens for row in MODEL_ROWS], model_from)})",
        "data.max_tokens": f"batches of {settings.update_tokens:,} tokens an update (for "
                           f"{tokens})",
        "optim.lr": f"lr {settings.lr:g} and " + (
            f"a warmup of {settings.warmup_fraction:.0%} of the planned updates"
            if settings.warmup_fraction else "the configured warmup") + f" (for {tokens})",
        "model.dropout": f"dropout {settings.dropout}" + (
            "" if settings.epochs is None else f" (for {_epochs_row(settings.epochs)})"),
    }
    return ", ".join(reasons[key] for key in keys)


def _tokens_span(starts: list[int], start: int) -> str:
    """The budgets of the table row starting at `start` (of rows starting at `starts`), in
    words."""
    above = [s for s in starts if s > start]
    if not above:
        return f"budgets from {start:,} target tokens"
    return (f"budgets under {above[0]:,} target tokens" if start == 0 else
            f"budgets of {start:,} to {above[0]:,} target tokens")


def _epochs_row(epochs: float) -> str:
    """The span of `DROPOUT_ROWS` that `epochs` falls in, in words."""
    starts = [start for start, _ in DROPOUT_ROWS]
    start = max(s for s in starts if epochs >= s)
    end = [s for s in starts if s > start]
    return f"{start:g} to {end[0]:g} epochs" if end else f"{start:g} epochs or more"


def default_budget(epoch_tokens: int) -> Budget:
    """The budget of a run that sets none: `DEFAULT_EPOCHS` epochs of `epoch_tokens` target
    tokens, at most `DEFAULT_MAX_TOKENS`, and at most `DEFAULT_MAX_TIME` seconds."""
    return Budget(max_target_tokens=min(DEFAULT_MAX_TOKENS, DEFAULT_EPOCHS * epoch_tokens),
                  max_time=DEFAULT_MAX_TIME)


def with_budget(cfg: TrainConfig, budget: Budget) -> TrainConfig:
    """`cfg` with the trainer's limits of `budget` (updates, target tokens, seconds)."""
    return replace(cfg, trainer=replace(cfg.trainer, max_updates=budget.max_updates,
                                        max_target_tokens=budget.max_target_tokens,
                                        max_time=budget.max_time))


def null_settings(cfg: TrainConfig) -> list[str]:
    """The settings the config leaves to the budget: `model` where it is `auto`, and those
    of `data.max_tokens`, `optim.lr` and `model.dropout` that are null."""
    values = {"data.max_tokens": cfg.data.max_tokens, "optim.lr": cfg.optim.lr,
              "model.dropout": cfg.model.dropout}
    return (["model"] if cfg.model.name == AUTO_MODEL else []) + [
        key for key, value in values.items() if value is None]


def epoch_tokens(train: Mixture, seed: int) -> int:
    """The target tokens of the first epoch's pairs of `train` (EOS included): what the
    budget is counted in epochs against."""
    draw = train.draw(seed, 1)
    return int(train.tgt_lens[draw].sum()) + len(draw)


def run_budget(cfg: TrainConfig, epoch_tokens: int,
               trained: TrainConfig | None = None) -> TrainConfig:
    """`cfg` with a budget: its own limits; those of `trained` (a resumed run's stored
    config) when `cfg` gives none; else `default_budget` for a corpus of `epoch_tokens`
    target tokens an epoch, logged."""
    if Budget.of(cfg).limited:
        return cfg
    if trained is not None and Budget.of(trained).limited:
        return with_budget(cfg, Budget.of(trained))
    budget = default_budget(epoch_tokens)
    log.info("budget: %s, the default of a run that sets no limit: %d epochs of this "
             "corpus's %s target tokens, at most %s target tokens and at most %s (set "
             "trainer.max_target_tokens, trainer.max_time or trainer.max_updates to choose)",
             budget.describe(), DEFAULT_EPOCHS, f"{epoch_tokens:,}", f"{DEFAULT_MAX_TOKENS:,}",
             format_duration(DEFAULT_MAX_TIME))
    return with_budget(cfg, budget)


def epoch_limit_note(cfg: TrainConfig, epoch_tokens: int, tokens_per_second: float | None,
                     world_size: int = 1) -> str | None:
    """What to say when `trainer.max_epochs` ends the run before its budget: the schedule
    cools down on the budget, so such a run ends at a high learning rate (None: it does
    not)."""
    update_tokens = cfg.data.max_tokens * cfg.optim.update_freq * world_size
    expected = Budget.of(cfg).expected_tokens(update_tokens, tokens_per_second)
    epochs = cfg.trainer.max_epochs
    if epochs is None or expected is None or epochs * epoch_tokens >= expected:
        return None
    why = (f"the learning rate is not cooled down (optim.cooldown={cfg.optim.cooldown} is a "
           "share of the budget)" if cfg.optim.cooldown else "the schedule is cut there")
    return (f"trainer.max_epochs={epochs} ends the run first, at "
            f"~{100 * epochs * epoch_tokens / expected:.0f}% of its budget "
            f"({epoch_tokens:,} target tokens an epoch): {why}")


def describe_settings(budget: Budget, settings: BudgetSettings,
                      tokens_per_second: float | None, epoch_tokens: int,
                      keys: list[str]) -> str:
    """The log's line for the settings `budget` chose for the config's null `keys`, and
    why (`explain_settings`)."""
    speed = tokens_per_second
    expected = budget.expected_tokens(settings.update_tokens, speed)
    return (f"settings for a budget of {budget.describe()} ("
            + (f"{speed:,.0f} target tokens/s measured: " if speed else "")
            + ("no limit on" if expected is None else f"~{expected:,.0f}")
            + " target tokens expected"
            + ("" if settings.epochs is None else
               f", {settings.epochs:,.1f} epochs of {epoch_tokens:,}")
            + f"): {explain_settings(settings, keys)} ("
            + ", ".join(f"{key}={AUTO_MODEL}" if key == "model" else key for key in keys)
            + f" in the config; set {'it' if len(keys) == 1 else 'them'} to choose)")


def needs_budget_settings(cfg: TrainConfig) -> bool:
    """Whether the config leaves a setting to the budget (`null_settings`)."""
    return bool(null_settings(cfg))


def probe_settings() -> BudgetSettings:
    """The settings a time budget's speed is measured at, before it chooses its own: the
    smallest batches and the first model row's model (the fewest tokens per second: an
    estimate on the safe side)."""
    row = BATCH_ROWS[0]
    return BudgetSettings(row.from_tokens, row.update_tokens, DROPOUT_ROWS[0][1], row.lr,
                          row.warmup_fraction, model=MODEL_ROWS[0].model)


def fit_to_budget(cfg: TrainConfig, settings: BudgetSettings, world_size: int = 1) -> TrainConfig:
    """`cfg` with its null settings taken from `settings`: the batch per rank and
    accumulation step (`update_tokens` split over them, at least `data.max_len`), the dropout,
    and the peak lr with its warmup share (the warmup protects that peak, so they go
    together; a share the config gives is kept), and under `model=auto` the chosen model
    preset, with the fields the config sets on top of `auto` (`compose.model_preset`)."""
    per_batch = max(cfg.data.max_len,
                    settings.update_tokens // (world_size * cfg.optim.update_freq))
    data, model, optim = cfg.data, cfg.model, cfg.optim
    if model.name == AUTO_MODEL:
        model = model_preset(settings.model, over=model)
    if data.max_tokens is None:
        data = replace(data, max_tokens=per_batch)
    if model.dropout is None:
        model = replace(model, dropout=settings.dropout)
    if optim.lr is None:
        optim = replace(optim, lr=settings.lr, warmup_fraction=(
            settings.warmup_fraction if optim.warmup_fraction is None else optim.warmup_fraction))
    return replace(cfg, data=data, model=model, optim=optim)


@dataclass
class Plan:
    """What the schedule expects of the run (saved in checkpoints)."""

    warmup_updates: int  # the warmup's length (planned while the run is inside it)
    planned_updates: int | None = None  # the updates the budget allows, as last measured


@dataclass
class _Mark:
    """The point of the run the time per update is measured from."""

    num_updates: int
    seconds: float


class Schedule:
    """The factor of the peak learning rate at every update, and the plan behind it."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.optim, self.budget = cfg.optim, Budget.of(cfg)
        self.peak = cfg.optim.lr
        self.plan = Plan(cfg.optim.warmup_updates)
        self._mark: _Mark | None = None
        self._observed = 0  # updates observed by this process (a resumed run starts again)
        self._built: tuple[int, Callable[[int], float]] | None = None  # (warmup, schedule)
        self._logged: int | None = None  # the planned updates of the plan logged last
        self._logged_timed = False  # whether a plan with its end in time was logged
        self._moved = False  # whether the last plan was LOGGED_CHANGE away from the logged
        if self.budget.updates_only:
            self._replan(0, self.budget.max_updates)

    # -- the factor --

    def factor(self, num_updates: int, progress: float) -> float:
        """The factor of `optim.lr` for the update after `num_updates`, at `progress`."""
        o = self.optim
        base = self._schedule(self.plan.warmup_updates)(num_updates)
        if o.cooldown:
            base *= min(1.0, max(0.0, 1.0 - progress) / o.cooldown)
        return base

    def _schedule(self, warmup_updates: int) -> Callable[[int], float]:
        """The schedule in updates (`lr_lambda`) for a warmup of `warmup_updates`, built
        again only when the plan chooses another warmup, not at every update."""
        if self._built is None or self._built[0] != warmup_updates:
            o = self.optim
            self._built = (warmup_updates, lr_lambda(o.schedule, warmup_updates,
                                                     self.budget.max_updates,
                                                     o.cooldown_updates))
        return self._built[1]

    def set_lr(self, optimizer: torch.optim.Optimizer, num_updates: int,
               progress: float) -> float:
        """Set every parameter group's lr for the next update; returns it."""
        lr = self.peak * self.factor(num_updates, progress)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    # -- the plan --

    def observe(self, num_updates: int, target_tokens: float, seconds: float) -> None:
        """Before an update, `num_updates` done: at the plan's points (update `PLAN_AFTER`,
        then every `REPLAN_EVERY`), forecast the updates the budget allows at the speed
        measured since the previous point. Target tokens per update are averaged over the
        whole run (a token budget plans alike when resumed); seconds per update over the
        last interval (the speed of the machine now)."""
        if not self.budget.limited:
            return  # nothing to plan for
        self._observed += 1
        if self._observed == SPEED_FROM:
            self._mark = _Mark(num_updates, seconds)
        if num_updates == 0 or (num_updates != PLAN_AFTER and num_updates % REPLAN_EVERY):
            return
        per_update = None
        if self._mark is not None and num_updates > self._mark.num_updates:
            per_update = (seconds - self._mark.seconds) / (num_updates - self._mark.num_updates)
            self._mark = _Mark(num_updates, seconds)
        left = self.budget.updates_left(num_updates, target_tokens, seconds,
                                        target_tokens / max(num_updates, 1), per_update)
        if left is not None and (per_update is not None or self.budget.max_time is None):
            self._replan(num_updates, num_updates + round(left), per_update)

    def _replan(self, num_updates: int, planned: int,
                seconds_per_update: float | None = None) -> None:
        """Record a new forecast; choose the warmup on the first one, and again while
        the run is still inside it (never shorter than what it has done). The plan is
        logged when it is first made, when its end can first be timed, and when its updates
        stay more than `LOGGED_CHANGE` away from the plan logged last for two plans in a row
        (one interval slowed by a validation moves one plan only)."""
        self.plan.planned_updates = planned
        fraction = self.optim.warmup_fraction
        if fraction is not None and num_updates < self.plan.warmup_updates:
            warmup = min(self.optim.warmup_updates, round(fraction * planned))
            self.plan.warmup_updates = max(warmup, num_updates + 1)
        timed, logged = seconds_per_update is not None, self._logged
        moved = logged is not None and abs(planned - logged) > LOGGED_CHANGE * logged
        if logged is None or (timed and not self._logged_timed) or (moved and self._moved):
            self._logged, self._logged_timed = planned, self._logged_timed or timed
            log.info("plan: %s", self.describe(num_updates, seconds_per_update))
            moved = False
        self._moved = moved

    def describe(self, num_updates: int, seconds_per_update: float | None = None) -> str:
        """The plan in words: the budget, the updates it allows, the warmup, where the
        cooldown starts, and (with the speed) how long the rest takes and when it ends."""
        planned, o = self.plan.planned_updates, self.optim
        parts = [(f"at update {num_updates:,}, " if num_updates else "")
                 + f"budget {self.budget.describe()} = ~{planned:,} updates",
                 f"warmup {self.plan.warmup_updates:,} updates"]
        if o.cooldown:
            parts.append(f"cooldown from update ~{round(planned * (1 - o.cooldown)):,} (the "
                         f"last {o.cooldown:.0%} of the budget)")
        elif o.cooldown_updates:
            parts.append(f"cooldown over the last {o.cooldown_updates:,} updates")
        else:
            parts.append("no cooldown")
        if seconds_per_update is not None:
            left = max(0, planned - num_updates) * seconds_per_update
            parts.append(f"{format_duration(left)} to go, ending about "
                         f"{time.strftime('%H:%M', time.localtime(time.time() + left))}")
        return "; ".join(parts)

    def state_dict(self) -> dict:
        return asdict(self.plan)

    def load_state_dict(self, state: dict) -> None:
        self.plan = Plan(**state)
