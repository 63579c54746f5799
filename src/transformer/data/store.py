"""The encoded corpus: every pair's SentencePiece ids, in a memory-mapped store on disk.

A store is a directory, written once by `StoreWriter` and then only read:

    meta.json         format version, id dtype, counts, vocabulary size, and what the store
                      was built from (the source files' fingerprints and the tokenizers')
    src.bin, tgt.bin  token ids (uint16 when the vocabulary fits, else int32), sentence after
                      sentence, without BOS/EOS
    src.idx, tgt.idx  int64 offsets, pairs + 1 of them: sentence i is ids[off[i]:off[i + 1]]
    lines.idx         int64: each pair's 0-based line number in the text files

The writer streams chunks into a temporary directory beside the store and renames it into
place only when it is complete, so a store exists whole or not at all. `ParallelCorpus.open`
checks every file's size against meta.json and that the offsets never decrease, then maps
the files; a batch's token ids and line numbers are copied out with positional reads
(`_read_rows`), so a process holds only the offsets it touched and the batch itself,
whatever the corpus's size, while the operating system's page cache holds the store once for
all the processes that read it (the ranks of a node). The ids read are checked against the
vocabulary size: a damaged file is a `DataError`, not an embedding index out of range.
Validation and test splits, and text encoded on the fly (`ParallelCorpus.encode`), use the
same class with arrays in memory.

Token layout of a `Batch`: the source with EOS appended (`x + [EOS]`), the target shifted
(`tgt_in = [BOS] + y`, `tgt_out = y + [EOS]`), padded with PAD; the ids are the tokenizer's
(`SpecialIds`, recorded in meta.json as `special_ids`; BOS is the decoder's start id).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np
import torch
from torch import Tensor

from ..errors import DataError, WriteError
from ..files import atomic_write
from .text import ParallelText
from .tokenizer import SpecialIds, TokenizerPair

__all__ = ["STORE_VERSION", "Batch", "Rows", "ParallelCorpus", "StoreWriter", "id_dtype"]

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]

STORE_VERSION = 2  # bump when the layout changes (1 was a single torch.save file)
SIDES = ("src", "tgt")


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest integer type of the store's token ids: uint16 up to 65,536 pieces."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


@dataclass
class Batch:
    """Padded tensors for one step; see the module docstring for BOS/EOS placement."""

    src: Tensor  # (B, S) long: x + [EOS], PAD_ID after
    src_valid_lens: Tensor  # (B,) long: len(x) + 1
    tgt_in: Tensor  # (B, T) long: [BOS] + y, PAD_ID after
    tgt_out: Tensor  # (B, T) long: y + [EOS], PAD_ID after
    tgt_valid_lens: Tensor  # (B,) long: len(y) + 1
    tgt_index: Tensor  # (N,) long: flat positions (row * T + column) of tgt_out's N real
    #                    tokens in row-major order, computed on the host where N is known,
    #                    so the loss selects them without a device-to-host sync
    num_tgt_tokens: int  # N, the non-pad positions of tgt_out
    indices: list[int]  # each row's 0-based line number in the split's files

    def __len__(self) -> int:
        return len(self.indices)

    def _map(self, fn) -> Batch:
        return Batch(fn(self.src), fn(self.src_valid_lens), fn(self.tgt_in), fn(self.tgt_out),
                     fn(self.tgt_valid_lens), fn(self.tgt_index), self.num_tgt_tokens,
                     self.indices)

    def to(self, device: str | torch.device, non_blocking: bool = False) -> Batch:
        """A copy with the tensors on `device` (`indices` stay a Python list). From pinned
        memory (`pin_memory`) a CUDA copy with `non_blocking` overlaps with computation."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """A copy in page-locked host memory, for asynchronous copies to a GPU."""
        return self._map(lambda t: t.pin_memory())


def _read_rows(path: Path, starts: np.ndarray, lens: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Rows of a store file, concatenated: row i is `lens[i]` values from value `starts[i]`.
    Read with pread, not through the mapping: on kernels that map whole large folios per
    page fault, gathering random rows from a mapping made a process's RSS reach the store's
    size within a few dozen batches; reads leave the data in the shared page cache only."""
    out = np.empty(int(lens.sum()), dtype=dtype)
    size, pos = dtype.itemsize, 0
    with open(path, "rb", buffering=0) as f:
        for start, n in zip(starts.tolist(), lens.tolist(), strict=True):
            out[pos:pos + n] = np.frombuffer(os.pread(f.fileno(), n * size, start * size), dtype)
            pos += n
    return out


