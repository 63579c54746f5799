"""Checkpoints: atomic save, safe load (weights_only), clear errors, keep-last-K, averaging,
RNG state."""

from __future__ import annotations

import os
import random
import runpy
from pathlib import Path

import pytest
import torch

from transformer.data.tokenizer import Tokenizer, TokenizerPair
from transformer.errors import CheckpointError
from transformer.model.transformer import ModelConfig, Transformer
from transformer.run import checkpoint as ckpt
from transformer.run.config import DecodingSettings, TrainConfig
from transformer.run.data_config import DataConfig

REPO = Path(__file__).resolve().parents[1]
CONFIG = ModelConfig(src_vocab_size=40, tgt_vocab_size=40, num_hiddens=16, ffn_num_hiddens=32,
                     num_heads=2, num_encoder_layers=1, num_decoder_layers=1, dropout=0.0)


def make_state(seed: int = 0, **extra) -> dict:
    torch.manual_seed(seed)
    model = Transformer(CONFIG)
    return {"model": model.state_dict(), "model_config": CONFIG.to_dict(), **extra}


def test_round_trip_rebuilds_the_same_model(tmp_path):
    path = tmp_path / "ckpt" / "c.pt"
    ckpt.save_checkpoint(make_state(train_state={"num_updates": 7}), path)
    assert os.listdir(path.parent) == ["c.pt"]  # no temporary file left behind
    state = ckpt.load_checkpoint(path)
    assert state["train_state"] == {"num_updates": 7}
    model = ckpt.model_from_checkpoint(state, path).eval()
    torch.manual_seed(0)
    reference = Transformer(CONFIG).eval()
    src, lens = torch.randint(4, 40, (2, 5)), torch.tensor([5, 3])
    tgt = torch.randint(4, 40, (2, 4))
    assert torch.equal(model(src, lens, tgt), reference(src, lens, tgt))


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_or_truncated_file_names_the_file(tmp_path, damage):
    path = tmp_path / "checkpoint_last.pt"
    ckpt.save_checkpoint(make_state(), path)
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "garbage": os.urandom(2000),
                      "empty": b""}[damage])
    with pytest.raises(CheckpointError) as info:
        ckpt.load_checkpoint(path)
    assert str(path) in str(info.value)


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(CheckpointError, match="not found.*nope.pt"):
        ckpt.load_checkpoint(tmp_path / "nope.pt")


def test_model_config_mismatch_names_the_key(tmp_path):
    path = tmp_path / "c.pt"
    ckpt.save_checkpoint(make_state(), path)
    state = ckpt.load_checkpoint(path)
    ckpt.check_model_config(state, CONFIG, path)  # same config: fine
    other = ModelConfig(**{**CONFIG.to_dict(), "num_hiddens": 32, "num_heads": 4})
    with pytest.raises(CheckpointError) as info:
        ckpt.check_model_config(state, other, path)
    message = str(info.value)
    assert str(path) in message
    assert "model.num_hiddens: checkpoint has 16, config asks for 32" in message
    assert "model.num_heads" in message and "model.dropout" not in message


