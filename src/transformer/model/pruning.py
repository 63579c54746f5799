"""Heads removed for good (`MultiHeadAttention.prune_heads`), and a pruned layer's weights
given back with every head, the removed ones as zeros (`unpruned_weights`: for formats with
one head count per stack, CTranslate2's and Hugging Face's)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .layers import Linear

__all__ = ["head_features", "select_features", "unpruned_weights"]


def head_features(heads: list[int], head_dim: int) -> Tensor:
    """The indices of the projections' features of `heads` (feature j belongs to head
    j // head_dim), in their order."""
    return (torch.tensor(heads)[:, None] * head_dim + torch.arange(head_dim)).flatten()


def select_features(linear: nn.Linear, index: Tensor, dim: int) -> nn.Linear:
    """A copy of `linear` keeping only output features (dim=0) or input features (dim=1)
    `index`; the bias belongs to the outputs, so it is kept whole for dim=1."""
    weight = linear.weight.detach().index_select(dim, index)  # (out, in), one side smaller
    out = Linear(weight.shape[1], weight.shape[0], bias=linear.bias is not None,
                 device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        out.weight.copy_(weight)
        if linear.bias is not None:
            out.bias.copy_(linear.bias if dim == 1 else linear.bias.index_select(0, index))
    return out


def unpruned_weights(layer: nn.Module) -> dict[str, Tensor]:
    """A `MultiHeadAttention` layer's projections with every original head, pruned ones as
    zeros: {"W_q.weight": (heads * head_dim, d), "W_q.bias": ..., "W_o.weight": (d, heads *
    head_dim), "W_o.bias"}; a zero head adds nothing to W_o's output."""
    total = layer.num_heads + len(layer.pruned_heads)
    rows = head_features(layer.head_ids, layer.head_dim)  # the kept heads' features
    out = {}
    for name in ("W_q", "W_k", "W_v", "W_o"):
        linear = getattr(layer, name)
        for kind in ("weight", "bias"):
            value = getattr(linear, kind)
            if value is None:
                continue
            value = value.detach()
            if name == "W_o" and kind == "weight":
                full = value.new_zeros(value.shape[0], total * layer.head_dim)
                full[:, rows] = value
            elif name != "W_o":
                full = value.new_zeros((total * layer.head_dim, *value.shape[1:]))
                full[rows] = value
            else:
                full = value
            out[f"{name}.{kind}"] = full
    return out
