"""A run's tokenizer pair: found (a given model, or the run directory's) or trained.

SentencePiece trains on a seeded sample of at most `data.spm_max_sentences` training pairs
(reservoir sampling while the text streams by), so its time and memory stop growing with the
corpus; a corpus smaller than that is used whole, in file order.

Its vocabulary size, where `data.vocab_size` is null, follows the corpus (`vocab_size_for`):
ten times the square root of the training text's words (both sides), in thousands, from
1,000 to 32,000: 8,000 for Multi30k's 29,000 caption pairs, 32,000 from ~10M words (a WMT
corpus). A small corpus gets fewer pieces, each seen often enough to be learned (Sennrich and
Zhang, "Revisiting Low-Resource Neural Machine Translation", 2019; Gowda and May, "Finding
the Optimal Vocabulary Size for Neural Machine Translation", 2020).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from ..data.text import ParallelText, iter_parallel
from ..data.tokenizer import Tokenizer, TokenizerPair
from ..errors import DataError
from .data_config import DataConfig

__all__ = ["spm_paths", "existing_tokenizers", "sample_pairs", "vocab_size_for",
           "train_tokenizers", "MIN_VOCAB", "MAX_VOCAB"]

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]

MIN_VOCAB, MAX_VOCAB = 1000, 32000  # the vocabulary sizes vocab_size_for chooses from


def spm_paths(cfg: DataConfig, run_dir: PathLike) -> list[Path]:
    """The run's SentencePiece model file(s): [spm.model], or [spm.src.model, spm.tgt.model]
    for separate vocabularies."""
    run_dir = Path(run_dir)
    if cfg.joint_vocab:
        return [run_dir / "spm.model"]
    return [run_dir / "spm.src.model", run_dir / "spm.tgt.model"]


def existing_tokenizers(cfg: DataConfig, run_dir: PathLike) -> TokenizerPair | None:
    """`cfg.spm_model` if set, else the run directory's model(s) if present, else None."""
    if cfg.spm_model is not None:
        tok = Tokenizer.load(Path(cfg.spm_model).expanduser())
        log.info("using SentencePiece model %s (vocab %d)", cfg.spm_model, tok.vocab_size)
        _check_tags(tok, cfg, cfg.spm_model)
        return TokenizerPair(tok, tok)
    paths = spm_paths(cfg, run_dir)
    if not all(p.is_file() for p in paths):
        return None
    toks = [Tokenizer.load(p) for p in paths]
    for path, tok in zip(paths, toks, strict=True):
        if cfg.vocab_size is not None and tok.vocab_size != cfg.vocab_size:
            raise DataError(
                f"{path} has vocabulary size {tok.vocab_size} but data.vocab_size="
                f"{cfg.vocab_size}; delete it or use a new run directory"
            )
        log.info("reusing SentencePiece model %s", path)
    pair = TokenizerPair(toks[0], toks[-1])
    _check_tags(pair.src, cfg, paths[0])
    return pair


def _check_tags(tokenizer: Tokenizer, cfg: DataConfig, path: PathLike) -> None:
    """The run's tags must be reserved pieces of the source tokenizer it reuses."""
    missing = [tag for tag in cfg.reserved_tags() if tag not in tokenizer.tags]
    if missing:
        raise DataError(f"{path} has no reserved piece for the tag(s) {', '.join(missing)} "
                        "that data.corpora names; delete it or use a new run directory")


def sample_pairs(chunks: Iterable[ParallelText], k: int, seed: int) -> tuple[ParallelText, int]:
    """A uniform sample of at most `k` pairs from a stream of chunks (Algorithm R, seeded),
    and the number of pairs seen. With k or fewer pairs, all of them in order."""
    src: list[str] = []
    tgt: list[str] = []
    lines: list[int] = []
    rng = np.random.default_rng(seed)
    seen = 0
    for chunk in chunks:
        take = max(0, min(len(chunk), k - seen))  # the reservoir is not full yet
        src += chunk.src[:take]
        tgt += chunk.tgt[:take]
        lines += chunk.lines[:take]
        if take < len(chunk):  # pair t (0-based overall) replaces a random slot w.p. k/(t+1)
            t = np.arange(seen + take, seen + len(chunk))
            slots = rng.integers(0, t + 1)
            for i in np.flatnonzero(slots < k):
                j, c = int(slots[i]), take + int(i)
                src[j], tgt[j], lines[j] = chunk.src[c], chunk.tgt[c], chunk.lines[c]
        seen += len(chunk)
    return ParallelText(src, tgt, lines), seen


def _drain(lines: list[str]) -> Iterator[str]:
    """The lines in order, each dropped from the list as it is handed over: SentencePiece
    keeps its own copy, so the two copies of the sample never coexist whole."""
    lines.reverse()
    while lines:
        yield lines.pop()


