"""Options that several commands share, declared once: the model to load (`--checkpoint`,
`--engine`, `--quantize`, `--device`, `--threads`), `--max-tokens`, the decoding options
(the fields of `request.DecodingRequest`, spelled as options: `nbest` is `--nbest`,
`target_lang` `--target-lang`; `describe_decoding` says what a request does), and the
evaluation data of the commands that score a model (`--data`, `--src`, `--ref`, ...); the
checks several commands make of their options (`check_counts`, `check_outputs`).

    add_model_options(parser)                      # then: load_model(args)
    add_decoding_options(parser)                   # then: decoding_request(args, translator)
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import hardware
from ..data.text import ParallelText
from ..decoding.corpus import DEFAULT_MAX_TOKENS
from ..decoding.request import OPTIONS, QUANTIZE, DecodingRequest, option_name
from ..decoding.translator import BaseTranslator, Translator
from ..deploy.engines import ENGINES, load_translator
from ..errors import ConfigError
from ..run.config import DecodingSettings
from ..tools.evaluation import evaluation_text

__all__ = ["add_model_options", "add_device_options", "add_max_tokens", "add_chunk_lines",
           "check_counts", "check_outputs", "load_model", "add_decoding_options",
           "decoding_request", "describe_decoding", "add_evaluation_options", "Evaluation",
           "load_for_evaluation"]



def add_model_options(parser: argparse.ArgumentParser, *, several: bool = False,
                      engines: bool = False) -> None:
    """`--checkpoint` (one, or with `several` several to average, or with `--ensemble` to
    decode together), with `engines` `--engine` (whose export `--checkpoint` then names),
    `--quantize` (our engine's int8 layers), and `add_device_options`."""
    parser.add_argument("--checkpoint", nargs="+" if several else None, required=True,
                        metavar="RUN_DIR_OR_PT",
                        help="checkpoint file or run directory (its best checkpoint)"
                             + ("; several (of one training run) are averaged, or with "
                                "--ensemble decoded together" if several else "")
                             + (", or an export directory (transformer export)"
                                if engines else ""))
    if several:
        parser.add_argument("--ensemble", action="store_true",
                            help="decode with every --checkpoint at once (models sharing "
                                 "their tokenizers, e.g. trained with different seeds): "
                                 "each step takes the mean of their next-token "
                                 "probabilities; the torch engine only")
    if engines:
        parser.add_argument("--engine", choices=("auto", *ENGINES), default="auto",
                            help="auto (ctranslate2 for an export directory, else torch), "
                                 "torch (our PyTorch model) or ctranslate2 (a model exported "
                                 "by transformer export; needs the export extra)")
    parser.add_argument("--quantize", choices=QUANTIZE,
                        help="int8: our engine's linear layers in int8 (PyTorch's dynamic "
                             "quantization; CPU only), translations close to float32's; "
                             "CTranslate2 chooses its type at export (transformer export "
                             "--quantization int8)")
    parser.add_argument("--workers", type=int, default=0,
                        help="our engine (torch): beam search and sampling in this many "
                             "processes of one CPU thread each, which search a request's "
                             "batches, or pieces of them, side by side (faster than threads "
                             "for requests of a few lines to a few hundred; each process "
                             "loads its own copy of the model when the command starts); "
                             "0: in this process")
    add_device_options(parser)


def add_device_options(parser: argparse.ArgumentParser) -> None:
    """`--device` and `--threads`: where the model runs."""
    parser.add_argument("--device", default="auto",
                        help="where the model runs: auto (CUDA if present, else the CPU), cpu, "
                             "cuda, cuda:1, ...")
    parser.add_argument("--threads", type=int,
                        help="CPU threads (default: the engine's); on a busy shared machine 1 "
                             "can be many times faster, as decoding runs many small operations")


def add_max_tokens(parser: argparse.ArgumentParser,
                   default: int = DEFAULT_MAX_TOKENS) -> None:
    """`--max-tokens`: source tokens per batch."""
    parser.add_argument("--max-tokens", type=int, default=default,
                        help="source tokens per batch (padding included, before the beam)")


def add_chunk_lines(parser: argparse.ArgumentParser) -> None:
    """`--chunk-lines`: input lines read and translated at a time (memory stays bounded)."""
    parser.add_argument("--chunk-lines", type=int, default=10_000,
                        help="input lines read, sorted and translated at a time")


MAX_COUNT = 2 ** 31 - 1  # threads, tokens or lines at a time: beyond any machine


def check_counts(args: argparse.Namespace, *names: str) -> None:
    """`--threads`, `--max-tokens` and the options `names` (e.g. "chunk_lines"), where a
    command has them, are in [1, MAX_COUNT]: `ConfigError` naming the option (exit 1)."""
    for name in ("threads", "max_tokens", *names):
        value = getattr(args, name, None)
        if value is not None and not 1 <= value <= MAX_COUNT:
            raise ConfigError(f"{option_name(name)} must be in [1, {MAX_COUNT}], got {value}")


def check_outputs(args: argparse.Namespace, inputs: Sequence[str],
                  outputs: Sequence[str]) -> None:
    """The files of the options `outputs` (e.g. "output") are not those of `inputs` nor of
    each other (where given): `ConfigError` naming both options, before the command
    overwrites what it reads."""
    seen: dict[Path, str] = {}
    for name in (*inputs, *outputs):
        path = getattr(args, name)
        if path is None:
            continue
        other = seen.setdefault(Path(path).resolve(), name)
        if other != name:
            raise ConfigError(f"{option_name(name)} and {option_name(other)} name the same "
                              f"file, {path}")


def load_model(args: argparse.Namespace) -> BaseTranslator:
    """The translator `add_model_options`' options name (`engines.load_translator`)."""
    return load_translator(args.checkpoint, getattr(args, "engine", "torch"),
                           device=args.device, threads=args.threads, quantize=args.quantize,
                           ensemble=getattr(args, "ensemble", False),
                           workers=getattr(args, "workers", 0))


def add_decoding_options(parser: argparse.ArgumentParser, *, nbest: bool = True,
                         sampling: bool = True, alignments: bool = True,
                         seed: int = 0) -> None:
    """The decoding request's options: the search (`--beam-size`, with `nbest` `--nbest`,
    `--alpha`, `--max-len-a`, `--max-len-b`, each left out: the checkpoint's chosen value,
    else the default), the language to translate into (`--target-lang`), and with
    `sampling` and `alignments` those modes' options. A command leaves out what it cannot
    write (`decoding_request` takes the default of an option the parser lacks). `seed`: the
    default `--seed`'s help names (a command whose default is not the request's 0 fills it
    in itself)."""
    p, default = parser, DecodingSettings()
    p.add_argument("--beam-size", type=int,
                   help=f"hypotheses kept at each step (default: the checkpoint's chosen beam "
                        f"size, else {default.beam_size})")
    if nbest:
        p.add_argument("--nbest", type=int, default=1, help="translations per input line")
    p.add_argument("--alpha", type=float,
                   help=f"length-penalty exponent (GNMT); 0 ranks by plain log-prob (default: "
                        f"the checkpoint's chosen alpha, else {default.alpha})")
    p.add_argument("--max-len-a", type=float,
                   help=f"outputs have at most a * source_len + b tokens (default: the "
                        f"checkpoint's, else {default.max_len_a})")
    p.add_argument("--max-len-b", type=int,
                   help=f"the b of that limit (default: the checkpoint's, else "
                        f"{default.max_len_b})")
    p.add_argument("--target-lang", metavar="LANG",
                   help="the language to translate into, e.g. de: required by a multilingual "
                        "model (one of those it was trained for); a bilingual one takes its "
                        "own (default: the model's only target language)")
    if sampling:
        drawn = p.add_argument_group("sampling (instead of beam search)")
        drawn.add_argument("--sampling-topk", type=int, metavar="K",
                           help="draw from the K most likely tokens (0: all; 1: greedy)")
        drawn.add_argument("--sampling-topp", type=float, metavar="P",
                           help="draw from the most likely tokens that make up probability P")
        drawn.add_argument("--temperature", type=float, metavar="T",
                           help="divide the logits by T before drawing (default: 1)")
        drawn.add_argument("--seed", type=int, help=f"seed of the draws (default: {seed})")
    if not alignments:
        return
    aligned = p.add_argument_group("alignments")
    aligned.add_argument("--alignment", action="store_true",
                         help="add each translation's word alignment (i-j pairs) after a tab")
    aligned.add_argument("--alignment-layer", type=int, metavar="L",
                         help="decoder layer whose encoder-decoder attention aligns "
                              "(default: -1, the last)")
    aligned.add_argument("--alignment-head", type=int, metavar="H",
                         help="one head of that layer (default: the average over heads)")


def decoding_request(args: argparse.Namespace, translator: BaseTranslator) -> DecodingRequest:
    """The request `add_decoding_options`' options ask for, over the translator's defaults
    and checked against it (`RequestError`, which `report_errors` prints naming the option:
    `--nbest`)."""
    options = {name: getattr(args, name) for name in OPTIONS if hasattr(args, name)}
    return translator.request(DecodingRequest.from_options(translator.decoding, **options))


def describe_decoding(request: DecodingRequest, stored: DecodingSettings,
                      args: argparse.Namespace) -> str:
    """How `request` decodes, for a command's first stderr line: e.g. "beam 5, alpha 2.5
    (from the checkpoint), max length 1.5 * source + 10", and "into de" where a target
    language is named (`stored`: the checkpoint's defaults; `args`: the options given)."""
    def origin(name: str) -> str:
        given = getattr(args, name) is not None
        chosen = getattr(stored, name) != getattr(DecodingSettings(), name)
        return "" if given or not chosen else " (from the checkpoint)"

    sampling = request.sampling
    search = (f"beam {request.beam_size}{origin('beam_size')}" if sampling is None else
              f"sampling (top-k {sampling.topk or 'all'}, top-p {sampling.topp:g}, "
              f"temperature {sampling.temperature:g}, seed {sampling.seed})")
    into = f", into {request.target_lang}" if request.target_lang else ""
    return (f"{search}, alpha {request.alpha:g}{origin('alpha')}, max length "
            f"{request.max_len_a:g} * source + {request.max_len_b}{into}")


def add_evaluation_options(parser: argparse.ArgumentParser,
                           splits: Sequence[str] = ("valid", "test"),
                           max_tokens: int = 4096) -> None:
    """The evaluation-data options of the commands that evaluate a model
    (`evaluation.evaluation_text`), `--max-tokens` and `add_device_options`; `splits` are
    the splits `--data` may name."""
    p = parser
    p.add_argument("--data", choices=tuple(splits), default="valid",
                   help="the run's split (its data=files paths or Multi30k language pair)")
    p.add_argument("--data-root", help="folder of the Multi30k .gz files (default: the run's "
                                       "data.root, else the download cache)")
    p.add_argument("--src", type=Path, help="source file (instead of --data)")
    p.add_argument("--ref", type=Path, help="reference file (instead of --data)")
    p.add_argument("--max-sentences", type=int, help="use only the first N sentences")
    p.add_argument("--set", metavar="NAME",
                   help="one named set of the run's (data.valid_sets / data.test_sets); "
                        "default: tune-decoding every set (their mean BLEU), the others the "
                        "first")
    add_max_tokens(p, max_tokens)
    add_device_options(p)


@dataclass
class Evaluation:
    """What an evaluation command starts with."""

    translator: Translator  # the model, tokenizers, decoding defaults and training config
    text: ParallelText  # the sentence pairs to evaluate on


def load_for_evaluation(args: argparse.Namespace) -> Evaluation:
    """The translator (its checkpoint loaded once) and the evaluation pairs, from
    `add_evaluation_options`' options. Sets the thread count; raises CheckpointError,
    DataError or OSError with a one-line message."""
    if args.threads:
        hardware.set_threads(args.threads)
    translator = Translator.load(args.checkpoint, args.device)
    text = evaluation_text(translator.training_config, data=args.data,
                           data_root=args.data_root, src=args.src, ref=args.ref,
                           max_sentences=args.max_sentences, name=args.set)
    return Evaluation(translator, text)
