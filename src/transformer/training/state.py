"""What a training run counts and returns: `TrainState` (saved in checkpoints, so that a
resumed run continues exactly), `TrainClock` (training time over resumed runs), `Agreement`
(what the ranks agree on before each update) and `TrainResult` (what `trainer.train`
returns)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .log import ValidationMetrics

__all__ = ["TrainState", "TrainResult", "TrainClock", "Agreement"]


@dataclass
class TrainState:
    """Counters saved in checkpoints (plain values) so that a resumed run continues exactly."""

    epoch: int = 1  # 1-based
    batches_done: int = 0  # this rank's batches of `epoch` already trained on
    num_updates: int = 0
    best_bleu: float = -1.0
    bad_validations: int = 0  # validations since the best BLEU (early stopping)
    last_validation: int = -1  # num_updates at the last validation
    bad_updates: int = 0  # updates skipped for a non-finite loss/gradient, in total
    bad_in_row: int = 0
    train_time: float = 0.0  # seconds, over all resumed runs
    target_tokens: int = 0  # target tokens trained on (all ranks), over all resumed runs

    @property
    def trained_epoch(self) -> int:
        """The epoch of the latest update (`epoch` already points at the next one after an
        epoch ends)."""
        return self.epoch - 1 if self.batches_done == 0 and self.epoch > 1 else self.epoch


@dataclass
class TrainResult:
    """What `train` returns (the tests read the losses)."""

    stop_reason: str
    state: TrainState
    losses: list[float] = field(default_factory=list)  # per update of this run, per token
    valid: ValidationMetrics | None = None  # the last validation's


@dataclass
class TrainClock:
    """Training time in seconds, summed over resumed runs: `offset` (what earlier runs
    trained) plus the time since `start()`. Before `start()` it reads `offset`."""

    offset: float = 0.0
    started: float | None = None

    def start(self) -> None:
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return self.offset + (0.0 if self.started is None else time.monotonic() - self.started)


@dataclass
class Agreement:
    """What all ranks agree on before an update (one all-reduce)."""

    tokens: float  # target tokens of this update, over all ranks
    seconds: float  # training time so far (the ranks' mean: one schedule for all)
    stop: str | None  # "signal" or "max_time" if any rank must stop, else None
