"""Data: config, input validation, Multi30k download, encoding cache, batches, shards."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import hashlib
import itertools
import logging
import random
import threading
from dataclasses import fields
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from transformer.data.batching import (
    eval_batches,
    even_rounds,
    padding_ratio,
    sorted_batches,
    train_batches,
)
from transformer.data.multi30k import SHA256 as MULTI30K_SHA256
from transformer.data.multi30k import download_file, download_multi30k
from transformer.data.store import ParallelCorpus
from transformer.data.text import iter_parallel, read_lines, read_parallel
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, TokenizerPair
from transformer.errors import DataError
from transformer.run import compose
from transformer.run.data import corpus_files, eval_set_files, load_data
from transformer.run.data_config import DataConfig

CONFIG_DIR = compose.CONFIG_DIR / "data"


# ---- helpers / fixtures -----------------------------------------------------------------


def write(path: Path, data: str | bytes) -> Path:
    """Write text (UTF-8, newlines untouched) or bytes; gzip when the name ends in .gz."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    path.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)
    return path


@contextlib.contextmanager
def serve(directory: Path):
    """Serve `directory` over HTTP on 127.0.0.1 (random port); yields the base URL."""

    class QuietHandler(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(QuietHandler, directory=str(directory))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def multi30k_train(multi30k_dir, multi30k_tokenizer) -> ParallelCorpus:
    """The slice's training pairs en->de, encoded with the session's default tokenizer."""
    text = read_parallel(multi30k_dir / "train.en.gz", multi30k_dir / "train.de.gz", split="train")
    return ParallelCorpus.encode(text, TokenizerPair(multi30k_tokenizer, multi30k_tokenizer))


def files_config(tmp_path: Path, spm_model: Path, **overrides) -> DataConfig:
    """A `data=files` config over small files written into tmp_path."""
    train_src = ["A dog runs.", "", "Two men talk.", "   ", "A very long sentence " * 20, "Hi."]
    train_tgt = ["Ein Hund rennt.", "Leer.", "Zwei Männer reden.", "\t", "Ein langer Satz.", ""]
    valid_src = ["A cat sleeps.", "", "A red car drives down a long and winding road."]
    valid_tgt = ["Eine Katze schläft.", "Nichts.", "Ein rotes Auto fährt."]
    paths = {}
    for key, lines in [
        ("train_src", train_src), ("train_tgt", train_tgt),
        ("valid_src", valid_src), ("valid_tgt", valid_tgt),
    ]:
        paths[key] = str(write(tmp_path / f"{key}.txt", "\n".join(lines) + "\n"))
    options = dict(name="files", spm_model=str(spm_model), max_len=20, max_tokens=64, **paths)
    options.update(overrides)
    return DataConfig(**options)


# ---- configuration ----------------------------------------------------------------------


def test_config_defaults_are_multi30k_en_de():
    cfg = DataConfig()
    assert (cfg.name, cfg.src_lang, cfg.tgt_lang) == ("multi30k", "en", "de")
    assert (cfg.vocab_size, cfg.spm_model_type, cfg.joint_vocab) == (None, "unigram", True)
    assert cfg.max_tokens is None  # both chosen when a run starts: by the corpus, the budget


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(max_tokens=-5), "data.max_tokens must be a positive integer, got -5"),
        (dict(vocab_size="8000"), "data.vocab_size must be a positive integer"),
        (dict(max_len=0), "data.max_len must be a positive integer, got 0"),
        (dict(max_len=300, max_tokens=200), "data.max_tokens (200) must be >= data.max_len (300)"),
        (dict(spm_model_type="word"), "data.spm_model_type must be one of"),
        (dict(name="wmt"), "data.name must be 'multi30k' or 'files'"),
        (dict(src_lang="xx"), "data.src_lang must be one of"),
        (dict(tgt_lang="en"), "data.src_lang and data.tgt_lang are both 'en'"),
        (dict(train_src="a.txt"), "data.train_src is only used with data.name=files"),
        (dict(name="files"), "data.train_src must be set when data.name=files"),
        (dict(joint_vocab=False, spm_model="x.model"), "data.spm_model needs a joint vocabulary"),
    ],
)
def test_config_errors_name_the_key(overrides, message):
    with pytest.raises(ValueError) as info:
        DataConfig(**overrides)
    assert message in str(info.value)


