"""Serve a model: a JSON translation API and a page showing what each head attends to.

    python scripts/serve.py --checkpoint RUN_DIR_OR_PT [--engine torch|ctranslate2] [--host 127.0.0.1]
        [--port 8000] [--threads N] [--device auto] [--access-log]

Then open http://127.0.0.1:8000/ or POST to /translate and /attention (docs/USAGE.md). The
model is the one named here: no request can load another. Needs the `serve` extra
(`pip install -e '.[serve]'`). A bad checkpoint prints one line and exits 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Optional

from transformer.checkpoint import CheckpointError
from transformer.engines import ENGINES, load_translator
from transformer.export import ExportError
from transformer.text import DataError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, type=Path, metavar="RUN_DIR_OR_PT",
                   help="checkpoint file or run directory (its best checkpoint)")
    p.add_argument("--engine", choices=ENGINES, default="torch",
                   help="what runs the model: our PyTorch engine (a checkpoint or run "
                        "directory) or CTranslate2 (a directory of scripts/export.py); "
                        "attention maps need torch")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--threads", type=int, help="CPU threads for the model (default: torch's)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--access-log", action="store_true", help="log every request")
    return p




def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads is not None and args.threads < 1:
        build_parser().error("--threads must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    try:
        import uvicorn

        from transformer.serve import create_app
    except ImportError as e:
        print(f"error: serving needs the serve extra (pip install -e '.[serve]'): {e}",
              file=sys.stderr)
        return 1
    try:
        translator = load_translator(args.checkpoint, args.engine, device=args.device,
                                     threads=args.threads)
    except (CheckpointError, ExportError, DataError, OSError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    uvicorn.run(create_app(translator), host=args.host, port=args.port,
                access_log=args.access_log, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
