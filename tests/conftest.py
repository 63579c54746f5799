"""Shared pytest fixtures.

Most tests read the small slice of Multi30k in `tests/data/multi30k` (its README says what it
is), so the suite runs from a bare clone. The few that need the whole corpus ask for the
`full_multi30k` fixture: `$MULTI30K_DIR`, else `../shared/data/multi30k` beside the
repository, else the package's download cache (downloaded with checksums if missing). Where
none of these can be had, those tests fail and say how to provide the data.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hypothesis import settings

    from transformer.data.tokenizer import Tokenizer
    from transformer.model.transformer import Transformer

REPO = Path(__file__).resolve().parents[1]
MULTI30K_SLICE = REPO / "tests" / "data" / "multi30k"
SHARED_MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
FULL_LANGS = ("en", "de", "fr")  # what the full-corpus tests read, raw and tokenized
# The target tokens of one epoch of Multi30k's training set (EOS included) under the recipe's
# 8,000-piece joint SentencePiece model: what the Multi30k preset's budgets make epochs of
# (checked against the whole corpus by tests/test_schedule.py where it is at hand).
MULTI30K_EPOCH_TOKENS = 471_603
XDIST_WORKER = "PYTEST_XDIST_WORKER"  # set in the worker processes of `pytest -n N`


def pytest_configure(config: pytest.Config) -> None:
    """In pytest-xdist's workers (the README's `pytest -n 2`), torch's operators and the
    commands the tests start run on one thread each: two workers of two OpenMP threads on
    two cores would leave every operator waiting for a thread that lost its core."""
    if XDIST_WORKER in os.environ:
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Every test leaves torch's thread count as it found it (commands run in-process set
    it from their `--threads`), so that the tests after it run on the threads chosen above."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], object]) -> Path:
    """The file `name`, made by `build(path)` once per test run: under pytest-xdist the
    first worker to ask builds it, under a lock, in the folder all the run's workers share,
    and the others wait for it and read it, instead of each training the same model."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if XDIST_WORKER in os.environ:
        root = root.parent  # the run's folder, above each worker's own
    path = root / name
    with FileLock(f"{path}.lock"):
        if not path.exists():
            build(path)
    return path


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The slice of Multi30k (train 3,000 / val 300 / test_2016_flickr 300 pairs, en and
    de), laid out as the full dataset: usable as `data.root`."""
    return MULTI30K_SLICE


def _read_gz(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode("utf-8").split("\n")[:-1]


@pytest.fixture(scope="session")
def multi30k_lines():
    """A function: Multi30k file name of the slice (e.g. "val.en.gz") -> its lines."""
    return lambda name: _read_gz(MULTI30K_SLICE / name)


@pytest.fixture(scope="session")
def spm_model(multi30k_lines, tmp_path_factory) -> Path:
    """A small joint SentencePiece model (vocab 500) of the slice, shared so that training
    runs skip training one."""
    from transformer.data.tokenizer import Tokenizer

    texts = multi30k_lines("train.en.gz")[:2000] + multi30k_lines("train.de.gz")[:2000]
    path = tmp_path_factory.mktemp("spm") / "spm500.model"
    Tokenizer.train(texts, path, vocab_size=500)
    return path


def _has_full_corpus(root: Path) -> bool:
    from transformer.data.multi30k import SHA256

    wanted = [name for name in SHA256
              if name.removesuffix(".gz").rsplit(".", 1)[-1] in FULL_LANGS]
    return all((root / name).is_file() for name in wanted)


@pytest.fixture(scope="session")
def full_multi30k() -> Path:
    """The whole Multi30k (en/de/fr: the raw files and the tokenized ones, tok/)."""
    from transformer.data.multi30k import DEFAULT_ROOT, download_multi30k

    candidates = [Path(os.environ["MULTI30K_DIR"])] if os.environ.get("MULTI30K_DIR") else []
    candidates += [SHARED_MULTI30K, Path(DEFAULT_ROOT).expanduser()]
    for root in candidates:
        if _has_full_corpus(root):
            return root
    cache = Path(DEFAULT_ROOT).expanduser()
    try:
        download_multi30k(cache, FULL_LANGS)
        download_multi30k(cache, FULL_LANGS, tokenized=True)
        return cache
    except (OSError, ValueError) as e:  # no network (DataError), a full disk (WriteError)
        error = e
    pytest.fail(
        f"this test needs the whole Multi30k corpus and could not download it ({error}). "
        f"Put the files of multi30k/dataset data/task1/raw/ ({', '.join(FULL_LANGS)}) and "
        "data/task1/tok/ into ../shared/data/multi30k beside the repository, or into the "
        "folder named by $MULTI30K_DIR, or allow the download.", pytrace=False)


@pytest.fixture(scope="session")
def full_multi30k_lines(full_multi30k):
    """A function: file name of the whole corpus (e.g. "train.en.gz") -> its lines."""
    return lambda name: _read_gz(full_multi30k / name)


@pytest.fixture(scope="session")
def multi30k_tokenizer_path(tmp_path_factory) -> Path:
    """A SentencePiece model with the default data settings but a 2,000-piece vocabulary
    (joint en+de, unigram), trained once per session on the slice's training split."""
    from transformer.data.tokenizer import Tokenizer

    texts = _read_gz(MULTI30K_SLICE / "train.en.gz") + _read_gz(MULTI30K_SLICE / "train.de.gz")
    path = tmp_path_factory.mktemp("spm") / "multi30k-unigram-2000.model"
    Tokenizer.train(texts, path, vocab_size=2000, model_type="unigram")
    return path


