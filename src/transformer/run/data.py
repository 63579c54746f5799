"""A run's data: its corpora and evaluation sets -> the tokenizer pair -> one encoded store each.

Flow (see `load_data`; `transformer prepare-data` runs it alone):

1. The files: `DataConfig.training_corpora` (`data.corpora`, or the one-corpus forms'
   train split: `data=files`, or Multi30k in `data.root`, downloaded and checksummed if
   missing) and `DataConfig.evaluation_sets` (`data.valid_sets`/`test_sets`, or the valid
   and test splits); a missing file is an error naming its key.
2. `tokenizers`: the tokenizer pair given (a checkpoint's), `data.spm_model`, the run
   directory's, or SentencePiece trained on a sample of every training corpus, with the
   run's tags as reserved pieces (`DataConfig.reserved_tags`).
3. `corpus_store` / `split_store`: each corpus's line counts are compared
   (`text.check_aligned`), then it is streamed (`text.iter_parallel`: UTF-8 and line
   endings checked), cleaned by its filters (`cleaning.CorpusCleaner`: text filters before
   encoding, the length ratio after), encoded chunk by chunk and written to a memory-mapped
   store (`store.StoreWriter`), once: the store is found again by the files' paths, the
   tokenizers and the filters, and trusted while the files' size and modification time
   (or, when those changed, their SHA-256) are the ones it was built from. Its meta.json
   records what each filter removed, for the cleaning table.
4. `store.ParallelCorpus.open` maps each store; training pairs longer than `data.max_len`
   (tags included) are filtered out of the view, then `max_pairs` keeps the first pairs;
   evaluation sets keep every pair (an empty set is refused), a side longer than
   `data.max_len` cut to it with a warning naming the line, and their raw lines (BLEU
   references). Tags are ids in front of each source (`ParallelCorpus.with_prefix`), never
   in a store.
5. `mixture.Mixture.draw` picks each epoch's pairs by the corpora's shares;
   `batching.train_batches` / `eval_batches` give arrays of indices; `collate` turns one
   into a padded `Batch`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np
import torch.distributed as dist

from ..data import multi30k
from ..data.batching import eval_batches, train_batches
from ..data.cleaning import REASONS, CorpusCleaner, Filters, format_cleaning_table
from ..data.mixture import Mixture, shares
from ..data.store import STORE_VERSION, ParallelCorpus, StoreWriter, read_meta
from ..data.text import check_aligned, iter_parallel, non_empty, read_parallel
from ..data.tokenizer import Tokenizer, TokenizerPair
from ..errors import DataError
from ..files import atomic_write
from ..runtime import DistEnv
from .checkpoint import tokenizers_from_state, tokenizers_to_state
from .data_config import CorpusConfig, DataConfig, EvalSetConfig
from .tokenizers import existing_tokenizers, train_tokenizers

__all__ = ["SplitFiles", "corpus_files", "eval_set_files", "store_path", "write_split_store",
           "split_store", "Data", "load_data", "load_data_on_ranks", "CLEANING_REPORT"]

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]

CLEANING_REPORT = "cleaning.txt"  # the cleaning table, in the run directory


# ---- files and download -----------------------------------------------------------------


@dataclass(frozen=True)
class SplitFiles:
    """The source and target file of one corpus or evaluation set."""

    src: Path
    tgt: Path


def _entry_key(cfg: DataConfig, group: str, name: str) -> str:
    """How errors name an entry's files: data.corpora[web], or data.train for the
    one-corpus forms' split (whose keys are data.train_src / data.train_tgt)."""
    named = {"train": cfg.corpora, "valid": cfg.valid_sets, "test": cfg.test_sets}[group]
    plural = {"train": "corpora", "valid": "valid_sets", "test": "test_sets"}[group]
    return f"data.{plural}[{name}]" if named else f"data.{group}"


def _checked(cfg: DataConfig, group: str, entry: CorpusConfig | EvalSetConfig) -> SplitFiles:
    """An entry's files, each checked to exist (a missing one names its key)."""
    key = _entry_key(cfg, group, entry.name)
    files = SplitFiles(Path(entry.src).expanduser(), Path(entry.tgt).expanduser())
    for side, path in (("src", files.src), ("tgt", files.tgt)):
        if not path.is_file():
            sep = "." if "[" in key else "_"
            raise DataError(f"{key}{sep}{side}: no such file: {path}")
    return files


def _download(cfg: DataConfig) -> None:
    """Multi30k's files of every language the run names, when missing from `data.root`
    (with `data.tokenized`, the tokenized ones it reads instead of the raw ones)."""
    if cfg.name == "multi30k":
        langs = [lang for lang in cfg.languages() if lang in multi30k.LANGS]
        multi30k.download_multi30k(cfg.root, langs, base_url=cfg.base_url,
                                   tokenized=cfg.tokenized)


