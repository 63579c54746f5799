"""Averaging checkpoints: only those of one training run (the same model, tokenizers and run
id) are averaged; those of independent runs are refused in one line by `average_weights`,
`transformer average-checkpoints` and `transformer translate --checkpoint A B`. A training
run keeps its run id when it resumes, and the commands that write a checkpoint from another
keep the one they read."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from transformer import cli
from transformer.data.tokenizer import Tokenizer, TokenizerPair
from transformer.decoding.translator import Translator
from transformer.errors import CheckpointError
from transformer.model.transformer import ModelConfig, Transformer
from transformer.run import checkpoint as ckpt
from transformer.run.compose import compose_config
from transformer.training.trainer import train

REPO = Path(__file__).resolve().parents[1]
SLICE = REPO / "tests" / "data" / "multi30k"
KEY = "encoder.blks.0.ffn.dense1.weight"
SOURCES = ["A man rides a bike.", "Two dogs play in the snow.", "A girl reads a book."]


def slice_lines(name: str) -> list[str]:
    return gzip.decompress((SLICE / name).read_bytes()).decode("utf-8").splitlines()


@pytest.fixture(scope="module")
def tokenizer(multi30k_small_tokenizer_path) -> Tokenizer:
    return Tokenizer.load(multi30k_small_tokenizer_path)


@pytest.fixture(scope="module")
def other_tokenizer(tokenizer) -> Tokenizer:
    """A tokenizer of the same size as `tokenizer`, trained on other sentences."""
    texts = slice_lines("train.en.gz")[300:600] + slice_lines("train.de.gz")[300:600]
    other = Tokenizer.train(texts, vocab_size=tokenizer.vocab_size)
    assert other != tokenizer and other.vocab_size == tokenizer.vocab_size
    return other


def save_model(path: Path, tokenizer: Tokenizer, *, run_id: str | None, seed: int = 0,
               num_hiddens: int = 16) -> dict:
    """A small random model's inference checkpoint, written to `path`; its state."""
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(
        src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size,
        num_hiddens=num_hiddens, ffn_num_hiddens=32, num_heads=2, num_encoder_layers=1,
        num_decoder_layers=1, max_positions=64))
    state = ckpt.inference_checkpoint(model, TokenizerPair(tokenizer, tokenizer),
                                      training_config=None, run_id=run_id)
    ckpt.save_checkpoint(state, path)
    return state


def test_checkpoints_of_one_run_average_to_the_mean_of_their_weights(tmp_path, tokenizer):
    """An older checkpoint without a run id averages with those of a run (by its tokenizer
    and model config); the average keeps the run's id."""
    paths = [tmp_path / f"checkpoint_{n}.pt" for n in (1, 2, 3)]
    states = [save_model(path, tokenizer, run_id=run_id, seed=seed)
              for path, run_id, seed in zip(paths, (None, "run1", "run1"), (0, 1, 2),
                                            strict=True)]
    averaged = ckpt.average_weights(paths)
    expected = sum(state["model"][KEY].double() for state in states) / 3
    torch.testing.assert_close(averaged["model"][KEY], expected.float())
    assert averaged["run_id"] == "run1" and averaged["averaged_from"] == [str(p) for p in paths]
    assert ckpt.average_checkpoints(paths)["run_id"] == "run1"
    assert Translator.load(paths, device="cpu").run_id == "run1"
    assert Translator.load(paths[0], device="cpu").run_id is None


def different_pair(kind: str, folder: Path, tokenizer: Tokenizer,
                   other_tokenizer: Tokenizer) -> tuple[Path, Path, str]:
    """Two checkpoints that must not be averaged, and the reason the refusal gives."""
    a, b = folder / "a.pt", folder / "b.pt"
    save_model(a, tokenizer, run_id="run1")
    if kind == "run":
        save_model(b, tokenizer, run_id="run2", seed=1)
        return a, b, "they come from different training runs (run_id run1 and run2)"
    if kind == "tokenizer":
        save_model(b, other_tokenizer, run_id=None, seed=1)
        return a, b, "their tokenizers differ (src and tgt)"
    save_model(b, tokenizer, run_id="run1", num_hiddens=32)
    return a, b, "their model configs differ (num_hiddens)"


KINDS = ["run", "tokenizer", "model"]


@pytest.mark.parametrize("kind", KINDS)
def test_average_weights_refuses_checkpoints_of_different_runs(tmp_path, tokenizer,
                                                               other_tokenizer, kind):
    a, b, reason = different_pair(kind, tmp_path, tokenizer, other_tokenizer)
    with pytest.raises(CheckpointError) as info:
        ckpt.average_weights([a, b])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"cannot average {b} with {a}: {reason}. ")
    assert "checkpoints of one training run" in message and "--ensemble" in message
    with pytest.raises(CheckpointError, match="cannot average"):
        Translator.load([a, b], device="cpu")


def test_a_third_run_is_refused_after_a_checkpoint_without_an_id(tmp_path, tokenizer):
    """The first checkpoint has no run id: the others are still compared with each other."""
    paths = [tmp_path / f"{name}.pt" for name in ("old", "a", "b")]
    for seed, (path, run_id) in enumerate(zip(paths, (None, "run1", "run2"), strict=True)):
        save_model(path, tokenizer, run_id=run_id, seed=seed)
    with pytest.raises(CheckpointError,
                       match=f"cannot average {paths[2]} with {paths[1]}: they come from "
                             f"different training runs"):
        ckpt.average_weights(paths)


