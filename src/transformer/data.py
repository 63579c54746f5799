"""Parallel corpora -> validated, SentencePiece-encoded corpora ready for batching.

Flow (see `load_data`):

1. `resolve_files`: the config names a source and a target file per split (`data=files`),
   or Multi30k files in `data.root`, downloaded and checksummed if missing (`data=multi30k`).
2. `text.read_parallel`: line counts, UTF-8 and line endings are checked; training pairs with
   an empty side are dropped (never validation/test pairs: translations stay line-aligned).
3. SentencePiece is trained on the training split once per run directory (`spm.model`).
4. `ParallelCorpus`: every sentence encoded once, cached on disk under `run_dir/cache/`,
   keyed by the files' content and the tokenizer. Training pairs longer than `data.max_len`
   are filtered.
5. `batching.train_batches` / `eval_batches` give lists of example indices;
   `ParallelCorpus.collate` turns one into a padded `Batch`.

Token layout: the model sees the source with EOS appended (`x + [EOS]`) and the target
shifted (`tgt_in = [BOS] + y`, `tgt_out = y + [EOS]`).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from . import multi30k
from .batching import eval_batches, train_batches
from .config import SPLITS, DataConfig
from .files import atomic_write
from .text import DataError, ParallelText, read_parallel
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, TokenizerPair

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]

CACHE_VERSION = 1  # bump when the cache file layout changes


# ---- files and download -----------------------------------------------------------------


@dataclass(frozen=True)
class SplitFiles:
    """The source and target file of one split."""

    src: Path
    tgt: Path


def split_files(cfg: DataConfig, split: str) -> Optional[SplitFiles]:
    """The files of `split` ("train", "valid", "test") as `cfg` names them, without checking
    or downloading them; None for a test split that `data=files` leaves unset."""
    if cfg.name == "multi30k":
        return SplitFiles(multi30k.split_file(cfg.root, split, cfg.src_lang),
                          multi30k.split_file(cfg.root, split, cfg.tgt_lang))
    src, tgt = getattr(cfg, f"{split}_src"), getattr(cfg, f"{split}_tgt")
    if src is None:
        return None  # only test is optional (DataConfig.validate)
    return SplitFiles(Path(src).expanduser(), Path(tgt).expanduser())


def resolve_files(cfg: DataConfig) -> dict[str, SplitFiles]:
    """Split name ("train", "valid", optionally "test") -> its files, downloading Multi30k
    files that are missing from `cfg.root`; a missing file of `data=files` names its key."""
    if cfg.name == "multi30k":
        multi30k.download_multi30k(cfg.root, (cfg.src_lang, cfg.tgt_lang), base_url=cfg.base_url)
    out = {}
    for split in SPLITS:
        files = split_files(cfg, split)
        if files is None:
            continue
        for side, path in (("src", files.src), ("tgt", files.tgt)):
            if not path.is_file():
                raise FileNotFoundError(f"data.{split}_{side}: no such file: {path}")
        out[split] = files
    return out


# ---- encoded corpus and batches ---------------------------------------------------------


@dataclass
class Batch:
    """Padded tensors for one step; see the module docstring for BOS/EOS placement."""

    src: Tensor  # (B, S) long: x + [EOS], PAD_ID after
    src_valid_lens: Tensor  # (B,) long: len(x) + 1
    tgt_in: Tensor  # (B, T) long: [BOS] + y, PAD_ID after
    tgt_out: Tensor  # (B, T) long: y + [EOS], PAD_ID after
    tgt_valid_lens: Tensor  # (B,) long: len(y) + 1
    num_tgt_tokens: int  # non-pad positions of tgt_out
    indices: list[int]  # each row's 0-based line number in the split's files

    def __len__(self) -> int:
        return len(self.indices)

    def to(self, device: Union[str, torch.device], non_blocking: bool = False) -> "Batch":
        """A copy with the tensors on `device` (`indices` stay a Python list)."""
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(
            move(self.src), move(self.src_valid_lens), move(self.tgt_in), move(self.tgt_out),
            move(self.tgt_valid_lens), self.num_tgt_tokens, self.indices,
        )

    def pin_memory(self) -> "Batch":
        """A copy in pinned memory (for fast `to(cuda, non_blocking=True)`)."""
        pin = lambda t: t.pin_memory()  # noqa: E731
        return Batch(
            pin(self.src), pin(self.src_valid_lens), pin(self.tgt_in), pin(self.tgt_out),
            pin(self.tgt_valid_lens), self.num_tgt_tokens, self.indices,
        )


def _padded_rows(
    flat: Tensor, offsets: Tensor, idx: Tensor, *, bos: bool = False, eos: bool = False
) -> Tensor:
    """Sentences `idx` of a flat id tensor as a (B, width) long tensor: optional BOS in
    front, optional EOS after the last piece, PAD_ID after that."""
    starts = offsets[idx]
    lens = offsets[idx + 1] - starts
    shift = int(bos)
    width = int(lens.max()) + shift + int(eos)
    pos = torch.arange(width) - shift  # position inside the sentence
    inside = (pos >= 0) & (pos < lens[:, None])
    out = torch.full((len(idx), width), PAD_ID, dtype=torch.long)
    if flat.numel():
        gather = (starts[:, None] + pos).clamp_(0, flat.numel() - 1)
        # index_select, not flat[gather]: advanced indexing is much slower on CPU
        tokens = flat.index_select(0, gather.flatten()).view_as(gather)
        out = torch.where(inside, tokens.long(), out)
    if bos:
        out[:, 0] = BOS_ID
    if eos:
        out[torch.arange(len(idx)), lens + shift] = EOS_ID
    return out


def _flatten(ids: list[list[int]]) -> tuple[Tensor, Tensor]:
    """Token lists -> (flat int32 ids, int64 offsets of length len(ids) + 1)."""
    flat = torch.tensor(list(itertools.chain.from_iterable(ids)), dtype=torch.int32)
    offsets = torch.zeros(len(ids) + 1, dtype=torch.long)
    offsets[1:] = torch.tensor([len(x) for x in ids], dtype=torch.long).cumsum(0)
    return flat, offsets


@dataclass
class ParallelCorpus:
    """An encoded split: sentence i's source pieces are
    `src_ids[src_offsets[i]:src_offsets[i + 1]]` (no BOS/EOS stored), likewise the target.

    One flat tensor per side instead of a tensor per sentence: loading the cache is a single
    read, and `collate` gathers a whole batch with one indexing operation.
    """

    src_ids: Tensor  # (total source pieces,) int32
    src_offsets: Tensor  # (N + 1,) int64
    tgt_ids: Tensor
    tgt_offsets: Tensor
    lines: Tensor  # (N,) int64: 0-based line numbers in the split's files
    src_text: Optional[list[str]] = None  # raw lines (kept for valid/test: BLEU references)
    tgt_text: Optional[list[str]] = None

    @classmethod
    def encode(cls, text: ParallelText, tokenizers: TokenizerPair, keep_text: bool = False):
        """Encode every sentence of `text` (multithreaded SentencePiece)."""
        src_flat, src_offsets = _flatten(tokenizers.src.encode_batch(text.src))
        tgt_flat, tgt_offsets = _flatten(tokenizers.tgt.encode_batch(text.tgt))
        lines = torch.tensor(text.lines, dtype=torch.long)
        corpus = cls(src_flat, src_offsets, tgt_flat, tgt_offsets, lines)
        if keep_text:
            corpus.src_text, corpus.tgt_text = text.src, text.tgt
        return corpus

    def __len__(self) -> int:
        return len(self.lines)

    @property
    def src_lens(self) -> Tensor:
        """(N,) number of source pieces per sentence (EOS not included)."""
        return self.src_offsets.diff()

    @property
    def tgt_lens(self) -> Tensor:
        """(N,) number of target pieces per sentence (BOS/EOS not included)."""
        return self.tgt_offsets.diff()

    def pair(self, i: int) -> tuple[list[int], list[int]]:
        """Source and target pieces of sentence i, as lists."""
        s, t = self.src_offsets, self.tgt_offsets
        return (
            self.src_ids[s[i] : s[i + 1]].tolist(),
            self.tgt_ids[t[i] : t[i + 1]].tolist(),
        )

    def select(self, keep: Tensor) -> "ParallelCorpus":
        """The sentences where the boolean mask `keep` (N,) is true, in order."""
        src_tokens = keep.repeat_interleave(self.src_lens)
        tgt_tokens = keep.repeat_interleave(self.tgt_lens)
        src_offsets = torch.zeros(int(keep.sum()) + 1, dtype=torch.long)
        src_offsets[1:] = self.src_lens[keep].cumsum(0)
        tgt_offsets = torch.zeros_like(src_offsets)
        tgt_offsets[1:] = self.tgt_lens[keep].cumsum(0)
        kept = keep.nonzero().flatten().tolist()
        return ParallelCorpus(
            self.src_ids[src_tokens], src_offsets, self.tgt_ids[tgt_tokens], tgt_offsets,
            self.lines[keep],
            None if self.src_text is None else [self.src_text[i] for i in kept],
            None if self.tgt_text is None else [self.tgt_text[i] for i in kept],
        )

    def filter_long(self, max_len: int, split: str = "train") -> "ParallelCorpus":
        """Drop pairs whose source + EOS or BOS + target exceeds `max_len` (count logged)."""
        keep = (self.src_lens + 1 <= max_len) & (self.tgt_lens + 1 <= max_len)
        dropped = len(self) - int(keep.sum())
        log.info(
            "%s: filtered %d pairs longer than data.max_len=%d tokens (including EOS/BOS)",
            split, dropped, max_len,
        )
        return self if dropped == 0 else self.select(keep)

    def collate(self, indices: Sequence[int]) -> Batch:
        """The padded `Batch` of sentences `indices` (positions in this corpus)."""
        if len(indices) == 0:
            raise ValueError("cannot collate an empty batch")
        idx = torch.as_tensor(indices, dtype=torch.long)
        tgt_valid_lens = self.tgt_lens[idx] + 1
        return Batch(
            src=_padded_rows(self.src_ids, self.src_offsets, idx, eos=True),
            src_valid_lens=self.src_lens[idx] + 1,
            tgt_in=_padded_rows(self.tgt_ids, self.tgt_offsets, idx, bos=True),
            tgt_out=_padded_rows(self.tgt_ids, self.tgt_offsets, idx, eos=True),
            tgt_valid_lens=tgt_valid_lens,
            num_tgt_tokens=int(tgt_valid_lens.sum()),
            indices=self.lines[idx].tolist(),
        )

    def save(self, path: PathLike) -> None:
        """Write the tensors (not the text) atomically."""
        state = {
            "version": CACHE_VERSION,
            "src_ids": self.src_ids, "src_offsets": self.src_offsets,
            "tgt_ids": self.tgt_ids, "tgt_offsets": self.tgt_offsets,
            "lines": self.lines,
        }
        with atomic_write(path) as f:
            torch.save(state, f)

    @classmethod
    def load(cls, path: PathLike) -> "ParallelCorpus":
        """Read a file written by `save`."""
        state = torch.load(path, weights_only=True)
        if state.get("version") != CACHE_VERSION:
            raise DataError(
                f"{path}: cache version {state.get('version')}, expected {CACHE_VERSION}"
            )
        return cls(
            state["src_ids"], state["src_offsets"], state["tgt_ids"], state["tgt_offsets"],
            state["lines"],
        )


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cache_path(
    files: SplitFiles, split: str, tokenizers: TokenizerPair, cache_dir: PathLike
) -> Path:
    """Where the encoded split is cached: keyed by both files' bytes and both tokenizers."""
    key = "|".join([
        f"v{CACHE_VERSION}", split, _sha256_file(files.src), _sha256_file(files.tgt),
        tokenizers.src.fingerprint, tokenizers.tgt.fingerprint,
    ])
    return Path(cache_dir) / f"{split}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.pt"


