"""Checkpoints: atomic save, safe load, model rebuild, averaging, and the one builder of
checkpoints for translation.

A checkpoint is a dict of tensors and plain Python values only, loaded with
`torch.load(weights_only=True)`, so a checkpoint from someone else cannot run code:

    format_version  int
    model           state dict
    model_config    ModelConfig.to_dict()
    tokenizer       {"src": ..., "tgt": ...} `Tokenizer.to_state()`: SentencePiece model
                    protos (bytes), or with an id table {spm, pieces, specials}
    config          TrainConfig.to_dict() of the run that trained it, or None
    decoding        DecodingSettings fields chosen for it (tune-decoding), if any
    run_id          the training run it comes from (a random hex string, kept on resume
                    and by averaging, tuning and pruning), or None (imported, or older)
    ...             where it came from (averaged_from, pruned_from, ...), and in training
                    checkpoints the state to resume (optimizer, counters, RNG states)

`inference_checkpoint` builds the common part, for every writer: training, averaging,
tuning, pruning. `stored_training_config`, `stored_decoding` and `stored_run_id` read it
back, typed. `average_weights` averages several checkpoints' parameters (read by
`Translator.load`), of one training run only (`check_averageable`): the weights of
independent runs do not line up, and their mean translates badly; `average_checkpoints`
turns that into an inference checkpoint (written by `transformer average-checkpoints`).

A training run keeps, in `run_dir/checkpoints/`: `checkpoint_last.pt` (resume from here),
`checkpoint_best.pt` (best validation BLEU) and the last K `checkpoint_<updates>.pt`
(for `average_checkpoints`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import random
import re
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Union

import torch

from ..data.tokenizer import Tokenizer, TokenizerPair
from ..errors import CheckpointError, ConfigError
from ..files import atomic_write
from ..model.transformer import ModelConfig, Transformer
from .config import DecodingSettings, TrainConfig

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["save_checkpoint", "resolve_checkpoint", "load_init_checkpoint", "load_checkpoint",
           "check_model_config", "model_from_checkpoint",
           "tokenizers_to_state", "tokenizers_from_state", "check_tokenizers",
           "stored_training_config", "stored_decoding", "stored_run_id", "run_id_for",
           "inference_checkpoint", "check_averageable", "check_ensemble_member",
           "average_weights",
           "average_checkpoints", "LAST", "BEST",
           "numbered_checkpoint_path", "numbered_checkpoints", "prune_checkpoints",
           "copy_checkpoint", "rng_state", "set_rng_state"]

LAST = "checkpoint_last.pt"
BEST = "checkpoint_best.pt"
_NUMBERED = re.compile(r"checkpoint_(\d+)\.pt")


def save_checkpoint(state: dict[str, Any], path: PathLike) -> None:
    """Write `state` to `path` atomically: a crash never leaves a half-written file."""
    with atomic_write(path) as f:
        torch.save({"format_version": FORMAT_VERSION, **state}, f)


def copy_checkpoint(src: PathLike, dst: PathLike) -> None:
    """Copy a checkpoint file atomically (temporary file, then rename)."""
    with open(src, "rb") as source, atomic_write(dst) as f:
        shutil.copyfileobj(source, f, 1 << 20)


def numbered_checkpoint_path(directory: PathLike, num_updates: int) -> Path:
    return Path(directory) / f"checkpoint_{num_updates}.pt"


def numbered_checkpoints(directory: PathLike) -> list[Path]:
    """The `checkpoint_<updates>.pt` files in `directory`, oldest (fewest updates) first."""
    found = [(int(m.group(1)), p) for p in Path(directory).glob("checkpoint_*.pt")
             if (m := _NUMBERED.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def prune_checkpoints(directory: PathLike, keep: int) -> None:
    """Delete all but the newest `keep` numbered checkpoints (last/best are never touched)."""
    paths = numbered_checkpoints(directory)
    for path in paths[: max(0, len(paths) - keep)]:
        path.unlink(missing_ok=True)


def rng_state() -> dict[str, Any]:
    """The random number generators' states, as tensors and plain values."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore `rng_state()` (dropout masks then continue exactly where they stopped)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]  # lists after a save/load round trip
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def resolve_checkpoint(path: PathLike) -> Path:
    """A `.pt` file as is; a run directory -> its checkpoints/checkpoint_best.pt, or
    checkpoint_last.pt (with a warning) when there is no best one yet. The directory may
    also be the `checkpoints` folder itself."""
    path = Path(path)
    if not path.is_dir():
        return path
    folders = [path / "checkpoints", path]
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        for folder in folders:
            if (folder / name).is_file():
                if name == "checkpoint_last.pt":
                    log.warning("%s has no checkpoint_best.pt; using %s", path, folder / name)
                return folder / name
    raise CheckpointError(f"no checkpoint_best.pt or checkpoint_last.pt in {path}/checkpoints")