@pytest.fixture(scope="session")
def multi30k_small_tokenizer_path(tmp_path_factory) -> Path:
    """A small joint SentencePiece model (vocab 400) from the first 300 en and de training
    lines: for tests whose models only need real pieces, not a good vocabulary."""
    from transformer.data.tokenizer import Tokenizer

    texts = (_read_gz(MULTI30K_SLICE / "train.en.gz")[:300]
             + _read_gz(MULTI30K_SLICE / "train.de.gz")[:300])
    path = tmp_path_factory.mktemp("spm") / "spm400.model"
    Tokenizer.train(texts, path, vocab_size=400)
    return path


@pytest.fixture(scope="session")
def multi30k_tokenizer(multi30k_tokenizer_path):
    """The session's default Multi30k tokenizer (see multi30k_tokenizer_path)."""
    from transformer.data.tokenizer import Tokenizer

    return Tokenizer.load(multi30k_tokenizer_path)


@pytest.fixture
def tuning(monkeypatch):
    """Run a test with measured constants changed: `tuning(short_softmax_keys=0)` swaps the
    package's tuning table (`hardware.TUNING`) for a copy with those values, for the test
    only; returns the table in use."""
    import dataclasses

    from transformer import hardware

    def use(**changes):
        monkeypatch.setattr(hardware, "TUNING", dataclasses.replace(hardware.TUNING, **changes))
        return hardware.TUNING

    return use


@pytest.fixture
def one_thread():
    """Run a test on one torch thread: its matrices are tiny, so one thread is as fast, and
    immune to OpenMP threads spinning while another process holds a core."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


PRUNED_HEADS = {"encoder.blks.0.attention": [0], "decoder.blks.1.attention2": [1, 3]}


def _save_random_model(tokenizer_path: Path, path: Path, pruned: dict) -> Path:
    import torch

    from transformer.data.tokenizer import Tokenizer, TokenizerPair
    from transformer.model.transformer import ModelConfig, Transformer
    from transformer.run.checkpoint import inference_checkpoint, save_checkpoint

    tokenizer = Tokenizer.load(tokenizer_path)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(
        src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size,
        num_hiddens=32, ffn_num_hiddens=64, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, max_positions=64))
    if pruned:
        model.prune_heads(pruned)
    save_checkpoint(inference_checkpoint(model, TokenizerPair(tokenizer, tokenizer),
                                         training_config=None), path)
    return path


@pytest.fixture(scope="session")
def random_checkpoint(multi30k_small_tokenizer_path, tmp_path_factory) -> Path:
    """A random small model (4 heads, 2+2 layers, 63 source pieces at most) with the small
    Multi30k tokenizer: real pieces, deterministic (if meaningless) translations."""
    return _save_random_model(multi30k_small_tokenizer_path,
                              tmp_path_factory.mktemp("random") / "random.pt", {})


@pytest.fixture(scope="session")
def pruned_checkpoint(multi30k_small_tokenizer_path, tmp_path_factory) -> Path:
    """`random_checkpoint`'s model with the heads of PRUNED_HEADS removed."""
    return _save_random_model(multi30k_small_tokenizer_path,
                              tmp_path_factory.mktemp("pruned") / "pruned.pt", PRUNED_HEADS)


