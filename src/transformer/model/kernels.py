"""Which kernels compute attention, decided in one place: `attend`.

The book computes attention explicitly: scores = Q K^T / sqrt(d), masked, a softmax,
dropout, times V (`explicit_attention`, which keeps the weights). PyTorch's fused
`scaled_dot_product_attention` computes the same without keeping the weights, and faster,
except on a CPU over few keys (`fused_attention`; fewer than the tuning table's
`fused_attention_min_keys`: the explicit path there, except in CPU inference over at most
`fused_attention_max_queries` rows of queries, where the explicit path's operators cost
more than the fused kernel's one call: a decoding step of a few sentences' beams). CPU
inference has two kernels of its own for the explicit path's small pieces: the softmax of
rows shorter than `short_softmax_keys` from its definition, exp(x - max) / sum (`softmax`),
and weights times values with fewer than `small_bmm_products` multiply-adds per matrix as a
sum of products (`weighted_values`): PyTorch's generic operators are 3-7x and 1.7-4.8x slower there
(decoding's first steps; `hardware.MEASURED` says where each was measured). Training on a
CPU computes the softmax of short rows from its definition too, with its own backward pass
(`_DefinedSoftmax`), and a bf16 softmax in float32: PyTorch's kernels took 3x and 2-3x as
long, forward and backward. Its other operators are PyTorch's.

Every mask here means True = may attend; masked scores get the dtype's minimum, and a query
with no key to attend to gets zero weights and a zero output, never NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import hardware

__all__ = ["attend", "explicit_attention", "fused_attention", "masked_softmax", "softmax",
           "weighted_values"]


def _inference_on_cpu(x: Tensor) -> bool:
    """Whether `x` is a float32 CPU tensor that no gradient flows through: the case of the
    CPU inference kernels."""
    return (x.is_cpu and x.dtype == torch.float32
            and not (torch.is_grad_enabled() and x.requires_grad))


def softmax(scores: Tensor) -> Tensor:
    """`F.softmax(scores, dim=-1)`. On a CPU, rows shorter than the tuning table's
    `short_softmax_keys` are computed from the definition, exp(x - max) / sum (in inference
    in place on one fresh tensor; with gradients by `_DefinedSoftmax`), and a bf16 row in
    float32, cast back: PyTorch's kernels are several times slower on short rows and on
    bf16 (forward and backward)."""
    if not scores.is_cpu:
        return F.softmax(scores, dim=-1)
    short = scores.shape[-1] < hardware.TUNING.short_softmax_keys
    if _inference_on_cpu(scores):
        if not short:
            return F.softmax(scores, dim=-1)
        e = (scores - scores.amax(-1, keepdim=True)).exp_()
        return e.div_(e.sum(-1, keepdim=True))
    if short:
        return _DefinedSoftmax.apply(scores)
    return F.softmax(scores, dim=-1, dtype=_at_least_float32(scores)).to(scores.dtype)


def _at_least_float32(x: Tensor) -> torch.dtype:
    """float32, or x's dtype where it is wider (float64)."""
    return torch.promote_types(x.dtype, torch.float32)


