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
from pathlib import Path
from typing import TYPE_CHECKING, Union

from .errors import DataError
from .files import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["new_figure", "save_png", "read_scalars", "bleu_vs_time", "plot_bleu_vs_time"]

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


def bleu_vs_time(run_dir: PathLike) -> tuple[list[float], list[float]]:
    """(training minutes, validation BLEU) at each validation of a run, from the
    `valid/train_time` and `valid/bleu` scalars the trainer logs."""
    bleu, seconds = read_scalars(run_dir, "valid/bleu"), read_scalars(run_dir, "valid/train_time")
    steps = sorted(set(bleu) & set(seconds))
    if not steps:
        raise DataError(f"{run_dir}: no validation with both valid/bleu and valid/train_time")
    return [seconds[s] / 60 for s in steps], [bleu[s] for s in steps]


def plot_bleu_vs_time(runs: Sequence[PathLike], output: PathLike,
                      labels: Sequence[str] | None = None,
                      title: str = "Validation BLEU (greedy) vs. training time") -> None:
    """One line per run: validation BLEU against training wall-clock minutes."""
    labels = list(labels) if labels else [Path(r).name for r in runs]
    if len(labels) != len(runs):
        raise DataError(f"{len(runs)} runs but {len(labels)} labels")
    fig = new_figure(7, 4.5, layout="tight")
    ax = fig.subplots()
    for run, label in zip(runs, labels, strict=True):
        minutes, bleu = bleu_vs_time(run)
        ax.plot(minutes, bleu, marker=".", label=label)
    ax.set_xlabel("training time (minutes)")
    ax.set_ylabel("validation BLEU")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    save_png(fig, output, dpi=120)