def load_init_checkpoint(init_from: PathLike) -> tuple[Path, dict]:
    """(path, state) of the checkpoint a run starts from (`init_from`: a checkpoint file or
    run directory), its tensors mapped rather than read."""
    path = resolve_checkpoint(Path(init_from).expanduser())
    return path, load_checkpoint(path, map_location="cpu", mmap=True)


def load_checkpoint(path: PathLike, map_location: str | torch.device = "cpu", *,
                    mmap: bool = False) -> dict:
    """Load a checkpoint safely (`weights_only=True`), with errors that name the file.
    `mmap=True` maps the tensors instead of reading them: cheap when only the plain values
    (counters, configs) are needed."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        culprit = next((line.strip() for line in str(e).splitlines()
                        if "unsupported global" in line.lower()), "")
        if not culprit:
            raise CheckpointError(f"corrupt or truncated checkpoint {path}: "
                                  f"{_torch_reason(e)}") from e
        raise CheckpointError(
            f"refusing to load {path}: it holds objects other than tensors and plain values, "
            f"which could run code when unpickled. {culprit}") from e
    except Exception as e:  # any: damaged bytes fail in torch's zip or pickle layers alike
        raise CheckpointError(f"corrupt or truncated checkpoint {path}: "
                              f"{type(e).__name__}: {_torch_reason(e)}") from e
    if not isinstance(state, dict) or "model" not in state or "model_config" not in state:
        raise CheckpointError(f"{path} is not a transformer checkpoint (no model/model_config)")
    version = state.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format {version!r}, this version of the "
                              f"package reads format {FORMAT_VERSION}")
    return state


def _torch_reason(error: Exception) -> str:
    """The reason in one of torch's multi-line messages, on one line: the lines that say
    what was wrong, without the advice around them (`weights_only`, "Check the
    documentation ...")."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith("WeightsUnpickler error:"):
            detail = line.removeprefix("WeightsUnpickler error:").strip()
            return detail or (lines[i + 1] if i + 1 < len(lines) else line)
    return "; ".join(lines) if lines else repr(error)


def check_model_config(state: dict, expected: ModelConfig, path: PathLike = "checkpoint") -> None:
    """Raise CheckpointError naming every model key whose value differs from `expected`."""
    try:
        saved = ModelConfig.normalized(state["model_config"])
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path} holds an invalid model config: {e}") from e
    want = expected.to_dict()
    keys = list(want) + [k for k in saved if k not in want]  # e.g. pruned_heads on one side
    diffs = [f"model.{k}: checkpoint has {saved.get(k)!r}, config asks for {want.get(k)!r}"
             for k in keys if saved.get(k) != want.get(k)]
    if diffs:
        raise CheckpointError(f"{path} does not match the requested model: " + "; ".join(diffs))


def model_from_checkpoint(state: dict, path: PathLike = "checkpoint") -> Transformer:
    """Rebuild the model from the config stored with its weights."""
    try:
        model = Transformer(ModelConfig.from_dict(state["model_config"]))
        model.load_state_dict(state["model"])
    except (ValueError, RuntimeError, TypeError, AttributeError) as e:
        raise CheckpointError(f"cannot rebuild the model stored in {path}: "
                              f"{_torch_reason(e)}") from e
    return model


def tokenizers_to_state(tokenizers: TokenizerPair) -> dict[str, Any]:
    return {"src": tokenizers.src.to_state(), "tgt": tokenizers.tgt.to_state()}


def tokenizers_from_state(state: dict, path: PathLike = "checkpoint") -> TokenizerPair:
    """The tokenizers stored in a checkpoint (one object when the vocabulary is joint)."""
    stored = state.get("tokenizer")
    if not isinstance(stored, dict) or not {"src", "tgt"} <= stored.keys():
        raise CheckpointError(f"{path} holds no tokenizer (expected tokenizer.src/.tgt)")
    try:
        src = Tokenizer.from_state(stored["src"])
        tgt = src if stored["tgt"] == stored["src"] else Tokenizer.from_state(stored["tgt"])
    except (RuntimeError, ValueError, TypeError) as e:  # a corrupt SentencePiece proto
        raise CheckpointError(f"{path} holds an unreadable tokenizer: "
                              f"{str(e).splitlines()[0] if str(e) else e!r}") from e
    return TokenizerPair(src, tgt)


