"""The training loop end to end, on small slices of Multi30k with small models: smoke preset,
exact resume, SIGTERM, torchrun/DDP, data=files, non-finite losses, schedule, accumulation."""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer import cli, hardware
from transformer.cli import plot_curves as plot_curves_command
from transformer.data.tokenizer import PAD_ID
from transformer.errors import ConfigError, TrainingError
from transformer.model.loss import LabelSmoothedLoss
from transformer.model.transformer import ModelConfig, Transformer
from transformer.run import checkpoint as ckpt
from transformer.run.compose import compose_config
from transformer.runtime import (
    DistEnv,
    cpu_has_native_bf16,
    peak_resident_bytes,
    resolve_precision,
)
from transformer.tools.plots import validation_curve
from transformer.training.optimizer import build_optimizer, decayed_parameters
from transformer.training.schedule import lr_lambda
from transformer.training.trainer import Trainer, train

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

REPO = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = str(REPO / "scripts/train.py")
# One thread per process: these models are too small to gain from two, and on a shared
# machine OpenMP's spin-waiting threads made runs up to 6x slower when a core was busy.
ONE_THREAD_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture
def small(multi30k_dir, spm_model) -> list[str]:
    """Overrides for a run of a few seconds: 300 pairs, a 2+2-layer d64 model, float32
    (tests compare sums of losses and gradients exactly; `auto` would pick bf16 on a CPU
    that has it), and the recipe's schedule shortened to fit, not fitted to the budget
    (test_schedule.py tests that)."""
    return [
        "model=tiny", f"data.root={multi30k_dir}", f"data.spm_model={spm_model}",
        "data.vocab_size=500", "data.max_train_pairs=300", "data.max_tokens=1024",
        "model.num_hiddens=64", "model.ffn_num_hiddens=128", "model.num_encoder_layers=2",
        "model.num_decoder_layers=2", "model.dropout=0.3",
        "optim.lr=0.002", "optim.warmup_updates=10", "optim.cooldown_updates=0",
        "optim.cooldown=0", "optim.warmup_fraction=null", "trainer.validate_after_budget=0",
        "trainer.max_time=null",
        "trainer.bleu_max_sentences=16", "trainer.log_every_updates=1", "trainer.keep_last=2",
        "trainer.precision=fp32", "trainer.validate_every_updates=0",
        "trainer.validate_after_updates=0",
    ]


