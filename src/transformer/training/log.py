"""What a training run reports: `train.log` and console lines, TensorBoard scalars, figures
and sample translations, and the running averages between log lines.

`setup_logging` routes the package's log records to the console (through tqdm, so the
progress bar survives) and to `run_dir/train.log`; `TrainLog` writes one run's records.
Only rank 0 writes anything: on other ranks `TrainLog` keeps its meter and writes nothing.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["setup_logging", "format_duration", "format_elapsed", "ValidationMetrics", "Meter",
           "RunProgress", "TrainLog"]

log = logging.getLogger(__name__)


class _TqdmHandler(logging.StreamHandler):
    """Console log lines that do not break the progress bar (written via tqdm, to stderr)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # any, as StreamHandler.emit: logging must never stop the run
            self.handleError(record)


def setup_logging(run_dir: Path, rank: int) -> Callable[[], None]:
    """Package logs to the console and `run_dir/train.log` on rank 0 (warnings only on other
    ranks). Returns the function that removes the handlers again."""
    logger = logging.getLogger("transformer")
    prefix = "" if rank == 0 else f"[rank {rank}] "
    formatter = logging.Formatter(f"%(asctime)s | %(levelname)s | {prefix}%(message)s",
                                  "%Y-%m-%d %H:%M:%S")
    handlers: list[logging.Handler] = [_TqdmHandler()]
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(run_dir / "train.log", encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    old_level, old_propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.propagate = False  # no second copy through a root handler

    def cleanup() -> None:
        for handler in handlers:
            logger.removeHandler(handler)
            handler.close()
        logger.setLevel(old_level)
        logger.propagate = old_propagate

    return cleanup


def format_duration(seconds: float) -> str:
    """A duration as people say it: 45 s, 12 min, 1 h 05 min."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def format_elapsed(seconds: float) -> str:
    """Training time on a log line: h:mm:ss."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@dataclass
class ValidationMetrics:
    """One validation's results."""

    loss: float  # label-smoothed cross-entropy per target token
    nll: float  # cross-entropy per target token
    bleu: float  # cased sacreBLEU of greedy translations
    chrf: float
    seconds: float  # time the validation took
    # With several validation sets: each set's own, by name; the fields above are then
    # their means (what model selection and early stopping read).
    sets: dict[str, ValidationMetrics] = field(default_factory=dict)

    @property
    def ppl(self) -> float:
        return math.exp(min(self.nll, 100.0))

    @classmethod
    def mean(cls, sets: dict[str, ValidationMetrics]) -> ValidationMetrics:
        """One set's metrics as they are; several sets' means, each kept under its name."""
        if len(sets) == 1:
            return next(iter(sets.values()))
        values = list(sets.values())
        return cls(*(sum(getattr(m, key) for m in values) / len(values)
                     for key in ("loss", "nll", "bleu", "chrf")),
                   sum(m.seconds for m in values), dict(sets))


class Meter:
    """Running sums between two log lines (plain floats: the update already synced once)."""

    def __init__(self) -> None:
        self.restart()
        self.last_loss = self.last_lr = math.nan

    def restart(self) -> None:
        self.loss = self.gnorm = self.tokens = 0.0
        self.updates = 0
        self.start = time.perf_counter()

    def add(self, loss: float, gnorm: float, tokens: float, lr: float) -> None:
        self.loss += loss * tokens
        self.gnorm += gnorm
        self.tokens += tokens
        self.updates += 1
        self.last_loss, self.last_lr = loss, lr

    def tokens_per_s(self) -> float:
        return self.tokens / max(time.perf_counter() - self.start, 1e-9)

    def postfix(self) -> dict[str, str]:
        """The progress bar's loss, learning rate and tokens/s."""
        return {"loss": f"{self.last_loss:.3f}", "lr": f"{self.last_lr:.2e}",
                "tok/s": f"{self.tokens_per_s():.0f}"}

    def pop(self) -> dict[str, float]:
        """The interval's averages; starts a new interval."""
        out = {"loss": self.loss / max(self.tokens, 1.0), "lr": self.last_lr,
               "gnorm": self.gnorm / max(self.updates, 1), "tokens_per_s": self.tokens_per_s()}
        self.restart()
        return out


class RunProgress:
    """The one progress bar of a run, over its whole budget (not restarted per epoch): the
    share done, the training time so far (resumed runs included), the time left, and the
    update, epoch, last loss, lr and tokens/s. The time left is this process's time per
    share of the budget, validations included, times the share left."""

    SETTLE = 0.002  # the share of the run done before the time left is estimated

    def __init__(self, enabled: bool, progress: float = 0.0) -> None:
        self.start_progress, self.started = progress, time.monotonic()
        self.bar = (tqdm(total=100.0, initial=100.0 * progress, file=sys.stderr, leave=False,
                         dynamic_ncols=True, bar_format="{percentage:3.0f}%|{bar}| {desc}")
                    if enabled else None)

    def left(self, progress: float) -> float | None:
        """Seconds left at this process's pace so far (None: too early to tell)."""
        done = progress - self.start_progress
        if done < self.SETTLE:
            return None
        return (time.monotonic() - self.started) / done * max(0.0, 1.0 - progress)

    def update(self, progress: float, elapsed: float, step: int, epoch: int,
               meter: Meter) -> None:
        if self.bar is None:
            return
        left = self.left(progress)
        stats = meter.postfix()
        self.bar.set_description_str(
            f"{format_elapsed(elapsed)} elapsed, "
            f"{'?' if left is None else format_duration(left)} left | update {step:,} | "
            f"epoch {epoch} | loss {stats['loss']} | lr {stats['lr']} | "
            f"{stats['tok/s']} tok/s", refresh=False)
        self.bar.update(100.0 * progress - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class TrainLog:
    """One run's records: log lines on every rank's logger, TensorBoard on rank 0 only.

    After a resume (`purge_step`), TensorBoard drops the events that the interrupted run
    logged past its checkpoint."""

    def __init__(self, run_dir: Path, is_main: bool, purge_step: int | None = None):
        self.meter = Meter()
        self.writer = None
        if is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir), purge_step=purge_step)

    @property
    def tensorboard(self) -> bool:
        """Whether figures and samples are wanted (rank 0)."""
        return self.writer is not None

    def update(self, step: int, epoch: int, loss: float, gnorm: float, tokens: float,
               lr: float, every: int, elapsed: float = 0.0) -> None:
        """Record one update; every `every` updates, write a log line (with the training
        time `elapsed`, resumed runs included) and the scalars."""
        self.meter.add(loss, gnorm, tokens, lr)
        if step % every:
            return
        m = self.meter.pop()
        log.info("epoch %d | update %d | %s | loss %.3f | lr %.3g | gnorm %.3f | %.0f tok/s",
                 epoch, step, format_elapsed(elapsed), m["loss"], m["lr"], m["gnorm"],
                 m["tokens_per_s"])
        if self.writer is not None:
            for key, value in m.items():
                self.writer.add_scalar(f"train/{key}", value, step)

    def validation(self, step: int, epoch: int, metrics: ValidationMetrics, best_bleu: float,
                   improved: bool, bad_validations: int, train_time: float,
                   target_tokens: int = 0, samples: Sequence[tuple[str, str, str]] = (),
                   figure: Figure | None = None) -> None:
        """The validation's log line and, on rank 0, its scalars, the encoder-decoder
        attention figure and (source, reference, hypothesis) samples."""
        log.info("epoch %d | update %d | %s | valid loss %.3f | nll %.3f | ppl %.2f | "
                 "bleu %.2f | chrf %.2f | best bleu %.2f%s | %.1f s", epoch, step,
                 format_elapsed(train_time), metrics.loss, metrics.nll, metrics.ppl,
                 metrics.bleu, metrics.chrf, best_bleu,
                 " (new best)" if improved else f" ({bad_validations} without improvement)",
                 metrics.seconds)
        for name, one in metrics.sets.items():
            log.info("epoch %d | update %d | valid %s | loss %.3f | nll %.3f | bleu %.2f | "
                     "chrf %.2f", epoch, step, name, one.loss, one.nll, one.bleu, one.chrf)
        self.meter.restart()  # validation time is not training throughput
        if self.writer is None:
            return
        for key in ("loss", "nll", "ppl", "bleu", "chrf"):
            self.writer.add_scalar(f"valid/{key}", getattr(metrics, key), step)
            for name, one in metrics.sets.items():
                self.writer.add_scalar(f"valid_{name}/{key}", getattr(one, key), step)
        # Training time and target tokens so far (resumes included), for BLEU-vs-time and
        # BLEU-vs-tokens plots.
        self.writer.add_scalar("valid/train_time", train_time, step)
        self.writer.add_scalar("valid/target_tokens", target_tokens, step)
        if figure is not None:
            self.writer.add_figure("valid/encoder_decoder_attention", figure, step)
        if samples:
            rows = [f"| {s} | {r} | {h} |" for s, r, h in samples]
            self.writer.add_text("valid/samples", "\n".join(
                ["| source | reference | greedy |", "|---|---|---|", *rows]), step)
        self.writer.flush()

    def epoch_draw(self, step: int, epoch: int, counts: dict[str, int]) -> None:
        """How many pairs of each training corpus `epoch` drew (a log line and, on rank 0,
        the scalars data/<corpus>, at the update the epoch starts after)."""
        total = max(1, sum(counts.values()))
        log.info("epoch %d draws %s pairs: %s", epoch, f"{total:,}", ", ".join(
            f"{name} {n:,} ({n / total:.1%})" for name, n in counts.items()))
        if self.writer is not None:
            for name, n in counts.items():
                self.writer.add_scalar(f"data/{name}", n, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
