"""Fuzzing what the package loads as a model: checkpoint files (damaged bytes, and well-formed
files with one field replaced), SentencePiece models, CTranslate2 export directories and
Hugging Face directories with a damaged file. Each must load and translate, or fail with
the package's error on one line, and a command that fails must leave no output behind."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line, assert_reported, fuzz, run_command  # tests/conftest.py
from hypothesis import given
from hypothesis import strategies as st

from transformer.data.tokenizer import Tokenizer
from transformer.decoding.translator import Translator
from transformer.deploy.engines import load_translator
from transformer.errors import CheckpointError, DataError, ExportError, TransformerError
from transformer.run.checkpoint import load_checkpoint, save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

SENTENCE = "A man rides a bike."


# ---- damaged bytes --------------------------------------------------------------------------

DAMAGE = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20)),
    st.tuples(st.just("garble"), st.binary(min_size=1, max_size=16), st.integers(0, 1 << 20)),
    st.tuples(st.just("replace"), st.binary(max_size=64)),
)


def damaged(raw: bytes, how: tuple) -> bytes:
    """`raw` truncated, overwritten in place at a position, or replaced, as `how` says."""
    if how[0] == "truncate":
        return raw[:how[1] % max(1, len(raw))]
    if how[0] == "garble":
        at = how[2] % max(1, len(raw))
        return raw[:at] + how[1] + raw[at + len(how[1]):]
    return how[1]


@fuzz(30)
@given(how=DAMAGE)
def test_a_damaged_checkpoint_file_is_refused_or_translates(random_checkpoint, how):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "model.pt")
        path.write_bytes(damaged(random_checkpoint.read_bytes(), how))
        try:
            translator = Translator.load(path, device="cpu")
        except CheckpointError as e:
            assert_one_line(e)
            assert str(path) in str(e)
            return
        assert isinstance(translator.translate([SENTENCE])[0], str)


# ---- well-formed checkpoints with one field replaced ----------------------------------------

ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 40), 1 << 40), st.floats(), st.text(max_size=8),
    st.binary(max_size=8), st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=2),
)


@pytest.fixture(scope="module")
def checkpoint_state(random_checkpoint) -> dict:
    return load_checkpoint(random_checkpoint)


def _replace(state: dict, where: tuple[str, ...], value: object) -> dict:
    """A copy of `state` with the entry at path `where` replaced by `value`."""
    if len(where) == 1:
        return {**state, where[0]: value}
    inner = state.get(where[0])
    inner = inner if isinstance(inner, dict) else {}
    return {**state, where[0]: _replace(inner, where[1:], value)}


def places(state: dict) -> list[tuple[str, ...]]:
    """Every entry of a checkpoint (or an export's description) a fuzzer may replace: its
    top-level fields, each key of its model config and decoding settings, its tokenizer's
    sides, its training config's groups and some of its tensors."""
    found = [(key,) for key in sorted(state)] + [("decoding", key) for key in
                                                 ("beam_size", "alpha", "max_len_a", "max_len_b")]
    found += [("model_config", key) for key in sorted(state["model_config"])]
    found += [("tokenizer", side) for side in ("src", "tgt")]
    if "languages" in state:  # an export
        return found + [("languages", side) for side in ("src", "tgt")]
    found += [("config", group) for group in ("model", "data", "optim", "trainer", "seed")]
    found += [("model", name) for name in sorted(state["model"])[:4]]
    return found


@fuzz(30)
@given(data=st.data())
def test_a_checkpoint_with_an_odd_field_is_refused_or_translates(checkpoint_state, data):
    """A checkpoint whose one entry holds an odd value (of the wrong type, out of range, a
    tensor of another shape): CheckpointError on one line, or a translator that works."""
    where = data.draw(st.sampled_from(places(checkpoint_state)), label="where")
    value = data.draw(ODD_VALUES | st.builds(torch.zeros, st.integers(0, 3)), label="value")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "model.pt")
        save_checkpoint(_replace(checkpoint_state, where, value), path)
        try:
            translator = Translator.load(path, device="cpu")
        except CheckpointError as e:
            assert_one_line(e)
            return
        assert isinstance(translator.translate([SENTENCE])[0], str)


# ---- SentencePiece models ------------------------------------------------------------------