def scalars(run_dir: Path) -> dict[str, list[float]]:
    """TensorBoard scalars of a run, read back from its event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_smoke_experiment_learns_and_writes_the_run_directory(tmp_path, multi30k_dir):
    cfg = compose_config([
        "experiment=smoke", f"data.root={multi30k_dir}",
        # The preset itself runs ~1 minute; a shorter cut of it keeps the suite fast.
        "data.max_train_pairs=1000", "trainer.max_updates=12",
        "trainer.validate_every_updates=6", "trainer.bleu_max_sentences=20",
        "trainer.log_every_updates=2"])
    result = train(cfg, tmp_path)

    assert result.stop_reason == "max_updates" and result.state.num_updates == 12
    losses = result.losses
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses  # it learns

    for name in ("config.yaml", "spm.model", "train.log", "checkpoints/checkpoint_last.pt",
                 "checkpoints/checkpoint_best.pt", "checkpoints/checkpoint_6.pt",
                 "checkpoints/checkpoint_12.pt"):
        assert (tmp_path / name).is_file(), name
    log_text = (tmp_path / "train.log").read_text()
    assert log_text.count("| valid loss") == 2 and "bleu" in log_text and "tok/s" in log_text
    # the last line: the process's peak resident memory, as /proc/self/status has it now
    resident = float(re.search(r"peak resident memory ([0-9.]+) GiB", log_text)[1])
    assert 0.05 < resident <= peak_resident_bytes() / 2**30 + 0.005

    state = ckpt.load_checkpoint(tmp_path / "checkpoints/checkpoint_last.pt")
    assert state["train_state"]["num_updates"] == 12
    model = ckpt.model_from_checkpoint(state)
    assert model.config.src_vocab_size == ckpt.tokenizers_from_state(state).src.vocab_size == 1000
    assert state["config"]["optim"]["lr"] == cfg.optim.lr == 0.002  # the smoke preset

    tb = scalars(tmp_path)
    for tag in ("train/loss", "train/lr", "train/gnorm", "train/tokens_per_s", "valid/loss",
                "valid/nll", "valid/ppl", "valid/bleu", "valid/chrf"):
        assert tag in tb, tag
    assert len(tb["train/loss"]) == 6 and len(tb["valid/bleu"]) == 2
    assert tb["train/lr"][0] < tb["train/lr"][-1]  # warming up

    curve = validation_curve(tmp_path)  # what `transformer plot-curves` draws
    assert curve.bleu == tb["valid/bleu"] and curve.loss == tb["valid/loss"]
    assert len(curve.minutes) == 2 and 0 < curve.minutes[0] < curve.minutes[1]
    assert curve.updates == sorted(curve.updates) and curve.updates[-1] == 12
    assert curve.target_tokens[-1] == pytest.approx(result.state.target_tokens)  # tokens axis
    assert 0 < curve.target_tokens[0] < curve.target_tokens[1]
    png = tmp_path / "plot" / "bleu.png"
    assert plot_curves_command.main([str(tmp_path), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert plot_curves_command.main([str(tmp_path / "plot"), "-o", str(png)]) == 1  # no logs


def test_resume_continues_with_identical_losses(tmp_path, small):
    """8 updates straight == 4 updates, stop, resume for 4 more: same losses (dropout on,
    gradient accumulation, the resume point in the middle of an epoch)."""
    common = small + ["optim.update_freq=2"]
    straight = train(compose_config(common + ["trainer.max_updates=8"]), tmp_path / "a")
    first = train(compose_config(common + ["trainer.max_updates=4"]), tmp_path / "b")
    assert first.state.batches_done > 0  # stopped mid-epoch
    second = train(compose_config(common + ["trainer.max_updates=8", "trainer.resume=true"]),
                   tmp_path / "b")
    assert second.state.epoch > first.state.epoch  # crossed an epoch boundary
    assert len(straight.losses) == 8
    assert first.losses + second.losses == straight.losses
    a = ckpt.load_checkpoint(tmp_path / "a/checkpoints/checkpoint_last.pt")["model"]
    b = ckpt.load_checkpoint(tmp_path / "b/checkpoints/checkpoint_last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_no_epoch_validation_before_validate_after_updates(tmp_path, small):
    """Epochs that end before trainer.validate_after_updates write checkpoint_last.pt only;
    later ones validate and keep numbered checkpoints. trainer.validate_every_updates
    validates from the start (a sparse curve), with a numbered checkpoint each time."""
    result = train(compose_config(small + ["trainer.max_updates=40",
                                           "trainer.validate_after_updates=25",
                                           "trainer.validate_every_updates=10",
                                           "trainer.keep_last=20"]), tmp_path)
    log_text = (tmp_path / "train.log").read_text()
    numbered = sorted(int(p.stem.split("_")[1])
                      for p in (tmp_path / "checkpoints").glob("checkpoint_[0-9]*.pt"))
    validated = [int(line.split("| update ")[1].split(" |")[0])
                 for line in log_text.splitlines() if "| valid loss" in line]
    assert validated == numbered and numbered[-1] == 40 == result.state.num_updates
    assert [n for n in numbered if n < 25] == [10, 20]  # only validate_every_updates
    late = [n for n in numbered if n >= 25 and n % 10]
    assert late, "the epochs ending after update 25 validate"
    assert result.state.last_validation == 40
    assert result.state.target_tokens > 0 and f"{result.state.target_tokens:,} target tokens" \
        in log_text


def test_validation_shares_the_batch_tokens_between_the_searches_it_runs_at_once(
        tmp_path, small, monkeypatch):
    """Validation's greedy search takes batches of data.max_tokens source tokens divided by
    the CPU threads, each searching a batch of its own (each holds its decoding caches);
    trainer.decode_max_tokens, where set, is the size of each."""
    from transformer.training import validation

    asked = []

    def search_corpus(*args, max_tokens, **kwargs):
        asked.append(max_tokens)
        return real(*args, max_tokens=max_tokens, **kwargs)

    real = validation.search_corpus
    monkeypatch.setattr(validation, "search_corpus", search_corpus)
    for overrides, threads in (([], 2), ([], 1), (["trainer.decode_max_tokens=300"], 2)):
        trainer = Trainer(compose_config(small + overrides), tmp_path / f"{len(asked)}",
                          DistEnv())
        try:
            with hardware.threads_restored():
                hardware.set_threads(threads)
                trainer.validate()
        finally:
            trainer.close()
    assert asked == [512, 1024, 300]  # data.max_tokens=1024


def test_precision_auto_takes_bf16_on_a_cpu_only_where_it_computes_bf16(tmp_path, small,
                                                                        monkeypatch):
    """`auto` asks PyTorch's CPU probes: with AVX512-BF16 and AMX forced off a run trains in
    float32 and says why; with one of them on it trains under bf16 autocast."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert not cpu_has_native_bf16()
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu).dtype is None
    train(compose_config(small + ["trainer.precision=auto", "trainer.max_updates=1"]), tmp_path)
    assert "device cpu, float32 (auto: no native bf16 on cpu)" in \
        (tmp_path / "train.log").read_text()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert resolve_precision("auto", cpu).dtype == torch.bfloat16
    assert resolve_precision("fp32", cpu).dtype is None  # an explicit choice wins