def train_en_de(tokenizers, src: list[str], tgt: list[str], *, steps: int = 300,
                **architecture):
    """A small en->de model (d 64, 2+2 layers unless `architecture` says otherwise), trained
    with teacher forcing on (src, tgt) pairs with the tokenizers' special ids."""
    import random

    import torch
    from torch import nn

    from transformer.model.transformer import ModelConfig, Transformer

    torch.manual_seed(0)
    rng = random.Random(0)
    ids = tokenizers.tgt.specials
    model = Transformer(ModelConfig(**{
        "src_vocab_size": tokenizers.src.vocab_size, "tgt_vocab_size": tokenizers.tgt.vocab_size,
        "num_hiddens": 64, "ffn_num_hiddens": 128, "num_heads": 4, "num_encoder_layers": 2,
        "num_decoder_layers": 2, "dropout": 0.0, "max_positions": 128, "pad_id": ids.pad,
        "start_id": ids.start, "eos_id": ids.eos, **architecture}))
    pairs = [(s + [ids.eos], t + [ids.eos])
             for s, t in zip(tokenizers.src.encode_batch(src), tokenizers.tgt.encode_batch(tgt),
                             strict=True) if len(s) < 40 and len(t) < 40]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    loss_fn = nn.CrossEntropyLoss(ignore_index=ids.pad)
    model.train()
    for _ in range(steps):
        batch = rng.sample(pairs, 48)
        s_len, t_len = (max(len(p[i]) for p in batch) for i in (0, 1))
        srcs = torch.tensor([s + [ids.pad] * (s_len - len(s)) for s, _ in batch])
        outs = torch.tensor([t + [ids.pad] * (t_len - len(t)) for _, t in batch])
        tgt_in = torch.cat([torch.full((48, 1), ids.start), outs[:, :-1]], 1)
        tgt_in = tgt_in.masked_fill(tgt_in == ids.eos, ids.pad)
        lens = torch.tensor([len(s) for s, _ in batch])
        loss = loss_fn(model(srcs, lens, tgt_in).flatten(0, 1), outs.flatten())
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return model.eval()


@pytest.fixture(scope="session")
def en_de_checkpoint(multi30k_tokenizer, tmp_path_factory) -> Path:
    """A post-norm en->de model trained on the slice (`train_en_de`, one thread, ~30 s), with
    decoding defaults alpha 1, beam 4: the model the export tests compare engines on."""
    import torch

    from transformer.data.tokenizer import TokenizerPair
    from transformer.run.checkpoint import inference_checkpoint, save_checkpoint
    from transformer.run.config import DecodingSettings, TrainConfig

    def build(path: Path) -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        tokenizers = TokenizerPair(multi30k_tokenizer, multi30k_tokenizer)
        model = train_en_de(tokenizers, _read_gz(MULTI30K_SLICE / "train.en.gz"),
                            _read_gz(MULTI30K_SLICE / "train.de.gz"))
        torch.set_num_threads(threads)
        save_checkpoint(inference_checkpoint(model, tokenizers, training_config=TrainConfig(),
                                             decoding=DecodingSettings(alpha=1.0, beam_size=4)),
                        path)

    return built_once(tmp_path_factory, "en_de.pt", build)


# ---- the copy task: a model that must learn --------------------------------------------------

def copy_sentence(rng: random.Random) -> str:
    """1-4 words of 1-3 letters of 'abcdef'."""
    words = ("".join(rng.choice("abcdef") for _ in range(rng.randint(1, 3)))
             for _ in range(rng.randint(1, 4)))
    return " ".join(words)


@pytest.fixture(scope="session")
def copy_checkpoint(tmp_path_factory) -> Path:
    """A tiny model trained from scratch to copy sentences of 1-4 words over 'abcdef' (~20 s):
    the model that must learn (tests/test_model.py) and that translates exactly
    (tests/test_translate.py)."""
    from transformer.data.tokenizer import Tokenizer, TokenizerPair
    from transformer.run.checkpoint import inference_checkpoint, save_checkpoint

    def build(path: Path) -> None:
        rng = random.Random(0)
        tokenizer = Tokenizer.train([copy_sentence(rng) for _ in range(2000)], vocab_size=24,
                                    byte_fallback=False)
        model = train_copy_model(tokenizer, rng)
        save_checkpoint(inference_checkpoint(model, TokenizerPair(tokenizer, tokenizer),
                                             training_config=None), path)

    return built_once(tmp_path_factory, "copy.pt", build)


