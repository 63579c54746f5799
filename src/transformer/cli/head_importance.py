"""Measure how much each attention head matters (Michel, Levy & Neubig, 2019).

    transformer head-importance --checkpoint RUN_DIR_OR_PT [--data valid|test]
        [--data-root DIR | --src FILE --ref FILE] [--max-sentences N]
        [--beam-size 1] [--output-dir DIR] [--device auto] [--threads N]

For every head of every attention layer (encoder self, decoder self, encoder-decoder):
the change in loss (cross-entropy per token) and BLEU when that head alone is masked, the
expected absolute gradient of the loss w.r.t. a gate on the head, and the mean entropy of
its attention (see transformer.tools.heads). BLEU decodes with beam search of --beam-size
(1, the default, is greedy search). Prints a table; writes head_importance.csv and
head_importance.png to --output-dir. `python scripts/head_importance.py` is the same command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from ..tools.attention_maps import attention_layers
from ..tools.heads import format_table, head_importance, plot_importance, write_csv
from . import command_parser, report_errors
from .options import add_evaluation_options, check_counts, load_for_evaluation


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__)
    p.add_argument("--checkpoint", required=True, metavar="RUN_DIR_OR_PT",
                   help="checkpoint file or run directory (its best checkpoint)")
    add_evaluation_options(p)
    p.add_argument("--beam-size", type=int, default=1,
                   help="beam size of the translations BLEU scores; 1 = greedy search")
    p.add_argument("--output-dir", type=Path, default=Path("head_importance"),
                   help="the directory to write head_importance.csv and .png to")
    return p


def run(args: argparse.Namespace) -> None:
    check_counts(args)
    evaluation = load_for_evaluation(args)
    translator, text = evaluation.translator, evaluation.text
    total = sum(layer.module.num_heads for layer in attention_layers(translator.model))
    with tqdm(total=total, unit="head", file=sys.stderr) as bar:
        report = head_importance(translator, text.src, text.tgt, beam_size=args.beam_size,
                                 max_tokens=args.max_tokens, on_head=lambda _: bar.update())
    print(format_table(report))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_csv(report, args.output_dir / "head_importance.csv")
    plot_importance(report, args.output_dir / "head_importance.png")
    print(f"wrote {args.output_dir / 'head_importance.csv'} and "
          f"{args.output_dir / 'head_importance.png'}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return report_errors(lambda: run(args))
