"""Serve a model: a JSON translation API and a page of every attention head.

    transformer serve --checkpoint RUN_DIR_OR_PT [--engine torch|ctranslate2]
        [--host 127.0.0.1] [--port 8000] [--threads N] [--device auto] [--access-log]

Then open http://127.0.0.1:8000/ or POST to /translate and /attention (docs/USAGE.md). The
model is the one named here: no request can load another. Needs the `serve` extra
(FastAPI and uvicorn). A bad checkpoint prints one line and exits 1.
`python scripts/serve.py` is the same command.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from ..engines import ENGINES, load_translator
from ..errors import TransformerError
from . import report_errors


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, type=Path, metavar="RUN_DIR_OR_PT",
                   help="checkpoint file or run directory (its best checkpoint)")
    p.add_argument("--engine", choices=ENGINES, default="torch",
                   help="what runs the model: our PyTorch engine (a checkpoint or run "
                        "directory) or CTranslate2 (a directory of transformer export); "
                        "attention maps need torch")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--threads", type=int, help="CPU threads for the model (default: torch's)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--access-log", action="store_true", help="log every request")
    return p


def run(args: argparse.Namespace) -> None:
    try:
        import uvicorn

        from ..serve import create_app
    except ImportError as e:
        raise TransformerError(f"serving needs the package's serve extra (pip install "
                               f"fastapi uvicorn): {e}") from e
    translator = load_translator(args.checkpoint, args.engine, device=args.device,
                                 threads=args.threads)
    uvicorn.run(create_app(translator), host=args.host, port=args.port,
                access_log=args.access_log, log_level="info")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    return report_errors(lambda: run(args))
