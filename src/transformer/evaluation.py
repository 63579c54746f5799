"""Evaluation data, and the decoding choices made on validation data.

- `evaluation_text`: (sources, references) of a Multi30k split in a checkpoint's language
  pair, or of two given files; `add_evaluation_arguments` and `load_for_evaluation` are the
  matching command-line options and start of the scripts that evaluate a model.
- `tune_decoding`: how many of a run's newest epoch checkpoints to average and which
  length-penalty alpha to decode with, by BLEU on validation data (the knobs Wu et al. 2021
  name; the test set is never an option). `checkpoints_within` restricts a run to what it
  had saved after a given training time, e.g. the first 30 minutes of a longer run.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import torch
from sacrebleu.metrics import BLEU

from .checkpoint import CheckpointError, load_checkpoint, numbered_checkpoints
from .data import MULTI30K_STEMS, DataError, read_lines
from .translator import DEFAULT_MAX_TOKENS, Translator, resolve_checkpoint

__all__ = ["load_translator", "evaluation_text", "add_evaluation_arguments",
           "load_for_evaluation", "checkpoints_within", "DecodingTrial", "tune_decoding",
           "best_trial"]

PathLike = Union[str, "os.PathLike[str]"]


# ---- evaluation data ----------------------------------------------------------------------


def load_translator(checkpoint: PathLike, device: Union[str, torch.device] = "auto"
                    ) -> tuple[Translator, dict]:
    """`Translator.load` for a checkpoint file or run directory, and the checkpoint itself
    (for its tokenizer and training config)."""
    path = resolve_checkpoint(checkpoint)
    return Translator.load(path, device), load_checkpoint(path)


def evaluation_text(state: dict, *, data: str = "valid",
                    data_root: PathLike = "../shared/data/multi30k",
                    src: Optional[PathLike] = None, ref: Optional[PathLike] = None,
                    max_sentences: Optional[int] = None) -> tuple[list[str], list[str]]:
    """(sources, references): the `src`/`ref` plain-text files if given, else the Multi30k
    split `data` ("valid" or "test") in `data_root`, in the checkpoint's language pair.
    Only the first `max_sentences` pairs with `max_sentences`."""
    if (src is None) != (ref is None):
        raise DataError("give both a source file and a reference file, or neither")
    if src is None:
        if data not in ("valid", "test"):
            raise DataError(f"data must be 'valid' or 'test', got {data!r}")
        langs = (state.get("config") or {}).get("data") or {}
        if not {"src_lang", "tgt_lang"} <= langs.keys():
            raise CheckpointError("the checkpoint does not name its language pair "
                                  "(config.data); give --src and --ref files")
        stem = Path(data_root).expanduser() / MULTI30K_STEMS[data]
        src = f"{stem}.{langs['src_lang']}.gz"
        ref = f"{stem}.{langs['tgt_lang']}.gz"
    if max_sentences is not None and max_sentences < 1:
        raise DataError(f"max_sentences must be >= 1, got {max_sentences}")
    sources, references = read_lines(src), read_lines(ref)
    if len(sources) != len(references):
        raise DataError(f"{src} has {len(sources)} lines but {ref} has {len(references)}")
    if not sources:
        raise DataError(f"{src} is empty")
    return sources[:max_sentences], references[:max_sentences]


def add_evaluation_arguments(parser: argparse.ArgumentParser,
                             splits: Sequence[str] = ("valid", "test"),
                             max_tokens: int = 4096) -> None:
    """The evaluation-data and device options of the scripts that evaluate a model
    (`evaluation_text`); `splits` are the Multi30k splits `--data` may name."""
    p = parser
    p.add_argument("--data", choices=tuple(splits), default="valid",
                   help="Multi30k split, in the checkpoint's language pair")
    p.add_argument("--data-root", default="../shared/data/multi30k",
                   help="folder of the Multi30k .gz files")
    p.add_argument("--src", type=Path, help="source file (instead of --data)")
    p.add_argument("--ref", type=Path, help="reference file (instead of --data)")
    p.add_argument("--max-sentences", type=int, help="use only the first N sentences")
    p.add_argument("--max-tokens", type=int, default=max_tokens, help="tokens per batch")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, ...")
    p.add_argument("--threads", type=int, help="CPU threads (default: torch's)")


def load_for_evaluation(args: argparse.Namespace) -> tuple[Translator, dict, list[str], list[str]]:
    """What an evaluation script starts with, from `add_evaluation_arguments`' options: the
    translator, its checkpoint, and the (sources, references) to evaluate on. Sets the
    thread count; raises CheckpointError, DataError or OSError with a one-line message."""
    if args.threads:
        torch.set_num_threads(args.threads)
    translator, state = load_translator(args.checkpoint, args.device)
    sources, references = evaluation_text(state, data=args.data, data_root=args.data_root,
                                          src=args.src, ref=args.ref,
                                          max_sentences=args.max_sentences)
    return translator, state, sources, references


# ---- choosing checkpoints and length penalty on validation data ---------------------------


def checkpoints_within(directory: PathLike, max_time: Optional[float] = None) -> list[Path]:
    """The numbered checkpoints in `directory` (a run's `checkpoints/`), oldest first; with
    `max_time`, only those saved within the first `max_time` seconds of training (by the
    training time each one records, resumed runs summed)."""
    paths = numbered_checkpoints(directory)
    if not paths:
        raise CheckpointError(f"no checkpoint_<updates>.pt files in {directory}")
    if max_time is None:
        return paths
    kept = [p for p in paths
            if load_checkpoint(p).get("train_state", {}).get("train_time", float("inf"))
            <= max_time]
    if not kept:
        raise CheckpointError(f"no checkpoint in {directory} was saved within the first "
                              f"{max_time:g} s of training")
    return kept


@dataclass(frozen=True)
class DecodingTrial:
    """One decoding setting and its validation score."""

    checkpoints: tuple[Path, ...]  # averaged, oldest first
    alpha: float                   # length-penalty exponent
    bleu: float                    # cased sacreBLEU (13a)
    brevity_penalty: float


def tune_decoding(checkpoints: Sequence[PathLike], sources: Sequence[str],
                  references: Sequence[str], *, lasts: Sequence[int], alphas: Sequence[float],
                  beam_size: int = 5, max_tokens: int = DEFAULT_MAX_TOKENS,
                  device: Union[str, torch.device] = "auto",
                  on_trial: Optional[Callable[[DecodingTrial], None]] = None
                  ) -> list[DecodingTrial]:
    """BLEU of every (average of the newest `last` checkpoints, alpha) pair; a `last` beyond
    the number of checkpoints is skipped. `checkpoints` are oldest first."""
    if not lasts or not alphas or min(lasts) < 1 or min(alphas) < 0:
        raise ValueError(f"need lasts >= 1 and alphas >= 0, got {list(lasts)}, {list(alphas)}")
    trials = []
    for last in sorted(set(lasts)):
        if last > len(checkpoints):
            continue
        chosen = tuple(Path(p) for p in checkpoints[-last:])
        translator = Translator.load(list(chosen), device=device)
        for alpha in alphas:
            hypotheses = translator.translate(list(sources), beam_size=beam_size, alpha=alpha,
                                              max_tokens=max_tokens)
            score = BLEU().corpus_score(hypotheses, [list(references)])
            trials.append(DecodingTrial(chosen, alpha, score.score, score.bp))
            if on_trial is not None:
                on_trial(trials[-1])
    if not trials:
        raise CheckpointError(f"only {len(checkpoints)} checkpoint(s), fewer than any of "
                              f"lasts={sorted(set(lasts))}")
    return trials


def best_trial(trials: Sequence[DecodingTrial]) -> DecodingTrial:
    """The highest BLEU; on a tie (at the printed 0.1), the fewest checkpoints, then the
    alpha listed first."""
    return max(trials, key=lambda t: round(t.bleu, 1))  # max keeps the first of equals