def _padded(flat: np.ndarray, lens: np.ndarray, ids: SpecialIds, *, bos: bool = False,
            eos: bool = False) -> Tensor:
    """Concatenated rows (`lens[i]` ids each) as a (B, width) long tensor: optional BOS
    (`ids.start`) in front, optional EOS after the last piece, PAD after that."""
    shift = int(bos)
    out = np.full((len(lens), int(lens.max()) + shift + int(eos)), ids.pad, dtype=np.int64)
    out[np.repeat(np.arange(len(lens)), lens), _positions_in_rows(lens) + shift] = flat
    if bos:
        out[:, 0] = ids.start
    if eos:
        out[np.arange(len(lens)), lens + shift] = ids.eos
    return torch.from_numpy(out)


def _positions_in_rows(lens: np.ndarray) -> np.ndarray:
    """For rows of `lens[i]` values laid end to end, each value's position in its row:
    lens [2, 3] -> [0, 1, 0, 1, 2]."""
    return np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)


def _offsets(lengths: np.ndarray, start: int = 0) -> np.ndarray:
    """Cumulative offsets start, start + l0, start + l0 + l1, ... (len(lengths) + 1)."""
    out = np.empty(len(lengths) + 1, dtype=np.int64)
    out[0] = start
    np.cumsum(lengths, out=out[1:])
    out[1:] += start
    return out


