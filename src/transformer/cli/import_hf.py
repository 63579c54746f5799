"""Import a Hugging Face Marian model (OPUS-MT) as a run directory every command reads.

    transformer import-hf HF_DIR --output RUN_DIR

HF_DIR is a local directory as `save_pretrained` writes it (config.json, model.safetensors or
pytorch_model.bin, source.spm, target.spm, vocab.json, tokenizer_config.json). Writes
RUN_DIR/checkpoints/checkpoint_best.pt, so `transformer translate --checkpoint RUN_DIR`,
`serve`, `export` and `head-importance` take it, and `transformer train
init_from=RUN_DIR ...` fine-tunes it. Nothing is unpickled except through
`torch.load(weights_only=True)`; a configuration our model cannot compute exactly (e.g.
`normalize_embedding`) ends with one line naming the key. `python scripts/import_hf.py` is
the same command.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..deploy.hf import import_hf
from ..errors import CheckpointError
from ..run.checkpoint import BEST, save_checkpoint
from . import command_parser, report_errors


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__)
    p.add_argument("hf_dir", type=Path, metavar="HF_DIR",
                   help="a MarianMTModel directory as save_pretrained writes it")
    p.add_argument("--output", type=Path, required=True, metavar="RUN_DIR",
                   help="the run directory to write (its checkpoints/checkpoint_best.pt)")
    return p


def run(args: argparse.Namespace) -> None:
    path = args.output / "checkpoints" / BEST
    if path.exists():
        raise CheckpointError(f"{path} exists already: choose another --output")
    state = import_hf(args.hf_dir)
    save_checkpoint(state, path)
    c = state["model_config"]
    print(f"imported {args.hf_dir} ({c['num_encoder_layers']}+{c['num_decoder_layers']} "
          f"layers, d={c['num_hiddens']}, {c['activation']}, vocabulary "
          f"{c['tgt_vocab_size']:,}) -> {path}")


def main(argv: Sequence[str] | None = None) -> int:
    return report_errors(lambda: run(build_parser().parse_args(argv)))
