"""Choose on validation data how many checkpoints to average and the length penalty.

    transformer tune-decoding RUN_DIR -o CHOSEN.pt [--within SECONDS]
        [--last 1 2 3 5 10] [--alpha 1.0 1.5 2.0 2.5 3.0] [--beam-size 5]
        [--data-root DIR | --src FILE --ref FILE] [--device auto]

Decodes the run's validation split (found as the run found it: its data=files paths, or
Multi30k in its data.root, else in the download cache) with the average of the newest N
numbered checkpoints for each N of --last, and each length-penalty alpha of --alpha, printing
cased sacreBLEU for each. Writes the best average to CHOSEN.pt with the chosen alpha and beam
size (ties: fewer checkpoints, then the alpha listed first); `transformer translate
--checkpoint CHOSEN.pt` then decodes with them unless told otherwise.
`--within 1800` considers only the checkpoints saved in the first 30 minutes of training.
The test set is not an option here: choices are made on validation data only.
`python scripts/tune_decoding.py` is the same command.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from .. import hardware
from ..decoding.corpus import DEFAULT_MAX_TOKENS
from ..decoding.translator import Translator
from ..errors import ConfigError
from ..run.checkpoint import (
    inference_checkpoint,
    load_checkpoint,
    save_checkpoint,
    stored_training_config,
)
from ..tools.evaluation import (
    DecodingTrial,
    best_trial,
    checkpoints_within,
    evaluation_sets,
    tune_decoding,
)
from . import command_parser, report_errors
from .options import add_evaluation_options, check_counts


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__)
    p.add_argument("run", type=Path, help="run directory (or its checkpoints/ folder)")
    p.add_argument("-o", "--output", type=Path, required=True,
                   help="where to write the chosen (averaged) checkpoint")
    p.add_argument("--within", type=float, metavar="SECONDS",
                   help="only checkpoints saved within this much training time")
    p.add_argument("--last", type=int, nargs="+", default=[1, 2, 3, 5, 10],
                   help="numbers of newest checkpoints to average")
    p.add_argument("--alpha", type=float, nargs="+", default=[1.0, 1.5, 2.0, 2.5, 3.0],
                   help="length-penalty exponents to try")
    p.add_argument("--beam-size", type=int, default=5,
                   help="beam size of every trial, stored in the chosen checkpoint")
    add_evaluation_options(p, splits=("valid",), max_tokens=DEFAULT_MAX_TOKENS)
    return p


def _row(trial: DecodingTrial) -> str:
    per_set = "".join(f"  {name} {bleu:.2f}" for name, bleu in trial.per_set.items())
    return (f"{len(trial.checkpoints):>4}  {trial.alpha:>5.2f}  {trial.bleu:>5.2f}  "
            f"{trial.brevity_penalty:.3f}  {trial.checkpoints[-1].name}{per_set}")


def run(args: argparse.Namespace) -> None:
    check_counts(args, "beam_size")
    if min(args.last) < 1 or min(args.alpha) < 0:
        raise ConfigError(f"--last must be >= 1 and --alpha >= 0, got --last "
                          f"{' '.join(map(str, args.last))} --alpha "
                          f"{' '.join(map(str, args.alpha))}")
    folder = args.run / "checkpoints" if (args.run / "checkpoints").is_dir() else args.run
    checkpoints = checkpoints_within(folder, args.within)
    newest = load_checkpoint(checkpoints[-1], mmap=True)  # mapped: only its config is read
    sets = evaluation_sets(stored_training_config(newest, checkpoints[-1]), data=args.data,
                           data_root=args.data_root, src=args.src, ref=args.ref,
                           max_sentences=args.max_sentences, name=args.set)
    if args.threads:
        hardware.set_threads(args.threads)
    described = ", ".join(f"{one.name} {len(one.text)}" for one in sets)
    print(f"{len(checkpoints)} checkpoints ({checkpoints[0].name} .. {checkpoints[-1].name}); "
          f"validation: {described} sentences, beam {args.beam_size}"
          + ("; BLEU: the mean over the sets" if len(sets) > 1 else ""))
    print("last  alpha   BLEU  BP     newest")
    trials = tune_decoding(checkpoints, sets, lasts=args.last,
                           alphas=args.alpha, beam_size=args.beam_size,
                           max_tokens=args.max_tokens, device=args.device,
                           on_trial=lambda t: print(_row(t), flush=True))
    best = best_trial(trials)
    chosen = Translator.load(list(best.checkpoints), device="cpu")
    decoding = dataclasses.replace(chosen.decoding, alpha=best.alpha, beam_size=args.beam_size)
    save_checkpoint(inference_checkpoint(
        chosen.model, chosen.tokenizers, training_config=chosen.training_config,
        decoding=decoding, run_id=chosen.run_id,
        averaged_from=[str(p) for p in best.checkpoints],
        valid_bleu=best.bleu), args.output)
    print(f"chosen: the average of the last {len(best.checkpoints)} checkpoint(s), alpha "
          f"{best.alpha:g}: validation BLEU {best.bleu:.2f}")
    print(f"wrote {args.output}; transformer translate --checkpoint {args.output} decodes "
          f"with alpha {best.alpha:g} and beam {args.beam_size} unless told otherwise")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return report_errors(lambda: run(args))