def _flatten(ids: list[list[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Token lists -> (flat ids of `dtype`, int64 lengths)."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype,
                       count=int(lengths.sum()))
    return flat, lengths


def _prefixed(flat: np.ndarray, lens: np.ndarray,
              prefix: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Rows (concatenated, `lens[i]` each) with `prefix` in front of every row."""
    new_lens = lens + len(prefix)
    out = np.empty(int(new_lens.sum()), dtype=flat.dtype)
    in_prefix = _positions_in_rows(new_lens) < len(prefix)
    out[in_prefix] = np.tile(np.asarray(prefix, dtype=flat.dtype), len(lens))
    out[~in_prefix] = flat
    return out, new_lens


@dataclass
class Rows:
    """Pairs read for a batch: each side's ids concatenated (`src[:src_lens[0]]` is the
    first source), lengths (int64) and line numbers."""

    src: np.ndarray
    src_lens: np.ndarray
    tgt: np.ndarray
    tgt_lens: np.ndarray
    lines: np.ndarray

    @staticmethod
    def join(parts: Sequence[Rows], order: np.ndarray) -> Rows:
        """The rows of `parts` laid end to end, then taken in `order` (positions in that
        concatenation)."""
        def gather(flats: list[np.ndarray], lens: list[np.ndarray]) -> tuple[np.ndarray,
                                                                               np.ndarray]:
            flat, lengths = np.concatenate(flats), np.concatenate(lens)
            starts = np.cumsum(lengths) - lengths
            picked = lengths[order]
            return flat[np.repeat(starts[order], picked) + _positions_in_rows(picked)], picked
        src, src_lens = gather([p.src for p in parts], [p.src_lens for p in parts])
        tgt, tgt_lens = gather([p.tgt for p in parts], [p.tgt_lens for p in parts])
        return Rows(src, src_lens, tgt, tgt_lens, np.concatenate([p.lines for p in parts])[order])

    def batch(self, ids: SpecialIds) -> Batch:
        """The padded `Batch` (see the module docstring for BOS/EOS placement)."""
        src_lens, tgt_lens = self.src_lens, self.tgt_lens
        width = int(tgt_lens.max()) + 1  # tgt_out's T: y + [EOS]
        return Batch(
            src=_padded(self.src, src_lens, ids, eos=True),
            src_valid_lens=torch.from_numpy(src_lens + 1),
            tgt_in=_padded(self.tgt, tgt_lens, ids, bos=True),
            tgt_out=_padded(self.tgt, tgt_lens, ids, eos=True),
            tgt_valid_lens=torch.from_numpy(tgt_lens + 1),
            tgt_index=torch.from_numpy(np.repeat(np.arange(len(tgt_lens)) * width, tgt_lens + 1)
                                       + _positions_in_rows(tgt_lens + 1)),
            num_tgt_tokens=int(tgt_lens.sum()) + len(tgt_lens),
            indices=self.lines.tolist(),
        )


@dataclass
class ParallelCorpus:
    """An encoded split, or a view of some of its pairs.

    Sentence j of the underlying arrays has source pieces
    `src_ids[src_offsets[j]:src_offsets[j + 1]]` (no BOS/EOS stored), likewise the target.
    The corpus's pair i is sentence `pairs[i]` (all sentences, in order, when `pairs` is
    None): `select` and `filter_long` make views without copying any ids.
    """

    src_ids: np.ndarray  # (source pieces,) uint16/int32, in memory or memory-mapped
    src_offsets: np.ndarray  # (sentences + 1,) int64
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray
    all_lines: np.ndarray  # (sentences,) int64: 0-based line numbers in the split's files
    pairs: np.ndarray | None = None  # (N,) int64 sentence numbers of this view
    src_text: list[str] | None = None  # raw lines (kept for valid/test: BLEU references)
    tgt_text: list[str] | None = None
    path: Path | None = field(default=None, compare=False)  # the store, when mapped
    special_ids: SpecialIds = SpecialIds()  # the tokenizer's: how `collate` frames rows
    # A mapped store's vocabulary size (meta.json): ids read from disk are checked against
    # it, so a damaged file is reported rather than fed to the embedding.
    vocab_size: int | None = field(default=None, compare=False)
    # Tag ids put in front of every source when a pair is read (a corpus tag, a target
    # language's tag): the store holds the text's pieces only.
    src_prefix: tuple[int, ...] = ()

    @classmethod
    def encode(cls, text: ParallelText, tokenizers: TokenizerPair,
               keep_text: bool = False) -> ParallelCorpus:
        """Encode every sentence of `text` into arrays in memory (multithreaded
        SentencePiece)."""
        corpus = cls.from_ids(tokenizers.src.encode_batch(text.src),
                              tokenizers.tgt.encode_batch(text.tgt), tokenizers.tgt.specials,
                              max(tokenizers.src.vocab_size, tokenizers.tgt.vocab_size),
                              text.lines)
        if keep_text:
            corpus.src_text, corpus.tgt_text = text.src, text.tgt
        return corpus

    @classmethod
    def from_ids(cls, src: list[list[int]], tgt: list[list[int]], special_ids: SpecialIds,
                 vocab_size: int, lines: Sequence[int] | None = None) -> ParallelCorpus:
        """Pairs of piece ids (no BOS/EOS) in memory; `lines` default to 0, 1, 2, ..."""
        dtype = id_dtype(vocab_size)
        src_ids, src_lens = _flatten(src, dtype)
        tgt_ids, tgt_lens = _flatten(tgt, dtype)
        lines = np.arange(len(src)) if lines is None else lines
        return cls(src_ids, _offsets(src_lens), tgt_ids, _offsets(tgt_lens),
                   np.asarray(lines, dtype=np.int64), special_ids=special_ids)

    @classmethod
    def open(cls, directory: PathLike) -> ParallelCorpus:
        """Map a store written by `StoreWriter`, after checking its files (`read_meta`)."""
        directory = Path(directory)
        meta = read_meta(directory)
        dtype, n = np.dtype(meta["dtype"]), meta["pairs"]
        arrays = {}
        for side in SIDES:
            arrays[f"{side}_ids"] = _map(directory / f"{side}.bin", dtype, meta[f"{side}_tokens"])
            arrays[f"{side}_offsets"] = _map(directory / f"{side}.idx", np.int64, n + 1)
            _check_offsets(directory / f"{side}.idx", arrays[f"{side}_offsets"],
                           meta[f"{side}_tokens"])
        return cls(**arrays, all_lines=_map(directory / "lines.idx", np.int64, n),
                   path=directory, special_ids=meta["special_ids"],
                   vocab_size=meta.get("vocab_size"))

    def __len__(self) -> int:
        return len(self.all_lines) if self.pairs is None else len(self.pairs)

    def _sentences(self, positions: np.ndarray) -> np.ndarray:
        """The stored sentence numbers of this view's pairs `positions`."""
        return positions if self.pairs is None else self.pairs[positions]

    @property
    def src_lens(self) -> np.ndarray:
        """(N,) int32: source pieces per pair, tags included (EOS not), computed from the
        offsets (batching needs them once an epoch; nothing per pair is kept besides the
        store)."""
        lens = self._lengths(self.src_offsets)
        return lens + len(self.src_prefix) if self.src_prefix else lens

    def with_prefix(self, prefix: Sequence[int]) -> ParallelCorpus:
        """The same pairs, each source read with `prefix` (tag ids) in front."""
        return dataclasses.replace(self, src_prefix=tuple(int(i) for i in prefix))

    @property
    def tgt_lens(self) -> np.ndarray:
        """(N,) int32: target pieces per pair (BOS/EOS not included)."""
        return self._lengths(self.tgt_offsets)

    def _lengths(self, offsets: np.ndarray) -> np.ndarray:
        lens = np.empty(len(offsets) - 1, dtype=np.int32)
        step = 1 << 20  # in chunks: no int64 copy of millions of offsets
        for start in range(0, len(lens), step):
            end = min(len(lens), start + step)
            np.subtract(offsets[start + 1:end + 1], offsets[start:end], out=lens[start:end],
                        casting="unsafe")
        return lens if self.pairs is None else lens[self.pairs]

    def _rows(self, side: str, sentences: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ids of `sentences` on one side ("src"/"tgt"), concatenated, and their
        lengths (int64)."""
        offsets, ids = getattr(self, f"{side}_offsets"), getattr(self, f"{side}_ids")
        starts = np.asarray(offsets[sentences])
        lens = np.asarray(offsets[sentences + 1]) - starts
        if self.path is not None and len(ids):
            rows = _read_rows(self.path / f"{side}.bin", starts, lens, ids.dtype)
            if self.vocab_size is not None and len(rows) and int(rows.max()) >= self.vocab_size:
                raise DataError(f"{self.path / f'{side}.bin'} holds token id {int(rows.max())}, "
                                f"outside the vocabulary of {self.vocab_size}; "
                                f"{_delete_hint(self.path)}")
            return rows, lens
        return ids[np.repeat(starts, lens) + _positions_in_rows(lens)], lens

    @property
    def lines(self) -> np.ndarray:
        """(N,) 0-based line number of each pair in the split's files."""
        return np.asarray(self.all_lines if self.pairs is None else self.all_lines[self.pairs])

    def pair(self, i: int) -> tuple[list[int], list[int]]:
        """Source (tags first) and target pieces of pair i, as lists."""
        j = int(self._sentences(np.asarray(i)))
        s, t = self.src_offsets, self.tgt_offsets
        return (list(self.src_prefix) + self.src_ids[s[j]:s[j + 1]].tolist(),
                self.tgt_ids[t[j]:t[j + 1]].tolist())

    def select(self, keep: np.ndarray) -> ParallelCorpus:
        """A view of the pairs where the boolean mask `keep` (N,) is true, in order."""
        keep = np.asarray(keep, dtype=bool)
        kept = np.flatnonzero(keep)
        view = dataclasses.replace(self, pairs=self._sentences(kept), src_text=None,
                                   tgt_text=None)
        if self.src_text is not None:
            view.src_text = [self.src_text[i] for i in kept]
            view.tgt_text = [self.tgt_text[i] for i in kept]
        return view

    def filter_long(self, max_len: int, split: str = "train") -> ParallelCorpus:
        """Drop pairs whose source + EOS or BOS + target exceeds `max_len` (count logged)."""
        keep = (self.src_lens + 1 <= max_len) & (self.tgt_lens + 1 <= max_len)
        dropped = len(self) - int(keep.sum())
        log.info("%s: filtered %d pairs longer than data.max_len=%d tokens (including "
                 "EOS/BOS)", split, dropped, max_len)
        return self if dropped == 0 else self.select(keep)

    def rows(self, indices: Sequence[int]) -> Rows:
        """The pairs `indices` (positions in this corpus) as they are batched: sources with
        their tags in front."""
        sentences = self._sentences(np.asarray(indices, dtype=np.int64))
        src, src_lens = self._rows("src", sentences)
        if self.src_prefix:
            src, src_lens = _prefixed(src, src_lens, self.src_prefix)
        tgt, tgt_lens = self._rows("tgt", sentences)
        lines = (self.all_lines[sentences] if self.path is None else
                 _read_rows(self.path / "lines.idx", sentences, np.ones_like(sentences),
                            np.dtype(np.int64)))
        return Rows(src, src_lens, tgt, tgt_lens, np.asarray(lines))

    def collate(self, indices: Sequence[int]) -> Batch:
        """The padded `Batch` of pairs `indices` (positions in this corpus)."""
        if len(indices) == 0:
            raise ValueError("cannot collate an empty batch")
        return self.rows(indices).batch(self.special_ids)

    def disk_bytes(self) -> int:
        """Bytes of the store on disk (0 for a corpus held in memory)."""
        if self.path is None:
            return 0
        return sum(p.stat().st_size for p in self.path.iterdir())


# ---- the store on disk --------------------------------------------------------------------


def _delete_hint(directory: Path) -> str:
    return f"the store is damaged; delete {directory} and it will be rebuilt"


ID_DTYPES = ("uint16", "int32")  # what `id_dtype` chooses


def read_meta(directory: PathLike) -> dict[str, Any]:
    """The store's meta.json, after checking that every file has the size it records: a
    truncated or damaged store raises `DataError` naming the file. Its `special_ids` are
    returned as `SpecialIds`."""
    directory = Path(directory)
    try:
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        version = meta["version"]
        if version == STORE_VERSION:
            counts = [meta[key] for key in ("pairs", "src_tokens", "tgt_tokens")]
            if meta["dtype"] not in ID_DTYPES or not all(
                    type(c) is int and c >= 0 for c in counts):
                raise ValueError(f"dtype {meta['dtype']!r}, counts {counts}")
            meta["special_ids"] = SpecialIds(**meta.get("special_ids", {}))
            vocab_size = meta.get("vocab_size")
            if vocab_size is not None and (type(vocab_size) is not int or vocab_size < 1):
                raise ValueError(f"vocab_size {vocab_size!r}")
    except (OSError, ValueError, KeyError, TypeError) as e:  # also JSON that is no dict
        raise DataError(f"{directory / 'meta.json'}: unreadable store description ({e}); "
                        f"{_delete_hint(directory)}") from None
    if version != STORE_VERSION:
        raise DataError(f"{directory}: store version {version}, this package reads "
                        f"{STORE_VERSION}; delete it and it will be rebuilt")
    dtype, n = np.dtype(meta["dtype"]), meta["pairs"]
    expected = {"lines.idx": 8 * n}
    for side in SIDES:
        expected[f"{side}.bin"] = dtype.itemsize * meta[f"{side}_tokens"]
        expected[f"{side}.idx"] = 8 * (n + 1)
    for name, size in expected.items():
        path = directory / name
        actual = path.stat().st_size if path.is_file() else None
        if actual != size:
            found = "is missing" if actual is None else f"has {actual:,} bytes"
            raise DataError(f"{path} {found}, expected {size:,}; {_delete_hint(directory)}")
    return meta


def _check_offsets(path: Path, offsets: np.ndarray, tokens: int) -> None:
    """Offsets that start at 0, never decrease and end at the side's token count (a store
    whose sizes agree can still hold garbled offsets); read in chunks."""
    step = 1 << 20
    ok = int(offsets[0]) == 0 and int(offsets[-1]) == tokens
    for start in range(0, len(offsets) - 1, step):
        if not ok:
            break
        chunk = np.asarray(offsets[start:start + step + 1])
        ok = bool(np.all(chunk[1:] >= chunk[:-1]))
    if not ok:
        raise DataError(f"{path}: offsets out of order or not matching "
                        f"{path.with_suffix('.bin').name}; {_delete_hint(path.parent)}")


def _map(path: Path, dtype: Any, count: int) -> np.ndarray:
    """A read-only memory map of `count` values (an empty array for 0: mmap needs bytes)."""
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


class StoreWriter:
    """Streams encoded chunks into a new store (see the module docstring).

        with StoreWriter(directory, vocab_size) as writer:
            for chunk in ...:
                writer.add(src_ids, tgt_ids, line_numbers)
            writer.finish(meta)      # only now does `directory` appear

    Leaving the block without `finish` (an error, a full disk) removes the temporary
    directory; a failed write raises `WriteError` naming the file.
    """

    def __init__(self, directory: PathLike, vocab_size: int) -> None:
        self.directory = Path(directory)
        self.tmp = self.directory.parent / f".{self.directory.name}.tmp-{os.getpid()}"
        self.dtype = id_dtype(vocab_size)
        self.vocab_size = vocab_size
        self.pairs = 0
        self.tokens = dict.fromkeys(SIDES, 0)
        self._files: dict[str, Any] = {}

    def __enter__(self) -> StoreWriter:
        shutil.rmtree(self.tmp, ignore_errors=True)
        try:
            self.tmp.mkdir(parents=True)
            for name in ("src.bin", "tgt.bin", "src.idx", "tgt.idx", "lines.idx"):
                self._files[name] = open(self.tmp / name, "wb")
        except OSError as e:
            self._close()
            raise WriteError(f"could not write {self.directory}: {e.strerror or e}") from e
        self._write("src.idx", np.zeros(1, dtype=np.int64))
        self._write("tgt.idx", np.zeros(1, dtype=np.int64))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close()
        shutil.rmtree(self.tmp, ignore_errors=True)  # a no-op after `finish`

    def _close(self) -> None:
        for f in self._files.values():
            try:
                f.close()
            except OSError:
                pass  # the write error that matters was raised already

    def _write(self, name: str, array: np.ndarray) -> None:
        try:
            self._files[name].write(array.tobytes())
        except OSError as e:
            raise WriteError(f"could not write {self.directory / name}: "
                             f"{e.strerror or e}") from e

    def add(self, src: list[list[int]], tgt: list[list[int]], lines: Sequence[int]) -> None:
        """Append aligned pairs: source and target ids (no BOS/EOS), their line numbers."""
        for side, ids in zip(SIDES, (src, tgt), strict=True):
            flat, lengths = _flatten(ids, self.dtype)
            self._write(f"{side}.bin", flat)
            self._write(f"{side}.idx", _offsets(lengths, self.tokens[side])[1:])
            self.tokens[side] += len(flat)
        self._write("lines.idx", np.asarray(lines, dtype=np.int64))
        self.pairs += len(lines)

    def finish(self, meta: dict[str, Any]) -> None:
        """Write meta.json (with the counts) and move the complete store into place,
        replacing an older one."""
        for name, f in self._files.items():
            try:
                f.flush()
                os.fsync(f.fileno())
            except OSError as e:
                raise WriteError(f"could not write {self.directory / name}: "
                                 f"{e.strerror or e}") from e
        self._close()
        meta = {**meta, "version": STORE_VERSION, "dtype": self.dtype.name,
                "pairs": self.pairs, "src_tokens": self.tokens["src"],
                "tgt_tokens": self.tokens["tgt"], "vocab_size": self.vocab_size}
        with atomic_write(self.tmp / "meta.json", text=True) as f:
            json.dump(meta, f, indent=1)
        read_meta(self.tmp)  # the sizes agree before anyone can trust the store
        old = self.directory.parent / f".{self.directory.name}.old-{os.getpid()}"
        if self.directory.exists():
            os.replace(self.directory, old)
        try:
            os.replace(self.tmp, self.directory)
        except OSError:
            if not self.directory.exists():  # not another process's identical store
                raise
        shutil.rmtree(old, ignore_errors=True)
