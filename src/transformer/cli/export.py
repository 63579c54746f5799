"""Export a model to CTranslate2 (fast CPU or GPU translation) or Hugging Face.

    transformer export --checkpoint RUN_DIR_OR_PT [RUN_DIR_OR_PT ...] --output DIR
        [--quantization float32|int8|int8_float32] [--vocab-map TRAIN_SRC TRAIN_TGT
        [--vocab-map-size N] [--vocab-map-always N]]
    transformer export --format hf --checkpoint RUN_DIR_OR_PT --output DIR [--license mit]

Writes a CTranslate2 model directory: `model.bin` and the vocabulary (CTranslate2's), the
SentencePiece model, and `transformer.json` (model config, decoding defaults, language
pair), so that `transformer translate --engine ctranslate2 --checkpoint DIR` translates
with the same tokenization and defaults as the checkpoint. Several checkpoints are averaged
first; pruned checkpoints export too (removed heads become zero weights). `int8` stores the
weights as 8-bit integers (about a third of the float32 size; the activations stay
float32). `--vocab-map` counts a vocabulary map in a parallel corpus (normally the training
data): CTranslate2 then scores only each batch's candidate target pieces instead of the
whole vocabulary (faster; a word outside the candidates cannot be produced; see
transformer/vocab_map.py). Needs the `ctranslate2` package: pip install
'ctranslate2>=4' (the `export` extra).

`--format hf` writes a directory that `transformers` loads offline
(`AutoModelForSeq2SeqLM.from_pretrained(DIR)`, `AutoTokenizer`, `pipeline("translation")`):
post-norm models as `MarianMTModel`, pre-norm ones as `PegasusForConditionalGeneration`,
with MarianTokenizer's files, a generation_config.json of the checkpoint's beam size and a
model card, README.md (languages, `--license`, the model, its training data and budget, its
scores and decoding settings; see transformer/deploy/hf.py and model_card.py). Needs
`safetensors` (the `hf` extra).

A multilingual model (trained into several target languages, each source tagged with its
target language) exports to neither format: the command says so in one line and writes
nothing; translate it with `transformer translate --target-lang`. `python scripts/export.py`
is the same command.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..decoding.translator import Translator
from ..decoding.vocab_map import DEFAULT_ALWAYS, DEFAULT_PER_SOURCE, build_vocab_map
from ..deploy.export import QUANTIZATIONS, check_exportable, export_ctranslate2, require_ctranslate2
from ..deploy.hf import export_hf
from ..deploy.model_card import DEFAULT_LICENSE, check_license, checkpoint_facts
from ..errors import ConfigError
from . import command_parser, report_errors

FORMATS = ("ctranslate2", "hf")


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__)
    p.add_argument("--checkpoint", nargs="+", required=True, metavar="RUN_DIR_OR_PT",
                   help="checkpoint file or run directory (its best checkpoint); several (of "
                        "one training run) are averaged")
    p.add_argument("--output", type=Path, required=True, help="the model directory to write")
    p.add_argument("--format", choices=FORMATS, default="ctranslate2",
                   help="ctranslate2 or hf (Hugging Face transformers)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default="float32",
                   help="CTranslate2 weight type")
    p.add_argument("--vocab-map", nargs=2, type=Path, metavar=("SRC", "TGT"),
                   help="a parallel corpus (normally the training files) to count a vocabulary "
                        "map in: CTranslate2 then decodes over candidate target pieces only")
    p.add_argument("--vocab-map-size", type=int, default=DEFAULT_PER_SOURCE, metavar="N",
                   help="candidate target pieces per source piece")
    p.add_argument("--vocab-map-always", type=int, default=DEFAULT_ALWAYS, metavar="N",
                   help="the N most frequent target pieces are always candidates")
    p.add_argument("--license", default=DEFAULT_LICENSE, metavar="ID",
                   help="--format hf: the license its model card (README.md) states, a Hub "
                        "license id such as mit, apache-2.0, cc-by-4.0 or other")
    return p


def check_options(args: argparse.Namespace) -> None:
    """Values the parser accepts but the export cannot use: ConfigError naming the option
    (`error: ...`, exit 1)."""
    if args.vocab_map_size < 1:
        raise ConfigError(f"--vocab-map-size must be >= 1, got {args.vocab_map_size}")
    if args.vocab_map_always < 0:
        raise ConfigError(f"--vocab-map-always must be >= 0, got {args.vocab_map_always}")
    if args.format == "hf" and args.vocab_map:
        raise ConfigError("--vocab-map is a CTranslate2 option, not for --format hf")
    if args.format == "hf" and args.quantization != "float32":
        raise ConfigError("--quantization is a CTranslate2 option, not for --format hf")
    if args.format != "hf" and args.license != DEFAULT_LICENSE:
        raise ConfigError("--license is for --format hf (its model card), not for CTranslate2")
    check_license(args.license, "--license")


def run(args: argparse.Namespace) -> None:
    check_options(args)
    source = " ".join(args.checkpoint)
    if args.format == "hf":
        config = export_hf(Translator.load(args.checkpoint, device="cpu"), args.output,
                           source=source, license=args.license,
                           facts=checkpoint_facts(args.checkpoint))
        print(f"wrote {args.output} ({config['architectures'][0]}, "
              f"{config['vocab_size']:,} pieces)")
        return
    require_ctranslate2()  # before loading anything
    translator = Translator.load(args.checkpoint, device="cpu")
    check_exportable(translator, source)  # before counting a vocabulary map
    vocab_map = None if args.vocab_map is None else build_vocab_map(
        translator.tokenizers, *args.vocab_map, per_source=args.vocab_map_size,
        always=args.vocab_map_always)
    export_ctranslate2(translator, args.output, quantization=args.quantization,
                       source=source, vocab_map=vocab_map)
    size = (args.output / "model.bin").stat().st_size
    mapped = "" if vocab_map is None else (
        f", vocabulary map of {len(vocab_map.candidates):,} source pieces from "
        f"{vocab_map.pairs:,} pairs")
    print(f"wrote {args.output} ({args.quantization}, model.bin {size / 2**20:.1f} MiB{mapped})")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return report_errors(lambda: run(args))
