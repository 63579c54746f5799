"""Prepare a run's data without training: the tokenizer and one memory-mapped store per split.

    python scripts/prepare_data.py [the same overrides as scripts/train.py] hydra.run.dir=runs/x

Takes the training command's configuration (configs/, Hydra) and run directory: it finds or
trains the SentencePiece model (on a sample of at most data.spm_max_sentences pairs) and
streams every split into an encoded store under runs/x/cache (or data.cache_dir), exactly as
`scripts/train.py` would at start-up, which then finds them ready. For a large corpus, run
it once before launching many training processes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from transformer.config import load_config_or_exit  # also registers the schema with Hydra
from transformer.data import load_data
from transformer.files import WriteError
from transformer.text import DataError
from transformer.train_log import setup_logging


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    config = load_config_or_exit(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    cleanup = setup_logging(run_dir, rank=0)
    try:
        data = load_data(config.data, run_dir)
    except (DataError, FileNotFoundError, WriteError) as e:
        sys.exit(f"error: {e}")
    finally:
        cleanup()
    for split in ("train", "valid", "test"):
        corpus = getattr(data, split)
        if corpus is not None:
            print(f"{split}: {len(corpus):,} pairs, {len(corpus.src_ids):,} + "
                  f"{len(corpus.tgt_ids):,} tokens -> {corpus.path}")


if __name__ == "__main__":
    main()
