"""Translate sentences with a trained model, and score them with sacrebleu.

    transformer translate --checkpoint RUN_DIR_OR_PT [--input FILE] [--output FILE]
        [--beam-size 5] [--nbest 1] [--max-tokens N] [--device auto] [--threads N]
        [--engine torch|ctranslate2] [--reference FILE]
        [--paper-protocol TOKENIZED_REFERENCE [--paper-lang de]]
        [--sampling-topk K] [--sampling-topp P] [--temperature T] [--seed S]
        [--prefix FILE] [--alignment [--alignment-layer L] [--alignment-head H]]
    transformer translate --checkpoint ... --input FILE --score --reference FILE

`--engine ctranslate2` translates with CTranslate2 from a directory written by
`transformer export` (given as `--checkpoint`), with the same options and output.

One translation per input line, in input order (an empty line gives an empty line). Beam
size and length penalty default to those stored in the checkpoint by
`transformer tune-decoding` (else beam 5, alpha 1.0); the settings used are printed on stderr.
`--output` appears only once complete (written atomically). With
`--nbest K`: K lines per input line, `LINE_NUMBER<TAB>SCORE<TAB>TRANSLATION`, best first.
With `--reference`: BLEU and chrF with their signatures on stderr, as the sacrebleu CLI
prints them. With `--paper-protocol`: BLEU as published Multi30k results compute it
(lowercased, Moses-normalized and -tokenized, `--tokenize none`).

Modes: `--sampling-topk/--sampling-topp/--temperature` draw each translation at random
(back-translation; `--seed` makes it repeatable) instead of beam search. `--prefix FILE`:
line i's translation begins with line i of FILE (an empty line: no prefix). `--alignment`
adds a tab and the word alignment (`0-0 1-2`, source word - output word) to each output
line, from the encoder-decoder attention of the last decoder layer averaged over heads (or
`--alignment-layer`/`--alignment-head`). `--score --reference FILE` translates nothing: it
prints for each input line the model's log-probability of the reference line as its
translation and the length-normalised score (as the search ranks), tab-separated.
Errors (bad checkpoint,
unreadable input, missing sacremoses, ...) print one line and exit 1, before translating.
`python scripts/translate.py` is the same command.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..alignment import AlignmentOptions
from ..config import DecodingSettings
from ..engines import ENGINES, load_translator
from ..errors import ConfigError, DataError
from ..files import atomic_write
from ..search import DEFAULT_MAX_TOKENS, Sampling
from ..text import iter_lines, read_lines
from ..translator import (
    BaseTranslator,
    bleu_report,
    paper_protocol,
    score_lines,
    translate_lines,
)
from . import report_errors


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", nargs="+", required=True, metavar="RUN_DIR_OR_PT",
                   help="checkpoint file or run directory (its best checkpoint); several are "
                        "averaged. With --engine ctranslate2: an export directory")
    p.add_argument("--engine", choices=ENGINES, default="torch",
                   help="torch (our PyTorch model, default) or ctranslate2 (a model exported by "
                        "transformer export; needs the export extra, ctranslate2)")
    p.add_argument("--input", type=Path, help="input file (default: standard input)")
    p.add_argument("--output", type=Path, help="output file (default: standard output)")
    p.add_argument("--beam-size", type=int,
                   help="default: the checkpoint's chosen beam size, else 5")
    p.add_argument("--nbest", type=int, default=1, help="translations per input line")
    p.add_argument("--alpha", type=float,
                   help="length-penalty exponent (GNMT); 0 ranks by plain log-prob (default: "
                        "the checkpoint's chosen alpha, else 1.0)")
    p.add_argument("--max-len-a", type=float,
                   help="outputs have at most a * source_len + b tokens (default 1.5)")
    p.add_argument("--max-len-b", type=int, help="(default 10)")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help="source tokens per batch (padding included, before the beam)")
    p.add_argument("--chunk-lines", type=int, default=10_000,
                   help="input lines read, sorted and translated at a time")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--threads", type=int,
                   help="CPU threads (default: the engine's); on a busy shared machine 1 can "
                        "be many times faster, as decoding runs many small operations")
    p.add_argument("--reference", type=Path, help="score the translations against this file")
    p.add_argument("--paper-protocol", type=Path, metavar="TOKENIZED_REFERENCE",
                   help="also score as published Multi30k results do: lowercase, normalize "
                        "punctuation and Moses-tokenize the translations (sacremoses), then "
                        "BLEU with --tokenize none against this already processed reference, "
                        "e.g. multi30k/tok/test_2016_flickr.lc.norm.tok.de")
    p.add_argument("--paper-lang", help="language for --paper-protocol's normalizer and "
                                        "tokenizer (default: the reference's file extension)")
    sampling = p.add_argument_group("sampling (instead of beam search)")
    sampling.add_argument("--sampling-topk", type=int, metavar="K",
                          help="draw from the K most likely tokens (0: all; 1: greedy)")
    sampling.add_argument("--sampling-topp", type=float, metavar="P",
                          help="draw from the most likely tokens that make up probability P")
    sampling.add_argument("--temperature", type=float, metavar="T",
                          help="divide the logits by T before drawing (default 1)")
    sampling.add_argument("--seed", type=int, help="seed of the draws (default 0)")
    modes = p.add_argument_group("prefixes, alignments, scores")
    modes.add_argument("--prefix", type=Path, metavar="FILE",
                       help="one line per input line: text its translation must begin with")
    modes.add_argument("--alignment", action="store_true",
                       help="add each translation's word alignment (i-j pairs) after a tab")
    modes.add_argument("--alignment-layer", type=int, default=-1, metavar="L",
                       help="decoder layer whose encoder-decoder attention aligns "
                            "(default -1: the last)")
    modes.add_argument("--alignment-head", type=int, metavar="H",
                       help="one head of that layer (default: the average over heads)")
    modes.add_argument("--score", action="store_true",
                       help="print the log-probability and normalised score of each "
                            "--reference line as the translation of the input line")
    return p


def _count_lines(path: Path) -> int:
    """Lines of a file, a last line without "\\n" included, read in blocks."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def run(args: argparse.Namespace) -> None:
    if args.score:
        return run_score(args)
    references = read_lines(args.reference) if args.reference else None
    prefixes = read_lines(args.prefix) if args.prefix else None
    paper_refs = read_lines(args.paper_protocol) if args.paper_protocol else None
    interactive = args.input is None and sys.stdin.isatty()
    total = _count_lines(args.input) if args.input else None
    for path, refs in ((args.reference, references), (args.paper_protocol, paper_refs),
                       (args.prefix, prefixes)):
        if refs is not None and total is not None and total != len(refs):
            kind = "--prefix" if path is args.prefix else "the reference"
            raise DataError(f"{kind} {path} has {len(refs)} lines but the input "
                            f"{args.input} has {total}")
    if paper_refs is not None:
        lang = _paper_lang(args)
        paper_protocol([], lang)  # fails now, not after translating, if sacremoses is missing
    translator = load_translator(args.checkpoint, args.engine, device=args.device,
                                 threads=args.threads)
    settings = translator.settings(beam_size=args.beam_size, alpha=args.alpha,
                                   max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    sampling, alignment = _sampling(args), _alignment(args, translator)
    mapped = translator.vocab_map  # CTranslate2 exports may have one
    print(f"decoding: {_describe(settings, translator.decoding, args, sampling)}"
          + (f", over the candidates of a vocabulary map ({mapped['source_pieces']:,} source "
             f"pieces)" if mapped else ""), file=sys.stderr)
    if sampling is None and args.nbest > settings.beam_size:
        raise DataError(f"--nbest {args.nbest} is larger than the beam size "
                        f"{settings.beam_size}")
    with contextlib.ExitStack() as stack:
        source = (stack.enter_context(open(args.input, "rb")) if args.input
                  else sys.stdin.buffer)
        out = (stack.enter_context(atomic_write(args.output, text=True)) if args.output
               else sys.stdout)
        bar = stack.enter_context(tqdm(total=total, unit="sent", disable=interactive,
                                       file=sys.stderr, dynamic_ncols=True))
        stack.enter_context(logging_redirect_tqdm())
        hypotheses = translate_lines(
            translator, iter_lines(source, str(args.input or "<stdin>")), out,
            chunk_lines=1 if interactive else args.chunk_lines, flush=interactive,
            keep=references is not None or paper_refs is not None, on_progress=bar.update,
            nbest=args.nbest, beam_size=settings.beam_size, alpha=settings.alpha,
            max_tokens=args.max_tokens, max_len_a=settings.max_len_a,
            max_len_b=settings.max_len_b, sampling=sampling, prefixes=prefixes,
            alignment=alignment)
    if references is not None:
        for line in bleu_report(hypotheses, references):
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
    translator = load_translator(args.checkpoint, args.engine, device=args.device,
                                 threads=args.threads)
    alpha = translator.settings(alpha=args.alpha).alpha
    print(f"scoring {len(sources):,} translations: log-prob and log-prob / length penalty "
          f"(alpha {alpha:g})", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        out = (stack.enter_context(atomic_write(args.output, text=True)) if args.output
               else sys.stdout)
        bar = stack.enter_context(tqdm(total=len(sources), unit="pair", file=sys.stderr,
                                       dynamic_ncols=True))
        score_lines(translator, sources, targets, out, chunk_lines=args.chunk_lines,
                    on_progress=bar.update, alpha=alpha, max_tokens=args.max_tokens)


def _sampling(args: argparse.Namespace) -> Sampling | None:
    """The sampling options given, or None: beam search."""
    if args.sampling_topk is None and args.sampling_topp is None and args.temperature is None:
        return None
    return Sampling(topk=0 if args.sampling_topk is None else args.sampling_topk,
                    topp=1.0 if args.sampling_topp is None else args.sampling_topp,
                    temperature=1.0 if args.temperature is None else args.temperature,
                    seed=args.seed or 0)


def _alignment(args: argparse.Namespace, translator: BaseTranslator) -> AlignmentOptions | None:
    """The alignment options, checked against the model's layers and heads."""
    if not args.alignment:
        return None
    options = AlignmentOptions(args.alignment_layer, args.alignment_head)
    c = translator.model_config
    layer = options.layer % c.num_decoder_layers if -c.num_decoder_layers <= options.layer \
        < c.num_decoder_layers else None
    if layer is None:
        raise ConfigError(f"--alignment-layer must be in [{-c.num_decoder_layers}, "
                          f"{c.num_decoder_layers}) for this model, got {options.layer}")
    pruned = c.pruned_heads.get(f"decoder.blks.{layer}.attention2", [])
    heads = [h for h in range(c.num_heads + len(pruned)) if h not in pruned]
    if options.head is not None and options.head not in heads:
        raise ConfigError(f"--alignment-head {options.head} is not a head of decoder layer "
                          f"{layer} (heads {heads})")
    return options


def _describe(settings: DecodingSettings, stored: DecodingSettings,
              args: argparse.Namespace, sampling: Sampling | None = None) -> str:
    """E.g. "beam 5, alpha 2.5 (from the checkpoint), max length 1.5 * source + 10"."""
    def origin(name: str) -> str:
        given = getattr(args, name) is not None
        chosen = getattr(stored, name) != getattr(DecodingSettings(), name)
        return "" if given or not chosen else " (from the checkpoint)"

    search = (f"beam {settings.beam_size}{origin('beam_size')}" if sampling is None else
              f"sampling (top-k {sampling.topk or 'all'}, top-p {sampling.topp:g}, "
              f"temperature {sampling.temperature:g}, seed {sampling.seed})")
    return (f"{search}, alpha {settings.alpha:g}{origin('alpha')}, max length "
            f"{settings.max_len_a:g} * source + {settings.max_len_b}")


def _paper_lang(args: argparse.Namespace) -> str:
    lang = args.paper_lang or args.paper_protocol.suffix.removeprefix(".")
    if not (lang.isalpha() and len(lang) == 2):  # an ISO 639-1 code, as Moses uses
        raise DataError(f"cannot tell the language of {args.paper_protocol} from its extension; "
                        f"give --paper-lang (e.g. de)")
    return lang


def _check_modes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options that cannot go together, or out of range: one line naming the option."""
    sampling = [name for name in ("--sampling-topk", "--sampling-topp", "--temperature")
                if getattr(args, name[2:].replace("-", "_")) is not None]
    if args.temperature is not None and args.temperature <= 0:
        parser.error("--temperature must be > 0 (greedy search: --beam-size 1)")
    if args.sampling_topk is not None and args.sampling_topk < 0:
        parser.error("--sampling-topk must be >= 0 (0: all tokens)")
    if args.sampling_topp is not None and not 0 < args.sampling_topp <= 1:
        parser.error("--sampling-topp must be in (0, 1]")
    if args.seed is not None and not sampling:
        parser.error("--seed seeds sampling: give --sampling-topk, --sampling-topp or "
                     "--temperature too")
    if sampling and (args.beam_size not in (None, 1) or args.nbest > 1):
        parser.error(f"{sampling[0]} draws one translation per line: it excludes "
                     f"--beam-size and --nbest")
    if (args.alignment_layer != -1 or args.alignment_head is not None) and not args.alignment:
        parser.error("--alignment-layer and --alignment-head need --alignment")
    if args.score:
        if args.reference is None or args.input is None:
            parser.error("--score needs --input and --reference (the translations to score)")
        others = [name for name, given in (
            ("--paper-protocol", args.paper_protocol), ("--prefix", args.prefix),
            ("--alignment", args.alignment), ("--nbest", args.nbest > 1),
            (sampling[0] if sampling else "", sampling)) if given]
        if others:
            parser.error(f"--score scores given translations: it excludes {others[0]}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (min(args.max_tokens, args.chunk_lines, args.nbest) < 1
            or (args.beam_size is not None and args.beam_size < 1)
            or (args.alpha is not None and args.alpha < 0)):
        parser.error("--beam-size, --nbest, --max-tokens, --chunk-lines must be >= 1, "
                     "--alpha >= 0")
    if args.beam_size is not None and args.nbest > args.beam_size:
        parser.error("--nbest must be between 1 and --beam-size")
    _check_modes(parser, args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    return report_errors(lambda: run(args))
