"""Figures: a matplotlib figure on the Agg canvas (`new_figure`), saved atomically as PNG
(`save_png`), and training curves from a run's TensorBoard logs.

    transformer plot-curves runs/ende runs/deen --labels en-de de-en -o docs/bleu.png

No pyplot: figures are plain `matplotlib.figure.Figure` objects drawn on their own Agg
canvas, so importing this module changes no global state (backend, open figures) of the
process that imports it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

from ..errors import DataError
from ..files import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["new_figure", "save_png", "read_scalars", "ValidationCurve", "validation_curve",
           "plot_validation_curves"]

PathLike = Union[str, "os.PathLike[str]"]


def new_figure(width: float, height: float, layout: str | None = "constrained") -> Figure:
    """A figure of `width` x `height` inches on the Agg canvas (nothing global, nothing to
    close)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout=layout)
    FigureCanvasAgg(figure)
    return figure


def save_png(figure: Figure, path: PathLike, dpi: int = 150) -> None:
    """Write `figure` as a PNG, atomically."""
    with atomic_write(path) as f:
        figure.savefig(f, format="png", dpi=dpi)


def read_scalars(run_dir: PathLike, tag: str) -> dict[int, float]:
    """{step: value} of one scalar tag over all event files of a run (a resumed run writes
    several; a later value for the same step wins)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(Path(run_dir).glob("events.out.tfevents.*"), key=os.path.getmtime)
    if not files:
        raise DataError(f"no TensorBoard event files in {run_dir}")
    values: dict[int, float] = {}
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0}).Reload()
        if tag in acc.Tags()["scalars"]:
            values.update((e.step, e.value) for e in acc.Scalars(tag))
    return values


@dataclass
class ValidationCurve:
    """A run's validations, in update order: when, and what they measured."""

    updates: list[int]
    minutes: list[float]  # training time so far (wall clock, validations and resumes included)
    bleu: list[float]  # greedy validation BLEU
    loss: list[float]  # label-smoothed validation loss per token
    target_tokens: list[float] | None = None  # target tokens so far (None: not logged)


def validation_curve(run_dir: PathLike) -> ValidationCurve:
    """Every validation of a run, from the `valid/*` scalars the trainer logs."""
    tags = {key: read_scalars(run_dir, f"valid/{key}") for key in ("bleu", "loss", "train_time")}
    steps = sorted(set.intersection(*(set(values) for values in tags.values())))
    if not steps:
        raise DataError(f"{run_dir}: no validation with valid/bleu, valid/loss and "
                        "valid/train_time")
    tokens = read_scalars(run_dir, "valid/target_tokens")  # runs of older versions lack it
    return ValidationCurve(steps, [tags["train_time"][s] / 60 for s in steps],
                           [tags["bleu"][s] for s in steps], [tags["loss"][s] for s in steps],
                           [tokens[s] for s in steps] if set(steps) <= set(tokens) else None)


def plot_validation_curves(runs: Sequence[PathLike], output: PathLike,
                           labels: Sequence[str] | None = None,
                           title: str = "Validation (greedy BLEU, loss)") -> None:
    """One line per run in six panels: validation BLEU and loss against training minutes
    (the same time budget), against target tokens (the same amount of training, on any
    machine) and against updates."""
    labels = list(labels) if labels else [Path(r).name for r in runs]
    if len(labels) != len(runs):
        raise DataError(f"{len(runs)} runs but {len(labels)} labels")
    fig = new_figure(15, 7.5, layout="tight")
    axes = fig.subplots(2, 3)
    for run, label in zip(runs, labels, strict=True):
        curve = validation_curve(run)
        millions = [t / 1e6 for t in curve.target_tokens] if curve.target_tokens else None
        for row, values in enumerate((curve.bleu, curve.loss)):
            axes[row, 0].plot(curve.minutes, values, marker=".", label=label)
            if millions is not None:
                axes[row, 1].plot(millions, values, marker=".", label=label)
            axes[row, 2].plot(curve.updates, values, marker=".", label=label)
    for row, name in enumerate(("validation BLEU", "validation loss")):
        for col, x in enumerate(("training time (minutes)", "target tokens (millions)",
                                 "updates")):
            ax = axes[row, col]
            ax.set_xlabel(x)
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
    axes[0, 0].legend()
    fig.suptitle(title)
    save_png(fig, output, dpi=110)
