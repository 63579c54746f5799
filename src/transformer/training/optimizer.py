"""The optimizer of a run, from its `optim` settings.

    optimizer = build_optimizer(model, cfg)      # Adam/AdamW, weight decay on weight matrices

PyTorch's own (`torch.optim.Adam`/`AdamW`); this module chooses its parameters: which are
decayed (`decayed_parameters`). The learning rate of each update comes from `schedule.py`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..run.config import TrainConfig

__all__ = ["build_optimizer", "decayed_parameters"]


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
