"""Fuzzing the data path with bytes: corpus files (bad UTF-8, NUL, CR-only line ends,
enormous lines, mismatched line counts, empty files, damaged gzip) through the text
readers, `load_data` and `transformer prepare-data`, and encoded stores whose files are
truncated or garbled. Every failure must be `DataError` on one line, and no half-written
store may be left behind."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line, assert_reported, fuzz, run_command  # tests/conftest.py
from hypothesis import given
from hypothesis import strategies as st

from transformer.data.store import ParallelCorpus, read_meta
from transformer.data.text import iter_lines, read_lines, read_parallel
from transformer.data.tokenizer import Tokenizer, TokenizerPair
from transformer.errors import DataError, TransformerError
from transformer.run.data import load_data, split_store
from transformer.run.data_config import DataConfig

# ---- corpus bytes -----------------------------------------------------------------------

PIECES = st.sampled_from([
    b"a man rides a bike", b"ein Mann", b"caf\xc3\xa9", b"\xe2\x80\x8f\xd7\xa9\xd7\x9c",  # RTL
    b"\xf0\x9f\x98\x80", b"e\xcc\x81", b"\x00", b"\r", b"\r\n", b"\n", b"\n\n", b" ", b"\t",
    b"\xef\xbb\xbf",  # a BOM (only the file's first is dropped)
    b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80",  # invalid UTF-8
])
LINES = st.lists(PIECES, max_size=12).map(b"".join)
CORPUS = st.one_of(
    LINES,
    st.binary(max_size=64),
    st.builds(lambda n, end: b"x" * n + end + b"y\n", st.sampled_from([1 << 16, 1 << 22 | 7]),
              st.sampled_from([b"", b"\n", b"\xff"])),  # an enormous line (past a block)
)


def gz(data: bytes, cut: int | None) -> bytes:
    """`data` gzipped, truncated to `cut` bytes when given (a damaged download)."""
    packed = gzip.compress(data)
    return packed if cut is None else packed[:cut]


def expected_lines(data: bytes) -> list[str]:
    """The readers' convention, stated plainly: lines end at "\\n"; a "\\r" before it is
    removed, any other becomes a space; one leading BOM is dropped."""
    text = data.decode("utf-8").removeprefix("\ufeff")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r").replace("\r", " ") for line in lines]


@fuzz(40)
@given(data=CORPUS, packed=st.booleans(), cut=st.none() | st.integers(0, 40))
def test_reading_any_bytes_gives_the_lines_or_a_data_error(data, packed, cut):
    """A file of any bytes, plain or gzipped (perhaps truncated): its lines by the readers'
    convention, or DataError naming the file; a stream reads the same lines."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "corpus.gz" if packed else "corpus.txt")
        path.write_bytes(gz(data, cut) if packed else data)
        try:
            lines = read_lines(path)
        except DataError as e:
            assert_one_line(e)
            assert str(path) in str(e)
            return
    if not packed or cut is None:
        assert lines == expected_lines(data)
        assert list(iter_lines(io.BytesIO(data), "stdin")) == lines


@fuzz(30)
@given(data=CORPUS)
def test_a_stream_of_any_bytes_gives_the_lines_or_a_data_error(data):
    try:
        lines = list(iter_lines(io.BytesIO(data), "stdin"))
    except DataError as e:
        assert_one_line(e)
        assert str(e).startswith("stdin, line ")
        with pytest.raises(UnicodeDecodeError):
            data.decode("utf-8")
        return
    assert lines == expected_lines(data)


@fuzz(30)
@given(src=LINES, tgt=LINES, split=st.sampled_from(["train", "valid"]))
def test_parallel_files_are_aligned_pairs_or_a_data_error(src, tgt, split):
    """Two files of any lines: aligned pairs of equal counts, or DataError (bad UTF-8,
    unequal counts naming both files, no pair left for training)."""
    with tempfile.TemporaryDirectory() as tmp:
        src_path, tgt_path = Path(tmp, "a.en"), Path(tmp, "a.de")
        src_path.write_bytes(src)
        tgt_path.write_bytes(tgt)
        try:
            text = read_parallel(src_path, tgt_path, split=split)
        except DataError as e:
            assert_one_line(e)
            return
    src_lines, tgt_lines = expected_lines(src), expected_lines(tgt)
    assert len(src_lines) == len(tgt_lines)
    assert [src_lines[i] for i in text.lines] == text.src
    assert [tgt_lines[i] for i in text.lines] == text.tgt