def corpus_files(cfg: DataConfig) -> list[tuple[CorpusConfig, SplitFiles]]:
    """The training corpora with their checked files (Multi30k downloaded if missing)."""
    _download(cfg)
    return [(c, _checked(cfg, "train", c)) for c in cfg.training_corpora()]


def eval_set_files(cfg: DataConfig, split: str) -> list[tuple[EvalSetConfig, SplitFiles]]:
    """The named sets of "valid" or "test" with their checked files."""
    _download(cfg)
    return [(e, _checked(cfg, split, e)) for e in cfg.evaluation_sets(split)]


# ---- one store per split ------------------------------------------------------------------


def store_path(files: SplitFiles, split: str, tokenizers: TokenizerPair,
               cache_dir: PathLike, cleaning: dict[str, Any] | None = None) -> Path:
    """Where a store lives: named by the files' paths, both tokenizers and, for a cleaned
    corpus, the cleaning (`_cleaning_key`; the files' contents are checked against the
    store's meta.json by `split_store`)."""
    parts = [f"v{STORE_VERSION}", split, str(files.src.resolve()), str(files.tgt.resolve()),
             tokenizers.src.fingerprint, tokenizers.tgt.fingerprint]
    if cleaning:
        parts.append(json.dumps(cleaning, sort_keys=True))
    key = "|".join(parts)
    return Path(cache_dir) / f"{split}-{hashlib.sha256(key.encode()).hexdigest()[:20]}"


def _cleaning_key(filters: Filters, corpus: CorpusConfig) -> dict[str, Any] | None:
    """What a cleaned store depends on besides its files and tokenizers: the filters (and
    the languages language identification checks); None when nothing is filtered, so an
    uncleaned store keeps the name it always had."""
    if filters.is_none():
        return None
    return {"filters": filters.to_dict(), "langs": [corpus.src_lang, corpus.tgt_lang]}


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


@dataclass
class Cleaning:
    """How one training corpus is cleaned while its store is written."""

    corpus: CorpusConfig
    key: str  # how errors name it: data.corpora[web]
    tags: dict[str, int] = field(default_factory=dict)  # reserved tags: none may be in text

    @property
    def filters(self) -> Filters:
        return self.corpus.cleaning()


def _check_no_tags(lines: list[str], numbers: list[int], path: Path, key: str,
                   tags: dict[str, int]) -> None:
    """A reserved tag in a corpus's text would be read as the tag: stop, naming it."""
    for tag in tags:
        for text, number in zip(lines, numbers, strict=True):
            if tag in text:
                raise DataError(f"{key}: {path} line {number + 1} holds {tag!r}, a reserved "
                                "tag (data.corpora[...].tag or a target-language tag); "
                                "choose tags that do not occur in the text")


def _keep(mask: np.ndarray, *lists: list) -> list[list]:
    kept = np.flatnonzero(mask)
    return [[values[i] for i in kept] for values in lists]


