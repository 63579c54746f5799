"""Shared pytest fixtures."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

# Multi30k raw files shared by all checkouts (never copied into the repo): ../shared/data/multi30k
MULTI30K_DIR = Path(__file__).resolve().parents[1].parent / "shared/data/multi30k"


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The folder holding the raw Multi30k files (train/val/test_2016_flickr x en/de/fr/cs)."""
    assert (MULTI30K_DIR / "train.en.gz").is_file(), f"Multi30k data not found in {MULTI30K_DIR}"
    return MULTI30K_DIR


def _read_multi30k(name: str) -> list[str]:
    """The lines of one Multi30k file, e.g. "val.en.gz"."""
    return gzip.decompress((MULTI30K_DIR / name).read_bytes()).decode("utf-8").split("\n")[:-1]


@pytest.fixture(scope="session")
def multi30k_lines():
    """A function: Multi30k file name (e.g. "val.en.gz") -> its lines."""
    return _read_multi30k


@pytest.fixture(scope="session")
def multi30k_tokenizer_path(multi30k_dir, tmp_path_factory) -> Path:
    """A SentencePiece model with the default data settings (joint en+de, unigram, vocab 8000)
    trained once per session on Multi30k train; about 5 s on 2 cores."""
    from transformer.tokenizer import Tokenizer

    texts = _read_multi30k("train.en.gz") + _read_multi30k("train.de.gz")
    path = tmp_path_factory.mktemp("spm") / "multi30k-unigram-8000.model"
    Tokenizer.train(texts, path, vocab_size=8000, model_type="unigram")
    return path


@pytest.fixture(scope="session")
def multi30k_small_tokenizer_path(tmp_path_factory) -> Path:
    """A small joint SentencePiece model (vocab 400) from the first 300 en and de training
    lines: for tests whose models only need real pieces, not a good vocabulary."""
    from transformer.tokenizer import Tokenizer

    texts = _read_multi30k("train.en.gz")[:300] + _read_multi30k("train.de.gz")[:300]
    path = tmp_path_factory.mktemp("spm") / "spm400.model"
    Tokenizer.train(texts, path, vocab_size=400)
    return path


@pytest.fixture(scope="session")
def multi30k_tokenizer(multi30k_tokenizer_path):
    """The session's default Multi30k tokenizer (see multi30k_tokenizer_path)."""
    from transformer.tokenizer import Tokenizer

    return Tokenizer.load(multi30k_tokenizer_path)


@pytest.fixture
def one_thread():
    """Run a test on one torch thread: its matrices are tiny, so one thread is as fast, and
    immune to OpenMP threads spinning while another process holds a core."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
