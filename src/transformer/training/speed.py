"""The speed probe of a time budget: target tokens per second of a few training steps, timed
before the run's own model is built, to turn seconds into the tokens the budget's settings
are chosen by (`schedule.budget_settings`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from ..model.loss import LabelSmoothedLoss
from ..model.transformer import Transformer
from ..run.config import TrainConfig
from ..run.data import Data
from .optimizer import build_optimizer

__all__ = ["measure_speed", "SPEED_PROBE_STEPS"]

SPEED_PROBE_STEPS = 8  # training steps timed (after one warm-up step)


def measure_speed(model: Transformer, data: Data, cfg: TrainConfig,
                  autocast: Callable[[], AbstractContextManager]) -> float:
    """Target tokens per second of `model`'s training steps (forward, backward and Adam,
    under `autocast`) on the first batches of `data` (the smallest row's batch size: what a
    time budget allows, before the batch size is chosen). Small batches train the fewest
    tokens per second, so the estimate errs toward the smaller rows (the safe side: a row
    used below its budget loses far more than one used above it)."""
    loss_fn = LabelSmoothedLoss(model, cfg.optim.label_smoothing)
    optimizer = build_optimizer(model, cfg)
    tokens, started = 0, time.perf_counter()
    for i, idx in enumerate(data.train_batches(epoch=1)[:SPEED_PROBE_STEPS + 1]):
        if i == 1:  # the first step allocates and warms up: left out
            tokens, started = 0, time.perf_counter()
        batch = data.train.collate(idx).to(model.device)
        with autocast():
            loss = loss_fn(batch.src, batch.src_valid_lens, batch.tgt_in, batch.tgt_out,
                           batch.tgt_index)
        (loss / batch.num_tgt_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # waits for the device
        tokens += batch.num_tgt_tokens
    return tokens / max(time.perf_counter() - started, 1e-9)