def write_split_store(directory: Path, files: SplitFiles, split: str,
                      tokenizers: TokenizerPair, cleaning: Cleaning | None = None) -> None:
    """Stream, check, clean (a training corpus) and encode one split into a new store at
    `directory`. The files' line counts are compared first (`check_aligned`: counted, not
    decoded), so misaligned files are refused before any encoding. A training corpus drops
    pairs with an empty side whatever its filters (counted as "empty"); its meta.json
    records the pairs read and each filter's count."""
    start = time.perf_counter()
    sources = {"src": _source(files.src), "tgt": _source(files.tgt)}  # before reading
    vocab = max(tokenizers.src.vocab_size, tokenizers.tgt.vocab_size)
    label = cleaning.key if cleaning else split
    meta: dict[str, Any] = {}
    with StoreWriter(directory, vocab) as writer:
        check_aligned(files.src, files.tgt, split=label)
        cleaner = (CorpusCleaner(cleaning.filters, cleaning.corpus.src_lang,
                                 cleaning.corpus.tgt_lang, name=cleaning.corpus.name)
                   if cleaning else None)
        empty = 0
        next_report = 1_000_000
        try:
            for chunk in iter_parallel(files.src, files.tgt, split=label,
                                       drop_empty=cleaning is None and split == "train"):
                src, tgt, lines = chunk.src, chunk.tgt, chunk.lines
                if cleaner is not None:
                    _check_no_tags(src, lines, files.src, label, cleaning.tags)
                    _check_no_tags(tgt, lines, files.tgt, label, cleaning.tags)
                    kept = np.array(non_empty(src, tgt), dtype=bool)
                    empty += len(src) - int(kept.sum())
                    src, tgt, lines = _keep(kept, src, tgt, lines)
                    src, tgt, lines = _keep(cleaner.text_mask(src, tgt), src, tgt, lines)
                src_ids = tokenizers.src.encode_batch(src)
                tgt_ids = tokenizers.tgt.encode_batch(tgt)
                if cleaner is not None:
                    lens = [np.fromiter(map(len, ids), np.int64, len(ids))
                            for ids in (src_ids, tgt_ids)]
                    src_ids, tgt_ids, lines = _keep(cleaner.length_mask(*lens), src_ids,
                                                    tgt_ids, lines)
                writer.add(src_ids, tgt_ids, lines)
                if writer.pairs >= next_report:
                    log.info("%s: %d pairs encoded (%.0f s)", label, writer.pairs,
                             time.perf_counter() - start)
                    next_report += 1_000_000
            if cleaner is not None:
                counts = dict(cleaner.counts)
                counts["empty"] += empty
                meta = {"filters": cleaning.filters.to_dict(),
                        "cleaning": {"read": cleaner.seen + empty, **counts}}
        finally:
            if cleaner is not None:
                cleaner.close()
        writer.finish({"split": split, "sources": sources,
                       "tokenizers": [tokenizers.src.fingerprint, tokenizers.tgt.fingerprint],
                       "special_ids": asdict(tokenizers.tgt.specials), **meta})
    log.info("%s: %d pairs encoded in %.1f s -> %s", label, writer.pairs,
             time.perf_counter() - start, directory)


def split_store(files: SplitFiles, split: str, tokenizers: TokenizerPair,
                cache_dir: PathLike, cleaning: Cleaning | None = None) -> Path:
    """The directory of a store, written first when missing or stale."""
    key = _cleaning_key(cleaning.filters, cleaning.corpus) if cleaning else None
    directory = store_path(files, split, tokenizers, cache_dir, key)
    if directory.is_dir() and _is_fresh(directory, files, tokenizers):
        log.info("%s: using the encoded store %s", cleaning.key if cleaning else split,
                 directory)
    else:
        write_split_store(directory, files, split, tokenizers, cleaning)
    return directory


# ---- everything together ----------------------------------------------------------------


@dataclass
class Data:
    """Everything the training loop needs from the data side."""

    cfg: DataConfig
    tokenizers: TokenizerPair
    train: Mixture
    valid_sets: dict[str, ParallelCorpus]  # name -> set; src_text / tgt_text: the raw lines
    test_sets: dict[str, ParallelCorpus] = field(default_factory=dict)
    cleaning: dict[str, dict[str, int]] = field(default_factory=dict)  # the cleaning table

    @property
    def valid(self) -> ParallelCorpus:
        """The first validation set."""
        return next(iter(self.valid_sets.values()))

    @property
    def test(self) -> ParallelCorpus | None:
        """The first test set, if any."""
        return next(iter(self.test_sets.values()), None)

    @property
    def tokenizer(self) -> Tokenizer:
        """The joint tokenizer (error for separate vocabularies: use `tokenizers`)."""
        if not self.tokenizers.shared:
            raise ValueError("separate vocabularies: use data.tokenizers.src / .tgt")
        return self.tokenizers.src

    def train_batches(self, epoch: int, rank: int = 0, world_size: int = 1,
                      draw: np.ndarray | None = None) -> list[np.ndarray]:
        """This rank's training batches for `epoch` (index arrays for `self.train.collate`)
        over the epoch's `draw` (`Mixture.draw`, computed when not given)."""
        if draw is None:
            draw = self.train.draw(self.cfg.seed, epoch)
        return train_batches(
            self.train.src_lens, self.train.tgt_lens, self.cfg.max_tokens,
            seed=self.cfg.seed, epoch=epoch, rank=rank, world_size=world_size, draw=draw,
        )

    def eval_batches(self, split: str = "valid", max_tokens: int | None = None, rank: int = 0,
                     world_size: int = 1, name: str | None = None) -> list[np.ndarray]:
        """Fixed-order batches of a "valid" or "test" set (the first, or the one named;
        index arrays for that set's `collate`)."""
        sets = {"valid": self.valid_sets, "test": self.test_sets}.get(split)
        if sets is None:
            raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
        if not sets or (name is not None and name not in sets):
            raise ValueError(f"no {split!r} set {name or ''} in this data")
        corpus = sets[name] if name is not None else next(iter(sets.values()))
        return eval_batches(corpus.src_lens, corpus.tgt_lens, max_tokens or self.cfg.max_tokens,
                            rank=rank, world_size=world_size)

    def cleaning_table(self) -> str:
        """What cleaning removed from each training corpus (`cleaning.format_cleaning_table`)."""
        return format_cleaning_table(self.cleaning)


