"""Back-translate monolingual target-side text into a synthetic parallel corpus.

    transformer backtranslate --checkpoint REVERSE_MODEL --input MONO --output OUT
        [--engine auto|torch|ctranslate2] [--quantize int8] [--sampling-topk 10] [--seed 1]
        [--beam-size N] [--chunk-lines 10000] [--max-tokens N] [--src-lang L] [--tgt-lang L]
        [--name bt] [--tag '<bt>'] [--weight 1.0] [--config-fragment FILE]

REVERSE_MODEL translates the target language into the source language (a run directory or
checkpoint, or an export directory, which CTranslate2 runs: the faster engine on a CPU).
MONO: target-language text, one sentence per line (plain or .gz). OUT: its translations,
one line per input line in order: the synthetic source of the corpus (OUT, MONO).

Decoding samples from the 10 most likely tokens with seed 1 (Edunov et al. 2018: sampling,
top-k 10 or unrestricted, beats beam search for back-translation); `--beam-size N` alone
searches a beam instead; the other decoding options are `transformer translate`'s.

Input is read and translated in chunks of `--chunk-lines`. An interrupted run resumes: run
the same command again. The translations grow in OUT.partial, and OUT.progress.json records
the input, the settings and the chunks done after each chunk is on disk; the next run goes
on after the last complete chunk, so no line is translated twice and none is lost, and each
chunk samples with a seed derived from (seed, chunk number), so the file is the same as an
uninterrupted run's (with our engine: CTranslate2 seeds its threads once per process). A
different input or setting is refused in one line (delete the two files to start over).
OUT appears, renamed from OUT.partial, only when complete.

At the end: lines written, seconds and sentences per second on stderr, and on stdout (or
`--config-fragment FILE`) the YAML to add the corpus to `data.corpora`, with `--name`,
`--weight` and `--tag` (`none`: untagged). List the real corpus there too.
`--src-lang`/`--tgt-lang` name the synthetic corpus's languages (OUT's and MONO's): where
the model records its languages, it must read the one and translate into the other, checked
before translating; they go into the corpus entry. Errors (an empty input, a model for the
wrong direction, a multilingual model without `--target-lang`, ...) print one line and exit
1, before translating. `python scripts/backtranslate.py` is the same command.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from ..decoding.translator import BaseTranslator
from ..errors import ConfigError
from ..files import atomic_write
from ..run.data_config import CorpusConfig
from ..tools.workflows import (
    BacktranslationSettings,
    backtranslate,
    corpus_fragment,
    count_input,
    resume_point,
)
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

SAMPLING_TOPK = 10  # Edunov et al. 2018's restricted sampling
SEED = 1


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        __doc__,
        epilog=f"Decoding samples (--sampling-topk {SAMPLING_TOPK} --seed {SEED}) unless "
               f"--beam-size alone asks for beam search. Run the same command again to "
               f"resume an interrupted run.")
    add_model_options(p, engines=True)
    p.add_argument("--input", type=Path, required=True, metavar="MONO",
                   help="target-language text, one sentence per line (plain or .gz)")
    p.add_argument("--output", type=Path, required=True, metavar="OUT",
                   help="the synthetic source: one translation per input line")
    add_decoding_options(p, nbest=False, alignments=False, seed=SEED)
    add_max_tokens(p)
    add_chunk_lines(p)
    corpus = p.add_argument_group("the corpus entry printed at the end")
    corpus.add_argument("--name", default="bt", help="its name")
    corpus.add_argument("--tag", default="<bt>",
                        help="the tag in front of its sources (none: no tag)")
    corpus.add_argument("--weight", type=float, default=1.0, help="its weight")
    corpus.add_argument("--src-lang", metavar="LANG",
                        help="OUT's language: the model must translate into it")
    corpus.add_argument("--tgt-lang", metavar="LANG",
                        help="MONO's language: the model must read it")
    corpus.add_argument("--config-fragment", type=Path, metavar="FILE",
                        help="write the entry's YAML to FILE instead of standard output")
    return p


def run(args: argparse.Namespace) -> None:
    _check_options(args)
    total = count_input(args.input)
    corpus = CorpusConfig(name=args.name, src=str(args.output.resolve()),
                          tgt=str(args.input.resolve()), weight=args.weight,
                          tag=None if args.tag == "none" else args.tag,
                          src_lang=args.src_lang, tgt_lang=args.tgt_lang)  # checked now
    translator = load_model(args)
    _check_languages(translator, args)
    request = decoding_request(_sampling_by_default(args), translator)
    settings = BacktranslationSettings(str(Path(args.checkpoint).resolve()),
                                       translator.engine, request, args.chunk_lines,
                                       args.max_tokens, translator.quantize)
    progress = resume_point(args.input, args.output, settings)
    seeds = " (each chunk's drawn from it and the chunk's number)" if request.sampling else ""
    resumed = f"; resuming after line {progress.lines:,}" if progress.lines else ""
    print(f"decoding: {describe_decoding(request, translator.decoding, args)}{seeds}"
          f"{resumed}", file=sys.stderr)
    with progress_bar(total, initial=progress.lines) as bar:
        report = backtranslate(translator, args.input, args.output, settings, progress,
                               on_progress=bar.update)
    earlier = f" ({report.resumed:,} of them by an earlier run)" if report.resumed else ""
    print(f"wrote {report.lines:,} lines to {args.output}{earlier} in {report.seconds:.1f} s "
          f"({report.per_second:.1f} sentences/s)", file=sys.stderr)
    _print_entry(corpus_fragment(corpus), args.config_fragment)


def _check_options(args: argparse.Namespace) -> None:
    """What the options alone can tell, before reading anything: `ConfigError` naming the
    option."""
    check_counts(args, "chunk_lines")
    check_outputs(args, ["input"], ["output", "config_fragment"])
    if None not in (args.src_lang, args.target_lang) and args.src_lang != args.target_lang:
        raise ConfigError(f"--target-lang {args.target_lang} is not --src-lang "
                          f"{args.src_lang}: the model translates into the corpus's source "
                          f"language")


def _print_entry(fragment: str, path: Path | None) -> None:
    """The corpus entry on stdout, or written to `path` (`--config-fragment`)."""
    if path is None:
        print(fragment, end="")
        return
    with atomic_write(path, text=True) as f:
        f.write(fragment)
    print(f"wrote the corpus entry to {path}", file=sys.stderr)


def _sampling_by_default(args: argparse.Namespace) -> argparse.Namespace:
    """The options with this command's defaults: sampling (top-k `SAMPLING_TOPK`) unless a
    sampling option or `--beam-size` is given, and seed `SEED` when sampling."""
    sampling = any(getattr(args, name) is not None
                   for name in ("sampling_topk", "sampling_topp", "temperature"))
    topk = args.sampling_topk
    if not sampling and args.beam_size is None:
        topk, sampling = SAMPLING_TOPK, True
    seed = SEED if sampling and args.seed is None else args.seed
    return argparse.Namespace(**{**vars(args), "sampling_topk": topk, "seed": seed})


def _check_languages(translator: BaseTranslator, args: argparse.Namespace) -> None:
    """`ConfigError` when the model records a language that `--tgt-lang` (what it must read)
    or `--src-lang` (what it must translate into) contradicts. What the model does not
    record is not checked."""
    reverse = "back-translation needs a model from MONO's language into OUT's"
    config = translator.training_config
    reads = sorted({c.src_lang for c in config.data.training_corpora()}) if config else []
    if args.tgt_lang is not None and reads and args.tgt_lang not in reads:
        raise ConfigError(f"the model translates from {', '.join(reads)}, not from --tgt-lang "
                          f"{args.tgt_lang}: {reverse}")
    into = translator.target_languages
    if args.src_lang is not None and into and args.src_lang not in into:
        raise ConfigError(f"the model translates into {', '.join(into)}, not into --src-lang "
                          f"{args.src_lang}: {reverse}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    return report_errors(lambda: run(args))