def test_train_on_a_device_the_machine_lacks_is_a_one_line_error(tmp_path, monkeypatch,
                                                                 capsys):
    """`transformer train trainer.device=cuda` without a GPU: one line naming the key, exit
    status 1, before any data is read or anything written in the run directory."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["transformer"])  # the command rewrites it
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "trainer.device=cuda", "data.root=/nonexistent",
                  f"hydra.run.dir={run_dir}"])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == \
        "error: trainer.device=cuda but this machine has no CUDA device\n"
    assert not (run_dir / "train.log").exists() and not (run_dir / "checkpoints").exists()
    with pytest.raises(ConfigError, match=r"^trainer.device=cuda:1 but this machine has no"):
        train(compose_config(["trainer.device=cuda:1"]), tmp_path / "api")


def test_resume_requires_a_checkpoint_and_the_same_model(tmp_path, small):
    with pytest.raises(ckpt.CheckpointError, match="no .*checkpoint_last.pt"):
        train(compose_config(small + ["trainer.resume=true"]), tmp_path)
    train(compose_config(small + ["trainer.max_updates=1"]), tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="model.num_hiddens: checkpoint has 64"):
        train(compose_config(small + ["trainer.max_updates=2", "model.num_hiddens=32"]),
              tmp_path)


def _wait_for(predicate, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"process exited early:\n{proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out")
        time.sleep(0.2)


def test_sigterm_saves_checkpoint_and_resume_continues(tmp_path, small):
    run_dir = tmp_path / "run"
    overrides = small + ["trainer.max_updates=100000"]
    proc = subprocess.Popen([sys.executable, TRAIN_SCRIPT, *overrides,
                             f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=ONE_THREAD_ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = run_dir / "train.log"
    _wait_for(lambda: log.is_file() and "| update 3 |" in log.read_text(), 120, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "SIGTERM received" in log.read_text() and "stopped (signal)" in log.read_text()

    state = ckpt.load_checkpoint(run_dir / "checkpoints/checkpoint_last.pt")
    done = state["train_state"]["num_updates"]
    assert done >= 3
    result = train(compose_config(small + [f"trainer.max_updates={done + 2}"]), run_dir)
    assert result.state.num_updates == done + 2 and len(result.losses) == 2
    assert f"{done} updates" in log.read_text().split("resumed from")[1].splitlines()[0]


def test_torchrun_two_cpu_processes(tmp_path, small):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         TRAIN_SCRIPT, *small, "trainer.max_updates=3", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, env=ONE_THREAD_ENV, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    log_text = (run_dir / "train.log").read_text()
    assert "world size 2" in log_text
    assert log_text.count("| valid loss") == 1  # rank 0 alone logs
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "checkpoint_3.pt", "checkpoint_best.pt", "checkpoint_last.pt"]
    state = ckpt.load_checkpoint(run_dir / "checkpoints/checkpoint_last.pt")
    assert state["train_state"]["num_updates"] == 3
    assert len(state["rng"]) == 2  # both ranks' RNG states, for an exact resume


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_nodes_end_with_identical_parameters(tmp_path, small):
    """Two "nodes" on 127.0.0.1 (c10d rendezvous, gloo, one process each), as on two
    machines: rank 0 prepares the data first, the other node's first rank then finds it
    ready; both train 3 updates and hold the same parameters as the checkpoint."""
    port = _free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
               "--nproc-per-node=1", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=test-two-nodes",
               "--max-restarts=0", str(REPO / "tests/torchrun_worker.py"),
               str(tmp_path / "run"), str(tmp_path), *small, "trainer.max_updates=3"]
    nodes = [subprocess.Popen(command, cwd=tmp_path, env=ONE_THREAD_ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    try:
        outputs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert [r["num_updates"] for r in ranks] == [3, 3]
    saved = ckpt.load_checkpoint(tmp_path / "run/checkpoints/checkpoint_last.pt")["model"]
    for name, value in saved.items():
        assert torch.equal(ranks[0]["model"][name], value), name
        assert torch.equal(ranks[1]["model"][name], value), name


def test_kill_mid_epoch_resumes_from_the_last_periodic_checkpoint(tmp_path, small):
    """trainer.save_every_updates=4: a run killed (SIGKILL, no chance to save) in the middle
    of an epoch resumes from its last multiple of 4 updates, and the losses from there on are
    those of a run that was never interrupted."""
    common = [o for o in small if not o.startswith(("data.max_train_pairs", "data.max_tokens"))]
    common += ["data.max_tokens=256", "trainer.save_every_updates=4"]
    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, TRAIN_SCRIPT, *common, "trainer.max_updates=100000",
                             f"hydra.run.dir={run}"], cwd=tmp_path, env=ONE_THREAD_ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = run / "train.log"
    _wait_for(lambda: log.is_file() and "| update 10 |" in log.read_text(), 120, proc)
    proc.kill()
    proc.communicate(timeout=60)
    state = ckpt.load_checkpoint(run / "checkpoints/checkpoint_last.pt")["train_state"]
    done = state["num_updates"]
    assert done >= 8 and done % 4 == 0
    assert state["epoch"] == 1 and state["batches_done"] == done  # mid-epoch (~190 batches)
    resumed = train(compose_config(common + [f"trainer.max_updates={done + 6}"]), run)
    straight = train(compose_config(common + [f"trainer.max_updates={done + 6}"]),
                     tmp_path / "straight")
    assert len(resumed.losses) == 6
    assert resumed.losses == straight.losses[done:]


def files_overrides(tmp_path: Path, multi30k_lines, train_pairs: int) -> list[str]:
    """`data.*_src/_tgt=...` overrides for plain files holding the slice's first
    `train_pairs` training and 30 validation pairs (en-de), for `data=files` runs."""
    overrides = []
    for split, stem, n in (("train", "train", train_pairs), ("valid", "val", 30)):
        for side, lang in (("src", "en"), ("tgt", "de")):
            path = tmp_path / f"{split}.{lang}"
            path.write_text("\n".join(multi30k_lines(f"{stem}.{lang}.gz")[:n]) + "\n")
            overrides.append(f"data.{split}_{side}={path}")
    return overrides


def test_smoke_experiment_with_data_files(tmp_path, multi30k_lines, small):
    """experiment=smoke composes with data=files: a quick check of one's own corpus."""
    paths = files_overrides(tmp_path, multi30k_lines, train_pairs=200)
    overrides = [o for o in small if not o.startswith("data.root")]
    cfg = compose_config(["experiment=smoke", "data=files", *overrides,
                          *paths, "trainer.max_updates=2"])
    assert cfg.data.name == "files" and cfg.trainer.max_epochs == 2  # from the preset
    result = train(cfg, tmp_path / "run")
    assert result.state.num_updates == 2
    assert (tmp_path / "run/checkpoints/checkpoint_best.pt").is_file()