def _tag_ids(tokenizer: Tokenizer, tags: list[str], where: str) -> list[int]:
    """The ids of `tags`, which the tokenizer must hold as reserved pieces."""
    missing = [tag for tag in tags if tag not in tokenizer.tags]
    if missing:
        raise DataError(f"the tokenizer ({where}) has no reserved piece for the tag(s) "
                        f"{', '.join(missing)}; a new run directory trains one that has")
    return [tokenizer.tags[tag] for tag in tags]


def _stored_counts(directory: Path, pairs: int) -> dict[str, int]:
    """A corpus store's cleaning counts (a store written without them: all pairs read)."""
    counts = read_meta(directory).get("cleaning")
    if not isinstance(counts, dict):
        counts = {"read": pairs}
    return {"read": int(counts.get("read", pairs)),
            **{reason: int(counts.get(reason, 0)) for reason in REASONS}}


def _training_corpus(cfg: DataConfig, corpus: CorpusConfig, files: SplitFiles,
                     tokenizers: TokenizerPair, cache_dir: Path
                     ) -> tuple[ParallelCorpus, dict[str, int]]:
    """One training corpus: its cleaned store, mapped, with its tags, long pairs dropped,
    cut to `max_pairs`; and its row of the cleaning table."""
    key = _entry_key(cfg, "train", corpus.name)
    cleaning = Cleaning(corpus, key, dict(tokenizers.src.tags))
    store = ParallelCorpus.open(split_store(files, "train", tokenizers, cache_dir, cleaning))
    counts = _stored_counts(store.path, len(store))
    tags = cfg.source_tags(corpus.tag, corpus.tgt_lang)
    if tags:
        store = store.with_prefix(_tag_ids(tokenizers.src, tags, key))
    if corpus.max_pairs is not None and corpus.max_pairs < len(store):
        store = store.select(np.arange(len(store)) < corpus.max_pairs)  # a view of the store
        log.info("%s: using the first %d pairs (max_pairs)", key, len(store))
    kept = store.filter_long(cfg.max_len, key)
    counts["max_len"] = len(store) - len(kept)
    counts["kept"] = len(kept)
    if len(kept) == 0:
        raise DataError(f"{key}: no pairs left for training after cleaning and data.max_len")
    log.info("%s: %d pairs, %d + %d tokens, %.2f bytes per token on disk", key, len(kept),
             len(kept.src_ids), len(kept.tgt_ids),
             kept.disk_bytes() / max(1, len(kept.src_ids) + len(kept.tgt_ids)))
    return kept, counts


def _within_max_len(corpus: ParallelCorpus, max_len: int, tags: int, vocab_size: int,
                    key: str, files: SplitFiles) -> ParallelCorpus:
    """An evaluation set (which keeps every pair) with each side cut to `data.max_len`
    positions as training counts them (source: `tags` + pieces + EOS; target: BOS +
    pieces), in memory: validation never gives the model more positions than it has
    (`model.max_positions` >= `data.max_len`). The cut pairs are warned about, naming their
    lines; the raw lines, the BLEU references, stay whole."""
    src_room, tgt_room = max(0, max_len - 1 - tags), max_len - 1
    long = np.flatnonzero((corpus.src_lens > src_room) | (corpus.tgt_lens > tgt_room))
    if len(long) == 0:
        return corpus
    lines = ", ".join(str(int(n) + 1) for n in corpus.lines[long[:10]])
    log.warning("%s: %d pair(s) longer than data.max_len=%d (line(s) %s%s of %s / %s); "
                "read as their first %d source and %d target pieces", key,
                len(long), max_len, lines, ", ..." if len(long) > 10 else "", files.src,
                files.tgt, src_room, tgt_room)
    pairs = [corpus.pair(i) for i in range(len(corpus))]
    return ParallelCorpus.from_ids([src[:src_room] for src, _ in pairs],
                                   [tgt[:tgt_room] for _, tgt in pairs], corpus.special_ids,
                                   vocab_size, corpus.lines)