def check_tokenizers(config: ModelConfig, tokenizers: TokenizerPair,
                     path: PathLike = "checkpoint") -> None:
    """Raise CheckpointError unless the tokenizers fit the model: vocabulary sizes, and the
    special ids the model and the search use (pad, start, eos)."""
    for side, tokenizer, size in (("src", tokenizers.src, config.src_vocab_size),
                                  ("tgt", tokenizers.tgt, config.tgt_vocab_size)):
        if tokenizer.vocab_size != size:
            raise CheckpointError(f"{path}: the {side} tokenizer has {tokenizer.vocab_size} "
                                  f"pieces but the model's vocabulary is {size}")
    ids = tokenizers.tgt.specials
    model_ids = {"pad_id": config.pad_id, "start_id": config.start_id, "eos_id": config.eos_id}
    tokenizer_ids = {"pad_id": ids.pad, "start_id": ids.start, "eos_id": ids.eos}
    if model_ids != tokenizer_ids or tokenizers.src.specials.eos != ids.eos:
        raise CheckpointError(f"{path}: the model's special ids {model_ids} differ from its "
                              f"tokenizers' {tokenizer_ids}")


def stored_training_config(state: dict, path: PathLike = "checkpoint") -> TrainConfig | None:
    """The training config a checkpoint records (`TrainConfig.from_dict`), or None."""
    stored = state.get("config")
    if stored is None:
        return None
    try:
        return TrainConfig.from_dict(stored)
    except ConfigError as e:
        raise CheckpointError(f"{path} holds an invalid training config: {e}") from e


def stored_decoding(state: dict, path: PathLike = "checkpoint") -> DecodingSettings:
    """The decoding settings a checkpoint stores (`decoding`: beam size, alpha, ... chosen
    on validation data), over the defaults; a checkpoint without them gets the defaults."""
    stored = state.get("decoding")
    try:
        return DecodingSettings.from_dict({} if stored is None else stored)
    except ConfigError as e:
        raise CheckpointError(f"{path} has invalid decoding settings: {e}") from e


def stored_run_id(state: dict) -> str | None:
    """The training run a checkpoint comes from (`run_id`), or None: an imported model, or a
    checkpoint written before runs had ids."""
    run_id = state.get("run_id")
    return run_id if isinstance(run_id, str) and run_id else None


def run_id_for(resumed: dict | None) -> str:
    """The run id of a training run: that of the checkpoint it resumes from (`resumed`), so
    that all of a run's checkpoints share it; a new random one for a new run (or one
    resumed from a checkpoint without an id)."""
    return (None if resumed is None else stored_run_id(resumed)) or uuid.uuid4().hex


def inference_checkpoint(model: Transformer, tokenizers: TokenizerPair, *,
                         training_config: TrainConfig | None,
                         decoding: DecodingSettings | None = None,
                         run_id: str | None = None,
                         **provenance: Any) -> dict[str, Any]:
    """A checkpoint that translates, as every writer builds it: the model's weights and
    config (pruned heads included), its tokenizers, the training config of its run (the
    language pair and data, which the evaluation tools read), the decoding settings chosen
    for it (None: the defaults), the id of the training run its weights come from (None:
    unknown, e.g. an imported model; what `check_averageable` compares) and `provenance`,
    plain values saying where it came from (e.g. `averaged_from=[...]`). A training
    checkpoint adds its resume state to this."""
    state = {"model": model.state_dict(), "model_config": model.config.to_dict(),
             "tokenizer": tokenizers_to_state(tokenizers),
             "config": None if training_config is None else training_config.to_dict(),
             "run_id": run_id}
    if decoding is not None:
        state["decoding"] = dataclasses.asdict(decoding)
    return {**state, **provenance}