def test_large_experiment_on_data_files_validates_by_updates_only(tmp_path, multi30k_lines,
                                                                   spm_model):
    """experiment=large with data=files (a small model here): validation every N updates and
    at the end, never at epoch ends; checkpoint_last.pt in between."""
    paths = files_overrides(tmp_path, multi30k_lines, train_pairs=60)
    cfg = compose_config(["experiment=large", "data=files",
                          *paths,
                          f"data.spm_model={spm_model}", "data.vocab_size=500",
                          "data.max_tokens=512", "model.num_hiddens=32",
                          "model.ffn_num_hiddens=64", "model.num_heads=2",
                          "model.num_encoder_layers=1", "model.num_decoder_layers=1",
                          "optim.warmup_updates=10", "trainer.validate_every_updates=4",
                          "trainer.max_updates=10", "trainer.bleu_max_sentences=8",
                          "trainer.log_every_updates=1"])
    result = train(cfg, tmp_path / "run")
    assert result.state.num_updates == 10 and result.state.epoch > 1  # crossed epoch ends
    log_text = (tmp_path / "run/train.log").read_text()
    validated = [int(line.split("| update ")[1].split(" |")[0])
                 for line in log_text.splitlines() if "| valid loss" in line]
    assert validated == [4, 8, 10]
    numbered = sorted(int(p.stem.split("_")[1])
                      for p in (tmp_path / "run/checkpoints").glob("checkpoint_[0-9]*.pt"))
    assert numbered == [4, 8, 10]


