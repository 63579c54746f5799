"""Distill a teacher's translations into a student's training corpus (best of n by chrF).

    transformer distill --checkpoint TEACHER --source SRC --reference REF --output OUT
        [--nbest 8] [--beam-size N] [--drop-worst 0.0 [--output-source FILE]]
        [--engine torch|ctranslate2] [--quantize int8] [--chunk-lines 10000] [--max-tokens N]
        [--alpha A] [--target-lang LANG]

Sequence-level knowledge distillation (Kim and Rush 2016): the teacher translates each line
of SRC with beam search (`--beam-size`, default `--nbest`) into its `--nbest` best
translations, and the one with the highest sentence chrF against the line of REF is kept
(sacrebleu's `sentence_chrf`; mozilla/translations' rule). OUT gets one kept translation
per line of SRC: the student trains on (SRC, OUT). `--drop-worst P` drops the share P of
lines whose kept translation scores the lowest chrF; `--output-source FILE` (required then)
gets their source lines, so that (FILE, OUT) stays line-aligned.

SRC and REF are read in chunks (`--chunk-lines`); OUT (and FILE) appear only when complete.
At the end on stderr: lines, seconds, sentences per second, and the mean sentence chrF of
the kept translations and of the teacher's 1-best, for comparison. Errors (SRC and REF of
different lengths, an empty file, `--drop-worst` outside [0, 1), ...) print one line and
exit 1, before translating. `python scripts/distill.py` is the same command.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from ..tools.workflows import count_input, distill
from . import command_parser, report_errors
from .options import (
    add_chunk_lines,
    add_decoding_options,
    add_max_tokens,
    add_model_options,
    check_counts,
    check_outputs,
    decoding_request,
    describe_decoding,
    load_model,
)
from .reports import progress_bar

NBEST = 8


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        __doc__,
        epilog=f"--nbest defaults to {NBEST} (the hypotheses scored by chrF), --beam-size to "
               f"--nbest.")
    add_model_options(p, several=True, engines=True)
    p.add_argument("--source", type=Path, required=True, metavar="SRC",
                   help="the source side of the corpus, one sentence per line")
    p.add_argument("--reference", type=Path, required=True, metavar="REF",
                   help="its target side (the human translations), line-aligned with SRC")
    p.add_argument("--output", type=Path, required=True, metavar="OUT",
                   help="the kept translation of each (kept) line")
    p.add_argument("--output-source", type=Path, metavar="FILE",
                   help="the source lines of the kept translations (required with "
                        "--drop-worst)")
    p.add_argument("--drop-worst", type=float, default=0.0, metavar="P",
                   help="drop the share P in [0, 1) of lines with the lowest chrF")
    add_decoding_options(p, sampling=False, alignments=False)
    p.set_defaults(nbest=NBEST)
    add_max_tokens(p)
    add_chunk_lines(p)
    return p


def run(args: argparse.Namespace) -> None:
    check_counts(args, "chunk_lines")
    check_outputs(args, ["source", "reference"], ["output", "output_source"])
    if not 0 <= args.drop_worst < 1:
        raise ConfigError(f"--drop-worst must be in [0, 1), got {args.drop_worst}")
    if args.drop_worst > 0 and args.output_source is None:
        raise ConfigError("--drop-worst drops lines: give --output-source FILE for their "
                          "source lines, so that the pairs stay aligned")
    total = count_input(args.source, args.reference)
    translator = load_model(args)
    beam = args.nbest if args.beam_size is None else args.beam_size
    options = argparse.Namespace(**{**vars(args), "beam_size": beam})
    request = decoding_request(options, translator)
    print(f"decoding: {describe_decoding(request, translator.decoding, options)}, the "
          f"{request.nbest} best scored by chrF", file=sys.stderr)
    with progress_bar(total) as bar:
        report = distill(translator, args.source, args.reference, args.output, request,
                         drop_worst=args.drop_worst, output_source=args.output_source,
                         chunk_lines=args.chunk_lines, max_tokens=args.max_tokens,
                         on_progress=bar.update)
    kept = (f"; kept {report.kept:,} (mean chrF {report.kept_chrf:.1f}), dropped the worst "
            f"{args.drop_worst:.0%}" if args.drop_worst else "")
    print(f"wrote {report.kept:,} lines to {args.output} in {report.seconds:.1f} s "
          f"({report.per_second:.1f} sentences/s); mean sentence chrF of the {report.lines:,} "
          f"lines: chosen {report.chosen_chrf:.1f}, the teacher's 1-best "
          f"{report.first_chrf:.1f}{kept}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    return report_errors(lambda: run(args))
