"""The optimizer and the learning-rate schedule of a run, from its `optim` settings.

    optimizer = build_optimizer(model, cfg)      # Adam/AdamW, weight decay on weight matrices
    scheduler = build_scheduler(optimizer, cfg)  # warmup, then constant or 1/sqrt(update)

Both are PyTorch's own (`torch.optim.Adam`/`AdamW`, `LambdaLR`); this module chooses their
parameters: which parameters are decayed (`decayed_parameters`) and the factor of the peak
learning rate at each update (`lr_lambda`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .config import TrainConfig

__all__ = ["build_optimizer", "build_scheduler", "decayed_parameters", "lr_lambda"]


def lr_lambda(schedule: str, warmup_updates: int, max_updates: int | None = None,
              cooldown_updates: int = 0) -> Callable[[int], float]:
    """LambdaLR factor of the peak lr for the update after `num_updates` updates: linear
    warmup to 1, then constant or 1/sqrt(update) decay (1 at the end of warmup); with
    `cooldown_updates`, the last that many of `max_updates` decay linearly from there to
    ~0 (a run of fixed length ends annealed instead of at a high lr)."""
    warmup = max(1, warmup_updates)
    if cooldown_updates and max_updates is None:
        raise ValueError("a cooldown needs max_updates")

    def base(step: int) -> float:
        if step < warmup:
            return step / warmup
        return 1.0 if schedule == "constant" else math.sqrt(warmup / step)

    def factor(num_updates: int) -> float:
        step = num_updates + 1  # 1-based number of the update about to be made
        if cooldown_updates:
            start = max_updates - cooldown_updates  # last update at the full schedule
            if step > start:
                return base(max(start, 1)) * (max_updates + 1 - step) / (cooldown_updates + 1)
        return base(step)

    return factor


def decayed_parameters(model: nn.Module) -> list[str]:
    """Names of the parameters weight decay applies to: the weight matrices of the linear
    layers (dim >= 2), not biases, LayerNorm gains or embeddings (nor an output projection
    tied to an embedding), as nanoGPT's `configure_optimizers` chooses."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return [name for name, p in model.named_parameters()  # a shared matrix appears once
            if p.dim() >= 2 and id(p) not in embeddings]


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam/AdamW, with the fused kernel where this PyTorch has one for the device (CPU:
    torch >= 2.4). With `optim.weight_decay` > 0, two parameter groups: the decayed weight
    matrices (`decayed_parameters`) and the rest, without decay."""
    o = cfg.optim
    cls = torch.optim.AdamW if o.name == "adamw" else torch.optim.Adam
    params: list[Any] = list(model.parameters())
    if o.weight_decay > 0:
        decayed = set(decayed_parameters(model))
        named = list(model.named_parameters())
        params = [{"params": [p for n, p in named if n in decayed]},
                  {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0}]
    kwargs = dict(lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    try:
        return cls(params, fused=True, **kwargs)
    except RuntimeError:  # no fused kernel for these parameters' device
        return cls(params, **kwargs)


def build_scheduler(optimizer: torch.optim.Optimizer,
                    cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """The run's schedule over `optimizer` (`lr_lambda` of `optim.schedule`,
    `optim.warmup_updates` and `optim.cooldown_updates` before `trainer.max_updates`),
    stepped once per update."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(cfg.optim.schedule, cfg.optim.warmup_updates,
                             cfg.trainer.max_updates, cfg.optim.cooldown_updates))