def _nan_after(monkeypatch, bad_attempts: set[int]) -> None:
    """Make the loss NaN on the given (0-based) update attempts."""
    original = Trainer.batch_loss
    attempts = {"n": 0}
    original_step = Trainer.train_step

    def train_step(self, batches):
        out = original_step(self, batches)
        attempts["n"] += 1
        return out

    def batch_loss(self, batch):
        loss = original(self, batch)
        return loss * math.nan if attempts["n"] in bad_attempts else loss

    monkeypatch.setattr(Trainer, "train_step", train_step)
    monkeypatch.setattr(Trainer, "batch_loss", batch_loss)


def test_nonfinite_loss_skips_the_update(tmp_path, small, monkeypatch):
    _nan_after(monkeypatch, {2})
    result = train(compose_config(small + ["trainer.max_updates=4"]), tmp_path)
    assert result.state.num_updates == 4 and result.state.bad_updates == 1
    assert "non-finite loss" in (tmp_path / "train.log").read_text()


def test_nonfinite_losses_in_a_row_stop_with_last_good_checkpoint(tmp_path, small, monkeypatch):
    _nan_after(monkeypatch, set(range(2, 100)))
    cfg = compose_config(small + ["trainer.max_updates=50", "trainer.validate_every_updates=2",
                                  "trainer.max_bad_updates=3"])
    with pytest.raises(TrainingError, match="3 updates in a row.*trainer.max_bad_updates=3"):
        train(cfg, tmp_path)
    state = ckpt.load_checkpoint(tmp_path / "checkpoints/checkpoint_last.pt")
    assert state["train_state"]["num_updates"] == 2
    assert all(torch.isfinite(v).all() for v in state["model"].values())


TINY = dict(num_hiddens=16, ffn_num_hiddens=32, num_heads=2, num_encoder_layers=1,
            num_decoder_layers=1)


def test_weight_decay_applies_to_the_weight_matrices_only():
    """The linear layers' weight matrices are decayed; embeddings (the output projection
    tied to one), biases and LayerNorm parameters are not. An untied projection is a weight
    matrix like any other."""
    tied = Transformer(ModelConfig(src_vocab_size=50, tgt_vocab_size=50, **TINY))
    assert decayed_parameters(tied) == [
        f"{block}.{layer}.weight"
        for block, attentions in (("encoder.blks.0", ["attention"]),
                                  ("decoder.blks.0", ["attention1", "attention2"]))
        for layer in [f"{a}.{w}" for a in attentions for w in ("W_q", "W_k", "W_v", "W_o")]
        + ["ffn.dense1", "ffn.dense2"]]
    untied = Transformer(ModelConfig(src_vocab_size=50, tgt_vocab_size=60,
                                     share_embeddings=False, tie_output=False, **TINY))
    assert set(decayed_parameters(untied)) == set(decayed_parameters(tied)) | {
        "output_projection.weight"}


@pytest.mark.parametrize("name, decay", [("adamw", 0.1), ("adam", 0.0)])
def test_an_update_decays_exactly_the_decayed_parameters(name, decay):
    """One update with zero gradients: AdamW shrinks each decayed matrix by lr * decay
    and leaves every other parameter as it was; without decay nothing moves."""
    cfg = compose_config([f"optim={name}", f"optim.weight_decay={decay}", "optim.lr=0.5",
                          "optim.warmup_updates=0"])
    model = Transformer(ModelConfig(src_vocab_size=50, tgt_vocab_size=50, **TINY))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = build_optimizer(model, cfg)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    decayed = set(decayed_parameters(model))
    for n, p in model.named_parameters():
        factor = 1 - 0.5 * decay if n in decayed else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor, msg=n)


def test_inverse_sqrt_schedule_with_warmup():
    f = lr_lambda("inverse_sqrt", 4)
    assert [f(n) for n in range(4)] == [0.25, 0.5, 0.75, 1.0]  # linear warmup to the peak
    assert f(15) == pytest.approx(math.sqrt(4 / 16))  # then 1/sqrt(update)
    assert lr_lambda("constant", 4)(100) == 1.0


