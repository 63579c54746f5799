"""A run's data: the files of each split -> the tokenizer pair -> one encoded store per split.

Flow (see `load_data`; `transformer prepare-data` runs it alone):

1. `resolve_files`: the config names a source and a target file per split (`data=files`),
   or Multi30k files in `data.root`, downloaded and checksummed if missing (`data=multi30k`).
2. `run_tokenizers`: the tokenizer pair given (a checkpoint's), `data.spm_model`, the run
   directory's, or SentencePiece trained on a sample of the training split.
3. `split_store`: each split is streamed (`text.iter_parallel`: UTF-8, line endings and line
   counts checked; empty training pairs dropped), encoded chunk by chunk and written to a
   memory-mapped store (`store.StoreWriter`), once: the store is found again by the files'
   paths and the tokenizers, and trusted while the files' size and modification time (or,
   when those changed, their SHA-256) are the ones it was built from.
4. `store.ParallelCorpus.open` maps each store; training pairs longer than `data.max_len`
   are filtered out of the view; valid/test keep their raw lines (BLEU references).
5. `batching.train_batches` / `eval_batches` give arrays of pair indices;
   `ParallelCorpus.collate` turns one into a padded `Batch`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

from . import multi30k
from .batching import eval_batches, train_batches
from .config import SPLITS, DataConfig
from .errors import DataError
from .run_tokenizers import existing_tokenizers, train_tokenizers
from .store import STORE_VERSION, ParallelCorpus, StoreWriter, read_meta
from .text import iter_parallel, read_parallel
from .tokenizer import Tokenizer, TokenizerPair

__all__ = ["SplitFiles", "split_files", "resolve_files", "store_path", "write_split_store",
           "split_store", "Data", "load_data"]

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]


# ---- files and download -----------------------------------------------------------------


@dataclass(frozen=True)
class SplitFiles:
    """The source and target file of one split."""

    src: Path
    tgt: Path


def split_files(cfg: DataConfig, split: str) -> SplitFiles | None:
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
                raise DataError(f"data.{split}_{side}: no such file: {path}")
        out[split] = files
    return out


# ---- one store per split ------------------------------------------------------------------


def store_path(files: SplitFiles, split: str, tokenizers: TokenizerPair,
               cache_dir: PathLike) -> Path:
    """Where a split's store lives: named by the files' paths and both tokenizers (the
    files' contents are checked against the store's meta.json by `split_store`)."""
    key = "|".join([f"v{STORE_VERSION}", split, str(files.src.resolve()),
                    str(files.tgt.resolve()), tokenizers.src.fingerprint,
                    tokenizers.tgt.fingerprint])
    return Path(cache_dir) / f"{split}-{hashlib.sha256(key.encode()).hexdigest()[:20]}"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def _source(path: Path, sha256: str | None = None) -> dict[str, Any]:
    """What a store records of a text file it was built from."""
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "sha256": sha256 or _sha256_file(path)}


def _is_fresh(directory: Path, files: SplitFiles, tokenizers: TokenizerPair) -> bool:
    """Whether the store at `directory` was built from these files' current contents with
    these tokenizers. A damaged store, or one from other tokenizers, raises `DataError`."""
    meta = read_meta(directory)
    fingerprints = [tokenizers.src.fingerprint, tokenizers.tgt.fingerprint]
    if meta.get("tokenizers") != fingerprints:
        raise DataError(f"{directory} was encoded with another tokenizer than this run's; "
                        "delete it and it will be rebuilt")
    for side, path in (("src", files.src), ("tgt", files.tgt)):
        try:
            recorded = meta["sources"][side]
            size, mtime_ns, sha256 = (recorded[k] for k in ("size", "mtime_ns", "sha256"))
        except (KeyError, TypeError):
            raise DataError(f"{directory / 'meta.json'} does not record the {side} file it "
                            "was built from; delete the store and it will be rebuilt") from None
        stat = path.stat()
        if (size, mtime_ns) == (stat.st_size, stat.st_mtime_ns):
            continue  # unchanged, as make and git decide, without reading the file
        if size != stat.st_size or sha256 != _sha256_file(path):
            log.info("%s changed since %s was built: rebuilding it", path, directory)
            return False
    return True


def write_split_store(directory: Path, files: SplitFiles, split: str,
                      tokenizers: TokenizerPair) -> None:
    """Stream, check and encode one split into a new store at `directory`."""
    start = time.perf_counter()
    sources = {"src": _source(files.src), "tgt": _source(files.tgt)}  # before reading
    vocab = max(tokenizers.src.vocab_size, tokenizers.tgt.vocab_size)
    with StoreWriter(directory, vocab) as writer:
        next_report = 1_000_000
        for chunk in iter_parallel(files.src, files.tgt, split=split):
            writer.add(tokenizers.src.encode_batch(chunk.src),
                       tokenizers.tgt.encode_batch(chunk.tgt), chunk.lines)
            if writer.pairs >= next_report:
                log.info("%s: %d pairs encoded (%.0f s)", split, writer.pairs,
                         time.perf_counter() - start)
                next_report += 1_000_000
        writer.finish({"split": split, "sources": sources,
                       "tokenizers": [tokenizers.src.fingerprint, tokenizers.tgt.fingerprint],
                       "special_ids": asdict(tokenizers.tgt.specials)})
    log.info("%s: %d pairs encoded in %.1f s -> %s", split, writer.pairs,
             time.perf_counter() - start, directory)


def split_store(files: SplitFiles, split: str, tokenizers: TokenizerPair,
                cache_dir: PathLike) -> Path:
    """The directory of the split's store, written first when missing or stale."""
    directory = store_path(files, split, tokenizers, cache_dir)
    if directory.is_dir() and _is_fresh(directory, files, tokenizers):
        log.info("%s: using the encoded store %s", split, directory)
    else:
        write_split_store(directory, files, split, tokenizers)
    return directory


