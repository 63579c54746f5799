"""Prepare a run's data without training: its tokenizer and memory-mapped stores.

    transformer prepare-data [the same overrides as transformer train] hydra.run.dir=runs/x
    transformer prepare-data --help      # the presets and every key, as transformer train's

Takes the training command's configuration and run directory: it finds or trains the
SentencePiece model (on a sample of at most data.spm_max_sentences pairs) and streams every
corpus (cleaned by its filters) and evaluation set into an encoded store under runs/x/cache
(or data.cache_dir), exactly as `transformer train` would at start-up, which then finds
them ready. It prints the cleaning table (pairs each filter removed from each corpus, also
in runs/x/cleaning.txt) and each store. For a large corpus, run it once
before launching many training processes. With `init_from`, the tokenizers are that
checkpoint's, as training takes them.
"""

from __future__ import annotations

from pathlib import Path

from ..run.checkpoint import load_init_checkpoint, tokenizers_from_state
from ..run.config import TrainConfig
from ..run.data import load_data
from ..training.log import setup_logging
from . import hydra_command


def prepare(config: TrainConfig, run_dir: Path) -> None:
    """Build the run's tokenizer and stores, and print what each split holds."""
    cleanup = setup_logging(run_dir, rank=0)
    try:
        tokenizers = None
        if config.init_from is not None:
            path, state = load_init_checkpoint(config.init_from)
            tokenizers = tokenizers_from_state(state, path)
        data = load_data(config.data, run_dir, tokenizers=tokenizers)
    finally:
        cleanup()
    print(data.cleaning_table())
    named = [(f"train {name}", corpus) for name, corpus in
             zip(data.train.names, data.train.corpora, strict=True)]
    named += [(f"valid {name}", corpus) for name, corpus in data.valid_sets.items()]
    named += [(f"test {name}", corpus) for name, corpus in data.test_sets.items()]
    for label, corpus in named:
        print(f"{label}: {len(corpus):,} pairs, {len(corpus.src_ids):,} + "
              f"{len(corpus.tgt_ids):,} tokens -> {corpus.path}")


main = hydra_command(prepare)