def test_cooldown_decays_linearly_over_the_last_updates():
    plain = lr_lambda("inverse_sqrt", 4)
    f = lr_lambda("inverse_sqrt", 4, max_updates=20, cooldown_updates=4)
    assert [f(n) for n in range(16)] == [plain(n) for n in range(16)]  # updates 1-16
    start = plain(15)  # update 16, the last at the full schedule
    assert [f(n) for n in range(16, 20)] == pytest.approx([start * k / 5 for k in (4, 3, 2, 1)])
    with pytest.raises(ValueError, match="cooldown needs max_updates"):
        lr_lambda("constant", 4, None, 3)


def test_cooldown_added_on_resume_equals_the_run_with_it_from_the_start(tmp_path, small):
    """A run stopped before its cooldown and resumed with one continues as if the cooldown
    had been configured from the start: the resumed lr follows the new schedule."""
    cool = ["trainer.max_updates=8", "optim.cooldown_updates=4"]
    straight = train(compose_config(small + cool), tmp_path / "a")
    first = train(compose_config(small + ["trainer.max_updates=4"]), tmp_path / "b")
    second = train(compose_config(small + cool), tmp_path / "b")
    assert first.losses + second.losses == straight.losses
    a = ckpt.load_checkpoint(tmp_path / "a/checkpoints/checkpoint_last.pt")
    b = ckpt.load_checkpoint(tmp_path / "b/checkpoints/checkpoint_last.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    lrs = scalars(tmp_path / "a")["train/lr"]  # one per update (log_every_updates=1)
    assert len(lrs) == 8 and lrs[4] > lrs[5] > lrs[6] > lrs[7] > 0
    assert lrs[7] == pytest.approx(lrs[3] / 5, rel=1e-3)


def test_training_loss_equals_cross_entropy_over_the_real_target_tokens():
    """LabelSmoothedLoss (fused projection) = CrossEntropyLoss over the model's logits at the
    non-pad positions: the same value and the same gradient for every parameter."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab_size=30, tgt_vocab_size=30, num_hiddens=16,
                                    ffn_num_hiddens=32, num_heads=2, num_encoder_layers=1,
                                    num_decoder_layers=2, dropout=0.0))
    src, tgt = torch.randint(4, 30, (3, 7)), torch.randint(4, 30, (3, 6))
    src_lens = torch.tensor([7, 4, 2])
    tgt[1, 4:] = tgt[2, 2:] = PAD_ID
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    ours = LabelSmoothedLoss(model, 0.1)(src, src_lens, tgt_in, tgt_out)
    ours.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    logits = model(src, src_lens, tgt_in)  # (3, 5, 30)
    ref = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(),
                                            ignore_index=PAD_ID, reduction="sum",
                                            label_smoothing=0.1)
    ref.backward()
    torch.testing.assert_close(ours, ref)
    assert (tgt_out != PAD_ID).sum() == 9  # 15 positions, 6 of them padding
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=name)
    # The real-token positions given from the host select the same rows: bit for bit.
    model.zero_grad()
    tgt_index = (tgt_out != PAD_ID).flatten().nonzero().squeeze(1)
    given = LabelSmoothedLoss(model, 0.1)(src, src_lens, tgt_in, tgt_out, tgt_index)
    given.backward()
    assert torch.equal(given, ours)
    assert all(torch.equal(grads[name], p.grad) for name, p in model.named_parameters())


def test_accumulated_batches_equal_one_big_batch(tmp_path, small):
    """update_freq sums the losses and divides by all target tokens of the update."""
    cfg = compose_config(small + ["model.dropout=0.0", "optim.label_smoothing=0.1"])
    trainer = Trainer(cfg, tmp_path, DistEnv())
    assert len(trainer.data.train) == 300  # data.max_train_pairs
    try:
        params = list(trainer.model.parameters())
        initial = [p.detach().clone() for p in params]
        grads = []

        def record_and_undo_step(*_):  # keep the gradients, keep the parameters unchanged
            grads.append([p.grad.clone() for p in params])
            with torch.no_grad():
                for p, p0 in zip(params, initial, strict=True):
                    p.copy_(p0)

        trainer.optimizer.register_step_post_hook(record_and_undo_step)
        idx = trainer.data.train_batches(1)[:2]
        corpus = trainer.data.train
        trainer.train_step([corpus.collate(idx[0]), corpus.collate(idx[1])])
        trainer.train_step([corpus.collate(np.concatenate(idx))])
    finally:
        trainer.close()
    assert trainer.losses[0] == pytest.approx(trainer.losses[1], rel=1e-5)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