# ---- load_data and transformer prepare-data ----------------------------------------------------

VALID_EN, VALID_DE = b"a dog runs\na man\n", b"ein Hund rennt\nein Mann\n"


@pytest.fixture(scope="module")
def tokenizers(multi30k_small_tokenizer_path) -> TokenizerPair:
    tokenizer = Tokenizer.load(multi30k_small_tokenizer_path)
    return TokenizerPair(tokenizer, tokenizer)


def files_config(folder: Path, train: tuple[bytes, bytes],
                 valid: tuple[bytes, bytes] = (VALID_EN, VALID_DE), **keys) -> DataConfig:
    """A data=files config over files in `folder` holding these bytes."""
    paths = {}
    for split, (src, tgt) in (("train", train), ("valid", valid)):
        for side, data in (("src", src), ("tgt", tgt)):
            path = folder / f"{split}.{side}"
            path.write_bytes(data)
            paths[f"{split}_{side}"] = str(path)
    return DataConfig(name="files", max_len=64, max_tokens=256, **paths, **keys)


def assert_only_whole_stores(cache: Path) -> None:
    """Every entry of the cache is a complete store: no temporary or half-written one."""
    for entry in cache.iterdir() if cache.exists() else []:
        assert not entry.name.startswith("."), entry
        read_meta(entry)


@fuzz(25)
@given(src=LINES, tgt=LINES, valid_src=st.sampled_from([VALID_EN, b"\xff\n", b"a\nb\nc\n"]))
def test_load_data_on_any_corpus_gives_stores_or_a_data_error(tokenizers, src, tgt,
                                                              valid_src):
    with tempfile.TemporaryDirectory() as tmp:
        cfg = files_config(Path(tmp), (src, tgt), (valid_src, VALID_DE))
        try:
            data = load_data(cfg, Path(tmp, "run"), tokenizers=tokenizers)
        except DataError as e:
            assert_one_line(e)
            assert_only_whole_stores(Path(tmp, "run", "cache"))
            return
        assert len(data.train) >= 1 and len(data.valid) == 2
        batch = data.train.collate(np.arange(len(data.train)))
        assert len(batch) == len(data.train)


@fuzz(4, shrink=False)
@given(src=LINES, tgt=LINES)
def test_prepare_data_reports_any_corpus_error_on_one_line(multi30k_small_tokenizer_path,
                                                           src, tgt):
    """`transformer prepare-data data=files ...`: exit 0, or `error: <one line>` and exit 1."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = files_config(Path(tmp), (src, tgt))
        overrides = [f"data.{key}={getattr(cfg, key)}" for key in
                     ("train_src", "train_tgt", "valid_src", "valid_tgt")]
        status, err = run_command(["prepare-data", "data=files", *overrides,
                                   f"data.spm_model={multi30k_small_tokenizer_path}",
                                   f"hydra.run.dir={Path(tmp, 'run')}"])
        assert_reported(status, err)
        assert_only_whole_stores(Path(tmp, "run", "cache"))


# ---- damaged stores ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tokenizers, multi30k_lines, tmp_path_factory) -> Path:
    """A training store of the slice's first 50 validation pairs, built once; tests damage
    copies."""
    folder = tmp_path_factory.mktemp("store")
    src = "\n".join(multi30k_lines("val.en.gz")[:50]) + "\n"
    tgt = "\n".join(multi30k_lines("val.de.gz")[:50]) + "\n"
    cfg = files_config(folder, (src.encode(), tgt.encode()))
    return Path(load_data(cfg, folder / "run", tokenizers=tokenizers).train.corpora[0].path)


STORE_FILES = st.sampled_from(["meta.json", "src.bin", "tgt.bin", "src.idx", "tgt.idx",
                               "lines.idx"])
DAMAGE = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 400)),
    st.tuples(st.just("garble"), st.binary(min_size=1, max_size=8), st.integers(0, 400)),
    st.tuples(st.just("replace"), st.binary(max_size=32)),
    st.tuples(st.just("delete")),
    st.tuples(st.just("meta"), st.sampled_from([
        "[]", "{}", '{"version": 1}', "null", '"x"', '{"version": 2}',
        '{"version": 1, "dtype": "uint16", "pairs": -1}',
        '{"version": 1, "dtype": "int8", "pairs": 50, "src_tokens": 1, "tgt_tokens": 1}',
        '{"version": 1, "dtype": "nonsense", "pairs": 50}',
    ])),
)


def damage(directory: Path, name: str, how: tuple) -> None:
    """Damage file `name` of a store as `how` says (a new meta.json: that file)."""
    path = directory / ("meta.json" if how[0] == "meta" else name)
    raw = path.read_bytes()
    if how[0] == "truncate":
        path.write_bytes(raw[:how[1] % max(1, len(raw))])
    elif how[0] == "garble":
        at = how[2] % max(1, len(raw))
        path.write_bytes(raw[:at] + how[1] + raw[at + len(how[1]):])
    elif how[0] == "replace":
        path.write_bytes(how[1])
    elif how[0] == "delete":
        path.unlink()
    else:  # meta: keep the real counts unless the damage names them
        meta = json.loads(raw)
        replacement = json.loads(how[1])
        path.write_text(json.dumps({**meta, **replacement} if isinstance(replacement, dict)
                                   and len(replacement) > 1 else replacement))


@fuzz(40)
@given(name=STORE_FILES, how=DAMAGE)
def test_a_damaged_store_is_refused_or_read_whole(store, tokenizers, name, how):
    """A store with one damaged file: DataError naming it, or (the damage left sizes and
    counts consistent) pairs whose ids are real token ids."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp, store.name)
        shutil.copytree(store, directory)
        damage(directory, name, how)
        try:
            corpus = ParallelCorpus.open(directory)
            batch = corpus.collate(np.arange(len(corpus)))
        except DataError as e:
            assert_one_line(e)
            return
        assert int(batch.src.max()) < tokenizers.src.vocab_size
        assert int(batch.tgt_out.max()) < tokenizers.tgt.vocab_size