class _Payload:
    """Unpickling this calls os.mkdir(marker): code execution from a checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_checkpoint_that_would_run_code_is_refused(tmp_path):
    path, marker = tmp_path / "evil.pt", tmp_path / "pwned"
    torch.save({**make_state(), "format_version": ckpt.FORMAT_VERSION,
                "extra": _Payload(marker)}, path)
    with pytest.raises(CheckpointError) as info:
        ckpt.load_checkpoint(path)
    assert "refusing to load" in str(info.value) and str(path) in str(info.value)
    assert not marker.exists()  # the code did not run
    # The payload is real: an unsafe load would have run it.
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_prune_keeps_the_newest_numbered_checkpoints(tmp_path):
    for n in (2, 9, 10, 100, 30):
        ckpt.save_checkpoint(make_state(), ckpt.numbered_checkpoint_path(tmp_path, n))
    for name in (ckpt.LAST, ckpt.BEST, "checkpoint_foo.pt"):
        (tmp_path / name).write_bytes(b"x")
    assert [p.name for p in ckpt.numbered_checkpoints(tmp_path)] == [
        "checkpoint_2.pt", "checkpoint_9.pt", "checkpoint_10.pt", "checkpoint_30.pt",
        "checkpoint_100.pt"]  # numeric, not lexicographic, order
    ckpt.prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["checkpoint_30.pt", "checkpoint_100.pt", ckpt.LAST, ckpt.BEST, "checkpoint_foo.pt"])


def test_average_checkpoints_script_keeps_the_first_ones_settings(tmp_path,
                                                                  multi30k_small_tokenizer_path):
    tokenizer = Tokenizer.load(multi30k_small_tokenizer_path)
    config = ModelConfig(**{**CONFIG.to_dict(), "src_vocab_size": tokenizer.vocab_size,
                            "tgt_vocab_size": tokenizer.vocab_size})
    tokenizers = TokenizerPair(tokenizer, tokenizer)
    run_config = TrainConfig(data=DataConfig(src_lang="fr", tgt_lang="cs"))
    paths = [ckpt.numbered_checkpoint_path(tmp_path, n) for n in (1, 2, 3)]
    states = []
    for seed, path in zip((0, 1, 2), paths, strict=True):
        torch.manual_seed(seed)
        states.append(ckpt.inference_checkpoint(
            Transformer(config), tokenizers, training_config=run_config,
            decoding=DecodingSettings(alpha=0.5 + seed, beam_size=3)))
        ckpt.save_checkpoint(states[-1], path)
    out = tmp_path / "avg.pt"
    main = runpy.run_path(str(REPO / "scripts/average_checkpoints.py"))["main"]
    assert main([str(tmp_path), "--last", "2", "-o", str(out)]) == 0  # seeds 1 and 2
    averaged = ckpt.load_checkpoint(out)
    key = "encoder.blks.0.ffn.dense1.weight"
    expected = (states[1]["model"][key] + states[2]["model"][key]) / 2
    torch.testing.assert_close(averaged["model"][key], expected)
    assert averaged["averaged_from"] == [str(p) for p in paths[1:]]
    assert averaged["tokenizer"] == ckpt.tokenizers_to_state(tokenizers)
    assert ckpt.stored_decoding(averaged) == DecodingSettings(alpha=1.5, beam_size=3)
    assert ckpt.stored_training_config(averaged) == run_config
    assert set(averaged) == {"format_version", "model", "model_config", "tokenizer", "config",
                             "decoding", "run_id", "averaged_from"}  # no training state
    ckpt.model_from_checkpoint(averaged, out)  # loadable for translation


def test_the_average_script_reports_an_empty_directory(tmp_path, capsys):
    main = runpy.run_path(str(REPO / "scripts/average_checkpoints.py"))["main"]
    assert main([str(tmp_path), "-o", str(tmp_path / "avg.pt")]) == 1
    assert capsys.readouterr().err == f"error: no checkpoint_<updates>.pt files in {tmp_path}\n"


def test_stored_training_config_reads_what_to_dict_wrote_and_names_bad_values():
    config = TrainConfig(data=DataConfig(src_lang="de", tgt_lang="en"))
    assert ckpt.stored_training_config({"config": config.to_dict()}) == config
    assert ckpt.stored_training_config({}) is None
    newer = config.to_dict()
    newer["optim"]["a_later_option"] = 1  # unknown keys: a checkpoint of another version
    assert ckpt.stored_training_config({"config": newer}) == config
    bad = config.to_dict()
    bad["optim"]["lr"] = -1.0
    with pytest.raises(CheckpointError, match="x.pt holds an invalid training config: "
                                              "optim.lr must be > 0"):
        ckpt.stored_training_config({"config": bad}, "x.pt")


def test_rng_state_survives_a_safe_save_and_load(tmp_path):
    state = make_state()
    torch.manual_seed(3)
    random.seed(3)
    state["rng"] = [ckpt.rng_state()]
    expected = (torch.rand(3), random.random())
    path = tmp_path / "c.pt"
    ckpt.save_checkpoint(state, path)
    torch.manual_seed(99)
    random.seed(99)
    ckpt.set_rng_state(ckpt.load_checkpoint(path)["rng"][0])
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
