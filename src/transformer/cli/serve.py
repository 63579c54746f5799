"""Serve a model: a JSON translation API and a page of every attention head.

    transformer serve --checkpoint RUN_DIR_OR_PT [--engine torch|ctranslate2]
        [--host 127.0.0.1] [--port 8000] [--threads N] [--device auto] [--access-log]
    transformer serve --ensemble --checkpoint RUN_A RUN_B [...]     # models decoding together

Then open http://127.0.0.1:8000/ or POST to /translate and /attention (docs/USAGE.md). The
model is the one named here: no request can load another. Needs the `serve` extra
(FastAPI and uvicorn). A bad checkpoint prints one line and exits 1.
`python scripts/serve.py` is the same command.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from ..errors import require
from . import command_parser, report_errors
from .options import add_model_options, check_counts, load_model


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__)
    add_model_options(p, several=True, engines=True)  # attention maps need the torch engine
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (0.0.0.0: every network interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--access-log", action="store_true", help="log every request")
    return p


def run(args: argparse.Namespace) -> None:
    check_counts(args)
    require("fastapi", extra="serve", feature="transformer serve")  # what ..serve builds on
    uvicorn = require("uvicorn", extra="serve", feature="transformer serve")
    from ..deploy.serve import create_app, model_thread

    executor = model_thread()  # loads the model, then runs it (`model_thread`)
    translator = executor.submit(load_model, args).result()
    uvicorn.run(create_app(translator, executor=executor), host=args.host, port=args.port,
                access_log=args.access_log, log_level="info")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    return report_errors(lambda: run(args))
