"""Translate sentences with a trained model, and score them with sacrebleu.

    transformer translate --checkpoint RUN_DIR_OR_PT [--input FILE] [--output FILE]
        [--beam-size 5] [--nbest 1] [--max-tokens N] [--device auto] [--threads N]
        [--engine torch|ctranslate2] [--quantize int8] [--target-lang LANG] [--reference FILE]
        [--paper-protocol TOKENIZED_REFERENCE [--paper-lang de]]
        [--sampling-topk K] [--sampling-topp P] [--temperature T] [--seed S]
        [--prefix FILE] [--alignment [--alignment-layer L] [--alignment-head H]]
        [--constraints FILE [--ordered-constraints]]
    transformer translate --ensemble --checkpoint RUN_A RUN_B [...] ...
    transformer translate --checkpoint ... --input FILE --score --reference FILE
        [--target-lang LANG]

`--engine ctranslate2` translates with CTranslate2 from a directory written by
`transformer export` (given as `--checkpoint`), with the same options and output.
`--quantize int8` runs our engine's linear layers in int8 (PyTorch's dynamic quantization,
CPU only): translations close to float32's, not always the same; CTranslate2 chooses its
type at export instead (`transformer export --quantization int8`).

One translation per input line, in input order (an empty line gives an empty line). Beam
size and length penalty default to those stored in the checkpoint by
`transformer tune-decoding` (else beam 5, alpha 1.0); the settings used are printed on stderr.
`--target-lang` chooses the language a multilingual model translates (and `--score` scores)
into, one of those it was trained for, and must be given for such a model; a bilingual model
takes its own language or none.
`--output` appears only once complete (written atomically). With
`--nbest K`: K lines per input line, `LINE_NUMBER<TAB>SCORE<TAB>TRANSLATION`, best first.
With `--reference`: BLEU and chrF with their signatures on stderr, as the sacrebleu CLI
prints them (BLEU with `--tokenize none` for a model trained on Multi30k's tokenized files,
`data.tokenized`, whose translations are tokenized text). With `--paper-protocol`: BLEU as
published Multi30k results compute it (lowercased, Moses-normalized and -tokenized,
`--tokenize none`).

Several `--checkpoint`s are averaged (checkpoints of one training run); with `--ensemble`
they decode together instead (models sharing their tokenizers, e.g. trained with different
seeds; each step normalizes the mean of their log-probabilities: `model/ensemble.py`), with
the first one's decoding defaults; alignments come from the first one.

Modes: `--sampling-topk/--sampling-topp/--temperature` draw each translation at random
(back-translation; `--seed` makes it repeatable) instead of beam search. `--prefix FILE`:
line i's translation begins with line i of FILE (an empty line: no prefix).
`--constraints FILE`: line i's translation contains each phrase of line i of FILE (phrases
separated by tabs; an empty line: none), in any order, or in the given order with
`--ordered-constraints` (lexically constrained beam search: `decoding/constraints.py`); a
line none of whose hypotheses meets them within the length limit gets its best translation
without them, counted in a warning. `--alignment`
adds a tab and the word alignment (`0-0 1-2`, source word - output word) to each output
line, from the encoder-decoder attention of the last decoder layer averaged over heads (or
`--alignment-layer`/`--alignment-head`). `--score --reference FILE` translates nothing: it
prints for each input line the model's log-probability of the reference line as its
translation and the length-normalised score (as the search ranks), tab-separated.
Errors (bad checkpoint, unreadable input, an option out of range or options that do not go
together, missing sacremoses, ...) print one line and exit 1, before translating.
`python scripts/translate.py` is the same command.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from ..data.text import count_lines, iter_lines, open_binary, read_lines
from ..decoding.translator import BaseTranslator
from ..errors import ConfigError, DataError
from ..files import atomic_write
from . import command_parser, report_errors
from .options import (
    add_chunk_lines,
    add_decoding_options,
    add_max_tokens,
    add_model_options,
    check_counts,
    decoding_request,
    describe_decoding,
    load_model,
)
from .reports import bleu_report, paper_protocol, progress_bar, score_lines, translate_lines


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__)
    add_model_options(p, several=True, engines=True)
    p.add_argument("--input", type=Path, help="input file (default: standard input)")
    p.add_argument("--output", type=Path, help="output file (default: standard output)")
    add_decoding_options(p)
    add_max_tokens(p)
    add_chunk_lines(p)
    p.add_argument("--reference", type=Path, help="score the translations against this file")
    p.add_argument("--paper-protocol", type=Path, metavar="TOKENIZED_REFERENCE",
                   help="also score as published Multi30k results do: lowercase, normalize "
                        "punctuation and Moses-tokenize the translations (sacremoses), then "
                        "BLEU with --tokenize none against this already processed reference, "
                        "e.g. multi30k/tok/test_2016_flickr.lc.norm.tok.de")
    p.add_argument("--paper-lang", help="language for --paper-protocol's normalizer and "
                                        "tokenizer (default: the reference's file extension)")
    modes = p.add_argument_group("prefixes and scores")
    modes.add_argument("--prefix", type=Path, metavar="FILE",
                       help="one line per input line: text its translation must begin with")
    modes.add_argument("--constraints", type=Path, metavar="FILE",
                       help="one line per input line: the phrases (tab-separated) its "
                            "translation must contain; an empty line: none")
    modes.add_argument("--ordered-constraints", action="store_true",
                       help="a line's constraints must appear in their given order")
    modes.add_argument("--score", action="store_true",
                       help="print the log-probability and normalised score of each "
                            "--reference line as the translation of the input line")
    return p


def run(args: argparse.Namespace) -> None:
    _check_modes(args)
    if args.score:
        return run_score(args)
    references = read_lines(args.reference) if args.reference else None
    prefixes = read_lines(args.prefix) if args.prefix else None
    constraints = read_constraints(args.constraints) if args.constraints else None
    paper_refs = read_lines(args.paper_protocol) if args.paper_protocol else None
    interactive = args.input is None and sys.stdin.isatty()
    total = count_lines(args.input) if args.input else None
    for path, refs in ((args.reference, references), (args.paper_protocol, paper_refs),
                       (args.prefix, prefixes), (args.constraints, constraints)):
        if refs is not None and total is not None and total != len(refs):
            kind = ("--prefix" if path is args.prefix else "--constraints"
                    if path is args.constraints else "the reference")
            raise DataError(f"{kind} {path} has {len(refs)} lines but the input "
                            f"{args.input} has {total}")
    if paper_refs is not None:
        lang = _paper_lang(args)
        paper_protocol([], lang)  # fails now, not after translating, if sacremoses is missing
    translator = load_model(args)
    request = decoding_request(args, translator)
    mapped = translator.vocab_map  # CTranslate2 exports may have one
    print(f"decoding: {describe_decoding(request, translator.decoding, args)}"
          + (f", an ensemble of {len(args.checkpoint)} models" if args.ensemble else "")
          + (f", over the candidates of a vocabulary map ({mapped['source_pieces']:,} source "
             f"pieces)" if mapped else ""), file=sys.stderr)
    with contextlib.ExitStack() as stack:
        source = (stack.enter_context(open_binary(args.input)) if args.input
                  else sys.stdin.buffer)
        out = (stack.enter_context(atomic_write(args.output, text=True)) if args.output
               else sys.stdout)
        bar = stack.enter_context(progress_bar(total, disable=interactive))
        hypotheses = translate_lines(
            translator, iter_lines(source, str(args.input or "<stdin>")), out, request,
            chunk_lines=1 if interactive else args.chunk_lines, flush=interactive,
            keep=references is not None or paper_refs is not None, on_progress=bar.update,
            max_tokens=args.max_tokens, prefixes=prefixes, constraints=constraints)
    if references is not None:
        tokenize = _bleu_tokenize(translator)
        if tokenize == "none":
            print("scored with --tokenize none: the model was trained on tokenized text "
                  "(data.tokenized)", file=sys.stderr)
        for line in bleu_report(hypotheses, references, tokenize=tokenize):
            print(line, file=sys.stderr)
    if paper_refs is not None:
        print(f"paper protocol (lowercased, punctuation-normalized, Moses-tokenized, {lang}):",
              file=sys.stderr)
        tokenized = paper_protocol(hypotheses, lang)
        for line in bleu_report(tokenized, paper_refs, tokenize="none", chrf=False):
            print(line, file=sys.stderr)


def run_score(args: argparse.Namespace) -> None:
    """`--score`: forced decoding of each input line's reference line."""
    sources = read_lines(args.input)
    targets = read_lines(args.reference)
    if len(sources) != len(targets):
        raise DataError(f"the reference {args.reference} has {len(targets)} lines but the "
                        f"input {args.input} has {len(sources)}")
    translator = load_model(args)
    request = decoding_request(args, translator)
    alpha = request.alpha
    into = f" into {request.target_lang}" if request.target_lang else ""
    print(f"scoring {len(sources):,} translations{into}: log-prob and log-prob / length "
          f"penalty (alpha {alpha:g})", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        out = (stack.enter_context(atomic_write(args.output, text=True)) if args.output
               else sys.stdout)
        bar = stack.enter_context(progress_bar(len(sources), unit="pair"))
        score_lines(translator, sources, targets, out, alpha=alpha,
                    chunk_lines=args.chunk_lines, max_tokens=args.max_tokens,
                    target_lang=request.target_lang, on_progress=bar.update)


def read_constraints(path: Path) -> list[list[str]]:
    """A constraints file: per line its phrases, separated by tabs ([] for an empty
    line)."""
    return [line.split("\t") if line.strip() else [] for line in read_lines(path)]


def _bleu_tokenize(translator: BaseTranslator) -> str:
    """sacrebleu's tokenizer for `--reference`: "none" for a model trained on Multi30k's
    tokenized files (`data.tokenized`: its translations are lowercased tokenized text, scored
    as published results score them), else 13a (also where the model does not record its
    training config, e.g. an imported one)."""
    config = translator.training_config
    return "none" if config is not None and config.data.tokenized else "13a"


def _paper_lang(args: argparse.Namespace) -> str:
    lang = args.paper_lang or args.paper_protocol.suffix.removeprefix(".")
    if not (lang.isalpha() and len(lang) == 2):  # an ISO 639-1 code, as Moses uses
        raise DataError(f"cannot tell the language of {args.paper_protocol} from its extension; "
                        f"give --paper-lang (e.g. de)")
    return lang


def _check_modes(args: argparse.Namespace) -> None:
    """Options of this command that cannot go together: `ConfigError` naming the option.
    (The decoding options are checked together, as one request, once the model is
    loaded.)"""
    check_counts(args, "chunk_lines")
    if args.score:
        if args.reference is None or args.input is None:
            raise ConfigError("--score needs --input and --reference (the translations to "
                              "score)")
        sampling = [name for name in ("--sampling-topk", "--sampling-topp", "--temperature")
                    if getattr(args, name[2:].replace("-", "_")) is not None]
        others = [name for name, given in (
            ("--paper-protocol", args.paper_protocol), ("--prefix", args.prefix),
            ("--constraints", args.constraints),
            ("--alignment", args.alignment), ("--nbest", args.nbest > 1),
            (sampling[0] if sampling else "", sampling)) if given]
        if others:
            raise ConfigError(f"--score scores given translations: it excludes {others[0]}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    return report_errors(lambda: run(args))