# ---- everything together ----------------------------------------------------------------


@dataclass
class Data:
    """Everything the training loop needs from the data side."""

    cfg: DataConfig
    tokenizers: TokenizerPair
    train: ParallelCorpus
    valid: ParallelCorpus  # src_text / tgt_text hold the raw lines (BLEU references)
    test: ParallelCorpus | None = None

    @property
    def tokenizer(self) -> Tokenizer:
        """The joint tokenizer (error for separate vocabularies: use `tokenizers`)."""
        if not self.tokenizers.shared:
            raise ValueError("separate vocabularies: use data.tokenizers.src / .tgt")
        return self.tokenizers.src

    def train_batches(self, epoch: int, rank: int = 0,
                      world_size: int = 1) -> list[np.ndarray]:
        """This rank's training batches for `epoch` (index arrays for `self.train.collate`)."""
        return train_batches(
            self.train.src_lens, self.train.tgt_lens, self.cfg.max_tokens,
            seed=self.cfg.seed, epoch=epoch, rank=rank, world_size=world_size,
        )

    def eval_batches(
        self,
        split: str = "valid",
        max_tokens: int | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> list[np.ndarray]:
        """Fixed-order batches of "valid" or "test" (index arrays for that corpus's
        `collate`)."""
        if split not in ("valid", "test"):
            raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
        corpus = self.valid if split == "valid" else self.test
        if corpus is None:
            raise ValueError(f"no {split!r} split in this data")
        return eval_batches(
            corpus.src_lens, corpus.tgt_lens, max_tokens or self.cfg.max_tokens,
            rank=rank, world_size=world_size,
        )


def load_data(
    cfg: DataConfig,
    run_dir: PathLike,
    *,
    tokenizers: TokenizerPair | None = None,
    cache_dir: PathLike | None = None,
) -> Data:
    """Resolve the files, find or train the tokenizers, prepare and open every split's store.

    The tokenizer is, in order: `tokenizers` (e.g. from a checkpoint), `cfg.spm_model`, the
    model already in `run_dir`, or a new one trained on a sample of the training split and
    saved into `run_dir`. Stores live in `cache_dir`, else `cfg.cache_dir`, else
    `run_dir/cache`.
    """
    run_dir = Path(run_dir)
    files = resolve_files(cfg)
    if tokenizers is None:
        tokenizers = existing_tokenizers(cfg, run_dir)
    if tokenizers is None:
        tokenizers = train_tokenizers(cfg, files["train"].src, files["train"].tgt, run_dir)
    if cache_dir is None:
        cache_dir = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else run_dir / "cache"
    corpora = {}
    for split, split_files_ in files.items():
        corpus = ParallelCorpus.open(split_store(split_files_, split, tokenizers, cache_dir))
        if split == "train":
            log.info("train: %d pairs, %d + %d tokens, %.2f bytes per token on disk",
                     len(corpus), len(corpus.src_ids), len(corpus.tgt_ids),
                     corpus.disk_bytes() / max(1, len(corpus.src_ids) + len(corpus.tgt_ids)))
        else:  # the raw lines: BLEU references
            text = read_parallel(split_files_.src, split_files_.tgt, split=split)
            corpus.src_text, corpus.tgt_text = text.src, text.tgt
        corpora[split] = corpus
    train = corpora["train"]
    if cfg.max_train_pairs is not None and cfg.max_train_pairs < len(train):
        # The store holds the whole split; the subset is a view.
        train = train.select(np.arange(len(train)) < cfg.max_train_pairs)
        log.info("train: using the first %d pairs (data.max_train_pairs)", len(train))
    train = train.filter_long(cfg.max_len)
    return Data(cfg, tokenizers, train, corpora["valid"], corpora.get("test"))