@fuzz(30)
@given(how=DAMAGE)
def test_a_damaged_sentencepiece_model_is_refused_or_tokenizes(multi30k_small_tokenizer_path,
                                                               how):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "spm.model")
        path.write_bytes(damaged(multi30k_small_tokenizer_path.read_bytes(), how))
        try:
            tokenizer = Tokenizer.load(path)
        except TransformerError as e:
            assert_one_line(e)
            assert str(path) in str(e)
            return
        ids = tokenizer.encode(SENTENCE)
        assert all(0 <= i < tokenizer.vocab_size for i in ids)
        assert isinstance(tokenizer.decode(ids), str)


# ---- export directories -------------------------------------------------------------------


def files_of(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.is_file())


@pytest.fixture(scope="module")
def ct2_export(random_checkpoint, tmp_path_factory) -> Path:
    from transformer.deploy.export import export_ctranslate2

    directory = tmp_path_factory.mktemp("ct2") / "export"
    export_ctranslate2(Translator.load(random_checkpoint, device="cpu"), directory)
    return directory


@fuzz(25)
@given(data=st.data())
def test_a_damaged_ctranslate2_export_is_refused_or_translates(ct2_export, data):
    name = data.draw(st.sampled_from(files_of(ct2_export)), label="file")
    how = data.draw(DAMAGE | st.just(("delete",)), label="how")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp, "export")
        shutil.copytree(ct2_export, directory)
        if how == ("delete",):
            (directory / name).unlink()
        else:
            (directory / name).write_bytes(damaged((directory / name).read_bytes(), how))
        try:
            translator = load_translator(directory, "ctranslate2", device="cpu", threads=1)
            output = translator.translate([SENTENCE])[0]
        except TransformerError as e:
            assert_one_line(e)
            return
        assert isinstance(output, str)


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-(1 << 40), 1 << 40)
                           | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=2),
                           max_leaves=5)


@fuzz(25)
@given(data=st.data())
def test_an_export_with_an_odd_description_is_refused_or_translates(ct2_export, data):
    """An export whose transformer.json holds one odd value (any field, or a key of its
    model config, decoding settings, tokenizer and languages): ExportError on one line, or
    a translator that works."""
    info = json.loads((ct2_export / "transformer.json").read_text())
    where = data.draw(st.sampled_from(places(info)), label="where")
    value = data.draw(JSON_VALUES, label="value")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp, "export")
        shutil.copytree(ct2_export, directory)
        (directory / "transformer.json").write_text(json.dumps(_replace(info, where, value)))
        try:
            output = load_translator(directory, "ctranslate2", device="cpu",
                                     threads=1).translate([SENTENCE])[0]
        except TransformerError as e:
            assert_one_line(e)
            return
        assert isinstance(output, str)


@pytest.fixture(scope="module")
def hf_directory(random_checkpoint, tmp_path_factory) -> Path:
    from transformer.deploy.hf import export_hf

    directory = tmp_path_factory.mktemp("hf") / "marian"
    export_hf(Translator.load(random_checkpoint, device="cpu"), directory)
    return directory


@fuzz(30, shrink=False)
@given(data=st.data())
def test_import_hf_of_a_damaged_directory_reports_one_line_and_writes_nothing(hf_directory,
                                                                              data):
    """`transformer import-hf` on a Marian directory with one damaged file: a checkpoint
    that translates, or `error: <one line>`, exit 1 and no run directory."""
    name = data.draw(st.sampled_from(files_of(hf_directory)), label="file")
    how = data.draw(DAMAGE | st.just(("delete",)), label="how")
    with tempfile.TemporaryDirectory() as tmp:
        directory, run = Path(tmp, "marian"), Path(tmp, "run")
        shutil.copytree(hf_directory, directory)
        if how == ("delete",):
            (directory / name).unlink()
        else:
            (directory / name).write_bytes(damaged((directory / name).read_bytes(), how))
        status, err = run_command(["import-hf", str(directory), "--output", str(run)])
        assert_reported(status, err)
        if status == 1:
            assert not (run / "checkpoints" / "checkpoint_best.pt").exists()
            assert not any(run.rglob("*.tmp")) if run.exists() else True
            return
        translator = Translator.load(run, device="cpu")
        assert isinstance(translator.translate([SENTENCE])[0], str)


