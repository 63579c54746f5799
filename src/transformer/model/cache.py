"""The decoding caches: keys and values of past steps (`KVCache`; one per attention layer,
a `blocks.LayerCache` per decoder block; `StepCache`, a decoder self-attention layer's for
the engine's decoding step, sized for the whole search at its start, its layers passing
one free buffer along: `SpareBuffer`), and the pool of buffers finished caches leave for
the next ones (`BufferPool`, `CACHE_BUFFERS`).

A decoder's self-attention cache grows by a step at a time; it is written, with the rows
beam search kept, into a second preallocated buffer at each step (one copy per step, however
many reorders came between two appends), and its buffers outlive the search in
`CACHE_BUFFERS`, so that the next batch writes into memory already paged in. The
encoder-decoder attention's cache is static: the encoder output projected once.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable

import torch
from torch import Tensor

from .. import hardware

__all__ = ["BufferPool", "CACHE_BUFFERS", "release_cache_buffers", "KVCache", "SpareBuffer",
           "StepCache"]


class BufferPool:
    """Flat buffers that finished decoding caches leave for the next ones to write into.

    A batch's self-attention cache grows to tens of MB per layer. Memory fresh from the
    operating system costs a page fault per 4 KB page on its first write, and the C
    library hands a freed buffer that large back to the system at once: without reuse,
    every batch of a corpus faulted its whole cache in again, in the copy that fills it.
    `take` hands out the smallest kept buffer that is large enough, else a new one; `give`
    keeps buffers, the largest first, up to `max_bytes` (None: the tuning table's
    `cache_pool_bytes`). CPU buffers only: on a GPU, PyTorch's caching allocator already
    reuses freed memory. Safe to share between threads (two batches searched at once)."""

    def __init__(self, max_bytes: int | None = None):
        self.max_bytes = max_bytes
        self._kept: list[Tensor] = []
        self._lock = threading.Lock()

    @property
    def kept(self) -> list[Tensor]:
        """The buffers kept now, the largest first (a copy of the list)."""
        with self._lock:
            return list(self._kept)

    @property
    def kept_bytes(self) -> int:
        """The bytes of the buffers kept now."""
        return sum(b.numel() * b.element_size() for b in self.kept)

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
            limit = (hardware.TUNING.cache_pool_bytes if self.max_bytes is None
                     else self.max_bytes)
            total = 0
            for i, b in enumerate(self._kept):
                total += b.numel() * b.element_size()
                if total > limit:
                    del self._kept[i:]  # the smallest: the cheapest to allocate again
                    break

    def clear(self) -> None:
        """Drop every kept buffer (their memory is freed as usual)."""
        with self._lock:
            self._kept.clear()


# The buffers of the decoder self-attention caches (`KVCache.release`), for all models in
# the process, up to the tuning table's `cache_pool_bytes` (two batches searched at once);
# beyond it, new ones. Training empties it after each validation (`release_cache_buffers`).
CACHE_BUFFERS = BufferPool()


def release_cache_buffers() -> None:
    """Free the buffers finished decoding caches left for later searches: a training run
    keeps them only while it validates."""
    CACHE_BUFFERS.clear()


class KVCache:
    """Keys and values of past decoding steps; `keys`/`values` are (batch, num_heads, steps,
    head_dim), contiguous: the layout batched matrix products read fastest (read through a
    permuted steps-first view, a step's self-attention over 24-64 cached steps took 3.3-4.1x
    as long; docs/benchmarks.md, "Our engine against CTranslate2 > The decoding cache's
    layout").

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


def _gather(cached: Tensor, rows: Tensor | None, out: Tensor, dim: int = 0) -> None:
    """Write `cached` (its `rows` along `dim`, where given) into the view `out`."""
    if rows is None:
        out.copy_(cached)
    elif cached.requires_grad:  # out= is not differentiable
        out.copy_(cached.index_select(dim, rows))
    else:
        torch.index_select(cached, dim, rows, out=out)


def _prefix(buffer: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The start of a flat buffer viewed as a contiguous tensor of `shape`."""
    return buffer[:math.prod(shape)].view(shape)


class SpareBuffer:
    """The one free buffer the `StepCache`s of a decoder's layers pass along within a step.

    Each append writes a layer's cache into a free buffer, and the buffer it held before is
    free from then on: the next layer's append writes into that one. A decoder of L layers
    then holds L + 1 buffers, where a spare per layer would make 2L, with the same copies
    (`step.DecoderState` makes one for its layers; a layer with more heads than the spare
    holds takes a larger buffer from the pool)."""

    def __init__(self, pool: BufferPool = CACHE_BUFFERS):
        self.pool = pool
        self._buffer: Tensor | None = None

    def take(self, numel: int, like: Tensor) -> Tensor:
        """A free flat buffer of at least `numel` elements of `like`'s dtype: the spare,
        else one from the pool (a spare too small goes back to the pool)."""
        buffer, self._buffer = self._buffer, None
        if buffer is not None and buffer.numel() >= numel and buffer.dtype == like.dtype:
            return buffer
        if buffer is not None:
            self.pool.give([buffer])
        return self.pool.take(numel, like)

    def put(self, freed: Tensor) -> None:
        """`freed`, a buffer no one reads any more, becomes the spare."""
        self.release()
        self._buffer = freed

    def release(self) -> None:
        """Give the spare to the pool."""
        if self._buffer is not None:
            self.pool.give([self._buffer])
        self._buffer = None


class StepCache:
    """A decoder self-attention layer's keys and values for the engine's decoding step
    (`step.DecoderState`): what `KVCache` holds, in fewer operators per step.

    Keys and values share one buffer: each append writes the cached steps (the rows a reorder
    kept: one `index_select` for keys and values) and then the new step (one copy) into a
    free buffer (`spare`'s), as one contiguous (2, rows, heads, steps, head_dim) tensor,
    which becomes the current one; the buffer it replaces becomes the spare. Keys and
    values are its two halves, each row's steps contiguous, the layout batched matrix
    products read fastest. Buffers are sized when the search starts for its most rows and
    steps (`max_rows`, `max_steps`) and taken from `pool`, so no step allocates; `release`
    gives them back. `spare`: the `SpareBuffer` the caches of a decoder's layers share
    (None: a spare of its own, which `release` gives back too).
    """

    def __init__(self, max_rows: int, max_steps: int, pool: BufferPool = CACHE_BUFFERS,
                 spare: SpareBuffer | None = None):
        self.max_rows, self.max_steps, self.pool = max_rows, max_steps, pool
        self.length = 0  # steps cached
        self._own_spare = spare is None
        self.spare = SpareBuffer(pool) if spare is None else spare
        self._current: Tensor | None = None  # (2, rows, heads, steps, head_dim)
        self._buffer: Tensor | None = None  # the current one's flat buffer
        self._kept: Tensor | None = None  # rows a reorder kept, not yet gathered

    def append(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Cache one new step's keys and values, kv (2, rows, heads, head_dim) -> all steps'
        keys and values, each (rows, heads, steps, head_dim)."""
        _, rows, heads, head_dim = kv.shape
        if rows > self.max_rows or self.length >= self.max_steps:
            raise ValueError(f"a StepCache of {self.max_rows} rows and {self.max_steps} steps "
                             f"cannot take a step of {rows} rows after {self.length}")
        t = self.length
        buffer = self.spare.take(2 * self.max_rows * heads * self.max_steps * head_dim, kv)
        out = _prefix(buffer, (2, rows, heads, t + 1, head_dim))
        if self._current is not None:
            _gather(self._current, self._kept, out.narrow(3, 0, t), dim=1)
        out.select(3, t).copy_(kv)
        if self._buffer is not None:
            self.spare.put(self._buffer)  # the replaced buffer: free from now on
        self._buffer, self._current, self._kept, self.length = buffer, out, None, t + 1
        return out.unbind()

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` (the surviving beams, in their new order), gathered at the next
        `append`."""
        if self._current is not None:
            self._kept = index if self._kept is None else self._kept.index_select(0, index)

    def release(self) -> None:
        """Empty the cache and give its buffer (and a spare of its own) to `pool` for the
        next search."""
        if self._buffer is not None:
            self.pool.give([self._buffer])
        if self._own_spare:
            self.spare.release()
        self._buffer, self._current, self._kept = None, None, None
        self.length = 0
