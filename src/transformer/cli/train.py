"""Train (or resume) a translation model; Hydra overrides as arguments.

    transformer train                                 # Multi30k en->de recipe (downloads it)
    transformer train data.root=DIR                   # Multi30k already in DIR (offline)
    transformer train experiment=smoke
    transformer train model=small optim.lr=0.001 hydra.run.dir=runs/small
    transformer train --config-dir my_configs experiment=mine   # your own preset
    torchrun --nproc-per-node=2 -m transformer train hydra.run.dir=runs/ddp ...

The configs are the package's: `transformer train [ARGS ...] --help` lists the presets and
every key with its default and meaning, `--cfg job` prints the composed config. The run
directory is Hydra's (`hydra.run.dir=...`), and a run directory with
checkpoints/checkpoint_last.pt is resumed; a run that stops on a bad value before its first
checkpoint removes the run directory it created. `python scripts/train.py` is the same
command.
"""

from __future__ import annotations

from pathlib import Path

from ..run.config import TrainConfig
from ..training.trainer import train
from . import hydra_command


def run(config: TrainConfig, run_dir: Path) -> None:
    """Train (or resume) the run in `run_dir`."""
    train(config, run_dir)


main = hydra_command(run)
