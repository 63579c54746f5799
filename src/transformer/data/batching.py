"""Batching: which examples go together, for training, evaluation and translation.

A batch is an array of example indices. Its cost is B x (largest size in the batch) positions
per side, padding included; `pack` cuts an ordering of examples into consecutive batches of at
most `max_tokens` positions, so sorting by length first keeps the padding small. Sizes count
the tokens the model sees: a sentence of n pieces has size n + 1 (EOS appended to the source,
BOS prepended to the target input).

- `train_batches`: one epoch, shuffled in pools of similar length, sharded over ranks;
- `eval_batches`: a fixed, length-sorted order for validation and test;
- `shard`: every rank gets the same number of batches, each example used once.

Translation packs its length-sorted sentences with `pack` too (`sorted_batches`, for
`corpus.search_corpus`, scoring and alignments; `even_rounds` when threads search batches
side by side, `dealt` when search processes take fewer batches than there are processes),
and `pad_rows` makes its padded tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["pack", "sorted_batches", "even_rounds", "dealt", "pad_rows", "shard", "train_batches",
           "eval_batches", "padding_ratio"]

Lengths = Sequence[int]  # a numpy array or a list: pieces per sentence


def pack(order: Sequence[int], sizes: Sequence[int], max_tokens: int,
         max_examples: int | None = None) -> list[np.ndarray]:
    """Greedily cut `order` into consecutive batches with B * max(size) <= max_tokens,
    where `sizes[i]` is what example i costs per row (for a pair: its larger side), and B <=
    `max_examples` where given. A single example larger than max_tokens gets a batch of its
    own. Batches are index arrays (of `order`'s integer type)."""
    order = np.asarray(order)
    if not np.issubdtype(order.dtype, np.integer):
        order = order.astype(np.int64)  # e.g. an empty list
    ordered = np.asarray(sizes)[order].astype(np.int64)  # this ordering's sizes only
    batches = []
    start = 0
    while start < len(order):
        # at most max_tokens // sizes[start] rows fit: look no further than that
        most = max(1, max_tokens // max(1, ordered[start]))  # rows that fit, at the most
        if max_examples is not None:
            most = min(most, max(1, max_examples))
        window = ordered[start:start + most + 1]
        longest = np.maximum.accumulate(window)
        rows = np.arange(1, len(window) + 1)
        fits = (rows * longest <= max_tokens) & (rows <= most)
        end = start + max(1, int(np.argmin(fits)) if not fits.all() else len(window))
        batches.append(order[start:end])
        start = end
    return batches


def sorted_batches(indices: Sequence[int], sizes: Sequence[int], max_tokens: int,
                   max_examples: int | None = None) -> list[list[int]]:
    """`indices` longest first (by `sizes[i]`), packed into batches of at most `max_tokens`
    positions and `max_examples` sentences (`pack`): how decoding, scoring and alignment
    batch their sentences."""
    order = sorted(indices, key=lambda i: -sizes[i])
    return [batch.tolist() for batch in pack(order, sizes, max_tokens, max_examples)]


def even_rounds(batches: list[list[int]], sizes: Sequence[int], max_tokens: int,
                parallel: int, max_examples: int | None = None) -> list[list[int]]:
    """`sorted_batches`' n batches packed again for `parallel` threads that search one batch
    each at a time, so that the threads end together: the same sentences, in the same order,
    in m = `parallel` x (n // `parallel`) batches, by the smallest budget per batch that
    gives at most m (and at most n / m x `max_tokens`: the n batches' tokens in all; at most
    `max_examples` sentences); where that gives fewer, the largest are halved until their
    number is a multiple of `parallel`. The largest batch is then as small as m batches
    allow. When n is not a multiple of `parallel`, fewer and larger batches: a last round
    of fewer batches than threads would leave threads idle, and more, smaller batches would
    pay a decoding step's fixed cost more often (docs/benchmarks.md, "Two threads, and
    batches in full rounds of them");
    when it is, the same number, of even size (a small last batch would leave its round
    to one thread). Unchanged for one thread, fewer batches than threads, or when no budget
    within the bounds gives m."""
    n = len(batches)
    if parallel <= 1 or n < parallel:
        return batches
    m = n // parallel * parallel
    order = np.array([i for batch in batches for i in batch])  # longest first, as packed
    sizes = np.asarray(sizes)  # once, for every `pack` below
    low, high, best = 1, max_tokens * n // m, None
    while low <= high:  # the smallest budget that packs the sentences into m batches
        budget = (low + high) // 2
        packed = pack(order, sizes, budget, max_examples)
        if len(packed) <= m:
            best, high = packed, budget - 1
        else:
            low = budget + 1
    if best is None:
        return batches
    # fewer than m at that budget: halving the largest stays within it
    return [batch.tolist() for batch in _halved_to_multiple(best, parallel)]


def dealt(batches: list[list[int]], parallel: int) -> list[list[int]]:
    """Fewer batches than `parallel` search processes, cut into `parallel` pieces where the
    sentences allow: the batch of the most sentences dealt into two, again and again, its
    sentences (longest first) taken in turn, so that both halves have about the same
    longest sentence, and so the same number of decoding steps, and the same rows; the
    processes then end together. Unchanged from `parallel` batches on."""
    pieces = list(batches)
    while pieces and len(pieces) < parallel:
        j = max(range(len(pieces)), key=lambda i: len(pieces[i]))
        if len(pieces[j]) < 2:
            break
        pieces[j:j + 1] = [pieces[j][0::2], pieces[j][1::2]]
    return pieces


def pad_rows(rows: Sequence[Sequence[int]], pad_value: int,
             device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Id lists -> (batch, longest) long tensor padded with `pad_value`, and the lengths
    (batch,): decoding's batches of sources, prefixes and outputs."""
    longest = max(1, max(map(len, rows)))
    padded = torch.tensor([list(r) + [pad_value] * (longest - len(r)) for r in rows],
                          dtype=torch.long)
    return padded.to(device), torch.tensor([len(r) for r in rows], device=device)


def shard(batches: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """Rank `rank`'s batches: every `world_size`-th one. When the count is not a multiple of
    `world_size`, the batches with the most sentences are halved until it is, so every rank
    gets the same number of batches and every sentence is still used exactly once."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    halved = _halved_to_multiple(batches, world_size)
    if halved is None:
        raise ValueError(
            f"cannot give {world_size} ranks the same number of batches: only "
            f"{sum(map(len, batches))} sentences"
        )
    return halved[rank::world_size]


def _halved_to_multiple(batches: Sequence, k: int) -> list | None:
    """`batches` with the one of the most sentences halved, again and again, until their
    number is a multiple of `k`; None when that would halve a single sentence."""
    batches = list(batches)
    while len(batches) % k:
        j = max(range(len(batches)), key=lambda i: len(batches[i]))
        if len(batches[j]) < 2:
            return None
        half = len(batches[j]) // 2
        batches[j : j + 1] = [batches[j][:half], batches[j][half:]]
    return batches


def train_batches(
    src_lens: Lengths,
    tgt_lens: Lengths,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    rank: int = 0,
    world_size: int = 1,
    pool_batches: int = 100,
    draw: np.ndarray | None = None,
) -> list[np.ndarray]:
    """One epoch of training batches for `rank`: arrays of corpus indices.

    The epoch's pairs are `draw` (indices, repeats allowed: `mixture.Mixture.draw`), by
    default every pair once.

    Sentences are shuffled, cut into pools of about `pool_batches` batches, sorted within
    each pool by the larger of their two sizes (which sets a batch's cost), then target and
    source size (ties broken by the shuffle), and packed greedily; then the batch order is
    shuffled. `src_lens`/`tgt_lens` count pieces without BOS/EOS; a batch holds at most
    `max_tokens` positions per side, padding included. Same (seed, epoch) -> same batches on
    every rank; the ranks' shares are disjoint, cover the epoch and have equal length (see
    `shard`). Vectorized: a corpus of millions of pairs costs seconds and a few arrays.
    """
    src_lens = np.asarray(src_lens)
    tgt_lens = np.asarray(tgt_lens)
    sizes = np.maximum(src_lens, tgt_lens).astype(np.int32)  # int32: millions of pairs
    sizes += 1
    if len(sizes) and sizes.max() > max_tokens:
        raise ValueError(
            f"a training pair has {sizes.max()} tokens, more than "
            f"max_tokens={max_tokens}; filter with data.max_len <= data.max_tokens"
        )
    rng = np.random.default_rng([seed, epoch])
    dtype = np.int32 if len(sizes) < 1 << 31 else np.int64
    order = np.arange(len(sizes), dtype=dtype) if draw is None else draw.astype(dtype)
    rng.shuffle(order)
    mean_size = max(1, int(sizes[order].sum()) // max(1, len(order)))
    pool_size = pool_batches * max(1, max_tokens // mean_size)
    batches = []
    for start in range(0, len(order), pool_size):
        pool = order[start : start + pool_size]
        # lexsort: the last key is the primary one; stable, so ties keep the shuffled order
        # (lengths order as sizes do: size = length + 1)
        pool = pool[np.lexsort((src_lens[pool], tgt_lens[pool], sizes[pool]))]
        batches += pack(pool, sizes, max_tokens)
    batches = [batches[i] for i in rng.permutation(len(batches))]
    return shard(batches, rank, world_size)


def eval_batches(
    src_lens: Lengths,
    tgt_lens: Lengths,
    max_tokens: int,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> list[np.ndarray]:
    """Batches in a fixed order for validation/test: sorted by size (the larger side, then
    source, then target) so padding stays small; every sentence is kept. Restore the file
    order with `Batch.indices`."""
    src_size = np.asarray(src_lens, dtype=np.int64) + 1
    tgt_size = np.asarray(tgt_lens, dtype=np.int64) + 1
    sizes = np.maximum(src_size, tgt_size)
    order = np.lexsort((tgt_size, src_size, sizes))
    return shard(pack(order, sizes, max_tokens), rank, world_size)


def padding_ratio(src_lens: Lengths, tgt_lens: Lengths,
                  batches: Sequence[Sequence[int]]) -> float:
    """Fraction of batch positions (both sides, EOS/BOS counted as real) that are padding."""
    src_size = np.asarray(src_lens, dtype=np.int64) + 1
    tgt_size = np.asarray(tgt_lens, dtype=np.int64) + 1
    real = total = 0
    for batch in batches:
        s, t = src_size[np.asarray(batch)], tgt_size[np.asarray(batch)]
        real += int(s.sum() + t.sum())
        total += len(batch) * int(s.max() + t.max())
    return 1.0 - real / total if total else 0.0
