"""Evaluation data, and the decoding choices made on validation data.

- `evaluation_text`: the validation or test pairs of the run a model came from, found the
  way the run found them (its `data=files` paths, or Multi30k in its `data.root`, else in
  the download cache), or two given files (the commands' options for it:
  `cli.options.add_evaluation_options`).
- `tune_decoding`: how many of a run's newest epoch checkpoints to average and which
  length-penalty alpha to decode with, by BLEU on validation data (the knobs Wu et al. 2021
  name; the test set is never an option). `checkpoints_within` restricts a run to what it
  had saved after a given training time, e.g. the first 30 minutes of a longer run.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import torch
from sacrebleu.metrics import BLEU

from ..data import multi30k
from ..data.text import ParallelText, read_parallel
from ..decoding.corpus import DEFAULT_MAX_TOKENS
from ..decoding.translator import Translator
from ..errors import CheckpointError, DataError
from ..run.checkpoint import load_checkpoint, numbered_checkpoints
from ..run.config import TrainConfig
from ..run.data_config import DataConfig

__all__ = ["evaluation_text", "EvaluationSet", "evaluation_sets", "checkpoints_within",
           "DecodingTrial", "tune_decoding", "best_trial"]

PathLike = Union[str, "os.PathLike[str]"]


# ---- evaluation data ----------------------------------------------------------------------


def _run_split(cfg: DataConfig, split: str, data_root: PathLike | None,
               name: str | None = None) -> tuple[Path, Path]:
    """(source, reference) files of the run's `split` set `name` (default: the first).
    Multi30k is looked for in `data_root` if given, else in the run's `data.root`, else in
    the download cache, where missing files are downloaded (checksummed)."""
    sets = cfg.evaluation_sets(split)
    if name is not None:
        sets = [e for e in sets if e.name == name]
        if not sets:
            names = ", ".join(e.name for e in cfg.evaluation_sets(split)) or "none"
            raise DataError(f"the run has no {split} set named {name!r} (its {split} sets: "
                            f"{names})")
    if not sets:
        raise DataError(f"the run has no {split} split (data.{split}_src is not set); "
                        "give --src and --ref files")
    named = cfg.valid_sets if split == "valid" else cfg.test_sets
    if cfg.name == "files" or named:  # paths as given
        return Path(sets[0].src).expanduser(), Path(sets[0].tgt).expanduser()
    roots = [data_root] if data_root is not None else [cfg.root, multi30k.DEFAULT_ROOT]
    for root in roots:
        entry = dataclasses.replace(cfg, root=str(root)).evaluation_sets(split)[0]
        if Path(entry.src).is_file() and Path(entry.tgt).is_file():
            return Path(entry.src), Path(entry.tgt)
    multi30k.download_multi30k(roots[-1], (cfg.src_lang, cfg.tgt_lang), base_url=cfg.base_url,
                               tokenized=cfg.tokenized)
    entry = dataclasses.replace(cfg, root=str(roots[-1])).evaluation_sets(split)[0]
    return Path(entry.src), Path(entry.tgt)


def evaluation_text(training_config: TrainConfig | None, *, data: str = "valid",
                    data_root: PathLike | None = None, src: PathLike | None = None,
                    ref: PathLike | None = None, max_sentences: int | None = None,
                    name: str | None = None) -> ParallelText:
    """The `src`/`ref` plain-text files if given, else the split `data` ("valid" or "test")
    of the run described by `training_config` (its checkpoint's; see `_run_split`): its
    set `name`, by default the first.
    Only the first `max_sentences` pairs with `max_sentences`."""
    if (src is None) != (ref is None):
        raise DataError("give both a source file and a reference file, or neither")
    if src is None:
        if data not in ("valid", "test"):
            raise DataError(f"data must be 'valid' or 'test', got {data!r}")
        if training_config is None:
            raise CheckpointError("the checkpoint does not record its training data "
                                  "(config.data); give --src and --ref files")
        src, ref = _run_split(training_config.data, data, data_root, name)
    if max_sentences is not None and max_sentences < 1:
        raise DataError(f"max_sentences must be >= 1, got {max_sentences}")
    text = read_parallel(src, ref, split=data)  # checks UTF-8 and the line counts
    if not text.src:
        raise DataError(f"{src} is empty")
    return ParallelText(text.src[:max_sentences], text.tgt[:max_sentences],
                        text.lines[:max_sentences])


@dataclass(frozen=True)
class EvaluationSet:
    """A named set of sentence pairs, and the language to translate it into (for a model
    trained for several target languages; None for the others)."""

    name: str
    text: ParallelText
    target_lang: str | None = None


def evaluation_sets(training_config: TrainConfig | None, *, data: str = "valid",
                    data_root: PathLike | None = None, src: PathLike | None = None,
                    ref: PathLike | None = None, max_sentences: int | None = None,
                    name: str | None = None) -> list[EvaluationSet]:
    """The given `src`/`ref` files as one set, else every set of the run's split `data`
    (`data.valid_sets`, or the one split), or its set `name` (see `evaluation_text`)."""
    if src is not None or training_config is None:
        text = evaluation_text(training_config, data=data, src=src, ref=ref,
                               max_sentences=max_sentences)
        return [EvaluationSet(name or "given", text)]
    cfg = training_config.data
    entries = cfg.evaluation_sets(data) if data in ("valid", "test") else []
    chosen = [e for e in entries if name is None or e.name == name]
    if not chosen:  # no such set: evaluation_text says so, naming the run's sets
        evaluation_text(training_config, data=data, data_root=data_root, name=name)
    return [EvaluationSet(e.name, evaluation_text(training_config, data=data,
                                                  data_root=data_root,
                                                  max_sentences=max_sentences, name=e.name),
                          e.tgt_lang if cfg.lang_tags else None) for e in chosen]


# ---- choosing checkpoints and length penalty on validation data ---------------------------


def checkpoints_within(directory: PathLike, max_time: float | None = None) -> list[Path]:
    """The numbered checkpoints in `directory` (a run's `checkpoints/`), oldest first; with
    `max_time`, only those saved within the first `max_time` seconds of training (by the
    training time each one records, resumed runs summed)."""
    paths = numbered_checkpoints(directory)
    if not paths:
        raise CheckpointError(f"no checkpoint_<updates>.pt files in {directory}")
    if max_time is None:
        return paths
    kept = [p for p in paths  # mmap: the tensors are not read, only the counters
            if load_checkpoint(p, mmap=True).get("train_state", {}).get("train_time",
                                                                        float("inf"))
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
    bleu: float                    # cased sacreBLEU (13a); over several sets, their mean
    brevity_penalty: float         # likewise
    per_set: dict[str, float] = field(default_factory=dict)  # several sets: each one's BLEU


def tune_decoding(checkpoints: Sequence[PathLike], sets: Sequence[EvaluationSet], *,
                  lasts: Sequence[int], alphas: Sequence[float],
                  beam_size: int = 5, max_tokens: int = DEFAULT_MAX_TOKENS,
                  device: str | torch.device = "auto",
                  on_trial: Callable[[DecodingTrial], None] | None = None
                  ) -> list[DecodingTrial]:
    """BLEU of every (average of the newest `last` checkpoints, alpha) pair on every set
    (each into its target language; the mean over several sets is what `best_trial`
    compares, as training selects by the mean validation BLEU); a `last` beyond the number
    of checkpoints is skipped. `checkpoints` are oldest first."""
    if not lasts or not alphas or min(lasts) < 1 or min(alphas) < 0:
        raise ValueError(f"need lasts >= 1 and alphas >= 0, got {list(lasts)}, {list(alphas)}")
    trials = []
    for last in sorted(set(lasts)):
        if last > len(checkpoints):
            continue
        chosen = tuple(Path(p) for p in checkpoints[-last:])
        translator = Translator.load(list(chosen), device=device)
        for alpha in alphas:
            scores = {one.name: BLEU().corpus_score(
                translator.translate(one.text.src, beam_size=beam_size, alpha=alpha,
                                     max_tokens=max_tokens, target_lang=one.target_lang),
                [one.text.tgt]) for one in sets}
            values = list(scores.values())
            trials.append(DecodingTrial(
                chosen, alpha, sum(v.score for v in values) / len(values),
                sum(v.bp for v in values) / len(values),
                {n: v.score for n, v in scores.items()} if len(sets) > 1 else {}))
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
