"""Several training corpora as one: each epoch draws its pairs from every corpus by share.

A corpus's share of an epoch is its weight times its size to the power 1/T, normalized
(`shares`): with `data.mix_temperature` null (T infinite) the weights alone are the sampling
probabilities (0.8 / 0.2 means four pairs of the first corpus to one of the second); T = 1
is plain concatenation; T > 1 flattens the sizes toward uniform, as fairseq's temperature
sampling of language pairs does. An epoch has as many pairs as the corpora together.

`Mixture.draw` is a seeded function of (seed, epoch): corpus i gets round(share_i x total)
draws: every pair of it once per full pass, and the remainder sampled without replacement,
so a corpus is repeated only beyond its size and a smaller draw takes a fresh subset each
epoch. The draw is an array of indices into the corpora laid end to end; nothing of a
corpus is read but the pairs of the batches (the stores stay memory-mapped), and the same
seed gives the same epochs, so a resumed run sees the batches it would have seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .store import Batch, ParallelCorpus, Rows

__all__ = ["shares", "Mixture"]


def shares(weights: Sequence[float], sizes: Sequence[int],
           temperature: float | None = None) -> np.ndarray:
    """Each corpus's share of an epoch: weight * size^(1/T), normalized (T None: weights)."""
    w = np.asarray(weights, dtype=np.float64)
    if temperature is not None:
        w = w * np.asarray(sizes, dtype=np.float64) ** (1.0 / temperature)
    return w / w.sum()


def _apportion(total: int, probs: np.ndarray) -> np.ndarray:
    """Integer counts summing to `total`, closest to `total * probs` (largest remainders)."""
    exact = total * probs
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return counts


@dataclass
class Mixture:
    """Named corpora (each its own store, tags in its `src_prefix`) and their shares."""

    names: list[str]
    corpora: list[ParallelCorpus]
    shares: np.ndarray  # (corpora,) float64, summing to 1

    def __post_init__(self) -> None:
        self.sizes = np.array([len(c) for c in self.corpora], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.sizes.sum())

    @property
    def src_lens(self) -> np.ndarray:
        """(N,) source pieces of every pair, tags included, the corpora end to end."""
        return np.concatenate([c.src_lens for c in self.corpora])

    @property
    def tgt_lens(self) -> np.ndarray:
        return np.concatenate([c.tgt_lens for c in self.corpora])

    def draw(self, seed: int, epoch: int) -> np.ndarray:
        """The pairs of `epoch` (indices into the corpora end to end, with repeats where a
        corpus's draw exceeds its size), in corpus order; batching shuffles them."""
        counts = _apportion(len(self), self.shares)
        dtype = np.int32 if len(self) < 1 << 31 else np.int64
        parts = []
        for i, (start, size, count) in enumerate(zip(self.starts, self.sizes, counts,
                                                     strict=True)):
            passes, rest = divmod(int(count), int(size))
            parts += [np.arange(start, start + size, dtype=dtype)] * passes
            if rest:
                rng = np.random.default_rng([seed, epoch, i])
                picked = np.sort(rng.choice(int(size), rest, replace=False))
                parts.append((start + picked).astype(dtype))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    def counts(self, indices: np.ndarray) -> dict[str, int]:
        """How many of `indices` (a draw) come from each corpus, by name."""
        which = np.searchsorted(self.starts, indices, side="right") - 1
        per = np.bincount(which, minlength=len(self.corpora))
        return {name: int(n) for name, n in zip(self.names, per, strict=True)}

    def collate(self, indices: Sequence[int]) -> Batch:
        """The padded `Batch` of `indices` (into the corpora end to end), rows in order."""
        if len(indices) == 0:
            raise ValueError("cannot collate an empty batch")
        if len(self.corpora) == 1:
            return self.corpora[0].collate(indices)
        indices = np.asarray(indices, dtype=np.int64)
        which = np.searchsorted(self.starts, indices, side="right") - 1
        grouped = np.argsort(which, kind="stable")  # rows by corpus, in batch order within
        parts = [self.corpora[i].rows(indices[grouped[which[grouped] == i]] - self.starts[i])
                 for i in np.unique(which)]
        order = np.empty_like(grouped)
        order[grouped] = np.arange(len(grouped))  # row r is row order[r] of the grouped rows
        return Rows.join(parts, order).batch(self.corpora[0].special_ids)