def train_copy_model(tokenizer: Tokenizer, rng: random.Random, steps: int = 450) -> Transformer:
    """Adam with warmup and a linear decay, plain cross-entropy, batches of 64 sentences."""
    import torch
    from torch import nn

    from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
    from transformer.model.transformer import ModelConfig, Transformer

    torch.manual_seed(0)
    vocab = tokenizer.vocab_size
    model = Transformer(ModelConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, num_hiddens=64, ffn_num_hiddens=128,
        num_heads=4, num_encoder_layers=2, num_decoder_layers=2, dropout=0.0, max_positions=64))
    opt = torch.optim.Adam(model.parameters(), lr=5e-3, betas=(0.9, 0.98))
    warmup = 100  # linear warmup, then linear decay to 0: converges to (near) exact copies
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / (steps - warmup))))
    loss_fn = nn.CrossEntropyLoss(ignore_index=PAD_ID)
    model.train()
    for _ in range(steps):
        seqs = [tokenizer.encode(copy_sentence(rng)) + [EOS_ID] for _ in range(64)]
        longest = max(map(len, seqs))
        src = torch.tensor([s + [PAD_ID] * (longest - len(s)) for s in seqs])
        lens = torch.tensor([len(s) for s in seqs])
        tgt_in = torch.cat([torch.full((64, 1), BOS_ID),
                            src[:, :-1].masked_fill(src[:, :-1] == EOS_ID, PAD_ID)], 1)
        loss = loss_fn(model(src, lens, tgt_in).flatten(0, 1), src.flatten())
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    return model.eval()


def reusing_venv(directory: Path) -> Path:
    """A fresh virtual environment that reuses this one's packages through a `.pth` file
    (as `--system-site-packages` would for a system Python); packages installed into it come
    first. Returns its python."""
    import site
    import venv

    venv.create(directory, with_pip=False)
    python = directory / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    ours = [*site.getsitepackages(), site.getusersitepackages()]
    Path(purelib, "reuse-environment.pth").write_text("\n".join(ours) + "\n")
    return python


# ---- servers started by tests -----------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(server: subprocess.Popen, url: str, log: Path,
                  timeout: float = 120.0) -> None:
    """Poll /health until it answers; fail with the server's output if it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the server exited with {server.returncode}: "
                        f"{log.read_text()}", pytrace=False)
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if json.load(response)["status"] == "ok":
                    return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.2)
    pytest.fail(f"the server did not answer within {timeout:.0f} s", pytrace=False)


# ---- fuzzing (tests/test_fuzz_*.py) ---------------------------------------------------------


def fuzz(examples: int, *, shrink: bool = True) -> settings:
    """Hypothesis settings of a fuzz test: `examples` cases, reproducible (derandomized, no
    example database, no deadline: a case may load a model). `shrink=False` reports a
    failing case as generated: for tests whose every case runs a whole command, where
    shrinking would rerun it for minutes."""
    from hypothesis import Phase, settings

    phases = list(Phase) if shrink else [Phase.explicit, Phase.reuse, Phase.generate]
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    phases=phases)


def assert_one_line(error: Exception) -> None:
    """A refusal on one line (counted per exception class in
    `--hypothesis-show-statistics`)."""
    from hypothesis import currently_in_test_context, event

    if currently_in_test_context():
        event(f"refused: {type(error).__name__}")
    assert str(error) and "\n" not in str(error), repr(str(error))


def run_command(argv: list[str]) -> tuple[int, str]:
    """`transformer ARGV` in this process: (exit status, what it wrote on stderr). The root
    logger starts without handlers, as in a process of its own (a command's
    `logging.basicConfig` then writes to this stderr), and gets its own back afterwards."""
    import contextlib
    import io
    import logging

    from transformer import cli

    err = io.StringIO()
    handlers, logging.root.handlers = logging.root.handlers, []
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                status = cli.main(argv)
            except SystemExit as e:  # argparse's exits, and a Hydra command's body's
                status = e.code
    finally:
        logging.root.handlers = handlers
    return status, err.getvalue()


def assert_reported(status: int, err: str) -> None:
    """Exit 0, or exit 1 with one `error: <one line>`, the last line on stderr (after the
    command's log lines); never a traceback."""
    assert status in (0, 1), err
    assert "Traceback" not in err, err
    if status == 1:
        lines = err.splitlines()
        assert err.endswith("\n") and lines[-1].startswith("error: "), err
        assert sum(line.startswith("error:") for line in lines) == 1, err