def load_corpus(
    files: SplitFiles,
    split: str,
    tokenizers: TokenizerPair,
    cache_dir: Optional[PathLike] = None,
    *,
    text: Optional[ParallelText] = None,
    keep_text: bool = False,
) -> ParallelCorpus:
    """Read, check and encode one split, or load its encoding from `cache_dir`.

    On a cache hit the training split is not read at all; with `keep_text` (valid/test) the
    text is always read, and so checked. `text` passes an already-read split.
    """
    path = None if cache_dir is None else cache_path(files, split, tokenizers, cache_dir)
    if path is not None and path.is_file():
        corpus = ParallelCorpus.load(path)
        log.info("%s: %d encoded pairs loaded from cache %s", split, len(corpus), path)
        if keep_text:
            if text is None:
                text = read_parallel(files.src, files.tgt, split=split)
            corpus.src_text, corpus.tgt_text = text.src, text.tgt
        return corpus
    if text is None:
        text = read_parallel(files.src, files.tgt, split=split)
    corpus = ParallelCorpus.encode(text, tokenizers, keep_text=keep_text)
    if path is not None:
        corpus.save(path)
    return corpus


# ---- everything together ----------------------------------------------------------------


def spm_paths(cfg: DataConfig, run_dir: PathLike) -> list[Path]:
    """The run's SentencePiece model file(s): [spm.model], or [spm.src.model, spm.tgt.model]
    for separate vocabularies."""
    run_dir = Path(run_dir)
    if cfg.joint_vocab:
        return [run_dir / "spm.model"]
    return [run_dir / "spm.src.model", run_dir / "spm.tgt.model"]


