"""Multi-head attention as *Dive into Deep Learning* teaches it.

The public API follows the book's PyTorch code as d2l-zh and the earlier editions of d2l-en
print it (`masked_softmax`, `transpose_qkv`, `transpose_output`, `DotProductAttention`,
`MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads, dropout,
bias=False)`), so their examples run unchanged; today's d2l-en builds the projections
lazily, `MultiHeadAttention(num_hiddens, num_heads, dropout, bias=False)`. On top of it, as
keyword-only arguments of `MultiHeadAttention.forward`:

* `key_mask` (bool, True = a real key) as an alternative to `valid_lens`;
* `causal=True` for decoder self-attention (query i sees keys <= i);
* `need_weights=True` to keep the weights in `attention.attention_weights`, as the book does;
* `cache=KVCache(...)` for incremental decoding (`cache.py`).

`MultiHeadAttention.forward` projects, splits the heads, attends, merges the heads and
projects with W_o; which kernel attends (PyTorch's fused one, or the book's explicit path
with the CPU's faster pieces) is chosen in one place, `kernels.attend`. For looking inside
the heads, two context managers add to a layer through PyTorch-style hooks, removed on exit
(exceptions included), and leave its forward pass and state as they were:

* `with mha.recording() as record:` keeps each pass's weights per head in `record.weights`,
  (batch, num_heads, queries, keys) (`register_weights_hook`; `tools.attention_maps`,
  `decoding.alignment`);
* `with mha.masking_heads(mask):` scales each head's output before W_o by `mask` (0
  silences a head; a gate that requires grad gives the loss's gradient per head, as in
  Michel et al., 2019; `tools.heads`): a pre-hook of W_o.

`prune_heads` removes heads for good.

Every boolean mask in this module, public or internal, means True = may attend (the
convention of SDPA's boolean `attn_mask`; note that `nn.MultiheadAttention`'s
`key_padding_mask` is the opposite, True = ignore). The book's `valid_lens` (how many keys
are real) is the other way to say it. Masked scores get the dtype's minimum, never a literal
like -1e9 that overflows in fp16. A query with no key it may attend to (e.g. `valid_lens`
of 0) yields an all-zero weight row and a zero output, never NaN.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from . import kernels
from .cache import KVCache
from .layers import Dropout, Linear
from .masks import attention_mask, valid_lens_mask
from .pruning import head_features, select_features

__all__ = ["masked_softmax", "transpose_qkv", "transpose_output", "DotProductAttention",
           "AttentionRecord", "MultiHeadAttention"]


def masked_softmax(X: Tensor, valid_lens: Tensor | None) -> Tensor:
    """The book's masked softmax: keys at or beyond `valid_lens` get weight exactly 0.

    X: (batch, queries, keys); valid_lens: None, (batch,) or (batch, queries).
    """
    mask = None if valid_lens is None else valid_lens_mask(valid_lens, X.shape[1], X.shape[-1])
    return kernels.masked_softmax(X, mask)


# ---------------------------------------------------------------------------------------
# Heads <-> batch reshapes
# ---------------------------------------------------------------------------------------
def _split_heads(X: Tensor, num_heads: int) -> Tensor:
    """(batch, seq, num_hiddens) -> (batch, num_heads, seq, num_hiddens / num_heads), a view."""
    return X.view(*X.shape[:-1], num_heads, -1).transpose(1, 2)  # view: a C call, no wrapper


def _merge_heads(X: Tensor) -> Tensor:
    """(batch, num_heads, seq, head_dim) -> (batch, seq, num_heads * head_dim)."""
    return X.transpose(1, 2).flatten(2)


def transpose_qkv(X: Tensor, num_heads: int) -> Tensor:
    """The book's reshape for parallel heads.

    (batch, seq, num_hiddens) -> (batch * num_heads, seq, num_hiddens / num_heads)
    """
    X = _split_heads(X, num_heads)  # (batch, num_heads, seq, head_dim)
    return X.reshape(-1, X.shape[2], X.shape[3])


def transpose_output(X: Tensor, num_heads: int) -> Tensor:
    """Reverse `transpose_qkv`: (batch * num_heads, seq, head_dim) -> (batch, seq, num_hiddens)."""
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])  # (batch, num_heads, seq, head_dim)
    return _merge_heads(X)


# ---------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------
class DotProductAttention(nn.Module):
    """Scaled dot-product attention, keeping `attention_weights` as the book does."""

    def __init__(self, dropout: float, **kwargs):
        super().__init__(**kwargs)
        self.dropout = Dropout(dropout)
        self.attention_weights: Tensor | None = None

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | None = None,
        *,
        mask: Tensor | None = None,
    ) -> Tensor:
        """queries (b, q, d), keys (b, k, d), values (b, k, v) -> (b, q, v).

        `mask` (boolean, broadcastable to (b, q, k), True = may attend) replaces
        `valid_lens` when the caller already combined its masks.
        """
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)  # (b, q, k)
        if valid_lens is not None:
            self.attention_weights = masked_softmax(scores, valid_lens)
        else:
            self.attention_weights = kernels.masked_softmax(scores, mask)
        return torch.bmm(self.dropout(self.attention_weights), values)


@dataclass(eq=False)  # compared by identity: the open records are told apart
class AttentionRecord:
    """What `MultiHeadAttention.recording` keeps: the attention weights of the layer's
    latest forward pass, per head, (batch, num_heads, queries, keys), as the softmax gave
    them (before dropout); None until a pass has run."""

    weights: Tensor | None = None

    def keep(self, layer: nn.Module, weights: Tensor) -> None:
        """A weights hook (`MultiHeadAttention.register_weights_hook`): keep `weights`."""
        self.weights = weights


class MultiHeadAttention(nn.Module):
    """Multi-head attention, the book's PyTorch API plus masks, a fast path and a cache."""

    def __init__(
        self,
        key_size: int,
        query_size: int,
        value_size: int,
        num_hiddens: int,
        num_heads: int,
        dropout: float,
        bias: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if num_heads <= 0 or num_hiddens % num_heads != 0:
            raise ValueError(
                f"num_hiddens ({num_hiddens}) must be divisible by num_heads ({num_heads})"
            )
        self.num_heads = num_heads
        self.head_dim = num_hiddens // num_heads  # fixed: pruning removes whole heads
        self.pruned_heads: set[int] = set()  # original indices of the heads pruned away
        self.attention = DotProductAttention(dropout)
        self.W_q = Linear(query_size, num_hiddens, bias=bias)
        self.W_k = Linear(key_size, num_hiddens, bias=bias)
        self.W_v = Linear(value_size, num_hiddens, bias=bias)
        self.W_o = Linear(num_hiddens, num_hiddens, bias=bias)
        # (an OrderedDict, as nn.Module's own hooks: a RemovableHandle refers to it weakly)
        self._weights_hooks: OrderedDict[int, Callable[[MultiHeadAttention, Tensor], None]] = (
            OrderedDict())
        self._head_masks: list[Tensor | None] = []  # open `masking_heads` blocks, innermost last

    def register_weights_hook(self, hook: Callable[[MultiHeadAttention, Tensor], None]
                              ) -> RemovableHandle:
        """Call `hook(layer, weights)` after each forward pass with the pass's attention
        weights per head, (batch, num_heads, queries, keys), as the softmax gave them
        (before dropout); while a hook is registered, passes take the explicit path, which
        computes them. Returns the handle whose `remove()` takes the hook away."""
        handle = RemovableHandle(self._weights_hooks)
        self._weights_hooks[handle.id] = hook
        return handle

    @contextlib.contextmanager
    def recording(self) -> Iterator[AttentionRecord]:
        """Keep the attention weights of each forward pass while the block is open:
        `record.weights` is the latest pass's, per head (batch, num_heads, queries, keys).
        On exit, even by an exception, the hook is removed; the record keeps its last
        weights for the caller."""
        record = AttentionRecord()
        handle = self.register_weights_hook(record.keep)
        try:
            yield record
        finally:
            handle.remove()

    @contextlib.contextmanager
    def masking_heads(self, mask: Tensor | None) -> Iterator[None]:
        """Multiply each head's output by its entry of `mask` before W_o while the block is
        open: (num_heads,), or (batch, num_heads) for one row per example (teacher-forced
        passes: beam search reorders and drops batch rows); None masks nothing. A pre-hook
        of W_o; an inner block's mask takes the place of an outer one's until it ends, and
        the hook is removed on exit, even by an exception."""
        if mask is not None and mask.shape[-1] != self.num_heads:
            raise ValueError(f"a head mask needs one entry per head ({self.num_heads}), "
                             f"got shape {tuple(mask.shape)}")

        def scale(W_o: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...] | None:
            if mask is None or self._head_masks[-1] is not mask:  # none, or an inner one's
                return None
            X = args[0]  # (batch, q, num_heads * head_dim): the merged heads
            per_feature = mask.to(X).repeat_interleave(self.head_dim, dim=-1)
            return (X * per_feature.view(-1, 1, X.shape[-1]),)

        handle = self.W_o.register_forward_pre_hook(scale)
        self._head_masks.append(mask)
        try:
            yield
        finally:
            handle.remove()
            self._head_masks.pop()

    @property
    def head_mask(self) -> Tensor | None:
        """The mask of the innermost open `masking_heads` block, or None."""
        return self._head_masks[-1] if self._head_masks else None

    @property
    def is_recording(self) -> bool:
        """Whether a weights hook (a `recording()` block) is registered."""
        return bool(self._weights_hooks)

    @property
    def head_attention_weights(self) -> Tensor | None:
        """The last weights per head, (batch, num_heads, queries, keys), for plotting."""
        w = self.attention.attention_weights
        return None if w is None else w.unflatten(0, (-1, self.num_heads))

    @property
    def head_ids(self) -> list[int]:
        """The original index of each remaining head, in order (0..num_heads-1 unpruned)."""
        return sorted(set(range(self.num_heads + len(self.pruned_heads))) - self.pruned_heads)

    def prune_heads(self, heads: Iterable[int]) -> None:
        """Remove `heads` (original indices; already pruned ones are ignored) for good:
        their rows of W_q, W_k, W_v (and biases) and their columns of W_o go, so the layer
        computes what it computed with those heads masked to 0 (`masking_heads`), up to
        rounding, faster. At least one head must remain (`pruning.unpruned_weights` gives
        the weights back with every head)."""
        head_ids = self.head_ids
        total = len(head_ids) + len(self.pruned_heads)
        heads = set(heads) - self.pruned_heads
        bad = sorted(h for h in heads if not 0 <= h < total)
        if bad:
            raise ValueError(f"no heads {bad}: this layer has heads 0..{total - 1}")
        keep = [i for i, h in enumerate(head_ids) if h not in heads]  # current positions
        if not keep:
            raise ValueError(f"cannot prune all {len(head_ids)} remaining heads of a layer")
        if not heads:
            return
        if self.head_mask is not None:
            raise ValueError("cannot prune heads inside masking_heads: the mask describes "
                             "the heads before pruning")
        index = head_features(keep, self.head_dim).to(self.W_q.weight.device)
        self.W_q, self.W_k, self.W_v = (select_features(W, index, dim=0)
                                        for W in (self.W_q, self.W_k, self.W_v))
        self.W_o = select_features(self.W_o, index, dim=1)
        self.num_heads = len(keep)
        self.pruned_heads |= heads

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | None = None,
        *,
        key_mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor:
        """queries (batch, q, query_size), keys/values (batch, k, *) -> (batch, q, num_hiddens).

        valid_lens: (batch,) or (batch, q), keys at or beyond it are ignored (the book's API).
        key_mask: (batch, k) bool, True marks a real key; an alternative to valid_lens.
        causal: query i attends to keys <= i (counting cached keys as the past).
        need_weights: keep `attention.attention_weights` (batch * num_heads, q, k); runs the
            explicit path. Inside `recording()` it is always true.
        cache: see `KVCache`; with a filled static cache `keys`/`values` are not used.
        """
        q, k, v = self._project(queries, keys, values, cache)  # (batch, heads, len, head_dim)
        mask = attention_mask(
            q.shape[0], q.shape[2], k.shape[2],
            valid_lens=valid_lens, key_mask=key_mask,
            causal=causal, device=q.device,
        )  # (batch or 1, 1, q or 1, k) or None
        plain_causal = (causal and valid_lens is None and key_mask is None
                        and q.shape[2] == k.shape[2])  # the fused kernel builds that mask
        output, weights = kernels.attend(q, k, v, mask, self.attention.dropout,
                                         plain_causal=plain_causal,
                                         keep_weights=need_weights or self.is_recording)
        if need_weights:  # where the book keeps them: (batch * num_heads, q, k)
            self.attention.attention_weights = weights.flatten(0, 1)
        for hook in list(self._weights_hooks.values()):
            hook(self, weights)
        return self.W_o(_merge_heads(output))  # (batch, q, num_hiddens)

    def _project(
        self, queries: Tensor, keys: Tensor, values: Tensor, cache: KVCache | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Project and split heads, using and updating the cache."""
        h = self.num_heads
        if cache is not None and cache.static and cache.keys is not None:
            return _split_heads(self.W_q(queries), h), cache.keys, cache.values
        if queries is keys and keys is values and torch.is_grad_enabled():
            # Training self-attention: one matmul over W_q, W_k, W_v concatenated, which
            # costs one concatenation per forward pass, i.e. per weight update. Without
            # gradients (decoding, step after step) three matmuls are as fast or faster
            # (docs/benchmarks.md, "The training step against `nn.Transformer`").
            W = torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight])  # (3 x hidden, d)
            b = (None if self.W_q.bias is None else
                 torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias]))
            q, k, v = (_split_heads(x, h) for x in F.linear(queries, W, b).chunk(3, dim=-1))
        else:
            q = _split_heads(self.W_q(queries), h)
            k = _split_heads(self.W_k(keys), h)
            v = _split_heads(self.W_v(values), h)
        if cache is not None:
            k, v = cache.append(k, v)
        return q, k, v
