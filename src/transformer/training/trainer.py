"""The training loop: batches -> label-smoothed loss -> backward -> clip -> Adam + schedule,
validation BLEU -> best checkpoint / early stopping, exact resume, DistributedDataParallel.

    train(cfg, run_dir)             # what `transformer train` calls (cfg: config.TrainConfig)

One update = `optim.update_freq` batches; their summed loss is divided by the number of target
tokens of the whole update on all ranks (as fairseq does), so gradient accumulation and more
GPUs only change the batch size. The loss is `loss.LabelSmoothedLoss` (the output projection
fused into the label-smoothed cross-entropy); validation uses `loss.evaluate_loss` and decodes
with `corpus.search_corpus`, the same functions the head tools and the Translator use.
The device, the process group, the precision and CUDA's switches come from `runtime`
(`resolve_device` rejects a device this machine lacks before any work), the optimizer from
`optimizer` (PyTorch's Adam), the learning rate of each update from `schedule` (fitted to the
run's budget: updates, target tokens or time), the counters from `state`, validation from
`validation`. Everything else is PyTorch's own too: `torch.amp`, `clip_grad_norm_`, DDP
with `no_sync()` while accumulating.

The run directory holds `config.yaml` (resolved), `spm.model`, `checkpoints/`, TensorBoard
event files and `train.log` (written by `log.TrainLog`); only rank 0 logs and writes.
A run directory that already has `checkpoints/checkpoint_last.pt` is resumed: model,
optimizer, schedule, scaler, counters, position in the epoch and RNG states are restored, so
the losses continue exactly.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Union

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ..data.store import Batch
from ..errors import CheckpointError, TrainingError, WriteError
from ..files import atomic_write
from ..model.loss import LabelSmoothedLoss
from ..model.transformer import ModelConfig, Transformer
from ..run import checkpoint as ckpt
from ..run.compose import load_config
from ..run.config import AUTO_MODEL, ModelSettings, TrainConfig
from ..run.data import load_data_on_ranks
from ..runtime import (
    DistEnv,
    allocator_description,
    configure_cuda,
    init_distributed,
    peak_resident_bytes,
    prefetched,
    resolve_device,
    resolve_precision,
)
from .log import (
    RunProgress,
    TrainLog,
    ValidationMetrics,
    setup_logging,
)
from .optimizer import build_optimizer
from .schedule import (
    Budget,
    BudgetSettings,
    Schedule,
    describe_settings,
    epoch_limit_note,
    epoch_tokens,
    fit_to_budget,
    needs_budget_settings,
    null_settings,
    run_budget,
)
from .speed import measure_speed, settings_at_measured_speed
from .state import Agreement, TrainClock, TrainResult, TrainState
from .validation import ValidationReport, validate

__all__ = ["Trainer", "train", "stop_on_signals"]

log = logging.getLogger(__name__)
PathLike = Union[str, "os.PathLike[str]"]



class Trainer:
    """Owns the model, optimizer and counters of one run; `fit()` trains to a limit."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, env: DistEnv) -> None:
        self.cfg, self.run_dir, self.env = cfg, run_dir, env
        self.ckpt_dir = run_dir / "checkpoints"
        self.device = env.rank_device(resolve_device(cfg.trainer.device, "trainer.device"))
        self.precision = resolve_precision(cfg.trainer.precision, self.device)
        if self.device.type == "cuda":
            log.info("CUDA: %s", configure_cuda(cfg.trainer.tf32, cfg.trainer.cudnn_attention))
        self.stop_requested: str | None = None  # set by the signal handler
        self.losses: list[float] = []

        resume = self._find_resume_checkpoint()
        self.run_id = ckpt.run_id_for(None if resume is None else resume[1])  # kept on resume
        init = self._init_checkpoint()
        if init is not None:  # the run's config says what it trains: the checkpoint's model
            self.cfg = cfg = replace(
                cfg, model=ModelSettings.of(ModelConfig.from_dict(init[1]["model_config"]),
                                            name="init_from"))
        start = resume or init
        self.data = load_data_on_ranks(cfg.data, run_dir, env, None if start is None else
                                    ckpt.tokenizers_from_state(start[1], start[0]))
        self.budget_settings: BudgetSettings | None = None  # what the budget chose, if any
        self._tokens_per_second: float | None = None  # measured for a time budget's settings
        self.cfg = cfg = self._fitted(cfg, resume)
        self.data = replace(self.data, cfg=cfg.data)
        torch.manual_seed(cfg.seed)  # the same initial model on every rank
        self.model = self._build_model(init, load_weights=resume is None).to(self.device)
        self.optimizer = build_optimizer(self.model, cfg)
        self.schedule = Schedule(cfg)
        self.progress = 0.0  # the share of the budget used, as of the last update
        self.scaler = (torch.amp.GradScaler(self.device.type)
                       if self.precision.dtype == torch.float16 else None)
        self.state = TrainState()
        torch.manual_seed(cfg.seed + env.rank)  # dropout differs between ranks
        if resume is not None:
            self._restore(*resume)
        else:  # the speed probe counts against the budget
            self.state.train_time = self._probe_seconds
        self.clock = TrainClock(self.state.train_time)
        self.progress = self.schedule.budget.progress(self.state.num_updates,
                                                      self.state.target_tokens,
                                                      self.state.train_time)
        self.loss = LabelSmoothedLoss(self.model, cfg.optim.label_smoothing)
        self.ddp = (DistributedDataParallel(self.loss, broadcast_buffers=False,
                                            device_ids=[self.device.index]
                                            if self.device.type == "cuda" else None)
                    if env.distributed else None)
        self.train_loss: nn.Module = self.ddp or self.loss
        if cfg.trainer.compile:
            self.train_loss = torch.compile(self.train_loss)
        self.log = TrainLog(run_dir, env.is_main,
                            purge_step=self.state.num_updates + 1 if resume else None)
        self._write_config()
        self._last_valid: ValidationMetrics | None = None
        self.display = RunProgress(enabled=False)  # the bar `fit` shows

    # -- setup pieces --

    def _find_resume_checkpoint(self) -> tuple[Path, dict] | None:
        """(path, state) of checkpoint_last.pt if the run directory has one."""
        path = self.ckpt_dir / ckpt.LAST
        if not path.is_file():
            if self.cfg.trainer.resume:
                raise CheckpointError(
                    f"trainer.resume=true but there is no {path} to resume from")
            return None
        return path, ckpt.load_checkpoint(path, map_location="cpu")

    def _init_checkpoint(self) -> tuple[Path, dict] | None:
        """(path, state) of `init_from`'s checkpoint, or None. Its weights are used only
        when the run starts (a resumed run has its own), its config and tokenizers always."""
        return None if self.cfg.init_from is None else ckpt.load_init_checkpoint(
            self.cfg.init_from)

    def _fitted(self, cfg: TrainConfig, resume: tuple[Path, dict] | None) -> TrainConfig:
        """`cfg` with what the corpus and the budget choose filled in, each choice logged:
        the vocabulary size (SentencePiece trained by then), the budget
        (`schedule.run_budget`), the batch size, dropout and peak lr
        (`_choose_budget_settings`), the model under `model=auto`; and a note when
        `trainer.max_epochs` comes first."""
        if cfg.data.vocab_size is None:
            cfg = replace(cfg, data=replace(cfg.data,
                                            vocab_size=self.data.tokenizers.src.vocab_size))
        self.epoch_tokens = epoch_tokens(self.data.train, cfg.data.seed)
        trained = resume and ckpt.stored_training_config(resume[1], resume[0])
        if trained and cfg.model.name == AUTO_MODEL:  # the model the run chose, resumed
            cfg = replace(cfg, model=trained.model)
        cfg = run_budget(cfg, self.epoch_tokens, trained or None)
        started, self._probe_seconds = time.monotonic(), 0.0
        if needs_budget_settings(cfg):
            self.budget_settings = self._choose_budget_settings(cfg, resume)
            self._probe_seconds = time.monotonic() - started  # used by a new run only
            log.info("%s", describe_settings(Budget.of(cfg), self.budget_settings,
                                             self._tokens_per_second, self.epoch_tokens,
                                             null_settings(cfg)))
            cfg = fit_to_budget(cfg, self.budget_settings, self.env.world_size)
        note = epoch_limit_note(cfg, self.epoch_tokens, self._tokens_per_second,
                                self.env.world_size)
        if note:
            log.info("%s", note)
        return cfg

    def _choose_budget_settings(self, cfg: TrainConfig,
                                resume: tuple[Path, dict] | None) -> BudgetSettings:
        """The settings for this run's budget and corpus (`schedule.budget_settings`): a
        resumed run's own (one saved without them: the values it trained with), else chosen
        on rank 0 (measuring the speed first when a time limit may bind) for every rank."""
        if resume is not None and resume[1].get("budget_settings"):
            return BudgetSettings(**resume[1]["budget_settings"])
        trained = resume and ckpt.stored_training_config(resume[1], resume[0])
        if trained is not None and not needs_budget_settings(trained):
            return BudgetSettings(
                0, trained.data.max_tokens * self.env.world_size * trained.optim.update_freq,
                trained.model.dropout, trained.optim.lr, trained.optim.warmup_fraction)
        box: list[Any] = [None]
        if self.env.is_main:
            box[0], self._tokens_per_second = settings_at_measured_speed(
                cfg, self.epoch_tokens, self._measure_speed, self.env.world_size)
        if self.env.distributed:
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def _measure_speed(self, cfg: TrainConfig) -> float:
        """The speed probe of a time budget (`speed.measure_speed`) at `cfg`'s model and
        batch, the run's device and precision, on a throwaway model (the run's own is built
        after, from its seed)."""
        return measure_speed(Transformer(self._model_config(cfg.model)).to(self.device),
                             replace(self.data, cfg=cfg.data), cfg, self.autocast)

    def _model_config(self, settings: ModelSettings) -> ModelConfig:
        """The model `settings` describe, with the vocabulary the tokenizers decide."""
        toks = self.data.tokenizers
        return settings.to_model_config(toks.src.vocab_size, toks.tgt.vocab_size,
                                        share_embeddings=self.cfg.data.joint_vocab,
                                        special_ids=toks.tgt.specials)

    def _build_model(self, init: tuple[Path, dict] | None, load_weights: bool) -> Transformer:
        """A new model from the config, or `init`'s (its pruned heads too), with `init`'s
        weights when `load_weights` (a resumed run restores its own instead)."""
        toks = self.data.tokenizers
        if init is not None and load_weights:
            model = ckpt.model_from_checkpoint(init[1], init[0])
            log.info("initialized from %s", init[0])
        else:
            config = (ModelConfig.from_dict(init[1]["model_config"]) if init is not None else
                      self._model_config(self.cfg.model))
            model = Transformer(config)
        ckpt.check_tokenizers(model.config, toks, init[0] if init else "the run's tokenizer")
        log.info("model %s: %s parameters, %s", self.cfg.model.name,
                 f"{model.num_parameters():,}", model.config)
        return model

    def _restore(self, path: Path, state: dict) -> None:
        """Continue from a checkpoint written by `save` (same model config required)."""
        ckpt.check_model_config(state, self.model.config, path)
        self.model.load_state_dict(state["model"])
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except ValueError as e:  # other parameter groups (another optim.weight_decay)
            raise CheckpointError(f"{path}: its optimizer state does not fit this run's "
                                  f"optimizer ({e})") from e
        if state.get("schedule"):  # the plan (older checkpoints: planned again)
            self.schedule.load_state_dict(state["schedule"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.state = TrainState(**state["train_state"])
        rngs = state["rng"]
        if len(rngs) == self.env.world_size:
            ckpt.set_rng_state(rngs[self.env.rank])
        else:
            log.warning("checkpoint has RNG states of %d ranks, this run has %d: dropout "
                        "will not continue exactly", len(rngs), self.env.world_size)
        s = self.state
        log.info("resumed from %s: epoch %d, %d batches into it, %d updates", path, s.epoch,
                 s.batches_done, s.num_updates)

    def _write_config(self) -> None:
        if self.env.is_main:
            with atomic_write(self.run_dir / "config.yaml", text=True) as f:
                f.write(OmegaConf.to_yaml(OmegaConf.structured(self.cfg)))
            dtype = self.precision.dtype
            log.info("device %s, %s (%s)%s", self.device,
                     "float32" if dtype is None else f"autocast {dtype}", self.precision.why,
                     f"; memory allocator {allocator_description()}"
                     if self.device.type == "cpu" else "")

    def close(self) -> None:
        self.log.close()

    # -- the loop --

    def fit(self) -> TrainResult:
        """Train until a limit, early stopping or a signal; returns why it stopped."""
        self.clock.start()
        self.display = RunProgress(self.env.is_main, self.run_progress())
        reason = None
        try:
            while reason is None:
                reason = self.run_epoch()
        finally:
            self.display.close()
        valid = self._last_valid
        if reason == "signal":
            self.save()
        elif self.state.last_validation != self.state.num_updates:
            valid = self.validate_and_save().metrics
        s = self.state
        resident = peak_resident_bytes()
        memory = (f"; peak GPU memory {torch.cuda.max_memory_allocated(self.device) / 2**30:.2f}"
                  " GiB" if self.device.type == "cuda" else
                  "" if resident is None else f"; peak resident memory {resident / 2**30:.2f} GiB")
        log.info("stopped (%s) in epoch %d after %d updates (%s target tokens), %.0f s; best "
                 "BLEU %.2f; checkpoints in %s%s", reason, s.trained_epoch, s.num_updates,
                 f"{s.target_tokens:,}", s.train_time, s.best_bleu, self.ckpt_dir, memory)
        return TrainResult(reason, s, self.losses, valid)

    def run_progress(self, epoch_batches: int | None = None) -> float:
        """The share of the run done: of its budget, or of its epochs where
        `trainer.max_epochs` ends it first (`epoch_batches`: the current epoch's batches)."""
        s, epochs = self.state, self.cfg.trainer.max_epochs
        if epochs is None:
            return self.progress
        within = s.batches_done / epoch_batches if epoch_batches else 0.0
        return max(self.progress, min(1.0, (s.epoch - 1 + within) / epochs))

    def run_epoch(self) -> str | None:
        """Train on the rest of the current epoch, then validate and save numbered
        checkpoints (before `trainer.validate_after_updates` updates, or without
        `trainer.validate_every_epoch`: write checkpoint_last.pt only). Within the epoch:
        validate every `trainer.validate_every_updates` (from the start: a sparse curve),
        save checkpoint_last.pt every `trainer.save_every_updates`. Returns the reason to
        stop, or None to go on with the next epoch."""
        s, t, uf = self.state, self.cfg.trainer, self.cfg.optim.update_freq
        if t.max_epochs is not None and s.epoch > t.max_epochs:
            return "max_epochs"
        draw = self.data.train.draw(self.cfg.data.seed, s.epoch)
        if len(self.data.train.names) > 1 and s.batches_done == 0:
            self.log.epoch_draw(s.num_updates, s.epoch, self.data.train.counts(draw))
        batches = self.data.train_batches(s.epoch, self.env.rank, self.env.world_size, draw)
        todo = batches[s.batches_done:]
        groups = [todo[start:start + uf] for start in range(0, len(todo), uf)]
        for group in prefetched(self._collate_group, groups, t.prefetch_batches):
            if t.max_updates is not None and s.num_updates >= t.max_updates:
                return "max_updates"
            if t.max_target_tokens is not None and s.target_tokens >= t.max_target_tokens:
                return "max_target_tokens"
            reason = self.train_step(group)
            if reason is not None:
                return reason
            s.batches_done += len(group)
            self.display.update(self.run_progress(len(batches)), self.clock.elapsed(),
                                s.num_updates, s.epoch, self.log.meter)
            validate = (t.validate_every_updates and s.num_updates != s.last_validation
                        and s.num_updates % t.validate_every_updates == 0)
            if validate and self.validate_and_save().early_stop:
                return "patience"
            if (not validate and t.save_every_updates
                    and s.num_updates % t.save_every_updates == 0):
                self.save()  # a kill loses at most save_every_updates updates
        s.epoch, s.batches_done = s.epoch + 1, 0
        if not t.validate_every_epoch:
            self.save()  # the epoch boundary, for resuming
            return None
        if (s.num_updates < t.validate_after_updates
                or self.progress < t.validate_after_budget):
            self.save()  # for resuming; numbered checkpoints come with the late epochs
            return None
        return "patience" if self.validate_and_save().early_stop else None

    def _collate_group(self, group: list[np.ndarray]) -> list[Batch]:
        """One update's batches, in page-locked memory when they go to a GPU."""
        batches = [self.data.train.collate(idx) for idx in group]
        return [b.pin_memory() for b in batches] if self.device.type == "cuda" else batches

    def train_step(self, batches: list[Batch]) -> str | None:
        """One update over `batches` (gradient accumulation). Returns "signal"/"max_time"
        when the ranks agree to stop instead (before any work)."""
        agreed = self._agree_before_update(sum(b.num_tgt_tokens for b in batches))
        if agreed.stop is not None:
            return agreed.stop
        s = self.state  # where the run is: the plan, then this update's lr
        self.schedule.observe(s.num_updates, s.target_tokens, agreed.seconds)
        self.progress = self.schedule.budget.progress(s.num_updates, s.target_tokens,
                                                      agreed.seconds)
        self.schedule.set_lr(self.optimizer, s.num_updates, self.progress)
        self.model.train()
        scale = self.env.world_size / agreed.tokens  # DDP averages gradients over ranks
        loss_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            with self.ddp.no_sync() if self.ddp is not None and not last else nullcontext():
                loss = self.batch_loss(batch.to(self.device, non_blocking=True))
                loss_scaled = loss * scale
                (self.scaler.scale(loss_scaled) if self.scaler else loss_scaled).backward()
            loss_sum += loss.detach()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        clip = self.cfg.optim.clip_norm or math.inf  # inf: only measure the norm
        gnorm = nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        loss_total, gnorm = self._reduce_stats(loss_sum, gnorm)  # the update's one sync
        self._apply_update(loss_total / agreed.tokens, gnorm, agreed.tokens)
        return None

    def batch_loss(self, batch: Batch) -> Tensor:
        """Label-smoothed cross-entropy summed over the batch's target tokens (`train_loss`)
        at the run's precision."""
        with self.autocast():
            return self.train_loss(batch.src, batch.src_valid_lens, batch.tgt_in,
                                   batch.tgt_out, batch.tgt_index)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.precision.dtype or torch.bfloat16,
                              enabled=self.precision.dtype is not None)

    def _agree_before_update(self, local_tokens: int) -> Agreement:
        """Total target tokens of this update over all ranks, and a stop reason if any rank
        got a signal or the time is up (all ranks decide alike), and the training time."""
        max_time, seconds = self.cfg.trainer.max_time, self.clock.elapsed()
        votes = {"tokens": float(local_tokens), "seconds": seconds,
                 "signal": float(self.stop_requested is not None),
                 "max_time": float(max_time is not None and seconds >= max_time)}
        if self.env.distributed:
            t = torch.tensor(list(votes.values()), dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
            votes = dict(zip(votes, t.tolist(), strict=True))
            votes["seconds"] /= self.env.world_size
        stop = "signal" if votes["signal"] else "max_time" if votes["max_time"] else None
        return Agreement(votes["tokens"], votes["seconds"], stop)

    def _reduce_stats(self, loss_sum: Tensor, gnorm: Tensor) -> tuple[float, float]:
        """(loss summed over all ranks' tokens, gradient norm) as Python floats."""
        stats = torch.stack([loss_sum.float(), gnorm.float().to(loss_sum.device)])
        if self.env.distributed:
            stats = stats.double()
            dist.all_reduce(stats[:1])  # the norm is already the same on every rank
        loss, norm = stats.tolist()
        return loss, norm

    def _apply_update(self, loss: float, gnorm: float, tokens: float) -> None:
        """Step the optimizer (its lr set by the schedule), or skip the update if anything is
        non-finite."""
        s, finite = self.state, math.isfinite(loss) and math.isfinite(gnorm)
        lr = self.optimizer.param_groups[0]["lr"]  # this update's learning rate
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skips the step itself on inf/NaN gradients
            self.scaler.update()
        elif finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if finite:
            s.num_updates += 1
            s.target_tokens += int(tokens)
            s.bad_in_row = 0
            self.losses.append(loss)
            self.log.update(s.num_updates, s.epoch, loss, gnorm, tokens, lr,
                            every=self.cfg.trainer.log_every_updates,
                            elapsed=self.clock.elapsed())
        elif self.scaler is not None and math.isfinite(loss):
            log.info("fp16 gradient overflow: update skipped, loss scale now %g",
                     self.scaler.get_scale())
        else:
            s.bad_updates += 1
            s.bad_in_row += 1
            log.warning("non-finite loss %s / gradient norm %s: update skipped (%d in a row, "
                        "%d in total)", loss, gnorm, s.bad_in_row, s.bad_updates)
            if s.bad_in_row >= self.cfg.trainer.max_bad_updates:
                raise TrainingError(
                    f"{s.bad_in_row} updates in a row had a non-finite loss or gradient "
                    f"(trainer.max_bad_updates={self.cfg.trainer.max_bad_updates}); stopping. "
                    f"The last good checkpoint is {self.ckpt_dir / ckpt.LAST}; try a lower "
                    "optim.lr, optim.clip_norm > 0 or trainer.precision=fp32.")

    # -- validation and checkpoints --

    def validate_and_save(self) -> _Validated:
        """Validate (rank 0), update best BLEU / patience, write checkpoints."""
        s, t = self.state, self.cfg.trainer
        report = self.validate() if self.env.is_main else None
        metrics = report.metrics if report is not None else None
        if self.env.distributed:
            box = [metrics]
            dist.broadcast_object_list(box, src=0)
            metrics = box[0]
        improved = metrics.bleu > s.best_bleu
        if improved:
            s.best_bleu, s.bad_validations = metrics.bleu, 0
        else:
            s.bad_validations += 1
        s.last_validation = s.num_updates
        self.save(best=improved, numbered=True)
        self.log.validation(s.num_updates, s.trained_epoch, metrics, s.best_bleu, improved,
                            s.bad_validations, self.clock.elapsed(), s.target_tokens,
                            report.samples if report is not None else (),
                            report.figure if report is not None else None)
        self._last_valid = metrics
        return _Validated(metrics, bool(t.patience and s.bad_validations >= t.patience))

    def validate(self) -> ValidationReport:
        """Validation of the model as it is now (`validation.validate`); writes nothing."""
        return validate(self.model, self.data, self.cfg, self.autocast,
                        figure=self.log.tensorboard)

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything needed to resume exactly or to translate: tensors and plain values."""
        self.state.train_time = self.clock.elapsed()
        rngs = [ckpt.rng_state()]
        if self.env.distributed:  # every rank's dropout RNG, for an exact resume
            rngs = [None] * self.env.world_size
            dist.all_gather_object(rngs, ckpt.rng_state())
        return {
            **ckpt.inference_checkpoint(self.model, self.data.tokenizers,
                                        training_config=self.cfg, run_id=self.run_id),
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "budget_settings": (asdict(self.budget_settings) if self.budget_settings is not None
                                else None),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "train_state": asdict(self.state),
            "rng": rngs,
        }

    def save(self, best: bool = False, numbered: bool = False) -> None:
        """Write checkpoint_last.pt (and best / numbered copies) atomically; rank 0 only,
        but every rank must call it (the RNG states are gathered). A failed write (a full
        disk) raises TrainingError saying which checkpoint is still good."""
        state = self.checkpoint_state()
        if not self.env.is_main:
            return
        last = self.ckpt_dir / ckpt.LAST
        try:
            ckpt.save_checkpoint(state, last)
            if best:
                ckpt.copy_checkpoint(last, self.ckpt_dir / ckpt.BEST)
            if numbered and self.cfg.trainer.keep_last:
                ckpt.copy_checkpoint(last, ckpt.numbered_checkpoint_path(
                    self.ckpt_dir, self.state.num_updates))
                ckpt.prune_checkpoints(self.ckpt_dir, self.cfg.trainer.keep_last)
        except WriteError as e:
            still = (f"the last good checkpoint is still {last}" if last.is_file()
                     else "no checkpoint was written yet")
            raise TrainingError(f"{e}; {still}") from e


@dataclass
class _Validated:
    """What `validate_and_save` returns."""

    metrics: ValidationMetrics
    early_stop: bool  # patience exhausted


# ---- entry point ------------------------------------------------------------------------


@contextmanager
def stop_on_signals(trainer: Trainer) -> Iterator[None]:
    """SIGINT/SIGTERM: finish the current update, save checkpoint_last.pt, return cleanly.
    A second SIGINT stops at once (KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if trainer.stop_requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        trainer.stop_requested = signal.Signals(signum).name
        log.warning("%s received: finishing the current update, then saving %s",
                    trainer.stop_requested, trainer.ckpt_dir / ckpt.LAST)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def train(cfg: TrainConfig, run_dir: PathLike) -> TrainResult:
    """Train (or resume) a model in `run_dir`; under torchrun, one call per rank."""
    cfg = load_config(cfg)
    env = init_distributed(resolve_device(cfg.trainer.device, "trainer.device"))
    try:
        if env.distributed:  # Hydra's timestamped run dir could differ between ranks
            box = [str(run_dir)]
            dist.broadcast_object_list(box, src=0)
            run_dir = box[0]
        run_dir = Path(run_dir)
        cleanup_logging = setup_logging(run_dir, env.rank)
        log.info("run directory %s, world size %d", run_dir, env.world_size)
        trainer = None
        try:
            trainer = Trainer(cfg, run_dir, env)
            with stop_on_signals(trainer):
                return trainer.fit()
        finally:
            if trainer is not None:
                trainer.close()
            cleanup_logging()
    finally:
        if env.owns_group:
            dist.destroy_process_group()
