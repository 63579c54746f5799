"""Export a trained model to CTranslate2 for fast CPU (or GPU) translation.

    python scripts/export.py --checkpoint RUN_DIR_OR_PT [RUN_DIR_OR_PT ...] --output DIR
        [--quantization float32|int8|int8_float32]

Writes a CTranslate2 model directory: `model.bin` and the vocabulary (CTranslate2's), the
SentencePiece model, and `transformer.json` (model config, decoding defaults, language
pair), so that `scripts/translate.py --engine ctranslate2 --checkpoint DIR` translates with
the same tokenization and defaults as the checkpoint. Several checkpoints are averaged first;
pruned checkpoints export too (removed heads become zero weights). `int8` stores the weights
as 8-bit integers (about a third of the float32 size; the activations stay float32).
Needs the `ctranslate2` package: pip install -e '.[export]'. Errors print one line, exit 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from transformer.checkpoint import CheckpointError
from transformer.export import QUANTIZATIONS, ExportError, export_ctranslate2, require_ctranslate2
from transformer.translator import Translator


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", nargs="+", required=True, metavar="RUN_DIR_OR_PT",
                   help="checkpoint file or run directory (its best checkpoint); several are "
                        "averaged")
    p.add_argument("--output", type=Path, required=True, help="the CTranslate2 model directory")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default="float32",
                   help="weight type (default float32)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        require_ctranslate2()  # before loading anything
        translator = Translator.load(args.checkpoint, device="cpu")
        export_ctranslate2(translator, args.output, quantization=args.quantization,
                           source=" ".join(args.checkpoint))
    except (CheckpointError, ExportError, OSError) as e:
        print(f"error: {str(e).replace(chr(10), ' ')}", file=sys.stderr)
        return 1
    size = (args.output / "model.bin").stat().st_size
    print(f"wrote {args.output} ({args.quantization}, model.bin {size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