@pytest.mark.parametrize("name", ["multi30k", "files"])
def test_yaml_configs_match_the_schema(name):
    """configs/data/*.yaml have exactly DataConfig's keys and merge onto the structured schema."""
    yaml = OmegaConf.load(CONFIG_DIR / f"{name}.yaml")
    assert list(yaml.keys()) == [f.name for f in fields(DataConfig)]
    merged = OmegaConf.merge(OmegaConf.structured(DataConfig), yaml)
    if name == "files":  # the paths come from the command line
        merged.merge_with_dotlist([f"{s}_{side}=/x/{s}.{side}" for s in ("train", "valid")
                                   for side in ("src", "tgt")])
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, DataConfig) and cfg.name == name
    if name == "multi30k":
        assert cfg == DataConfig()  # the YAML spells out the dataclass defaults
    else:
        assert cfg.train_src == "/x/train.src" and cfg.test_src is None


def test_yaml_files_config_without_paths_fails_clearly():
    yaml = OmegaConf.load(CONFIG_DIR / "files.yaml")
    merged = OmegaConf.merge(OmegaConf.structured(DataConfig), yaml)
    with pytest.raises(ValueError, match="data.train_src must be set"):
        OmegaConf.to_object(merged)


# ---- reading and validation -------------------------------------------------------------


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    src = write(tmp_path / "a.en", "one\ntwo\nthree\n")
    tgt = write(tmp_path / "b.de.gz", "eins\nzwei\n")
    with pytest.raises(DataError) as info:
        read_parallel(src, tgt, split="valid")
    message = str(info.value)
    assert str(src) in message and str(tgt) in message
    assert "3 lines" in message and "2 lines" in message


@pytest.mark.parametrize("name", ["bad.txt", "bad.txt.gz"])
def test_invalid_utf8_names_file_and_line(tmp_path, name):
    path = write(tmp_path / name, "fine\nstill fine\nbroken \xff here\n".encode("latin-1"))
    with pytest.raises(DataError) as info:
        read_lines(path)
    assert str(path) in str(info.value) and "line 3" in str(info.value)


def test_windows_line_endings_and_stray_carriage_returns(tmp_path):
    path = write(tmp_path / "crlf.txt", "\ufeffone\r\ntwo\rhalf\r\n\r\nlast")
    assert read_lines(path) == ["one", "two half", "", "last"]
    assert read_lines(write(tmp_path / "plain.txt.gz", "one\ntwo\n")) == ["one", "two"]


def test_empty_pairs_dropped_from_train_only(tmp_path, caplog):
    src = write(tmp_path / "s.txt", "a\n\nb\n  \nc\nd\n")
    tgt = write(tmp_path / "t.txt", "A\nB\n\nX\n\t\nD\n")
    caplog.set_level(logging.INFO, logger="transformer")
    train = read_parallel(src, tgt, split="train")
    assert (train.src, train.tgt, train.lines) == (["a", "d"], ["A", "D"], [0, 5])
    assert "dropped 4 with an empty or whitespace-only side" in caplog.text
    caplog.clear()  # the pairs beyond a limit are not counted as dropped
    assert list(iter_parallel(src, tgt, split="train", max_pairs=1))[0].src == ["a"]
    assert "6 pairs read" in caplog.text  # one chunk
    assert "dropped 4 with an empty or whitespace-only side, kept the first 1" in caplog.text
    for split in ("valid", "test"):
        kept = read_parallel(src, tgt, split=split)
        assert kept.src == ["a", "", "b", "  ", "c", "d"] and kept.lines == list(range(6))