def check_refused(status: int, err: str, a: Path, b: Path, reason: str) -> None:
    assert status == 1
    assert err.count("\n") == 1 and err.startswith(f"error: cannot average {b} with {a}: ")
    assert reason in err and "--ensemble" in err


@pytest.mark.parametrize("kind", KINDS)
def test_average_checkpoints_command_refuses_different_runs(tmp_path, tokenizer,
                                                            other_tokenizer, kind, capsys):
    a, b, reason = different_pair(kind, tmp_path, tokenizer, other_tokenizer)
    out = tmp_path / "averaged.pt"
    status = cli.main(["average-checkpoints", str(a), str(b), "-o", str(out)])
    check_refused(status, capsys.readouterr().err, a, b, reason)
    assert not out.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_translate_refuses_checkpoints_of_different_runs(tmp_path, tokenizer, other_tokenizer,
                                                         kind, capsys):
    a, b, reason = different_pair(kind, tmp_path, tokenizer, other_tokenizer)
    source = tmp_path / "in.txt"
    source.write_text("\n".join(SOURCES) + "\n")
    status = cli.main(["translate", "--checkpoint", str(a), str(b), "--input", str(source),
                       "--device", "cpu"])
    captured = capsys.readouterr()
    check_refused(status, captured.err, a, b, reason)
    assert captured.out == ""


def test_the_average_checkpoints_command_keeps_the_run_id(tmp_path, tokenizer, capsys):
    paths = [ckpt.numbered_checkpoint_path(tmp_path, n) for n in (1, 2)]
    states = [save_model(path, tokenizer, run_id="run1", seed=n)
              for n, path in enumerate(paths)]
    out = tmp_path / "averaged.pt"
    assert cli.main(["average-checkpoints", str(tmp_path), "-o", str(out)]) == 0
    averaged = ckpt.load_checkpoint(out)
    assert averaged["run_id"] == "run1"
    torch.testing.assert_close(averaged["model"][KEY],
                               (states[0]["model"][KEY] + states[1]["model"][KEY]) / 2)


def test_tune_decoding_and_prune_heads_keep_the_run_id(tmp_path, tokenizer, capsys):
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    for n in (1, 2):
        save_model(ckpt.numbered_checkpoint_path(folder, n), tokenizer, run_id="run1", seed=n)
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(SOURCES) + "\n")
    ref.write_text("\n".join(SOURCES) + "\n")
    chosen, pruned = tmp_path / "chosen.pt", tmp_path / "pruned.pt"
    assert cli.main(["tune-decoding", str(tmp_path / "run"), "-o", str(chosen), "--src",
                     str(src), "--ref", str(ref), "--last", "1", "2", "--alpha", "1",
                     "--beam-size", "1", "--device", "cpu"]) == 0
    assert cli.main(["prune-heads", "--checkpoint", str(chosen), "--src", str(src), "--ref",
                     str(ref), "--fraction", "0.25", "--output", str(pruned),
                     "--device", "cpu"]) == 0
    capsys.readouterr()
    assert ckpt.load_checkpoint(chosen)["run_id"] == "run1"
    assert ckpt.load_checkpoint(pruned)["run_id"] == "run1"


@pytest.mark.usefixtures("one_thread")
def test_a_resumed_run_keeps_its_run_id_and_a_new_run_has_another(tmp_path, multi30k_dir,
                                                                   spm_model):
    """Two runs of one update each; the first resumed for one more: its checkpoints before
    and after the resume share its id and average; the other run's are refused."""
    small = ["experiment=smoke", f"data.root={multi30k_dir}", f"data.spm_model={spm_model}",
             "data.vocab_size=500", "data.max_train_pairs=100", "data.max_tokens=512",
             "model.num_hiddens=32", "model.ffn_num_hiddens=64", "model.num_encoder_layers=1",
             "model.num_decoder_layers=1", "model.num_heads=2", "trainer.bleu_max_sentences=4",
             "trainer.precision=fp32", "trainer.keep_last=0"]
    first, other = tmp_path / "first", tmp_path / "other"
    train(compose_config(small + ["trainer.max_updates=1"]), first)
    last = first / "checkpoints" / ckpt.LAST
    before = tmp_path / "before.pt"
    ckpt.copy_checkpoint(last, before)
    train(compose_config(small + ["trainer.max_updates=2", "trainer.resume=true"]), first)
    train(compose_config(small + ["trainer.max_updates=1"]), other)
    run_id = ckpt.load_checkpoint(before)["run_id"]
    assert isinstance(run_id, str) and len(run_id) == 32 and int(run_id, 16) >= 0
    assert ckpt.load_checkpoint(last)["train_state"]["num_updates"] == 2
    assert ckpt.load_checkpoint(last)["run_id"] == run_id
    other_id = ckpt.load_checkpoint(other / "checkpoints" / ckpt.LAST)["run_id"]
    assert other_id not in (None, run_id)
    assert ckpt.average_weights([before, last])["run_id"] == run_id
    with pytest.raises(CheckpointError, match="different training runs"):
        ckpt.average_weights([last, other / "checkpoints" / ckpt.LAST])