class _DefinedSoftmax(torch.autograd.Function):
    """Softmax over the last axis from its definition, in float32 or wider (a bf16 input's
    result cast back): y = exp(x - max) / sum, and backward y * (g - sum(g * y))."""

    @staticmethod
    def forward(ctx, scores: Tensor) -> Tensor:
        x = scores.to(_at_least_float32(scores))
        e = (x - x.amax(-1, keepdim=True)).exp_()
        y = e.div_(e.sum(-1, keepdim=True))
        ctx.save_for_backward(y)
        return y.to(scores.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        g = grad.to(y.dtype)
        return (y * (g - (g * y).sum(-1, keepdim=True))).to(grad.dtype)


def masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """`softmax` over the last axis; where `mask` is False the weight is exactly 0, and a row
    whose mask is all False gives all zeros (not NaN, not uniform)."""
    if mask is None:
        return softmax(scores)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    # A fully masked row becomes uniform here; the final masked_fill zeroes it.
    return softmax(scores).masked_fill(~mask, 0.0)


def weighted_values(weights: Tensor, values: Tensor) -> Tensor:
    """`torch.bmm(weights, values)`: (b, q, k) x (b, k, v) -> (b, q, v); in CPU inference
    with fewer than the tuning table's `small_bmm_products` multiply-adds per matrix, the sum
    over keys of weight x value (one query over a dozen keys: decoder self-attention, step
    by step)."""
    b, q, k = weights.shape
    if (q * k * values.shape[-1] >= hardware.TUNING.small_bmm_products
            or not _inference_on_cpu(values)):
        return torch.bmm(weights, values)
    return (weights.unsqueeze(-1) * values.unsqueeze(1)).sum(2)  # (b, q, k, v) -> (b, q, v)


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                       dropout: nn.Module) -> tuple[Tensor, Tensor]:
    """The book's attention, heads folded into the batch axis: q (batch, heads, queries,
    head_dim), k and v (batch, heads, keys, head_dim), `mask` broadcastable to (batch, heads,
    queries, keys) -> the output (batch, heads, queries, head_dim) and the weights (batch,
    heads, queries, keys), as the softmax gave them (before dropout)."""
    batch_size, h, num_queries, head_dim = q.shape
    num_keys, rows = k.shape[2], batch_size * h
    if mask is not None:  # (batch, 1, q, k) -> (batch * heads, q, k)
        mask = mask.expand(batch_size, h, num_queries, num_keys).reshape(
            rows, num_queries, num_keys)
    scores = torch.bmm(q.reshape(rows, num_queries, head_dim),
                       k.reshape(rows, num_keys, head_dim).transpose(1, 2)) / math.sqrt(head_dim)
    weights = masked_softmax(scores, mask)  # (batch * heads, q, k)
    output = weighted_values(dropout(weights) if dropout.training else weights,
                             v.reshape(rows, num_keys, head_dim))  # (batch * heads, q, head_dim)
    return (output.view(batch_size, h, num_queries, -1),
            weights.view(batch_size, h, num_queries, num_keys))


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float,
                    is_causal: bool) -> Tensor:
    """PyTorch's `scaled_dot_product_attention` with the explicit path's semantics, guarding
    fully masked query rows; the shapes of `explicit_attention`."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal)
    # SDPA returns NaN for a query that may attend to no key: let such a row attend
    # everywhere, then zero its output (the explicit path gives zero there too).
    has_key = mask.any(dim=-1, keepdim=True)  # (batch, 1, q or 1, 1)
    output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~has_key,
                                            dropout_p=dropout_p)
    return output.masked_fill(~has_key, 0.0)


def _few_queries(q: Tensor, dropout: nn.Module) -> bool:
    """Whether q (batch, heads, queries, head_dim) is CPU inference over at most the tuning
    table's `fused_attention_max_queries` rows of queries (batch x heads x queries): a
    decoding step of a few sentences' beams, where the explicit path's dozen operators cost
    more than the fused kernel's one call, whatever the keys."""
    batch, heads, queries, _ = q.shape
    return (batch * heads * queries <= hardware.TUNING.fused_attention_max_queries
            and not dropout.training and _inference_on_cpu(q))


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: nn.Module, *,
           plain_causal: bool = False, keep_weights: bool = False
           ) -> tuple[Tensor, Tensor | None]:
    """Attention of q over k and v (the shapes of `explicit_attention`) by the kernel that
    suits it: the explicit path where the weights are kept or the keys are few on a CPU
    (unless the queries are few too: `_few_queries`), else the fused kernel -> the output
    and the weights (None from the fused kernel). `plain_causal`: `mask` is only the
    causal mask of as many queries as keys, which the fused kernel builds itself."""
    if keep_weights or (q.is_cpu
                        and k.shape[2] < hardware.TUNING.fused_attention_min_keys
                        and not _few_queries(q, dropout)):
        return explicit_attention(q, k, v, mask, dropout)
    dropout_p = dropout.p if dropout.training else 0.0
    return fused_attention(q, k, v, None if plain_causal else mask, dropout_p,
                           plain_causal), None