def test_files_config_end_to_end(tmp_path, multi30k_tokenizer_path, caplog):
    caplog.set_level(logging.INFO, logger="transformer")
    cfg = files_config(tmp_path, multi30k_tokenizer_path)
    data = load_data(cfg, tmp_path / "run")
    # train: pairs 1, 3 (blank side) and 5 (empty target) dropped; pair 4 is too long
    assert data.cleaning["train"] == {"read": 6, "empty": 3, "copies": 0, "max_repeat": 0,
                                      "sentences": 0, "langid": 0, "duplicates": 0,
                                      "max_ratio": 0, "max_len": 1, "kept": 2}
    table = (tmp_path / "run" / "cleaning.txt").read_text().splitlines()
    assert table[0].split() == ["corpus", "read", "empty", "copies", "max_repeat", "sentences",
                                "langid", "duplicates", "max_ratio", "max_len", "kept"]
    assert table[1].split() == ["train", "6", "3", "0", "0", "0", "0", "0", "0", "1", "2"]
    assert "filtered 1 pairs longer than data.max_len=20" in caplog.text
    assert data.train.corpora[0].lines.tolist() == [0, 2]
    # valid keeps every line, even the empty source, and restores the file order
    assert len(data.valid) == 3 and data.valid.src_text[1] == ""
    order = [i for b in data.eval_batches("valid") for i in data.valid.collate(b).indices]
    assert sorted(order) == [0, 1, 2]
    empty = data.valid.collate([1])
    assert empty.src.tolist() == [[EOS_ID]] and empty.src_valid_lens.tolist() == [1]
    assert data.test is None
    assert data.tokenizer.to_bytes() == multi30k_tokenizer_path.read_bytes()


def test_missing_file_names_the_key(tmp_path, multi30k_tokenizer_path):
    cfg = files_config(tmp_path, multi30k_tokenizer_path, valid_tgt=str(tmp_path / "nope.de"))
    with pytest.raises(DataError, match="data.valid_tgt: no such file"):
        eval_set_files(cfg, "valid")


# ---- Multi30k download over loopback HTTP -----------------------------------------------


def test_download_multi30k_over_http_with_checksums(full_multi30k, tmp_path):
    root = tmp_path / "multi30k"
    with serve(full_multi30k) as url:
        cfg = DataConfig(root=str(root), base_url=url, src_lang="de", tgt_lang="en")
        corpus_files(cfg)  # downloads the 6 missing files
        files = {split: eval_set_files(cfg, split)[0][1] for split in ("valid", "test")}
    names = sorted(p.name for p in root.iterdir())
    assert names == sorted(f"{stem}.{lang}.gz" for stem in ("train", "val", "test_2016_flickr")
                           for lang in ("de", "en"))  # nothing else, no temporary files
    for name in names:
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == MULTI30K_SHA256[name]
    assert files["valid"].src == root / "val.de.gz"
    assert files["test"].tgt == root / "test_2016_flickr.en.gz"
    download_multi30k(root, ("de", "en"), base_url="http://127.0.0.1:9/")  # all present: no request


