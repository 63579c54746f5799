"""Draw a model's attention maps for one sentence: one PNG per attention layer.

    transformer attention-maps --checkpoint RUN_DIR_OR_PT --source "A man rides a bike."
        [--target "Ein Mann fährt Fahrrad."] --output-dir DIR [--beam-size 5] [--device auto]

Without --target the source is translated with beam search first. The pair then runs
through the model once, teacher-forced, and DIR gets `enc-self-<i>.png`, `dec-self-<i>.png`
and `enc-dec-<i>.png` (layer i, one panel per head, axes labelled with the SentencePiece
pieces; decoder rows show the token each position predicts).
`python scripts/attention_maps.py` is the same command.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from .. import hardware
from ..decoding.translator import Translator
from ..tools.attention_maps import write_attention_maps
from . import command_parser, report_errors
from .options import add_device_options, check_counts


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__)
    p.add_argument("--checkpoint", required=True, metavar="RUN_DIR_OR_PT",
                   help="checkpoint file or run directory (its best checkpoint)")
    p.add_argument("--source", required=True, help="the source sentence")
    p.add_argument("--target", help="the target sentence (default: the model's translation)")
    p.add_argument("--output-dir", type=Path, required=True,
                   help="the directory to write the PNGs to (made if missing)")
    p.add_argument("--beam-size", type=int, default=5,
                   help="beam size for translating the source (without --target)")
    add_device_options(p)
    return p


def run(args: argparse.Namespace) -> None:
    check_counts(args)
    if args.threads:
        hardware.set_threads(args.threads)
    translator = Translator.load(args.checkpoint, args.device)
    target = args.target
    if target is None:
        target = translator.translate([args.source], beam_size=args.beam_size)[0]
    print(f"source: {args.source}\ntarget: {target}")
    for path in write_attention_maps(translator.model, translator.tokenizers, args.source,
                                     target, args.output_dir):
        print(path)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return report_errors(lambda: run(args))
