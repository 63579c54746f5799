"""Train a translation model: a thin Hydra entry point over `transformer.training.train`.

    python scripts/train.py                          # Multi30k en->de recipe (downloads it)
    python scripts/train.py data.root=DIR            # Multi30k already in DIR (offline)
    python scripts/train.py experiment=smoke
    python scripts/train.py model=small optim.lr=0.001 hydra.run.dir=runs/small
    torchrun --nproc_per_node=2 scripts/train.py hydra.run.dir=runs/ddp ...

Configs live in configs/ (see configs/config.yaml); the run directory is Hydra's
(`hydra.run.dir=...`), and a run directory with checkpoints/checkpoint_last.pt is resumed.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from transformer.checkpoint import CheckpointError
from transformer.config import load_config_or_exit  # also registers the schema with Hydra
from transformer.files import WriteError
from transformer.text import DataError
from transformer.training import TrainingError, train


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    config = load_config_or_exit(cfg)
    try:
        train(config, HydraConfig.get().runtime.output_dir)
    except (TrainingError, CheckpointError, DataError, FileNotFoundError, WriteError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
