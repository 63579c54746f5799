"""The encoded, memory-mapped store and the streaming preparation behind it: what a corpus of
millions of pairs needs (bounded memory, errors naming the line, stores that are never
trusted half-written), checked on small files."""

from __future__ import annotations

import dataclasses
import gzip
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from transformer.data import text as text_module
from transformer.data.batching import train_batches
from transformer.data.store import ParallelCorpus, StoreWriter, id_dtype
from transformer.data.text import iter_parallel, read_parallel
from transformer.data.tokenizer import Tokenizer, TokenizerPair
from transformer.errors import DataError
from transformer.run import data as data_module
from transformer.run.data import SplitFiles, load_data, store_path
from transformer.run.data_config import DataConfig
from transformer.run.tokenizers import sample_pairs

REPO = Path(__file__).resolve().parents[1]


def slice_files(multi30k_dir: Path, tmp_path: Path, n: int = 3000) -> dict[str, Path]:
    """The slice's train/val en-de as plain files (the first n training pairs)."""
    out = {}
    for split, stem, count in (("train", "train", n), ("valid", "val", None)):
        for lang in ("en", "de"):
            lines = gzip.decompress((multi30k_dir / f"{stem}.{lang}.gz").read_bytes())
            lines = lines.decode().split("\n")[:-1][:count]
            out[f"{split}.{lang}"] = tmp_path / f"{split}.{lang}"
            out[f"{split}.{lang}"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def files_config(files: dict[str, Path], **overrides) -> DataConfig:
    return DataConfig(name="files", train_src=str(files["train.en"]),
                      train_tgt=str(files["train.de"]), valid_src=str(files["valid.en"]),
                      valid_tgt=str(files["valid.de"]), **overrides)


def test_store_is_mapped_and_equals_encoding_in_memory(multi30k_dir, tmp_path,
                                                       multi30k_tokenizer_path):
    files = slice_files(multi30k_dir, tmp_path)
    cfg = files_config(files, spm_model=str(multi30k_tokenizer_path), vocab_size=2000)
    data = load_data(cfg, tmp_path / "run")
    train = data.train.corpora[0]
    assert isinstance(train.src_ids, np.memmap) and isinstance(train.tgt_offsets, np.memmap)
    assert train.src_ids.dtype == np.uint16  # a 2,000-piece vocabulary fits in 16 bits
    text = read_parallel(files["train.en"], files["train.de"], split="train")
    in_memory = ParallelCorpus.encode(text, data.tokenizers)
    assert np.array_equal(train.src_ids, in_memory.src_ids)
    assert np.array_equal(train.tgt_offsets, in_memory.tgt_offsets)
    tok = data.tokenizer
    assert train.pair(1234) == (tok.encode(text.src[1234]), tok.encode(text.tgt[1234]))
    batches = train_batches(train.src_lens, train.tgt_lens, 1000, seed=1, epoch=1)
    for b in batches[:5]:
        mapped, memory = train.collate(b), in_memory.collate(b)
        assert mapped.indices == memory.indices
        for name in ("src", "src_valid_lens", "tgt_in", "tgt_out", "tgt_valid_lens"):
            assert getattr(mapped, name).equal(getattr(memory, name)), name
    # ids 2 bytes each, offsets and line numbers 24 bytes per pair: under 3 bytes per token
    tokens = len(train.src_ids) + len(train.tgt_ids)
    assert train.disk_bytes() / tokens < 3.0


def test_int32_ids_when_the_vocabulary_does_not_fit_16_bits(tmp_path):
    assert id_dtype(65536) == np.uint16 and id_dtype(65537) == np.int32
    src = [[70000, 5, 65536], [4]]
    tgt = [[9], [100000, 3]]
    with StoreWriter(tmp_path / "store", vocab_size=120000) as writer:
        writer.add(src, tgt, [0, 2])
        writer.finish({})
    corpus = ParallelCorpus.open(tmp_path / "store")
    assert corpus.src_ids.dtype == np.int32
    assert [corpus.pair(i) for i in range(2)] == [(src[0], tgt[0]), (src[1], tgt[1])]
    assert corpus.lines.tolist() == [0, 2]


def test_invalid_utf8_deep_in_a_streamed_file_names_its_line(tmp_path, monkeypatch,
                                                              multi30k_small_tokenizer_path):
    """Read in small blocks and chunks, as a large corpus is: the error still names the
    exact line, and no store is left behind."""
    monkeypatch.setattr(text_module, "BLOCK_BYTES", 1000)
    lines = [f"sentence number {i}".encode() for i in range(5000)]
    lines[3456] = b"a bad \xff byte"  # line 3,457
    (tmp_path / "train.en").write_bytes(b"\n".join(lines) + b"\n")
    (tmp_path / "train.de").write_text("".join(f"Satz {i}\n" for i in range(5000)))
    with pytest.raises(DataError, match=r"train.en, line 3457: invalid UTF-8 \(byte 0xff at "
                                        r"byte 7 of the line\)"):
        list(iter_parallel(tmp_path / "train.en", tmp_path / "train.de", split="train",
                           chunk_pairs=300))
    (tmp_path / "valid.en").write_text("a\n")
    (tmp_path / "valid.de").write_text("b\n")
    files = {f"{split}.{lang}": tmp_path / f"{split}.{lang}"
             for split in ("train", "valid") for lang in ("en", "de")}
    cfg = files_config(files, spm_model=str(multi30k_small_tokenizer_path), vocab_size=400)
    with pytest.raises(DataError, match="line 3457"):
        load_data(cfg, tmp_path / "run")
    assert list((tmp_path / "run" / "cache").iterdir()) == []  # nothing half-written


def test_mismatched_line_counts_name_both_files_and_leave_no_store(tmp_path, multi30k_dir,
                                                                   multi30k_tokenizer_path):
    files = slice_files(multi30k_dir, tmp_path, n=1000)
    with open(files["train.de"], "a", encoding="utf-8") as f:
        f.write("Eine Zeile zu viel.\n")
    cfg = files_config(files, spm_model=str(multi30k_tokenizer_path), vocab_size=2000)
    with pytest.raises(DataError, match=r"train: .*train.en has 1000 lines but .*train.de has "
                                        r"1001 lines"):
        load_data(cfg, tmp_path / "run")
    assert list((tmp_path / "run" / "cache").iterdir()) == []


@pytest.mark.parametrize("name", ["src.bin", "tgt.idx", "lines.idx"])
def test_truncated_store_file_is_named_and_never_trusted(tmp_path, multi30k_dir,
                                                          multi30k_tokenizer_path, name):
    files = slice_files(multi30k_dir, tmp_path, n=500)
    cfg = files_config(files, spm_model=str(multi30k_tokenizer_path), vocab_size=2000)
    store = load_data(cfg, tmp_path / "run").train.corpora[0].path
    damaged = store / name
    damaged.write_bytes(damaged.read_bytes()[:-2])
    with pytest.raises(DataError, match=f"{damaged} has .* bytes, expected .*; the store is "
                                        f"damaged; delete {store}"):
        load_data(cfg, tmp_path / "run")
    shutil.rmtree(store)  # as the message says: then it is rebuilt
    assert len(load_data(cfg, tmp_path / "run").train) == 500


def test_store_of_another_tokenizer_is_refused(tmp_path, multi30k_dir, multi30k_tokenizer_path,
                                               multi30k_small_tokenizer_path):
    files = slice_files(multi30k_dir, tmp_path, n=500)
    cfg = files_config(files, spm_model=str(multi30k_tokenizer_path), vocab_size=2000)
    store = load_data(cfg, tmp_path / "run").train.corpora[0].path
    other = Tokenizer.load(multi30k_small_tokenizer_path)
    split = SplitFiles(files["train.en"], files["train.de"])
    moved = store_path(split, "train", TokenizerPair(other, other), tmp_path / "run" / "cache")
    store.rename(moved)  # e.g. copied by hand into another run's cache
    cfg = dataclasses.replace(cfg, spm_model=str(multi30k_small_tokenizer_path), vocab_size=400)
    with pytest.raises(DataError, match=f"{moved} was encoded with another tokenizer"):
        load_data(cfg, tmp_path / "run")


def test_unchanged_files_are_not_read_again_and_changed_ones_are(tmp_path, multi30k_dir,
                                                                 multi30k_tokenizer_path,
                                                                 monkeypatch, caplog):
    files = slice_files(multi30k_dir, tmp_path, n=500)
    cfg = files_config(files, spm_model=str(multi30k_tokenizer_path), vocab_size=2000)
    first = load_data(cfg, tmp_path / "run")

    def fail(*args, **kwargs):
        raise AssertionError("the training text should not be read")

    with monkeypatch.context() as m:  # same size and time: trusted without hashing
        m.setattr(data_module, "_sha256_file", fail)
        m.setattr(data_module, "write_split_store", fail)
        assert load_data(cfg, tmp_path / "run").train.corpora[0].path == first.train.corpora[0].path
    files["train.en"].touch()  # a new time, the same bytes: hashed, found equal, reused
    with monkeypatch.context() as m:
        m.setattr(data_module, "write_split_store", fail)
        load_data(cfg, tmp_path / "run")
    lines = files["train.en"].read_text(encoding="utf-8").splitlines()
    lines[7] = "A completely different sentence."
    files["train.en"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    caplog.set_level(logging.INFO, logger="transformer")
    data = load_data(cfg, tmp_path / "run")
    assert "changed since" in caplog.text
    assert data.train.corpora[0].pair(7)[0] == data.tokenizer.encode(
        "A completely different sentence.")


def test_sentencepiece_trains_on_a_seeded_sample(tmp_path, multi30k_dir, caplog):
    files = slice_files(multi30k_dir, tmp_path)
    caplog.set_level(logging.INFO, logger="transformer")
    cfg = files_config(files, vocab_size=500, spm_max_sentences=800)
    data = load_data(cfg, tmp_path / "run")
    assert "SentencePiece sample: 800 of 3000 training pairs (data.spm_max_sentences=800)" \
        in caplog.text
    assert len(data.train) == 3000  # the sample is for the tokenizer only
    again = load_data(cfg, tmp_path / "run2")
    assert again.tokenizer == data.tokenizer  # seeded: the same sample, the same model


def test_reservoir_sample_is_uniform_seeded_and_whole_when_small():
    def chunks(n, size=700):
        for start in range(0, n, size):
            ids = list(range(start, min(n, start + size)))
            yield text_module.ParallelText([str(i) for i in ids], [f"t{i}" for i in ids], ids)

    small, seen = sample_pairs(chunks(500), 1000, seed=1)
    assert seen == 500 and small.lines == list(range(500))  # all of them, in order
    sample, seen = sample_pairs(chunks(20000), 1000, seed=1)
    assert seen == 20000 and len(set(sample.lines)) == 1000
    assert all(s == str(i) and t == f"t{i}" for s, t, i in zip(sample.src, sample.tgt,
                                                               sample.lines, strict=True))
    assert sample_pairs(chunks(20000), 1000, seed=1)[0].lines == sample.lines
    assert sample_pairs(chunks(20000), 1000, seed=2)[0].lines != sample.lines
    # uniform: each tenth of the corpus holds ~100 of the 1,000 (binomial sd ~9.5)
    counts = np.bincount(np.asarray(sample.lines) // 2000, minlength=10)
    assert counts.min() > 60 and counts.max() < 140, counts


def test_prepare_data_script_then_training_finds_the_stores(tmp_path, multi30k_dir,
                                                            multi30k_small_tokenizer_path):
    run = tmp_path / "run"
    overrides = [f"data.root={multi30k_dir}", f"data.spm_model={multi30k_small_tokenizer_path}",
                 "data.vocab_size=400", f"hydra.run.dir={run}"]
    result = subprocess.run([sys.executable, str(REPO / "scripts/prepare_data.py"), *overrides],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "train: 3,000 pairs" in result.stdout and "valid: 300 pairs" in result.stdout
    stores = sorted(p.name for p in (run / "cache").iterdir())
    assert [s.split("-")[0] for s in stores] == ["test", "train", "valid"]
    from transformer.run.compose import compose_config
    cfg = compose_config([o for o in overrides if not o.startswith("hydra")])
    data = load_data(cfg.data, run)
    assert sorted(p.name for p in (run / "cache").iterdir()) == stores
    assert data.train.corpora[0].path == run / "cache" / stores[1]