def test_corrupted_download_is_rejected_and_not_saved(multi30k_dir, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    raw = bytearray((multi30k_dir / "val.en.gz").read_bytes())
    sha256 = hashlib.sha256(raw).hexdigest()  # of the file as it should arrive
    raw[100] ^= 0xFF
    (served / "val.en.gz").write_bytes(bytes(raw))
    dest = tmp_path / "root"
    with serve(served) as url:
        with pytest.raises(DataError) as info:
            download_file(url + "val.en.gz", dest / "val.en.gz", sha256)
        assert "val.en.gz" in str(info.value) and "checksum mismatch" in str(info.value)
        with pytest.raises(DataError, match="could not download val.de.gz"):  # HTTP 404
            download_file(url + "val.de.gz", dest / "val.de.gz", MULTI30K_SHA256["val.de.gz"])
    assert list(dest.iterdir()) == []  # neither a final nor a partial file


# ---- encoding, cache, tokenizer reuse ---------------------------------------------------


def test_multi30k_load_trains_once_and_caches(multi30k_dir, tmp_path, monkeypatch):
    cfg = DataConfig(root=str(multi30k_dir), vocab_size=2000, spm_model_type="bpe")
    run = tmp_path / "run"
    first = load_data(cfg, run)
    assert (run / "spm.model").is_file() and len(list((run / "cache").glob("*-*"))) == 3
    assert (len(first.train), len(first.valid), len(first.test)) == (3000, 300, 300)
    assert first.tokenizer.vocab_size == 2000

    def fail(*args, **kwargs):
        raise AssertionError("should have been cached")

    monkeypatch.setattr(Tokenizer, "train", fail)
    monkeypatch.setattr(Tokenizer, "encode_batch", fail)
    second = load_data(cfg, run)
    assert np.array_equal(second.train.corpora[0].src_ids, first.train.corpora[0].src_ids)
    assert np.array_equal(second.train.corpora[0].tgt_offsets, first.train.corpora[0].tgt_offsets)
    assert second.valid.tgt_text == first.valid.tgt_text  # references are raw text
    reference = "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen"
    assert second.valid.tgt_text[0] == reference
    monkeypatch.undo()

    with pytest.raises(DataError, match="vocabulary size 2000 but data.vocab_size=3000"):
        load_data(DataConfig(root=str(multi30k_dir), vocab_size=3000), run)


def test_vocabulary_too_large_for_the_text_names_the_key(multi30k_dir, tmp_path):
    cfg = DataConfig(root=str(multi30k_dir), vocab_size=8000, max_train_pairs=200)
    with pytest.raises(DataError, match=r"data.vocab_size=8000 on the 200 training pairs: "
                                        r"Vocabulary size too high \(8000\)"):
        load_data(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "spm.model").exists()


def test_cache_is_keyed_by_content_and_tokenizer(tmp_path, multi30k_tokenizer_path,
                                                 multi30k_small_tokenizer_path):
    cfg = files_config(tmp_path, multi30k_tokenizer_path)
    load_data(cfg, tmp_path / "run")
    stores = list((tmp_path / "run" / "cache").glob("train-*"))
    assert len(stores) == 1
    # Same file names, new content: the store must not be reused, but rebuilt in its place.
    write(Path(cfg.train_src), "A horse.\nA cow jumps.\nTwo men talk.\n")
    write(Path(cfg.train_tgt), "Ein Pferd.\nEine Kuh springt.\nZwei Männer reden.\n")
    data = load_data(cfg, tmp_path / "run")
    assert len(data.train) == 3 and list((tmp_path / "run" / "cache").glob("train-*")) == stores
    # Another tokenizer: another store beside it.
    other = dataclasses.replace(cfg, spm_model=str(multi30k_small_tokenizer_path))
    load_data(other, tmp_path / "run")
    assert len(list((tmp_path / "run" / "cache").glob("train-*"))) == 2
    tok = data.tokenizer
    assert data.train.corpora[0].pair(1) == (tok.encode("A cow jumps."),
                                             tok.encode("Eine Kuh springt."))


def test_separate_vocabularies(tmp_path, multi30k_dir):
    src = tmp_path / "train.en"
    tgt = tmp_path / "train.de"
    src.write_bytes(gzip.decompress((multi30k_dir / "train.en.gz").read_bytes()))
    tgt.write_bytes(gzip.decompress((multi30k_dir / "train.de.gz").read_bytes()))
    cfg = DataConfig(
        name="files", train_src=str(src), train_tgt=str(tgt),
        valid_src=str(multi30k_dir / "val.en.gz"), valid_tgt=str(multi30k_dir / "val.de.gz"),
        joint_vocab=False, vocab_size=1000, spm_model_type="bpe",
    )
    data = load_data(cfg, tmp_path / "run")
    assert not data.tokenizers.shared
    assert (tmp_path / "run" / "spm.src.model").is_file()
    assert (tmp_path / "run" / "spm.tgt.model").is_file()
    s, t = data.valid.pair(0)
    assert data.tokenizers.src.decode(s) == data.valid.src_text[0]
    assert data.tokenizers.tgt.decode(t) == data.valid.tgt_text[0]
    with pytest.raises(ValueError, match="separate vocabularies"):
        _ = data.tokenizer  # a property that refuses


# ---- batches ----------------------------------------------------------------------------


def test_collate_layout(multi30k_train, multi30k_tokenizer):
    corpus = multi30k_train
    batch = corpus.collate([5, 0, 17])
    assert batch.indices == [5, 0, 17]
    for row, i in enumerate(batch.indices):
        x, y = corpus.pair(i)
        n, m = len(x), len(y)
        assert batch.src[row, : n + 1].tolist() == x + [EOS_ID]
        assert batch.tgt_in[row, : m + 1].tolist() == [BOS_ID] + y
        assert batch.tgt_out[row, : m + 1].tolist() == y + [EOS_ID]
        assert (batch.src[row, n + 1 :] == PAD_ID).all()
        assert (batch.tgt_in[row, m + 1 :] == PAD_ID).all()
        assert (batch.tgt_out[row, m + 1 :] == PAD_ID).all()
        assert batch.src_valid_lens[row] == n + 1 and batch.tgt_valid_lens[row] == m + 1
    assert batch.src.dtype == torch.long and batch.src.shape == (3, int(batch.src_valid_lens.max()))
    assert batch.tgt_in.shape == batch.tgt_out.shape == (3, int(batch.tgt_valid_lens.max()))
    assert batch.num_tgt_tokens == int((batch.tgt_out != PAD_ID).sum())
    decode = multi30k_tokenizer.decode
    assert decode(batch.tgt_out[1].tolist()) == decode(batch.tgt_in[1].tolist())
    assert decode(batch.tgt_out[1].tolist()) == decode(corpus.pair(0)[1])
    real = (batch.tgt_out != PAD_ID).flatten().nonzero().squeeze(1)  # what the loss selects
    assert torch.equal(batch.tgt_index, real) and len(real) == batch.num_tgt_tokens
    moved = batch.to("cpu")
    assert torch.equal(moved.tgt_in, batch.tgt_in) and moved.indices == batch.indices
    assert torch.equal(moved.tgt_index, batch.tgt_index)


def test_every_pair_exactly_once_per_epoch(multi30k_train):
    lens = (multi30k_train.src_lens, multi30k_train.tgt_lens)
    for epoch in range(3):
        batches = train_batches(*lens, 4096, seed=1, epoch=epoch)
        flat = [i for b in batches for i in b]
        assert len(flat) == len(multi30k_train) and sorted(flat) == list(range(len(multi30k_train)))


def as_lists(batches) -> list[list[int]]:
    return [b.tolist() for b in batches]


def test_batches_are_deterministic_per_seed_and_epoch(multi30k_train):
    lens = (multi30k_train.src_lens, multi30k_train.tgt_lens)
    a = as_lists(train_batches(*lens, 4096, seed=1, epoch=0))
    assert a == as_lists(train_batches(*lens, 4096, seed=1, epoch=0))
    assert a != as_lists(train_batches(*lens, 4096, seed=1, epoch=1))
    assert a != as_lists(train_batches(*lens, 4096, seed=2, epoch=0))
    # Batches are built from length-sorted pools; their order must still be shuffled.
    longest = [int(multi30k_train.collate(b).tgt_in.shape[1]) for b in a]
    descents = sum(x > y for x, y in zip(longest, longest[1:], strict=False))
    assert descents > len(a) // 4


@pytest.mark.parametrize("max_tokens", [300, 1000, 4096])
def test_batches_never_exceed_max_tokens(multi30k_train, max_tokens):
    lens = (multi30k_train.src_lens, multi30k_train.tgt_lens)
    batches = train_batches(*lens, max_tokens, seed=3, epoch=0)
    for b in batches:
        batch = multi30k_train.collate(b)
        assert batch.src.numel() <= max_tokens and batch.tgt_in.numel() <= max_tokens
    full = sum(multi30k_train.collate(b).tgt_in.numel() > 0.8 * max_tokens for b in batches)
    assert full > 0.8 * len(batches)  # the budget is actually used


@pytest.mark.parametrize("world_size", [2, 3, 4, 7])
def test_rank_shards_are_disjoint_covering_and_equal(multi30k_train, world_size):
    lens = (multi30k_train.src_lens, multi30k_train.tgt_lens)
    shards = [train_batches(*lens, 4096, seed=1, epoch=2, rank=r, world_size=world_size)
              for r in range(world_size)]
    assert len({len(s) for s in shards}) == 1  # same number of steps on every rank
    flat = [i for s in shards for b in s for i in b]
    assert sorted(flat) == list(range(len(multi30k_train)))  # disjoint and covering
    for s in shards:
        assert all(len(b) > 0 for b in s)


def test_rank_shards_split_batches_when_needed():
    lens = torch.full((10,), 9)  # size 10 each: 4 per batch at max_tokens=40 -> 3 batches
    assert len(train_batches(lens, lens, 40, seed=0, epoch=0)) == 3
    shards = [train_batches(lens, lens, 40, seed=0, epoch=0, rank=r, world_size=4)
              for r in range(4)]
    assert [len(s) for s in shards] == [1, 1, 1, 1]
    assert sorted(i for s in shards for b in s for i in b) == list(range(10))
    with pytest.raises(ValueError, match="same number of batches"):
        train_batches(lens[:2], lens[:2], 40, seed=0, epoch=0, rank=0, world_size=3)
    with pytest.raises(ValueError, match="rank"):
        train_batches(lens, lens, 40, seed=0, epoch=0, rank=4, world_size=4)


@pytest.mark.parametrize("max_examples", [None, 1, 7, 64])
def test_decoding_batches_keep_both_bounds(max_examples):
    """`sorted_batches` (decoding): every sentence once, longest first, each batch within
    `max_tokens` padded positions and `max_examples` sentences, and as full as they allow."""
    sizes = torch.randint(1, 60, (500,), generator=torch.Generator().manual_seed(0)).tolist()
    batches = sorted_batches(range(len(sizes)), sizes, 1000, max_examples)
    assert sorted(i for b in batches for i in b) == list(range(len(sizes)))
    flat = [sizes[i] for b in batches for i in b]
    assert flat == sorted(sizes, reverse=True)
    limit = max_examples or len(sizes)
    for b, after in zip(batches, batches[1:] + [[]], strict=True):
        assert len(b) * max(sizes[i] for i in b) <= 1000 and len(b) <= limit
        if after:  # the next sentence did not fit: too long, or the batch was full
            assert (len(b) + 1) * sizes[b[0]] > 1000 or len(b) == limit


def _least_largest_batch(sizes: list[int], m: int, max_examples: int) -> int:
    """The reference for `even_rounds`: over every cut of `sizes` (longest first) into m
    consecutive batches of at most `max_examples`, the smallest largest padded batch."""
    best = None
    for cuts in itertools.combinations(range(1, len(sizes)), m - 1):
        bounds = list(zip((0, *cuts), (*cuts, len(sizes)), strict=True))
        if all(b - a <= max_examples for a, b in bounds):
            largest = max((b - a) * sizes[a] for a, b in bounds)
            best = largest if best is None else min(best, largest)
    return best


@pytest.mark.parametrize("parallel", [2, 3])
def test_even_rounds_cut_the_batches_into_full_rounds_of_the_least_tokens(parallel):
    """`even_rounds`: n batches become the same sentences, in the same order, in a multiple
    of the threads up to m = parallel x (n // parallel) batches (m = n when n is one
    already), none over `max_examples` sentences, the largest batch as small as any cut
    into m batches can make it (every cut tried), if that is within n / m x `max_tokens`
    padded positions."""
    rng = random.Random(parallel)
    tried = 0
    for _ in range(200):
        sizes = [rng.randint(1, 20) for _ in range(rng.randint(4, 14))]
        max_tokens, max_examples = rng.randint(20, 60), rng.randint(3, 8)
        batches = sorted_batches(range(len(sizes)), sizes, max_tokens, max_examples)
        n = len(batches)
        packed = even_rounds(batches, sizes, max_tokens, parallel, max_examples)
        if n < parallel:
            assert packed == batches
            continue
        m = n // parallel * parallel
        least = _least_largest_batch([sizes[i] for b in batches for i in b], m, max_examples)
        if least is None or least > max_tokens * n // m:
            assert packed == batches  # no full rounds within the bounds
            continue
        tried += 1
        assert [i for b in packed for i in b] == [i for b in batches for i in b]
        assert len(packed) % parallel == 0 and len(packed) <= m
        assert all(len(b) <= max_examples for b in packed)
        assert max(len(b) * sizes[b[0]] for b in packed) == least
    assert tried >= 20
    assert even_rounds(batches, sizes, max_tokens, 1, max_examples) == batches


def test_padding_at_most_ten_percent_on_multi30k(full_multi30k, multi30k_tokenizer):
    """The whole of Multi30k train en->de and the default max_tokens: real tokens (EOS/BOS
    included) are >= 90% of all batch positions, both sides together. The batching decides
    the padding, so the session's tokenizer (unigram, trained on the slice) stands in for
    one trained on the whole corpus."""
    text = read_parallel(full_multi30k / "train.en.gz", full_multi30k / "train.de.gz",
                         split="train")
    multi30k_train = ParallelCorpus.encode(text, TokenizerPair(multi30k_tokenizer,
                                                               multi30k_tokenizer))
    assert len(multi30k_train) == 29000
    for epoch in range(2):
        lens = (multi30k_train.src_lens, multi30k_train.tgt_lens)
        batches = train_batches(*lens, 4096, seed=1, epoch=epoch)
        real = total = 0
        for b in batches:
            batch = multi30k_train.collate(b)
            real += int(batch.src_valid_lens.sum() + batch.tgt_valid_lens.sum())
            total += batch.src.numel() + batch.tgt_in.numel()
        assert real / total >= 0.90
        ratio = padding_ratio(multi30k_train.src_lens, multi30k_train.tgt_lens, batches)
        assert ratio == pytest.approx(1 - real / total)


def test_eval_batches_fixed_order_and_complete(multi30k_dir, multi30k_tokenizer):
    text = read_parallel(multi30k_dir / "val.en.gz", multi30k_dir / "val.de.gz", split="valid")
    pair = TokenizerPair(multi30k_tokenizer, multi30k_tokenizer)
    corpus = ParallelCorpus.encode(text, pair, keep_text=True)
    batches = eval_batches(corpus.src_lens, corpus.tgt_lens, 1000)
    assert as_lists(batches) == as_lists(eval_batches(corpus.src_lens, corpus.tgt_lens, 1000))
    assert sorted(i for b in batches for i in b) == list(range(len(text)))
    translations = [None] * len(corpus)
    for b in batches:
        batch = corpus.collate(b)
        assert batch.src.numel() <= 1000 and batch.tgt_in.numel() <= 1000
        for row, i in enumerate(batch.indices):
            translations[i] = multi30k_tokenizer.decode(batch.tgt_out[row].tolist())
    assert translations[:50] == [" ".join(t.split()) for t in text.tgt[:50]]
    shards = [eval_batches(corpus.src_lens, corpus.tgt_lens, 1000, rank=r, world_size=3)
              for r in range(3)]
    assert len({len(s) for s in shards}) == 1
    assert sorted(i for s in shards for b in s for i in b) == list(range(len(text)))


def test_data_train_batches_uses_config(tmp_path, multi30k_tokenizer_path):
    cfg = files_config(tmp_path, multi30k_tokenizer_path, max_tokens=20)
    data = load_data(cfg, tmp_path / "run")
    assert as_lists(data.train_batches(0)) == as_lists(train_batches(
        data.train.src_lens, data.train.tgt_lens, 20, seed=data.cfg.seed, epoch=0
    ))