@fuzz(20, shrink=False)
@given(data=st.data())
def test_import_hf_of_an_odd_json_file_reports_one_line(hf_directory, data):
    """`transformer import-hf` on a Marian directory whose config.json, vocab.json or
    tokenizer_config.json holds one odd value (any key): a checkpoint that translates, or
    `error: <one line>` and no run directory."""
    name = data.draw(st.sampled_from(["config.json", "vocab.json", "tokenizer_config.json"]),
                     label="file")
    values = json.loads((hf_directory / name).read_text())
    key = data.draw(st.sampled_from(sorted(values)), label="key")
    value = data.draw(JSON_VALUES, label="value")
    with tempfile.TemporaryDirectory() as tmp:
        directory, run = Path(tmp, "marian"), Path(tmp, "run")
        shutil.copytree(hf_directory, directory)
        (directory / name).write_text(json.dumps({**values, key: value}))
        status, err = run_command(["import-hf", str(directory), "--output", str(run)])
        assert_reported(status, err)
        if status == 1:
            assert not (run / "checkpoints" / "checkpoint_best.pt").exists()
            return
        translator = Translator.load(run, device="cpu")
        assert isinstance(translator.translate([SENTENCE])[0], str)


# ---- what the fuzzing above once found ---------------------------------------------------------


@pytest.mark.parametrize("how, reason", [
    (("garble", b"\x00", 239), "Unsupported operand"),  # torch's several-line message
    (("replace", b"\x00"), "corrupt or truncated"),
])
def test_found_by_fuzzing_damaged_checkpoints(random_checkpoint, tmp_path, how, reason):
    path = tmp_path / "model.pt"
    path.write_bytes(damaged(random_checkpoint.read_bytes(), how))
    with pytest.raises(CheckpointError, match=reason) as info:
        Translator.load(path, device="cpu")
    assert_one_line(info.value)


@pytest.mark.parametrize("where, value, reason", [
    (("decoding", "alpha"), False, "decoding"),  # loaded, then every translation refused
    (("decoding", "beam_size"), torch.zeros(0), "decoding"),  # a tensor's truth value
    (("format_version",), torch.zeros(0), "checkpoint format"),
    (("model", "decoder.blks.0.addnorm1.ln.bias"), None, "ln.bias"),  # several lines
])
def test_found_by_fuzzing_checkpoints_with_an_odd_field(checkpoint_state, tmp_path, where,
                                                        value, reason):
    path = tmp_path / "model.pt"
    save_checkpoint(_replace(checkpoint_state, where, value), path)
    with pytest.raises(CheckpointError, match=reason) as info:
        Translator.load(path, device="cpu")
    assert_one_line(info.value)


@pytest.mark.parametrize("how", [("truncate", 0), ("garble", b"\xff", 0)])
def test_found_by_fuzzing_damaged_sentencepiece_models(multi30k_small_tokenizer_path,
                                                       tmp_path, how):
    """SentencePiece's RuntimeError (several lines of C++ context) and a model parsed from
    nothing (special ids -1) were not the package's errors."""
    path = tmp_path / "spm.model"
    path.write_bytes(damaged(multi30k_small_tokenizer_path.read_bytes(), how))
    with pytest.raises(DataError, match="not a usable SentencePiece model") as info:
        Tokenizer.load(path)
    assert_one_line(info.value)


@pytest.mark.parametrize("where", [("decoding",), ("tokenizer",), ("tokenizer", "src")])
def test_found_by_fuzzing_exports_with_an_odd_description(ct2_export, tmp_path, where):
    """null for the decoding settings was an AttributeError, for the tokenizer's files a
    TypeError."""
    info = json.loads((ct2_export / "transformer.json").read_text())
    directory = tmp_path / "export"
    shutil.copytree(ct2_export, directory)
    (directory / "transformer.json").write_text(json.dumps(_replace(info, where, None)))
    with pytest.raises(ExportError) as error:
        load_translator(directory, "ctranslate2", device="cpu", threads=1)
    assert_one_line(error.value)


@pytest.mark.parametrize("name, key, value", [
    ("config.json", "dropout", None),  # a TypeError from float()
    ("config.json", "attention_dropout", [0.1]),
    ("vocab.json", "'", None),  # a TypeError comparing ids
])
def test_found_by_fuzzing_an_odd_hugging_face_file(hf_directory, tmp_path, name, key, value):
    values = json.loads((hf_directory / name).read_text())
    directory, run = tmp_path / "marian", tmp_path / "run"
    shutil.copytree(hf_directory, directory)
    (directory / name).write_text(json.dumps({**values, key: value}))
    status, err = run_command(["import-hf", str(directory), "--output", str(run)])
    assert status == 1, err
    assert_reported(status, err)
