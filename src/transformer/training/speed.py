"""The speed probe of a time budget: target tokens per second of a few training steps, timed
before the run's own model is built, to turn seconds into the tokens the budget's settings
are chosen by (`schedule.budget_settings`): `settings_at_measured_speed` probes the slowest
row's model and batches, then the ones that speed chooses, until the choice stays."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from time import perf_counter

from ..model.loss import LabelSmoothedLoss
from ..model.transformer import Transformer
from ..run.config import TrainConfig
from ..run.data import Data
from .optimizer import build_optimizer
from .schedule import (
    BATCH_ROWS,
    MODEL_ROWS,
    Budget,
    BudgetSettings,
    budget_settings,
    fit_to_budget,
    probe_settings,
)

__all__ = ["measure_speed", "settings_at_measured_speed", "SPEED_PROBE_STEPS"]

log = logging.getLogger(__name__)

SPEED_PROBE_STEPS = 8  # training batches, each stepped twice: the second pass is timed


def measure_speed(model: Transformer, data: Data, cfg: TrainConfig,
                  autocast: Callable[[], AbstractContextManager]) -> float:
    """Target tokens per second of `model`'s training steps (forward, backward and Adam,
    under `autocast`) on the first `SPEED_PROBE_STEPS` batches of `data` at its batch size.

    The batches are stepped twice and the second pass is timed: a batch of a shape not seen
    before first makes its kernels (oneDNN's primitives are made per shape), which a run
    pays for its first batches only, so a single pass measures a model slower than it
    trains (the trainer probes the smallest row's model and batches first, then the ones
    their speed chooses: `settings_at_measured_speed`)."""
    loss_fn = LabelSmoothedLoss(model, cfg.optim.label_smoothing)
    optimizer = build_optimizer(model, cfg)
    batches = [data.train.collate(idx).to(model.device)
               for idx in data.train_batches(epoch=1)[:SPEED_PROBE_STEPS]]
    for _ in range(2):  # a pass that makes the kernels, then the timed one
        started = perf_counter()
        for batch in batches:
            with autocast():
                loss = loss_fn(batch.src, batch.src_valid_lens, batch.tgt_in, batch.tgt_out,
                               batch.tgt_index)
            (loss / batch.num_tgt_tokens).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss.item()  # waits for the device
    seconds = perf_counter() - started
    return sum(b.num_tgt_tokens for b in batches) / max(seconds, 1e-9)


def settings_at_measured_speed(cfg: TrainConfig, epoch_tokens: int,
                               measure: Callable[[TrainConfig], float], world_size: int = 1
                               ) -> tuple[BudgetSettings, float | None]:
    """`budget_settings` for `cfg`'s budget at the speed of the model and batch they choose,
    and that speed (None without a time limit). `measure(cfg)` times training steps at
    `cfg`'s model and batch, on one rank; the speed of `world_size` ranks is that times
    `world_size`.

    A time limit is measured first at `probe_settings` (the slowest row), then at the model
    and batch that speed chooses, until a choice is confirmed by its own speed; then one row
    up (`_one_row_up`), since a faster model or batch may reach that row's tokens too: the
    choice is the confirmed one that trains the most tokens. At most one probe per model and
    batch: the smallest row's speed alone plans a faster model's run for too few tokens."""
    budget = Budget.of(cfg)
    if budget.max_time is None:
        return budget_settings(budget, epoch_tokens, None, cfg.model.name), None
    probed, seen = fit_to_budget(cfg, probe_settings()), set()
    confirmed = None
    for _ in range(len(BATCH_ROWS) + len(MODEL_ROWS)):
        seen.add(_probed_as(probed))
        speed = measure(probed) * world_size
        log.info("speed probe: the %s model, batches of %s tokens: %s target tokens/s",
                 probed.model.name, f"{probed.data.max_tokens:,}", f"{speed:,.0f}")
        chosen = budget_settings(budget, epoch_tokens, speed, cfg.model.name)
        fitted = fit_to_budget(cfg, chosen)  # its model and batch (dropout aside)
        if _probed_as(fitted) == _probed_as(probed):
            tokens = _tokens(budget, chosen, speed)
            if confirmed is None or _tokens(budget, *confirmed) < tokens:
                confirmed = chosen, speed
            up = _one_row_up(budget, epoch_tokens, tokens, cfg.model.name)
            fitted = fit_to_budget(cfg, up) if up is not None else probed
        if _probed_as(fitted) in seen:
            break
        probed = fitted
    return confirmed or (chosen, speed)


def _probed_as(cfg: TrainConfig) -> tuple[str, int | None]:
    """What a probe's speed depends on: the model preset and the batch."""
    return cfg.model.name, cfg.data.max_tokens


def _tokens(budget: Budget, settings: BudgetSettings, speed: float) -> float:
    """The target tokens `budget` allows at `settings`' batches and `speed`."""
    return budget.expected_tokens(settings.update_tokens, speed) or 0.0


def _one_row_up(budget: Budget, epoch_tokens: int, expected: float,
                model: str) -> BudgetSettings | None:
    """The settings a time budget would choose were it just fast enough to reach the next
    `from_tokens` of `BATCH_ROWS` or `MODEL_ROWS` above the `expected` target tokens of the
    choice made (None: above the last)."""
    above = [row.from_tokens for row in (*BATCH_ROWS, *MODEL_ROWS) if row.from_tokens > expected]
    if not above:
        return None
    return budget_settings(budget, epoch_tokens, min(above) / budget.max_time * 1.001, model)