def _averaging_conflict(a: dict, b: dict) -> str | None:
    """Why the checkpoints `a` and `b` cannot be averaged, or None: their model configs
    (vocabulary sizes included), their tokenizers (the stored SentencePiece models and id
    tables, side by side) or their run ids (where both have one) differ."""
    config_a, config_b = a["model_config"], b["model_config"]
    keys = [k for k in {**config_a, **config_b} if config_a.get(k) != config_b.get(k)]
    if keys:
        return f"their model configs differ ({', '.join(keys)})"
    stored_a, stored_b = a.get("tokenizer") or {}, b.get("tokenizer") or {}
    sides = [side for side in ("src", "tgt") if stored_a.get(side) != stored_b.get(side)]
    if sides:
        return f"their tokenizers differ ({' and '.join(sides)})"
    run_a, run_b = stored_run_id(a), stored_run_id(b)
    if run_a and run_b and run_a != run_b:
        return f"they come from different training runs (run_id {run_a} and {run_b})"
    return None


def check_ensemble_member(state: dict, path: PathLike, other: dict,
                          other_path: PathLike) -> None:
    """Raise CheckpointError, one line naming both files, unless the checkpoint `other` may
    join `state` in an ensemble (`ensemble.Ensemble`): the same tokenizers, source and
    target (one encoding of the sources feeds every member, and their next-token
    distributions are over one vocabulary). Architectures and training runs may differ."""
    stored, stored_other = state.get("tokenizer") or {}, other.get("tokenizer") or {}
    sides = [side for side in ("src", "tgt") if stored.get(side) != stored_other.get(side)]
    if sides:
        which = " and ".join({"src": "source", "tgt": "target"}[side] for side in sides)
        raise CheckpointError(f"cannot ensemble {other_path} with {path}: their {which} "
                              f"tokenizers differ; ensemble members must share both "
                              f"vocabularies")


def check_averageable(state: dict, path: PathLike, other: dict, other_path: PathLike) -> None:
    """Raise CheckpointError, one line naming both files, unless the checkpoints `state`
    and `other` may be averaged: the same model config and tokenizers, and the same run id
    where both have one (checkpoints without one, written before runs had ids, are compared
    by the rest). Averaging is for the checkpoints of one run: independent runs learn
    different, unaligned weights, and their mean translates badly."""
    reason = _averaging_conflict(state, other)
    if reason is not None:
        raise CheckpointError(
            f"cannot average {other_path} with {path}: {reason}. Averaging is for checkpoints "
            f"of one training run; independently trained models decode together "
            f"as an ensemble instead (--ensemble)")


def average_weights(paths: Sequence[PathLike]) -> dict[str, Any]:
    """The first checkpoint's state with its parameters replaced by their mean over all of
    `paths` (summed in float64, then cast back), `averaged_from` and the run id they share:
    what `Translator.load` reads when given several checkpoints. Checkpoints of different
    runs, tokenizers or models are refused (`check_averageable`)."""
    if not paths:
        raise ValueError("averaging needs at least one checkpoint")
    first = load_checkpoint(paths[0])
    total = {k: v.double() if v.is_floating_point() else v.clone()
             for k, v in first["model"].items()}
    reference, reference_path = _identity(first), paths[0]  # the first with a run id, if any
    for path in paths[1:]:
        state = load_checkpoint(path)
        check_averageable(reference, reference_path, state, path)
        if stored_run_id(reference) is None and stored_run_id(state) is not None:
            reference, reference_path = _identity(state), path
        for k, v in state["model"].items():
            if total[k].is_floating_point():
                total[k] += v.double()
    weights = {k: (v / len(paths)).to(first["model"][k].dtype) if v.is_floating_point() else v
               for k, v in total.items()}
    return {**first, "model": weights, "averaged_from": [str(p) for p in paths],
            "run_id": stored_run_id(reference)}


def _identity(state: dict) -> dict[str, Any]:
    """What `check_averageable` compares of a checkpoint, without its weights."""
    return {key: state.get(key) for key in ("model_config", "tokenizer", "run_id")}


def average_checkpoints(paths: Sequence[PathLike]) -> dict[str, Any]:
    """The inference checkpoint of `average_weights(paths)`: their tokenizer and run id,
    the first one's training config and decoding settings, and `averaged_from`. The
    training state (optimizer, counters) is dropped: it is for translation, not for
    resuming."""
    state = average_weights(paths)
    return inference_checkpoint(model_from_checkpoint(state, paths[0]),
                                tokenizers_from_state(state, paths[0]),
                                training_config=stored_training_config(state, paths[0]),
                                decoding=stored_decoding(state, paths[0]),
                                run_id=stored_run_id(state),
                                averaged_from=state["averaged_from"])
