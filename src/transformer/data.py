"""Parallel corpora -> validated, SentencePiece-encoded, token-bucketed batches.

Flow (see `load_data`):

1. `resolve_files`: the config names a source and a target file per split (`data=files`),
   or Multi30k files in `data.root`, downloaded and checksummed if missing (`data=multi30k`).
2. `read_parallel`: line counts, UTF-8 and line endings are checked; training pairs with an
   empty side are dropped (never validation/test pairs: translations stay line-aligned).
3. SentencePiece is trained on the training split once per run directory (`spm.model`).
4. `ParallelCorpus`: every sentence encoded once, cached on disk under `run_dir/cache/`,
   keyed by the files' content and the tokenizer. Training pairs longer than `data.max_len`
   are filtered.
5. `train_batches` / `eval_batches`: lists of example indices holding at most `max_tokens`
   tokens per side; `ParallelCorpus.collate` turns one into a padded `Batch`.

Token counting, used everywhere below: the model sees the source with EOS appended
(`x + [EOS]`) and the target shifted (`tgt_in = [BOS] + y`, `tgt_out = y + [EOS]`), so a
sentence of n pieces has *size* n + 1 on either side. A batch of B sentences costs
B * (largest size in the batch) positions per side, padding included.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import logging
import os
import random
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from .tokenizer import BOS_ID, EOS_ID, MODEL_TYPES, PAD_ID, Tokenizer, TokenizerPair

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
MULTI30K_LANGS = ("en", "de", "fr", "cs")
MULTI30K_STEMS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
# SHA-256 of the files in multi30k/dataset, data/task1/raw/ (upstream, unchanged).
MULTI30K_SHA256 = {
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}

SPLITS = ("train", "valid", "test")
CACHE_VERSION = 1  # bump when the cache file layout changes


class DataError(ValueError):
    """Bad input data: misaligned files, invalid UTF-8, failed checksum, ..."""


# ---- configuration ----------------------------------------------------------------------


@dataclass
class DataConfig:
    """The `data` config group (configs/data/*.yaml have exactly these keys).

    `max_len` is the longest training sequence the model sees, counting the added EOS
    (source) or BOS (target): pairs with more than `max_len - 1` pieces on either side are
    dropped from training. `max_tokens` bounds each batch per side, padding included.
    """

    name: str = "multi30k"  # "multi30k" (named dataset) or "files" (the *_src/*_tgt keys)
    root: str = "~/.cache/transformer/multi30k"  # Multi30k folder; missing files downloaded
    src_lang: str = "en"
    tgt_lang: str = "de"
    train_src: Optional[str] = None
    train_tgt: Optional[str] = None
    valid_src: Optional[str] = None
    valid_tgt: Optional[str] = None
    test_src: Optional[str] = None
    test_tgt: Optional[str] = None
    base_url: str = MULTI30K_URL  # Multi30k download prefix: <base_url><stem>.<lang>.gz
    vocab_size: int = 8000
    spm_model_type: str = "unigram"  # or "bpe"
    joint_vocab: bool = True  # one SentencePiece model for both sides
    spm_model: Optional[str] = None  # an existing .model to use instead of training one
    max_len: int = 256
    max_tokens: int = 4096
    seed: int = 1
    max_train_pairs: Optional[int] = None  # use only the first N training pairs (smoke runs)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first bad key."""
        for key in ("vocab_size", "max_len", "max_tokens"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"data.{key} must be a positive integer, got {value!r}")
        if self.max_train_pairs is not None and (
            isinstance(self.max_train_pairs, bool) or not isinstance(self.max_train_pairs, int)
            or self.max_train_pairs <= 0
        ):
            raise ValueError(
                f"data.max_train_pairs must be a positive integer or null, "
                f"got {self.max_train_pairs!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"data.seed must be an integer, got {self.seed!r}")
        if self.max_tokens < self.max_len:
            raise ValueError(
                f"data.max_tokens ({self.max_tokens}) must be >= data.max_len "
                f"({self.max_len}) so that every training pair fits in a batch"
            )
        if self.spm_model_type not in MODEL_TYPES:
            raise ValueError(
                f"data.spm_model_type must be one of {MODEL_TYPES}, got {self.spm_model_type!r}"
            )
        if not isinstance(self.joint_vocab, bool):
            raise ValueError(f"data.joint_vocab must be true or false, got {self.joint_vocab!r}")
        if self.spm_model is not None and not self.joint_vocab:
            raise ValueError("data.spm_model needs a joint vocabulary (data.joint_vocab=true)")
        file_keys = [f"{s}_{side}" for s in SPLITS for side in ("src", "tgt")]
        if self.name == "multi30k":
            for key in ("src_lang", "tgt_lang"):
                if getattr(self, key) not in MULTI30K_LANGS:
                    raise ValueError(
                        f"data.{key} must be one of {MULTI30K_LANGS} for Multi30k, "
                        f"got {getattr(self, key)!r}"
                    )
            if self.src_lang == self.tgt_lang:
                raise ValueError(f"data.src_lang and data.tgt_lang are both {self.src_lang!r}")
            for key in file_keys:
                if getattr(self, key) is not None:
                    raise ValueError(f"data.{key} is only used with data.name=files")
        elif self.name == "files":
            for key in file_keys[:4]:
                if not getattr(self, key):
                    raise ValueError(f"data.{key} must be set when data.name=files")
            if (self.test_src is None) != (self.test_tgt is None):
                raise ValueError("data.test_src and data.test_tgt must be set together")
        else:
            raise ValueError(f"data.name must be 'multi30k' or 'files', got {self.name!r}")


# ---- files and download -----------------------------------------------------------------


@dataclass(frozen=True)
class SplitFiles:
    """The source and target file of one split."""

    src: Path
    tgt: Path


def resolve_files(cfg: DataConfig) -> dict[str, SplitFiles]:
    """Split name ("train", "valid", optionally "test") -> its files, downloading Multi30k
    files that are missing from `cfg.root`."""
    if cfg.name == "multi30k":
        root = Path(cfg.root).expanduser()
        download_multi30k(root, (cfg.src_lang, cfg.tgt_lang), base_url=cfg.base_url)
        return {
            split: SplitFiles(root / f"{stem}.{cfg.src_lang}.gz",
                              root / f"{stem}.{cfg.tgt_lang}.gz")
            for split, stem in MULTI30K_STEMS.items()
        }
    out = {}
    for split in SPLITS:
        src, tgt = getattr(cfg, f"{split}_src"), getattr(cfg, f"{split}_tgt")
        if src is None:
            continue  # only test is optional (DataConfig.validate)
        for key, value in ((f"{split}_src", src), (f"{split}_tgt", tgt)):
            if not Path(value).expanduser().is_file():
                raise FileNotFoundError(f"data.{key}: no such file: {value}")
        out[split] = SplitFiles(Path(src).expanduser(), Path(tgt).expanduser())
    return out


def download_multi30k(
    root: PathLike, langs: Sequence[str] = ("en", "de"), *, base_url: str = MULTI30K_URL
) -> None:
    """Download the train/val/test_2016_flickr files of `langs` missing from `root`.

    Files already present are trusted (a download only ever becomes visible after its
    checksum passed, see `download_file`).
    """
    root = Path(root)
    for stem in MULTI30K_STEMS.values():
        for lang in langs:
            name = f"{stem}.{lang}.gz"
            if not (root / name).is_file():
                url = base_url.rstrip("/") + "/" + name
                download_file(url, root / name, MULTI30K_SHA256[name])


def download_file(url: str, dest: PathLike, sha256: str, *, timeout: float = 60.0) -> None:
    """Download `url` to `dest`, verifying its SHA-256.

    The data goes to a hidden temporary file in the same folder and is renamed to `dest`
    only after the checksum matched, so `dest` never exists half-written or corrupted.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s -> %s", url, dest)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    while chunk := response.read(1 << 20):
                        out.write(chunk)
                        digest.update(chunk)
            except (urllib.error.URLError, OSError) as e:
                raise DataError(f"could not download {dest.name} from {url}: {e}") from e
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != sha256:
            raise DataError(
                f"checksum mismatch for {dest.name} downloaded from {url}: expected sha256 "
                f"{sha256}, got {digest.hexdigest()}; the file was not saved"
            )
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)  # no-op after a successful os.replace


# ---- reading and validation -------------------------------------------------------------


def read_lines(path: PathLike) -> list[str]:
    """The lines of a UTF-8 text file (plain or `.gz`), without line terminators.

    Lines are split on "\\n" only; a "\\r" before it (Windows) is removed and any other "\\r"
    becomes a space, so a stray "\\r" can never shift line alignment. A UTF-8 BOM is removed.
    """
    path = Path(path)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{path}: not a valid gzip file ({e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - raw.rfind(b"\n", 0, e.start)
        raise DataError(
            f"{path}, line {line}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at byte {column} "
            "of the line)"
        ) from None
    text = text.removeprefix("\ufeff")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start a new one
    if "\r" in text:
        lines = [line.removesuffix("\r").replace("\r", " ") for line in lines]
    return lines


@dataclass
class ParallelText:
    """Line-aligned sentences of one split; `lines[i]` is pair i's 0-based line number."""

    src: list[str]
    tgt: list[str]
    lines: list[int]

    def __len__(self) -> int:
        return len(self.src)


def read_parallel(src_path: PathLike, tgt_path: PathLike, *, split: str) -> ParallelText:
    """Read and check one split. Only for split == "train", pairs with an empty or
    whitespace-only side are dropped (and counted in the log)."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"{split}: {src_path} has {len(src)} lines but {tgt_path} has {len(tgt)} lines; "
            "source and target files must be line-aligned"
        )
    lines = list(range(len(src)))
    if split == "train":
        lines = [i for i in lines if src[i].strip() and tgt[i].strip()]
        log.info(
            "%s: %d pairs in %s / %s; dropped %d with an empty or whitespace-only side",
            split, len(src), src_path, tgt_path, len(src) - len(lines),
        )
        if len(lines) < len(src):
            src, tgt = [src[i] for i in lines], [tgt[i] for i in lines]
        if not lines:
            raise DataError(f"{split}: no non-empty pairs in {src_path} / {tgt_path}")
    else:
        log.info("%s: %d pairs in %s / %s", split, len(src), src_path, tgt_path)
    return ParallelText(src, tgt, lines)


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
        # index_select, not flat[gather]: advanced indexing is ~100x slower on some CPUs
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
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "version": CACHE_VERSION,
            "src_ids": self.src_ids, "src_offsets": self.src_offsets,
            "tgt_ids": self.tgt_ids, "tgt_offsets": self.tgt_offsets,
            "lines": self.lines,
        }
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)

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


# ---- batching ---------------------------------------------------------------------------


def _pack(
    order: Sequence[int], src_size: list[int], tgt_size: Optional[list[int]], max_tokens: int
) -> list[list[int]]:
    """Greedily cut `order` into batches with B * max(size) <= max_tokens on each side.
    A single sentence larger than max_tokens gets a batch of its own."""
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for i in order:
        size = src_size[i] if tgt_size is None else max(src_size[i], tgt_size[i])
        if batch and (len(batch) + 1) * max(longest, size) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, size)
    if batch:
        batches.append(batch)
    return batches


def _shard(batches: list[list[int]], rank: int, world_size: int) -> list[list[int]]:
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
    batch holds at most `max_tokens` positions per side (see module docstring).
    Same (seed, epoch) -> same batches on every rank; the ranks' shares are disjoint, cover
    the epoch and have equal length (see `_shard`).
    """
    src_size = (src_lens + 1).tolist()
    tgt_size = (tgt_lens + 1).tolist()
    if src_size and max(max(src_size), max(tgt_size)) > max_tokens:
        raise ValueError(
            f"a training pair has {max(max(src_size), max(tgt_size))} tokens, more than "
            f"max_tokens={max_tokens}; filter with data.max_len <= data.max_tokens"
        )
    rng = random.Random(f"{seed}:{epoch}")
    order = list(range(len(src_size)))
    rng.shuffle(order)
    mean_size = max(1, sum(map(max, src_size, tgt_size)) // max(1, len(order)))
    pool_size = pool_batches * max(1, max_tokens // mean_size)
    key = lambda i: (max(src_size[i], tgt_size[i]), tgt_size[i], src_size[i])  # noqa: E731
    batches = []
    for start in range(0, len(order), pool_size):
        pool = sorted(order[start : start + pool_size], key=key)
        batches += _pack(pool, src_size, tgt_size, max_tokens)
    rng.shuffle(batches)
    return _shard(batches, rank, world_size)


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
        order = sorted(range(len(src_size)), key=lambda i: src_size[i])
    else:
        key = lambda i: (max(src_size[i], tgt_size[i]), src_size[i], tgt_size[i])  # noqa: E731
        order = sorted(range(len(src_size)), key=key)
    return _shard(_pack(order, src_size, tgt_size, max_tokens), rank, world_size)


def padding_ratio(corpus: ParallelCorpus, batches: Sequence[Sequence[int]]) -> float:
    """Fraction of batch positions (both sides, EOS/BOS counted as real) that are padding."""
    src_size = (corpus.src_lens + 1).tolist()
    tgt_size = (corpus.tgt_lens + 1).tolist()
    real = total = 0
    for batch in batches:
        s = [src_size[i] for i in batch]
        t = [tgt_size[i] for i in batch]
        real += sum(s) + sum(t)
        total += len(batch) * (max(s) + max(t))
    return 1.0 - real / total if total else 0.0


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
    if cfg.joint_vocab:
        tok = Tokenizer.train(itertools.chain(text.src, text.tgt), paths[0], **options)
        pair = TokenizerPair(tok, tok)
    else:
        pair = TokenizerPair(
            Tokenizer.train(text.src, paths[0], **options),
            Tokenizer.train(text.tgt, paths[1], **options),
        )
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