def vocab_size_for(words: float) -> int:
    """The vocabulary size for a training text of `words` words (both sides together): ten
    times their square root, rounded to thousands, from `MIN_VOCAB` to `MAX_VOCAB`."""
    return min(MAX_VOCAB, max(MIN_VOCAB, 1000 * round(math.sqrt(words) / 100)))


def _chosen_vocab_size(text: ParallelText, seen: int) -> int:
    """`vocab_size_for` the corpus whose sample is `text`, of `seen` pairs (logged)."""
    sampled = sum(len(line.split()) for line in itertools.chain(text.src, text.tgt))
    words = sampled * seen / max(len(text), 1)
    size = vocab_size_for(words)
    log.info("data.vocab_size: %s, chosen for the ~%s words of the training text (10 x their "
             "square root, in thousands, %s to %s; set data.vocab_size to choose)",
             f"{size:,}", f"{words:,.0f}", f"{MIN_VOCAB:,}", f"{MAX_VOCAB:,}")
    return size


def _largest_allowed(error: str) -> int | None:
    """The largest vocabulary SentencePiece says it can build, from its error, if it says."""
    found = re.search(r"<= (\d+)", error)
    return int(found.group(1)) if found else None


def train_tokenizers(cfg: DataConfig, corpora: Sequence[tuple[Any, int | None, str]],
                     run_dir: PathLike) -> TokenizerPair:
    """Train SentencePiece on a sample of the training corpora (at most
    `cfg.spm_max_sentences` pairs of them all, uniform over their pairs; of a corpus with a
    pair limit, among its first pairs), with the run's tags (`DataConfig.reserved_tags`) as
    reserved pieces, and save it into `run_dir`. `corpora`: (files with `.src`/`.tgt`,
    pair limit or None, the name errors give it) each. The text is streamed and checked on
    the way. A null `cfg.vocab_size` is chosen from the corpus (`vocab_size_for`; when a
    tiny corpus cannot fill it, SentencePiece's largest)."""
    start = time.perf_counter()
    chunks = itertools.chain.from_iterable(
        iter_parallel(files.src, files.tgt, split=name, max_pairs=limit, drop_empty=True)
        for files, limit, name in corpora)
    text, seen = sample_pairs(chunks, cfg.spm_max_sentences, cfg.seed)
    log.info("SentencePiece sample: %d of %d training pairs (data.spm_max_sentences=%d), "
             "read in %.1f s", len(text), seen, cfg.spm_max_sentences,
             time.perf_counter() - start)
    chosen, pairs = cfg.vocab_size is None, len(text)
    vocab_size = _chosen_vocab_size(text, seen) if chosen else cfg.vocab_size
    try:
        pair = _train_pair(cfg, text, vocab_size, keep=chosen, run_dir=run_dir)
    except RuntimeError as e:  # SentencePiece's own checks, e.g. too few distinct pieces
        reason = str(e).splitlines()[0].split("] ")[-1]
        largest = _largest_allowed(reason)
        if not chosen or largest is None:
            raise DataError(f"cannot train SentencePiece with data.vocab_size={vocab_size} "
                            f"on the {pairs} training pairs: {reason}") from None
        log.info("data.vocab_size: %s, the largest SentencePiece can build from this corpus",
                 f"{largest:,}")
        pair = _train_pair(cfg, text, largest, keep=False, run_dir=run_dir)
    log.info("trained SentencePiece (%s, %s pieces) in %.1f s -> %s", cfg.spm_model_type,
             f"{pair.src.vocab_size:,}", time.perf_counter() - start,
             ", ".join(map(str, spm_paths(cfg, run_dir))))
    return pair


def _train_pair(cfg: DataConfig, text: ParallelText, vocab_size: int, keep: bool,
                run_dir: PathLike) -> TokenizerPair:
    """SentencePiece trained on `text` (a joint model, or one per side) and saved into
    `run_dir`; with `keep`, `text` is left whole for a second try, else handed over line by
    line (`_drain`), so that the two copies of the sample never coexist whole."""
    options = dict(vocab_size=vocab_size, model_type=cfg.spm_model_type,
                   tags=cfg.reserved_tags())
    paths = spm_paths(cfg, run_dir)
    lines = iter if keep else _drain
    if cfg.joint_vocab:
        tok = Tokenizer.train(itertools.chain(lines(text.src), lines(text.tgt)), paths[0],
                              **options)
        return TokenizerPair(tok, tok)
    return TokenizerPair(Tokenizer.train(lines(text.src), paths[0], **options),
                         Tokenizer.train(lines(text.tgt), paths[1], **options))
