"""The package as a user gets it: a wheel built from this checkout, installed into a fresh
virtual environment, and the main commands run from a folder outside the checkout.

The new environment reuses this one's packages (torch, sentencepiece, ...) through a `.pth`
file, as `--system-site-packages` would for a system Python, but never the checkout: an
editable install's own `.pth` is not read from there, and PYTHONPATH is dropped. So a command
that needs a file of the checkout (a config, the attention page, a script) fails here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port, reusing_venv, wait_until_up

REPO = Path(__file__).resolve().parents[1]
SLICE = REPO / "tests" / "data" / "multi30k"

# A user's own preset, found through --config-dir: a small model trained for two epochs.
USER_EXPERIMENT = """\
# @package _global_
model:
  num_hiddens: 32
  ffn_num_hiddens: 64
  num_heads: 2
  num_encoder_layers: 1
  num_decoder_layers: 1
data:
  vocab_size: 500
  max_train_pairs: 600
  max_tokens: 1024
optim:
  lr: 0.003
  warmup_updates: 20
trainer:
  max_epochs: 2
  bleu_max_sentences: 20
  keep_last: 2
  device: cpu
"""


class Installed:
    """The fresh environment and a working folder outside the checkout."""

    def __init__(self, root: Path, work: Path) -> None:
        self.bin = root / "venv" / "bin"
        self.work = work
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.env["PATH"] = f"{self.bin}{os.pathsep}{self.env['PATH']}"
        self.env["OMP_NUM_THREADS"] = "1"

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        """Run a command of the fresh environment in the working folder; it must succeed."""
        result = subprocess.run(list(args), cwd=self.work, env=self.env, capture_output=True,
                                text=True, timeout=timeout)
        assert result.returncode == 0, f"{args}: {result.stdout[-3000:]}{result.stderr[-3000:]}"
        return result


def build_wheel(root: Path) -> Path:
    """`pip wheel` of a copy of what the wheel is built from (pyproject, README, LICENSE,
    src/), so the build leaves nothing in the checkout."""
    source = root / "source"
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "--wheel-dir", str(root / "dist"), str(source)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (root / "dist").glob("transformer-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(root)
    python = reusing_venv(root / "venv")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--quiet", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    work = root / "work"
    shutil.copytree(SLICE, work / "multi30k")  # the user's data, not the checkout's
    (work / "my_configs" / "experiment").mkdir(parents=True)
    (work / "my_configs" / "experiment" / "mini.yaml").write_text(USER_EXPERIMENT)
    return Installed(root, work)


def test_the_installed_package_comes_from_the_wheel(installed):
    where = installed.run("python", "-c", "import transformer; print(transformer.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(installed.bin.parent)
    assert not Path(where.stdout.strip()).is_relative_to(REPO)
    assert "translate" in installed.run("transformer", "--help").stdout
    assert "tune-decoding" in installed.run("python", "-m", "transformer", "--help").stdout


def test_train_translate_tune_export_and_serve_from_the_wheel(installed):
    run = installed.run
    run("transformer", "train", "--config-dir", "my_configs", "experiment=mini",
        "data.root=multi30k", "hydra.run.dir=run")
    checkpoints = installed.work / "run" / "checkpoints"
    assert (checkpoints / "checkpoint_best.pt").is_file()
    assert len(list(checkpoints.glob("checkpoint_[0-9]*.pt"))) == 2  # one per epoch

    lines = [f"A man number {i} rides a bike." for i in range(5)]
    (installed.work / "in.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run("transformer", "translate", "--checkpoint", "run", "--input", "in.en", "--output",
        "out.de", "--beam-size", "2")
    assert len((installed.work / "out.de").read_text(encoding="utf-8").splitlines()) == 5

    run("transformer", "average-checkpoints", "run/checkpoints", "--last", "2", "-o", "avg.pt")
    tuned = run("transformer", "tune-decoding", "run", "-o", "chosen.pt", "--last", "1", "2",
                "--alpha", "1.0", "1.5", "--beam-size", "2", "--max-sentences", "20")
    assert "chosen: the average of the last" in tuned.stdout

    run("transformer", "export", "--checkpoint", "chosen.pt", "--output", "ct2")
    run("transformer", "translate", "--engine", "ctranslate2", "--checkpoint", "ct2",
        "--input", "in.en", "--output", "ct2.de")
    assert len((installed.work / "ct2.de").read_text(encoding="utf-8").splitlines()) == 5

    port, log = free_port(), installed.work / "server.log"
    with open(log, "w") as output:
        server = subprocess.Popen(["transformer", "serve", "--checkpoint", "chosen.pt",
                                   "--port", str(port), "--threads", "1"], cwd=installed.work,
                                  env=installed.env, stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_until_up(server, f"http://127.0.0.1:{port}", log)  # /health says "ok"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as page:
            assert b"<html" in page.read().lower()  # the page: package data of the wheel
    finally:
        server.terminate()
        server.wait(timeout=30)