def existing_tokenizers(cfg: DataConfig, run_dir: PathLike) -> Optional[TokenizerPair]:
    """`cfg.spm_model` if set, else the run directory's model(s) if present, else None."""
    if cfg.spm_model is not None:
        tok = Tokenizer.load(Path(cfg.spm_model).expanduser())
        log.info("using SentencePiece model %s (vocab %d)", cfg.spm_model, tok.vocab_size)
        return TokenizerPair(tok, tok)
    paths = spm_paths(cfg, run_dir)
    if not all(p.is_file() for p in paths):
        return None
    toks = [Tokenizer.load(p) for p in paths]
    for path, tok in zip(paths, toks):
        if tok.vocab_size != cfg.vocab_size:
            raise DataError(
                f"{path} has vocabulary size {tok.vocab_size} but data.vocab_size="
                f"{cfg.vocab_size}; delete it or use a new run directory"
            )
        log.info("reusing SentencePiece model %s", path)
    return TokenizerPair(toks[0], toks[-1])


def train_tokenizers(cfg: DataConfig, text: ParallelText, run_dir: PathLike) -> TokenizerPair:
    """Train SentencePiece on the training split and save it into `run_dir`."""
    start = time.perf_counter()
    options = dict(vocab_size=cfg.vocab_size, model_type=cfg.spm_model_type)
    paths = spm_paths(cfg, run_dir)
    try:
        if cfg.joint_vocab:
            tok = Tokenizer.train(itertools.chain(text.src, text.tgt), paths[0], **options)
            pair = TokenizerPair(tok, tok)
        else:
            pair = TokenizerPair(
                Tokenizer.train(text.src, paths[0], **options),
                Tokenizer.train(text.tgt, paths[1], **options),
            )
    except RuntimeError as e:  # SentencePiece's own checks, e.g. too few distinct pieces
        reason = str(e).splitlines()[0].split("] ")[-1]
        raise DataError(f"cannot train SentencePiece with data.vocab_size={cfg.vocab_size} on "
                        f"the {len(text)} training pairs: {reason}") from None
    log.info("trained SentencePiece (%s) in %.1f s -> %s", cfg.spm_model_type,
             time.perf_counter() - start, ", ".join(map(str, paths)))
    return pair


