"""Batching: which examples go together, for training, evaluation and translation.

A batch is a list of example indices. Its cost is B x (largest size in the batch) positions
per side, padding included; `pack` cuts an ordering of examples into consecutive batches of at
most `max_tokens` positions, so sorting by length first keeps the padding small. Sizes count
the tokens the model sees: a sentence of n pieces has size n + 1 (EOS appended to the source,
BOS prepended to the target input).

- `train_batches`: one epoch, shuffled in pools of similar length, sharded over ranks;
- `eval_batches`: a fixed, length-sorted order for validation and test;
- `shard`: every rank gets the same number of batches, each example used once.

Translation packs its length-sorted sentences with `pack` too (`search.search_corpus`).
"""

from __future__ import annotations

import random
from typing import Iterable, Optional, Sequence

from torch import Tensor

__all__ = ["pack", "shard", "train_batches", "eval_batches", "padding_ratio"]


def pack(order: Iterable[int], sizes: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Greedily cut `order` into consecutive batches with B * max(size) <= max_tokens,
    where `sizes[i]` is what example i costs per row (for a pair: its larger side). A single
    example larger than max_tokens gets a batch of its own."""
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for i in order:
        size = sizes[i]
        if batch and (len(batch) + 1) * max(longest, size) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, size)
    if batch:
        batches.append(batch)
    return batches


def shard(batches: list[list[int]], rank: int, world_size: int) -> list[list[int]]:
    """Rank `rank`'s batches: every `world_size`-th one. When the count is not a multiple of
    `world_size`, the batches with the most sentences are halved until it is, so every rank
    gets the same number of batches and every sentence is still used exactly once."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    batches = list(batches)
    while len(batches) % world_size:
        j = max(range(len(batches)), key=lambda k: len(batches[k]))
        if len(batches[j]) < 2:
            raise ValueError(
                f"cannot give {world_size} ranks the same number of batches: only "
                f"{sum(map(len, batches))} sentences"
            )
        half = len(batches[j]) // 2
        batches[j : j + 1] = [batches[j][:half], batches[j][half:]]
    return batches[rank::world_size]


def train_batches(
    src_lens: Tensor,
    tgt_lens: Tensor,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    rank: int = 0,
    world_size: int = 1,
    pool_batches: int = 100,
) -> list[list[int]]:
    """One epoch of training batches for `rank`: lists of corpus indices.

    Sentences are shuffled, cut into pools of about `pool_batches` batches, sorted within
    each pool by the larger of their two sizes (which sets a batch's cost), then target and
    source size (ties broken by the shuffle), and packed greedily; then the batch order is
    shuffled. `src_lens`/`tgt_lens` count pieces without BOS/EOS; a
    batch holds at most `max_tokens` positions per side, padding included.
    Same (seed, epoch) -> same batches on every rank; the ranks' shares are disjoint, cover
    the epoch and have equal length (see `shard`).
    """
    src_size = (src_lens + 1).tolist()
    tgt_size = (tgt_lens + 1).tolist()
    sizes = list(map(max, src_size, tgt_size))
    if sizes and max(sizes) > max_tokens:
        raise ValueError(
            f"a training pair has {max(sizes)} tokens, more than "
            f"max_tokens={max_tokens}; filter with data.max_len <= data.max_tokens"
        )
    rng = random.Random(f"{seed}:{epoch}")
    order = list(range(len(src_size)))
    rng.shuffle(order)
    mean_size = max(1, sum(sizes) // max(1, len(order)))
    pool_size = pool_batches * max(1, max_tokens // mean_size)
    key = lambda i: (sizes[i], tgt_size[i], src_size[i])  # noqa: E731
    batches = []
    for start in range(0, len(order), pool_size):
        pool = sorted(order[start : start + pool_size], key=key)
        batches += pack(pool, sizes, max_tokens)
    rng.shuffle(batches)
    return shard(batches, rank, world_size)


def eval_batches(
    src_lens: Tensor,
    tgt_lens: Optional[Tensor],
    max_tokens: int,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> list[list[int]]:
    """Batches in a fixed order for validation/test: sorted by size (the larger side, then
    source, then target) so padding stays small; every sentence is kept. Restore the file order with
    `Batch.indices`. Pass `tgt_lens=None` to size batches by the source only (translation)."""
    src_size = (src_lens + 1).tolist()
    tgt_size = None if tgt_lens is None else (tgt_lens + 1).tolist()
    if tgt_size is None:
        sizes = src_size
        order = sorted(range(len(src_size)), key=lambda i: src_size[i])
    else:
        sizes = list(map(max, src_size, tgt_size))
        key = lambda i: (sizes[i], src_size[i], tgt_size[i])  # noqa: E731
        order = sorted(range(len(src_size)), key=key)
    return shard(pack(order, sizes, max_tokens), rank, world_size)


def padding_ratio(src_lens: Tensor, tgt_lens: Tensor, batches: Sequence[Sequence[int]]) -> float:
    """Fraction of batch positions (both sides, EOS/BOS counted as real) that are padding."""
    src_size = (src_lens + 1).tolist()
    tgt_size = (tgt_lens + 1).tolist()
    real = total = 0
    for batch in batches:
        s = [src_size[i] for i in batch]
        t = [tgt_size[i] for i in batch]
        real += sum(s) + sum(t)
        total += len(batch) * (max(s) + max(t))
    return 1.0 - real / total if total else 0.0