def _evaluation_set(cfg: DataConfig, split: str, entry: EvalSetConfig, files: SplitFiles,
                    tokenizers: TokenizerPair, cache_dir: Path) -> ParallelCorpus:
    """A validation or test set: its store (pairs cut to `data.max_len`: `_within_max_len`),
    its raw lines (BLEU references), its tags. An empty set is refused: nothing could be
    scored."""
    key = _entry_key(cfg, split, entry.name)
    corpus = ParallelCorpus.open(split_store(files, split, tokenizers, cache_dir))
    if len(corpus) == 0:
        raise DataError(f"{key}: no lines in {files.src} / {files.tgt}")
    tags = cfg.source_tags(None, entry.tgt_lang)
    vocab_size = max(tokenizers.src.vocab_size, tokenizers.tgt.vocab_size)
    corpus = _within_max_len(corpus, cfg.max_len, len(tags), vocab_size, key, files)
    text = read_parallel(files.src, files.tgt, split=key)
    corpus.src_text, corpus.tgt_text = text.src, text.tgt
    if tags:
        if entry.tgt_lang not in cfg.target_languages():
            raise DataError(f"{key}.tgt_lang: the model is trained to translate into "
                            f"{', '.join(cfg.target_languages())}, not {entry.tgt_lang!r}")
        corpus = corpus.with_prefix(_tag_ids(tokenizers.src, tags, split))
    return corpus


def load_data(
    cfg: DataConfig,
    run_dir: PathLike,
    *,
    tokenizers: TokenizerPair | None = None,
    cache_dir: PathLike | None = None,
) -> Data:
    """Resolve the files, find or train the tokenizers, prepare and open every store.

    The tokenizer is, in order: `tokenizers` (e.g. from a checkpoint), `cfg.spm_model`, the
    model already in `run_dir`, or a new one trained on a sample of the training corpora and
    saved into `run_dir`. Stores live in `cache_dir`, else `cfg.cache_dir`, else
    `run_dir/cache`. The cleaning table is logged and written to `run_dir/cleaning.txt`.
    """
    run_dir = Path(run_dir)
    training = corpus_files(cfg)
    evaluation = {split: eval_set_files(cfg, split) for split in ("valid", "test")}
    if tokenizers is None:
        tokenizers = existing_tokenizers(cfg, run_dir)
    if tokenizers is None:
        tokenizers = train_tokenizers(
            cfg, [(files, c.max_pairs, _entry_key(cfg, "train", c.name)) for c, files in training],
            run_dir)
    cache_dir = Path(cache_dir if cache_dir is not None else
                     Path(cfg.cache_dir).expanduser() if cfg.cache_dir else run_dir / "cache")
    corpora, counts = [], {}
    for corpus, files in training:
        kept, counts[corpus.name] = _training_corpus(cfg, corpus, files, tokenizers,
                                                     cache_dir)
        corpora.append(kept)
    sizes = [len(c) for c in corpora]
    mixture = Mixture([c.name for c, _ in training], corpora,
                      shares([c.weight for c, _ in training], sizes, cfg.mix_temperature))
    data = Data(cfg, tokenizers, mixture,
                *({e.name: _evaluation_set(cfg, split, e, files, tokenizers, cache_dir)
                   for e, files in evaluation[split]} for split in ("valid", "test")),
                cleaning=counts)
    table = data.cleaning_table()
    log.info("cleaning (pairs removed by each filter; data.corpora[...].filters):\n%s",
             table.rstrip("\n"))
    if len(training) > 1:
        log.info("each epoch: %s", ", ".join(
            f"{name} {share:.1%}" for name, share in zip(mixture.names, mixture.shares,
                                                         strict=True)))
    with atomic_write(run_dir / CLEANING_REPORT, text=True) as f:
        f.write(table)
    return data


def load_data_on_ranks(cfg: DataConfig, run_dir: PathLike, env: DistEnv,
                       tokenizers: TokenizerPair | None = None) -> Data:
    """`load_data` for every rank of a torchrun job (one process: `load_data` itself). Rank
    0 finds or trains the tokenizers and prepares the stores, and sends the tokenizers to
    every rank; then the first rank of each other node prepares what its node lacks (nothing
    on a shared filesystem), while the node's other ranks wait; then those open the stores,
    whose pages their node's OS shares between them."""
    if not env.distributed:
        return load_data(cfg, run_dir, tokenizers=tokenizers)
    data = load_data(cfg, run_dir, tokenizers=tokenizers) if env.is_main else None
    box = [tokenizers_to_state(data.tokenizers) if env.is_main else None]
    dist.broadcast_object_list(box, src=0)
    tokenizers = tokenizers_from_state({"tokenizer": box[0]}, "rank 0's tokenizers")
    for node_leaders in (True, False):
        if not env.is_main and (env.local_rank == 0) == node_leaders:
            data = load_data(cfg, run_dir, tokenizers=tokenizers)
        dist.barrier()
    return data