@dataclass
class Data:
    """Everything the training loop needs from the data side."""

    cfg: DataConfig
    tokenizers: TokenizerPair
    train: ParallelCorpus
    valid: ParallelCorpus  # src_text / tgt_text hold the raw lines (BLEU references)
    test: Optional[ParallelCorpus] = None

    @property
    def tokenizer(self) -> Tokenizer:
        """The joint tokenizer (error for separate vocabularies: use `tokenizers`)."""
        if not self.tokenizers.shared:
            raise ValueError("separate vocabularies: use data.tokenizers.src / .tgt")
        return self.tokenizers.src

    def train_batches(self, epoch: int, rank: int = 0, world_size: int = 1) -> list[list[int]]:
        """This rank's training batches for `epoch` (index lists for `self.train.collate`)."""
        return train_batches(
            self.train.src_lens, self.train.tgt_lens, self.cfg.max_tokens,
            seed=self.cfg.seed, epoch=epoch, rank=rank, world_size=world_size,
        )

    def eval_batches(
        self,
        split: str = "valid",
        max_tokens: Optional[int] = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> list[list[int]]:
        """Fixed-order batches of "valid" or "test" (index lists for that corpus's `collate`)."""
        if split not in ("valid", "test"):
            raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
        corpus = self.valid if split == "valid" else self.test
        if corpus is None:
            raise ValueError(f"no {split!r} split in this data")
        return eval_batches(
            corpus.src_lens, corpus.tgt_lens, max_tokens or self.cfg.max_tokens,
            rank=rank, world_size=world_size,
        )


def _first_pairs(text: ParallelText, n: Optional[int]) -> ParallelText:
    """The first `n` pairs of `text` (all of them for None)."""
    if n is None or n >= len(text):
        return text
    return ParallelText(text.src[:n], text.tgt[:n], text.lines[:n])


def load_data(
    cfg: DataConfig,
    run_dir: PathLike,
    *,
    tokenizers: Optional[TokenizerPair] = None,
    cache_dir: Optional[PathLike] = None,
) -> Data:
    """Resolve, check, tokenize and encode all splits.

    The tokenizer is, in order: `tokenizers` (e.g. from a checkpoint), `cfg.spm_model`, the
    model already in `run_dir`, or a new one trained on the training split and saved into
    `run_dir`. Encoded splits are cached in `cache_dir` (default `run_dir/cache`).
    """
    run_dir = Path(run_dir)
    files = resolve_files(cfg)
    train_text = None
    if tokenizers is None:
        tokenizers = existing_tokenizers(cfg, run_dir)
    if tokenizers is None:
        train_text = read_parallel(files["train"].src, files["train"].tgt, split="train")
        tokenizers = train_tokenizers(cfg, _first_pairs(train_text, cfg.max_train_pairs), run_dir)
    cache_dir = run_dir / "cache" if cache_dir is None else Path(cache_dir)
    train = load_corpus(files["train"], "train", tokenizers, cache_dir, text=train_text)
    if cfg.max_train_pairs is not None and cfg.max_train_pairs < len(train):
        # The cache holds the whole split; the subset is taken here.
        train = train.select(torch.arange(len(train)) < cfg.max_train_pairs)
        log.info("train: using the first %d pairs (data.max_train_pairs)", len(train))
    splits = {
        split: load_corpus(files[split], split, tokenizers, cache_dir, keep_text=True)
        for split in ("valid", "test")
        if split in files
    }
    train = train.filter_long(cfg.max_len)
    return Data(cfg, tokenizers, train, splits["valid"], splits.get("test"))

