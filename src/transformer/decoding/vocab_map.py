"""A vocabulary map (CTranslate2's "vmap", Marian's lexical shortlist): for each source piece,
the target pieces likely to appear in its translation, counted in a parallel corpus.

    vocab_map = build_vocab_map(tokenizers, "train.en", "train.de")
    vocab_map.write("runs/x/ct2/vmap.txt")        # export_ctranslate2(..., vocab_map=...)

With the map, CTranslate2 scores at each decoding step only the union of the candidates of
the batch's source pieces and the `always` most frequent target pieces, not the whole
vocabulary: the output projection, softmax and top-k, which dominate a small model's decoding,
shrink with it. The price: a word outside the candidates can never be produced, and the
candidate set is a batch's union, so a sentence's output can depend on its batch.

The statistic: over a seeded uniform sample of at most `max_pairs` training pairs, p(t | s) =
(pairs with piece s in the source and t in the target) / (pairs with s in the source); each
source piece keeps its `per_source` most likely target pieces among those that are not
always candidates anyway and that occur with it in at least `MIN_PAIRS` pairs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Union

import numpy as np

from ..data.text import iter_parallel
from ..data.tokenizer import TokenizerPair
from ..files import atomic_write
from ..run.tokenizers import sample_pairs

__all__ = ["DEFAULT_PER_SOURCE", "DEFAULT_ALWAYS", "VocabMap", "build_vocab_map"]

PathLike = Union[str, "os.PathLike[str]"]
DEFAULT_PER_SOURCE = 10  # candidates per source piece (chosen on Multi30k validation)
DEFAULT_ALWAYS = 100  # the most frequent target pieces, candidates for every batch
MIN_PAIRS = 2  # a source and a target piece seen together in one pair only: mostly chance


@dataclass
class VocabMap:
    """Target pieces that are always candidates, and each source piece's candidates."""

    always: list[str]
    candidates: dict[str, list[str]]
    pairs: int  # the sentence pairs counted

    def write(self, path: PathLike) -> None:
        """CTranslate2's vmap.txt: `source piece<TAB>target pieces`, one source piece per
        line; the line with an empty source holds the pieces that are always candidates."""
        with atomic_write(path, text=True) as f:
            f.write("\t" + " ".join(self.always) + "\n")
            for piece, targets in self.candidates.items():
                f.write(f"{piece}\t{' '.join(targets)}\n")


def build_vocab_map(tokenizers: TokenizerPair, src_path: PathLike, tgt_path: PathLike, *,
                    per_source: int = DEFAULT_PER_SOURCE, always: int = DEFAULT_ALWAYS,
                    max_pairs: int = 200_000,
                    seed: int = 0) -> VocabMap:
    """Count the map in a parallel corpus (checked as training data is: DataError names the
    file and line of bad text, or both files when their line counts differ)."""
    if per_source < 1 or always < 0 or max_pairs < 1:
        raise ValueError(f"need per_source >= 1, always >= 0 and max_pairs >= 1, got "
                         f"{per_source}, {always}, {max_pairs}")
    text, _ = sample_pairs(iter_parallel(src_path, tgt_path, split="train"), max_pairs, seed)
    src_ids = [_pieces_of(ids, tokenizers.src.specials.all)
               for ids in tokenizers.src.encode_batch(text.src)]
    tgt_ids = [_pieces_of(ids, tokenizers.tgt.specials.all)
               for ids in tokenizers.tgt.encode_batch(text.tgt)]
    frequent = _most_frequent(tgt_ids, tokenizers.tgt.vocab_size, always)
    by_source = _likeliest_targets(src_ids, tgt_ids, tokenizers.tgt.vocab_size,
                                   per_source=per_source, left_out=frequent)
    src_piece, tgt_piece = tokenizers.src.id_to_piece, tokenizers.tgt.id_to_piece
    return VocabMap([tgt_piece(t) for t in frequent],
                    {src_piece(s): [tgt_piece(t) for t in targets]
                     for s, targets in by_source.items()}, len(text))


def _most_frequent(tgt_ids: list[np.ndarray], tgt_vocab: int, n: int) -> list[int]:
    """The `n` target pieces found in the most pairs (ties: lower id first)."""
    frequency = np.bincount(np.concatenate(tgt_ids + [np.zeros(0, np.int64)]),
                            minlength=tgt_vocab)
    return [int(t) for t in np.argsort(-frequency, kind="stable")[:n] if frequency[t] > 0]


def _likeliest_targets(src_ids: list[np.ndarray], tgt_ids: list[np.ndarray], tgt_vocab: int, *,
                       per_source: int, left_out: list[int]) -> dict[int, list[int]]:
    """Source piece -> its `per_source` target pieces of highest p(t | s), that is, found
    with it in the most pairs (at least MIN_PAIRS; ties: lower id first), `left_out` left out."""
    keys, counts = _cooccurrences(src_ids, tgt_ids, tgt_vocab)
    sources, targets = keys // tgt_vocab, keys % tgt_vocab
    keep = ~np.isin(targets, left_out) & (counts >= MIN_PAIRS)
    sources, targets, counts = sources[keep], targets[keep], counts[keep]
    order = np.lexsort((targets, -counts, sources))  # by source, then most pairs first
    sources, targets = sources[order], targets[order]
    if not len(sources):  # no piece pair was seen MIN_PAIRS times
        return {}
    starts = np.flatnonzero(np.r_[True, sources[1:] != sources[:-1]])
    ends = np.r_[starts[1:], len(sources)].astype(np.int64)
    return {int(sources[a]): targets[a:min(b, a + per_source)].tolist()
            for a, b in zip(starts, ends, strict=True)}


def _pieces_of(ids: list[int], special_ids: tuple[int, ...]) -> np.ndarray:
    """A sentence's distinct piece ids, special ids left out."""
    unique = np.unique(np.asarray(ids, dtype=np.int64))
    return unique[~np.isin(unique, special_ids)]


def _cooccurrences(src_ids: list[np.ndarray], tgt_ids: list[np.ndarray], tgt_vocab: int,
                   chunk: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (source piece, target piece) keys `s * tgt_vocab + t` and the number of
    pairs each occurs in; counted chunk by chunk so memory follows the distinct keys."""
    keys, counts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for start in range(0, len(src_ids), chunk):
        block = [(s[:, None] * tgt_vocab + t[None, :]).ravel()
                 for s, t in zip(src_ids[start:start + chunk], tgt_ids[start:start + chunk],
                                 strict=True)]
        k, c = np.unique(np.concatenate(block + [np.zeros(0, np.int64)]), return_counts=True)
        keys.append(k)
        counts.append(c)
    merged, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    return merged, np.bincount(inverse, weights=np.concatenate(counts)).astype(np.int64)
