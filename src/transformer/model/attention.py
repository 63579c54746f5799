"""Multi-head attention as *Dive into Deep Learning* teaches it, made fast.

The public API follows the book's PyTorch code as d2l-zh and the earlier editions of d2l-en
print it (`masked_softmax`, `transpose_qkv`, `transpose_output`, `DotProductAttention`,
`MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads, dropout,
bias=False)`), so their examples run unchanged; today's d2l-en builds the projections
lazily, `MultiHeadAttention(num_hiddens, num_heads, dropout, bias=False)`. On top of it, as
keyword-only arguments of `MultiHeadAttention.forward`:

* `key_mask` (bool, True = a real key) as an alternative to `valid_lens`;
* `causal=True` for decoder self-attention (query i sees keys <= i);
* `need_weights=True` to keep the attention weights (explicit path, as in the book);
* `cache=KVCache(...)` for incremental decoding.

For looking inside the heads, two context managers of `MultiHeadAttention` change what its
forward passes do while they are open, and restore the layer on exit (exceptions included):

* `with mha.recording() as record:` keeps each pass's weights per head in `record.weights`,
  (batch, num_heads, queries, keys) (`transformer.tools.attention_maps`,
  `transformer.decoding.alignment`);
* `with mha.masking_heads(mask):` scales each head's output before W_o by `mask` (0
  silences a head; a gate that requires grad gives the loss's gradient per head, as in
  Michel et al., 2019; `transformer.tools.heads`).

`prune_heads` removes heads for good.

Without weights requested, attention runs through PyTorch's fused
`scaled_dot_product_attention` (SDPA) with the same masking semantics, except on CPU with
fewer than `CPU_FUSED_MIN_KEYS` keys, where the explicit path is faster.

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
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .layers import Dropout, Linear

__all__ = [
    "masked_softmax",
    "transpose_qkv",
    "transpose_output",
    "attention_mask",
    "key_padding_mask",
    "DotProductAttention",
    "KVCache",
    "BufferPool",
    "CACHE_BUFFERS",
    "AttentionRecord",
    "MultiHeadAttention",
]


# ---------------------------------------------------------------------------------------
# Masks and the masked softmax
# ---------------------------------------------------------------------------------------
def _valid_lens_mask(valid_lens: Tensor, num_queries: int, num_keys: int) -> Tensor:
    """Boolean mask (batch, num_queries or 1, num_keys) from 1-D or 2-D `valid_lens`."""
    keys = torch.arange(num_keys, device=valid_lens.device)
    if valid_lens.dim() == 1:  # (batch,): the same length for every query
        return keys[None, None, :] < valid_lens[:, None, None]
    if valid_lens.dim() == 2:  # (batch, queries): one length per query
        if valid_lens.shape[1] != num_queries:
            raise ValueError(
                f"2-D valid_lens must have shape (batch, {num_queries}), "
                f"got {tuple(valid_lens.shape)}"
            )
        return keys[None, None, :] < valid_lens[:, :, None]
    raise ValueError(f"valid_lens must be 1-D or 2-D, got shape {tuple(valid_lens.shape)}")


def key_padding_mask(valid_lens: Tensor, num_keys: int) -> Tensor:
    """(batch, num_keys) bool from `valid_lens` (batch,): True for the first valid_lens[i]
    keys of row i (real tokens), False for padding. A model builds it once per forward pass
    and hands it to every layer as `key_mask`."""
    return _valid_lens_mask(valid_lens, 1, num_keys)[:, 0]


# PyTorch's CPU softmax takes 3-7x as long over rows shorter than this as over rows of this
# length (decoding's first steps: few keys per query); there inference computes it from its
# definition instead (docs/RESULTS.md, "Engines on every CPU").
CPU_SHORT_SOFTMAX = 16
# PyTorch multiplies a batch of matrices with fewer than this many multiply-adds each with a
# plain loop, 2-5x slower than summing weights x values (`_weighted_values`).
CPU_SMALL_BMM = 400


def _inference_on_cpu(x: Tensor) -> bool:
    """Whether `x` is a float32 CPU tensor that no gradient flows through: the case of the
    fast paths below (training keeps PyTorch's operators and their backward passes)."""
    return (x.device.type == "cpu" and x.dtype == torch.float32
            and not (torch.is_grad_enabled() and x.requires_grad))


def _softmax(scores: Tensor) -> Tensor:
    """`F.softmax(scores, dim=-1)`; in CPU inference over rows shorter than
    `CPU_SHORT_SOFTMAX`, exp(x - max) / sum, in place on one fresh tensor."""
    if scores.shape[-1] >= CPU_SHORT_SOFTMAX or not _inference_on_cpu(scores):
        return F.softmax(scores, dim=-1)
    e = (scores - scores.amax(-1, keepdim=True)).exp_()
    return e.div_(e.sum(-1, keepdim=True))


def _weighted_values(weights: Tensor, values: Tensor) -> Tensor:
    """`torch.bmm(weights, values)`: (b, q, k) x (b, k, v) -> (b, q, v); in CPU inference
    with fewer than `CPU_SMALL_BMM` multiply-adds per matrix, the sum over keys of weight x
    value (one query over a dozen keys: decoder self-attention, step by step)."""
    b, q, k = weights.shape
    if q * k * values.shape[-1] >= CPU_SMALL_BMM or not _inference_on_cpu(values):
        return torch.bmm(weights, values)
    return (weights.unsqueeze(-1) * values.unsqueeze(1)).sum(2)  # (b, q, k, v) -> (b, q, v)


def _masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax over the last axis; where `mask` is False the weight is exactly 0.

    A row whose mask is all False gives all zeros (not NaN, not uniform).
    """
    if mask is None:
        return _softmax(scores)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    # A fully masked row becomes uniform here; the final masked_fill zeroes it.
    return _softmax(scores).masked_fill(~mask, 0.0)


def masked_softmax(X: Tensor, valid_lens: Tensor | None) -> Tensor:
    """The book's masked softmax: keys at or beyond `valid_lens` get weight exactly 0.

    X: (batch, queries, keys); valid_lens: None, (batch,) or (batch, queries).
    """
    if valid_lens is None:
        return _softmax(X)
    return _masked_softmax(X, _valid_lens_mask(valid_lens, X.shape[1], X.shape[-1]))


def attention_mask(
    batch_size: int,
    num_queries: int,
    num_keys: int,
    *,
    valid_lens: Tensor | None = None,
    key_mask: Tensor | None = None,
    causal: bool = False,
    device: torch.device | None = None,
) -> Tensor | None:
    """Combine every kind of mask into one boolean mask, True = may attend.

    Returns None when nothing is masked, else a tensor broadcastable to
    (batch, num_heads, num_queries, num_keys) of shape (batch or 1, 1, queries or 1, keys).
    With `causal`, query i sees keys <= i + (num_keys - num_queries): the queries are the
    last `num_queries` positions of the key sequence (as when a cache holds the past).
    """
    if valid_lens is not None and key_mask is not None:
        raise ValueError("pass either valid_lens or key_mask, not both")
    mask = None
    if valid_lens is not None:
        mask = _valid_lens_mask(valid_lens, num_queries, num_keys)  # (batch, q or 1, keys)
    elif key_mask is not None:
        if key_mask.shape != (batch_size, num_keys):
            raise ValueError(
                f"key_mask must have shape (batch, keys) = {(batch_size, num_keys)}, "
                f"got {tuple(key_mask.shape)}"
            )
        mask = key_mask.bool()[:, None, :]  # (batch, 1, keys)
    if causal and num_queries > 1:  # a single (newest) query may see every key
        q = torch.arange(num_queries, device=device)[:, None] + (num_keys - num_queries)
        future = torch.arange(num_keys, device=device)[None, :] <= q  # (queries, keys)
        mask = future[None] if mask is None else mask & future
    return None if mask is None else mask.unsqueeze(1)  # insert the heads axis


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
            weights = masked_softmax(scores, valid_lens)
        else:
            weights = _masked_softmax(scores, mask)
        self.attention_weights = weights  # kept for looking; the output uses its own copy
        return _weighted_values(self.dropout(weights), values)  # as threads may share it


class BufferPool:
    """Flat buffers that finished decoding caches leave for the next ones to write into.

    A batch's self-attention cache grows to tens of MB per layer. Memory fresh from the
    operating system costs a page fault per 4 KB page on its first write, and the C
    library hands a freed buffer that large back to the system at once: without reuse,
    every batch of a corpus faulted its whole cache in again, in the copy that fills it
    (docs/RESULTS.md, "Engines on every CPU"). `take` hands out the smallest kept buffer
    that is large enough, else a new one; `give` keeps buffers, the largest first, up to
    `max_bytes`. CPU buffers only: on a GPU, PyTorch's caching allocator already reuses
    freed memory. Safe to share between threads (two batches searched at once)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._kept: list[Tensor] = []
        self._lock = threading.Lock()

    def take(self, numel: int, like: Tensor) -> Tensor:
        """A flat buffer of at least `numel` elements of `like`'s dtype and device, its
        contents undefined: a kept one, else a new one of twice `numel` (room to grow).
        A buffer made under `torch.inference_mode` is handed out only there, the one place
        PyTorch lets it be written."""
        writable = torch.is_inference_mode_enabled()
        with self._lock:
            fits = [i for i, b in enumerate(self._kept) if b.numel() >= numel
                    and b.dtype == like.dtype and b.device == like.device
                    and (writable or not b.is_inference())]
            if fits:
                return self._kept.pop(min(fits, key=lambda i: self._kept[i].numel()))
        return like.new_empty(2 * numel)

    def give(self, buffers: Iterable[Tensor]) -> None:
        """Keep `buffers` (those on the CPU) for later `take`s; no one may read or write
        them any more."""
        with self._lock:
            self._kept.extend(b for b in buffers if b.device.type == "cpu")
            self._kept.sort(key=lambda b: -b.numel() * b.element_size())
            total = 0
            for i, b in enumerate(self._kept):
                total += b.numel() * b.element_size()
                if total > self.max_bytes:
                    del self._kept[i:]  # the smallest: the cheapest to allocate again
                    break

    def clear(self) -> None:
        """Drop every kept buffer (their memory is freed as usual)."""
        with self._lock:
            self._kept.clear()


# The buffers of the decoder self-attention caches (`KVCache.release`), for all models in
# the process: 1 GiB holds those of two batches searched at once (the growing buffers of
# each layer; ~0.5-0.6 GiB for the recipe's model over Multi30k); beyond it, new ones.
CACHE_BUFFERS = BufferPool(max_bytes=2 ** 30)


class KVCache:
    """Keys and values of past decoding steps; `keys`/`values` are (batch, num_heads, steps,
    head_dim), contiguous: the layout batched matrix products read fastest (read through a
    permuted steps-first view, a step's self-attention over 24-64 cached steps took 3.3-4.1x
    as long; docs/RESULTS.md, "Engines on every CPU").

    `static=False` (decoder self-attention): each call appends the new steps by writing the
    cached steps, then the new ones, into a second buffer (the start of a flat buffer with
    room for more, taken from `pool`, so no allocation once it is large enough), which
    becomes the current one. Reordering the batch (beam search) only notes the rows to keep;
    the next append gathers them in that same copy (one `index_select`), so beam search
    copies the cache once per step, however many reorders came between two appends. The
    owner of a finished cache calls `release`, which gives its buffers back to `pool`.
    `static=True` (encoder-decoder attention): the encoder output is projected on the
    first call and reused on every later call; a reorder selects its rows at once.
    """

    def __init__(self, static: bool = False, pool: BufferPool = CACHE_BUFFERS):
        self.static = static
        self.pool = pool
        self.length = 0  # steps cached
        self._keys: Tensor | None = None
        self._values: Tensor | None = None
        self._rows: Tensor | None = None  # self-attention: rows a reorder kept, not yet gathered
        self._buffers: list[Tensor] = []  # self-attention: flat [keys, values] now in use
        self._spare: list[Tensor] = []  # and the pair the next append writes into
        self._outgrown: list[Tensor] = []  # and buffers too small by now, until `release`

    @property
    def keys(self) -> Tensor | None:
        self._gather_pending()
        return self._keys

    @property
    def values(self) -> Tensor | None:
        self._gather_pending()
        return self._values

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Cache new steps' k, v (batch, heads, new_steps, head_dim) -> all steps' keys
        and values (batch, heads, steps, head_dim)."""
        if self.static:
            self._keys, self._values, self.length = k.contiguous(), v.contiguous(), k.shape[2]
            return self._keys, self._values
        batch, heads, new, head_dim = k.shape
        shape = (batch, heads, self.length + new, head_dim)
        if not self._spare or min(b.numel() for b in self._spare) < math.prod(shape):
            self._outgrown += self._spare
            self._spare = [self.pool.take(math.prod(shape), k) for _ in range(2)]
        stored = []
        for spare, cached, added in zip(self._spare, (self._keys, self._values), (k, v),
                                        strict=True):
            out = _prefix(spare, shape)
            if cached is not None:
                _gather(cached, self._rows, out[:, :, :self.length])
            out[:, :, self.length:] = added
            stored.append(out)
        self._buffers, self._spare = self._spare, self._buffers
        self._keys, self._values = stored
        self._rows, self.length = None, shape[2]
        return self._keys, self._values

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (e.g. surviving beams), in place."""
        if self._keys is None:
            return
        if self.static:
            self._keys = self._keys.index_select(0, index)
            self._values = self._values.index_select(0, index)
        else:
            self._rows = index if self._rows is None else self._rows.index_select(0, index)

    def release(self) -> None:
        """Empty the cache and give its buffers to `pool` for the next cache (the caller
        holds no `keys`/`values` read from it any more)."""
        self.pool.give(self._buffers + self._spare + self._outgrown)
        self._buffers, self._spare, self._outgrown = [], [], []
        self._keys = self._values = self._rows = None
        self.length = 0

    def _gather_pending(self) -> None:
        """Apply a reorder that no append has gathered yet (for a reader of `keys`)."""
        if self._rows is not None:
            self._keys, self._values = (x.index_select(0, self._rows)
                                        for x in (self._keys, self._values))
            self._rows = None


def _gather(cached: Tensor, rows: Tensor | None, out: Tensor) -> None:
    """Write `cached` (its `rows`, where given) into the view `out`."""
    if rows is None:
        out.copy_(cached)
    elif cached.requires_grad:  # out= is not differentiable
        out.copy_(cached.index_select(0, rows))
    else:
        torch.index_select(cached, 0, rows, out=out)


def _prefix(buffer: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The start of a flat buffer viewed as a contiguous tensor of `shape`."""
    return buffer[:math.prod(shape)].view(shape)


# PyTorch's fused CPU kernel loses to two bmm's when there are few keys, so on CPU shorter
# attention takes the explicit path (measured in docs/RESULTS.md, "Attention").
CPU_FUSED_MIN_KEYS = 48


@dataclass(eq=False)  # compared by identity: the open records are told apart
class AttentionRecord:
    """What `MultiHeadAttention.recording` keeps: the attention weights of the layer's
    latest forward pass, per head, (batch, num_heads, queries, keys), as the softmax gave
    them (before dropout); None until a pass has run."""

    weights: Tensor | None = None


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
        # Open `recording()` blocks, innermost last: each pass fills all of them.
        self._records: list[AttentionRecord] = []
        self._head_mask: Tensor | None = None  # see `masking_heads`; None costs nothing

    @contextlib.contextmanager
    def recording(self) -> Iterator[AttentionRecord]:
        """Keep the attention weights of each forward pass while the block is open:
        `record.weights` is the latest pass's, per head (batch, num_heads, queries, keys).
        Passes run the explicit path (as `need_weights=True`). On exit, even by an
        exception, the layer keeps no weights and records only for the blocks still open;
        the record keeps its last weights for the caller."""
        record = AttentionRecord()
        self._records.append(record)
        try:
            yield record
        finally:
            self._records.remove(record)
            self.attention.attention_weights = None

    @contextlib.contextmanager
    def masking_heads(self, mask: Tensor | None) -> Iterator[None]:
        """Multiply each head's output by its entry of `mask` before W_o while the block is
        open: (num_heads,), or (batch, num_heads) for one row per example (teacher-forced
        passes: beam search reorders and drops batch rows); None masks nothing. The
        previous mask is restored on exit, even by an exception."""
        if mask is not None and mask.shape[-1] != self.num_heads:
            raise ValueError(f"a head mask needs one entry per head ({self.num_heads}), "
                             f"got shape {tuple(mask.shape)}")
        previous, self._head_mask = self._head_mask, mask
        try:
            yield
        finally:
            self._head_mask = previous

    @property
    def head_mask(self) -> Tensor | None:
        """The mask of the innermost open `masking_heads` block, or None."""
        return self._head_mask

    @property
    def is_recording(self) -> bool:
        """Whether a `recording()` block is open."""
        return bool(self._records)

    @property
    def head_attention_weights(self) -> Tensor | None:
        """The last weights per head, (batch, num_heads, queries, keys), for plotting."""
        w = self.attention.attention_weights
        return None if w is None else w.unflatten(0, (-1, self.num_heads))

    @property
    def head_ids(self) -> list[int]:
        """The original index of each remaining head, in order (0..num_heads-1 unpruned)."""
        return sorted(set(range(self.num_heads + len(self.pruned_heads))) - self.pruned_heads)

    def unpruned_weights(self) -> dict[str, Tensor]:
        """The projections' tensors with every original head, pruned ones as zeros:
        {"W_q.weight": (heads * head_dim, d), "W_q.bias": ..., "W_o.weight": (d, heads *
        head_dim), "W_o.bias"}; a zero head adds nothing to W_o's output. For formats with
        one head count per stack (CTranslate2, Hugging Face)."""
        total = self.num_heads + len(self.pruned_heads)
        rows = (torch.tensor(self.head_ids)[:, None] * self.head_dim
                + torch.arange(self.head_dim)).flatten()  # the kept heads' features
        out = {}
        for name in ("W_q", "W_k", "W_v", "W_o"):
            linear = getattr(self, name)
            for kind in ("weight", "bias"):
                value = getattr(linear, kind)
                if value is None:
                    continue
                value = value.detach()
                if name == "W_o" and kind == "weight":
                    full = value.new_zeros(value.shape[0], total * self.head_dim)
                    full[:, rows] = value
                elif name != "W_o":
                    full = value.new_zeros((total * self.head_dim, *value.shape[1:]))
                    full[rows] = value
                else:
                    full = value
                out[f"{name}.{kind}"] = full
        return out

    def prune_heads(self, heads: Iterable[int]) -> None:
        """Remove `heads` (original indices; already pruned ones are ignored) for good:
        their rows of W_q, W_k, W_v (and biases) and their columns of W_o go, so the layer
        computes what it computed with those heads masked to 0 (`masking_heads`), up to
        rounding, faster. At least one head must remain."""
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
        if self._head_mask is not None:
            raise ValueError("cannot prune heads inside masking_heads: the mask describes "
                             "the heads before pruning")
        # Feature j of the projections belongs to head j // head_dim.
        index = (torch.tensor(keep)[:, None] * self.head_dim
                 + torch.arange(self.head_dim)).flatten().to(self.W_q.weight.device)
        self.W_q, self.W_k, self.W_v = (_select_features(W, index, dim=0)
                                        for W in (self.W_q, self.W_k, self.W_v))
        self.W_o = _select_features(self.W_o, index, dim=1)
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
        need_weights = need_weights or self.is_recording
        q, k, v = self._project(queries, keys, values, cache)  # (batch, heads, len, head_dim)
        batch_size, _, num_queries, _ = q.shape
        num_keys = k.shape[2]
        mask = attention_mask(
            batch_size, num_queries, num_keys,
            valid_lens=valid_lens, key_mask=key_mask,
            causal=causal, device=q.device,
        )  # (batch or 1, 1, q or 1, k) or None
        if need_weights or (q.device.type == "cpu" and num_keys < CPU_FUSED_MIN_KEYS):
            output = self._explicit_attention(q, k, v, mask)
            if not need_weights:
                self.attention.attention_weights = None
        else:
            self.attention.attention_weights = None
            # Plain causal self-attention: SDPA builds the causal mask inside its kernel.
            plain_causal = (causal and valid_lens is None and key_mask is None
                            and num_queries == num_keys)
            output = self._fused_attention(q, k, v, None if plain_causal else mask, plain_causal)
        if self._records:
            weights = self.head_attention_weights  # (batch, heads, q, k)
            for record in self._records:
                record.weights = weights
        if self._head_mask is not None:  # (num_heads,) or (batch, num_heads)
            output = output * self._head_mask.to(output).view(-1, self.num_heads, 1, 1)
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
            # (docs/RESULTS.md, "Measurements behind code choices").
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

    def _explicit_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """The book's path: heads folded into the batch axis, weights kept."""
        batch_size, h, num_queries, head_dim = q.shape
        fold = lambda x: x.reshape(batch_size * h, x.shape[2], head_dim)
        if mask is not None:  # (batch, 1, q, k) -> (batch * heads, q, k)
            mask = mask.expand(batch_size, h, num_queries, k.shape[2]).reshape(
                batch_size * h, num_queries, k.shape[2])
        output = self.attention(fold(q), fold(k), fold(v), mask=mask)  # (batch*h, q, head_dim)
        return output.view(batch_size, h, *output.shape[1:])  # (batch, heads, q, head_dim)

    def _fused_attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool
    ) -> Tensor:
        """SDPA with the explicit path's semantics, guarding fully masked query rows."""
        dropout_p = self.attention.dropout.p if self.training else 0.0
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal)
        # SDPA returns NaN for a query that may attend to no key: let such a row attend
        # everywhere, then zero its output (the explicit path gives zero there too).
        has_key = mask.any(dim=-1, keepdim=True)  # (batch, 1, q or 1, 1)
        output = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask | ~has_key, dropout_p=dropout_p)
        return output.masked_fill(~has_key, 0.0)


def _select_features(linear: nn.Linear, index: Tensor, dim: int) -> nn.Linear:
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
