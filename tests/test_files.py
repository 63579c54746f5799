"""Atomic writes when the disk fills: every file the package writes (checkpoints, the
tokenizer, the corpus cache, translations) appears whole or not at all, and the error is one
line naming the file.

A full disk is simulated with a file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored): writing past
it fails with a real OSError (EFBIG, "File too large") from the operating system, as ENOSPC
would on a full filesystem.
"""

from __future__ import annotations

import contextlib
import resource
import signal
from pathlib import Path

import pytest

from transformer.data.store import ParallelCorpus
from transformer.data.tokenizer import Tokenizer, TokenizerPair
from transformer.errors import WriteError
from transformer.files import append_synced, atomic_write
from transformer.run import checkpoint as ckpt
from transformer.run.data import SplitFiles, write_split_store


def _limit_file_size(nbytes: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(
        resource.RLIMIT_FSIZE)[1]))


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """Writes beyond `nbytes` per file fail in this process for the duration."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.getsignal(signal.SIGXFSZ)
    _limit_file_size(nbytes)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def leftovers(folder: Path) -> list[str]:
    """Temporary files left in `folder` (atomic_write names them .NAME.*.tmp)."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path):
    path = tmp_path / "out.bin"
    with atomic_write(path) as f:
        f.write(b"old")
    with pytest.raises(WriteError) as info, file_size_limit(1000):
        with atomic_write(path) as f:
            f.write(b"x" * 5000)
    assert str(info.value) == f"could not write {path}: File too large"
    assert path.read_bytes() == b"old" and leftovers(tmp_path) == []
    with pytest.raises(KeyError):  # the block's own errors pass through unchanged
        with atomic_write(path, text=True) as f:
            f.write("new")
            raise KeyError("not a write error")
    assert path.read_bytes() == b"old" and leftovers(tmp_path) == []
    with atomic_write(path, text=True) as f:
        f.write("new\n")
    assert path.read_text() == "new\n"


def test_append_synced_returns_the_size_on_disk_and_names_the_file_it_cannot_grow(tmp_path):
    path = tmp_path / "out.partial"
    assert append_synced(path, b"one\n") == 4
    assert append_synced(path, b"two\n") == 8 and path.read_bytes() == b"one\ntwo\n"
    with pytest.raises(WriteError) as info, file_size_limit(1000):
        append_synced(path, b"x" * 5000)
    assert str(info.value) == f"could not write {path}: File too large"


def test_full_disk_while_saving_the_tokenizer_and_the_corpus_store(tmp_path, multi30k_lines):
    lines = multi30k_lines("train.en.gz")[:500]
    tokenizer = Tokenizer.train(lines, vocab_size=500)
    path = tmp_path / "spm.model"
    with pytest.raises(WriteError, match=f"could not write {path}: File too large"):
        with file_size_limit(4096):
            tokenizer.save(path)
    assert not path.exists() and leftovers(tmp_path) == []

    files = SplitFiles(tmp_path / "train.en", tmp_path / "train.de")
    for file in (files.src, files.tgt):
        file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    pair = TokenizerPair(tokenizer, tokenizer)
    store = tmp_path / "cache" / "train-0123"
    write_split_store(store, files, "train", pair)
    before = {p.name: p.read_bytes() for p in store.iterdir()}
    files.src.write_text("\n".join(lines[::-1]) + "\n", encoding="utf-8")  # new contents
    with pytest.raises(WriteError, match=f"could not write {store}/src.bin: File too large"):
        with file_size_limit(4096):  # the ids of 500 sentences need ~15 kB
            write_split_store(store, files, "train", pair)
    # the old store is intact and nothing half-written is left beside it
    assert {p.name: p.read_bytes() for p in store.iterdir()} == before
    assert [p.name for p in store.parent.iterdir()] == [store.name]
    assert ParallelCorpus.open(store).pair(0)[0] == tokenizer.encode(lines[0])


def test_full_disk_while_checkpointing_stops_training_with_one_line(
        tmp_path, multi30k_dir, multi30k_small_tokenizer_path, capsys, one_thread):
    """The run stops with exit 1 and one line naming the checkpoint and the last good one,
    which is intact and loadable; no temporary file is left. (Both runs in this process:
    `transformer train` as its command line runs it, the second under the size limit.)"""
    from transformer import cli

    run = tmp_path / "run"
    overrides = ["model=tiny", f"data.root={multi30k_dir}",
                 f"data.spm_model={multi30k_small_tokenizer_path}",
                 "data.vocab_size=400", "data.max_train_pairs=100", "data.max_tokens=512",
                 "model.num_hiddens=32", "model.ffn_num_hiddens=64", "model.num_heads=2",
                 "model.num_encoder_layers=1", "model.num_decoder_layers=1",
                 "optim.cooldown_updates=0", "trainer.bleu_max_sentences=4",
                 "trainer.validate_every_updates=1", f"hydra.run.dir={run}"]
    assert cli.main(["train", *overrides, "trainer.max_updates=1"]) == 0, \
        capsys.readouterr().err[-2000:]
    last = run / "checkpoints" / "checkpoint_last.pt"
    size = last.stat().st_size
    assert size > 200_000  # so that the limit below stops only the checkpoint
    capsys.readouterr()
    with file_size_limit(size // 2), pytest.raises(SystemExit) as exited:
        cli.main(["train", *overrides, "trainer.max_updates=3"])  # Hydra's app exits
    err = capsys.readouterr().err
    assert exited.value.code == 1
    assert err.strip().splitlines()[-1] == (  # after the run's log lines
        f"error: could not write {last}: File too large; the last good checkpoint is still "
        f"{last}")
    assert "Traceback" not in err
    assert ckpt.load_checkpoint(last)["train_state"]["num_updates"] == 1
    assert leftovers(run / "checkpoints") == []


def test_full_disk_while_writing_translations(tmp_path, random_checkpoint, capsys,
                                              one_thread):
    """`transformer translate --output` (in this process, under the size limit)."""
    from transformer import cli

    source = tmp_path / "in.txt"
    source.write_text("A man rides a bike.\n" * 300, encoding="utf-8")
    output = tmp_path / "out" / "hyp.txt"
    output.parent.mkdir()
    with file_size_limit(2000):
        status = cli.main(["translate", "--checkpoint", str(random_checkpoint), "--input",
                           str(source), "--output", str(output), "--beam-size", "1",
                           "--device", "cpu"])
    assert status == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: could not write {output}: File too large")
    assert list(output.parent.iterdir()) == []  # no partial output, no temporary file