@fuzz(15)
@given(name=STORE_FILES, how=DAMAGE)
def test_a_damaged_store_in_the_cache_is_refused_or_rebuilt(store, tokenizers, name, how):
    """The run's cache holding a damaged store: `split_store` and `ParallelCorpus.open`
    say so (DataError), or `split_store` finds it stale and rebuilds it whole."""
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp, "cache")
        shutil.copytree(store, cache / store.name)
        damage(cache / store.name, name, how)
        meta = json.loads((store / "meta.json").read_text())
        files = _files_of(meta)
        try:
            corpus = ParallelCorpus.open(split_store(files, "train", tokenizers, cache))
        except TransformerError as e:
            assert isinstance(e, DataError)
            assert_one_line(e)
            return
        assert len(corpus) == 50


def _files_of(meta: dict):
    from transformer.run.data import SplitFiles

    return SplitFiles(Path(meta["sources"]["src"]["path"]), Path(meta["sources"]["tgt"]["path"]))


@pytest.mark.parametrize("name, how", [
    ("src.idx", ("garble", b"\x03", 12)),  # an offset 2^24 too large: a huge allocation
    ("src.idx", ("garble", b"\x01", 2)),  # offsets out of order: a negative length
    ("src.bin", ("garble", b"\x02", 1)),  # a token id beyond the vocabulary
    ("meta.json", ("meta", '{"version": 2, "dtype": "object", "pairs": 50}')),
])
def test_found_by_fuzzing_damaged_stores(store, name, how, tmp_path):
    """Damage the fuzzing above once found read without an error, or failing with
    MemoryError, ValueError or an embedding index out of range."""
    directory = tmp_path / store.name
    shutil.copytree(store, directory)
    damage(directory, name, how)
    with pytest.raises(DataError, match=name):
        corpus = ParallelCorpus.open(directory)
        corpus.collate(np.arange(len(corpus)))


def test_found_by_fuzzing_a_store_without_its_sources(store, tokenizers, tmp_path):
    """A meta.json whose sizes agree but that lost the files it was built from."""
    meta = json.loads((store / "meta.json").read_text())
    shutil.copytree(store, tmp_path / store.name)
    (tmp_path / store.name / "meta.json").write_text(json.dumps({**meta, "sources": {}}))
    with pytest.raises(DataError, match="does not record the src file"):
        split_store(_files_of(meta), "train", tokenizers, tmp_path)
