"""Devices, the process group's rank device, and the helpers the training loop runs on: the
device resolver's answers and one-line errors (CUDA and MPS faked absent or present), CUDA's
switches, the prefetch thread, and the environment `transformer train` runs in (its memory
allocator, found and preloaded by running the command again)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer import hardware
from transformer.errors import ConfigError
from transformer.runtime import (
    ALLOCATOR_LIBRARIES,
    DistEnv,
    configure_cuda,
    device_index,
    find_allocator,
    prefetched,
    resolve_device,
    training_environment,
)


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this machine has `n` CUDA devices: `gpus(n)`."""
    def fake(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    return fake


def test_auto_takes_cuda_where_there_is_a_gpu_else_the_cpu(gpus):
    gpus(0)
    assert resolve_device("auto") == torch.device("cpu")
    gpus(2)
    assert resolve_device("auto") == torch.device("cuda")


def test_named_devices_this_machine_has(gpus):
    gpus(2)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cpu:1") == torch.device("cpu")  # one CPU device
    assert resolve_device("cuda") == torch.device("cuda")  # the current GPU, as in PyTorch
    assert resolve_device("cuda:1", "trainer.device") == torch.device("cuda", 1)
    assert resolve_device(torch.device("cuda", 0)) == torch.device("cuda", 0)


@pytest.mark.parametrize("name, option, count, message", [
    ("cuda", "trainer.device", 0, "trainer.device=cuda but this machine has no CUDA device"),
    ("cuda:0", "--device", 0, "--device cuda:0 but this machine has no CUDA device"),
    ("cuda:3", "--device", 1, "--device cuda:3 but this machine has only cuda:0"),
    ("cuda:2", "trainer.device", 2, "trainer.device=cuda:2 but this machine has only cuda:0 "
                                    "to cuda:1"),
    ("gpu", "--device", 0, "--device gpu is not a device: expected auto, cpu, cuda, cuda:N "
                           "or mps"),
    ("cuda:x", "trainer.device", 1, "trainer.device=cuda:x is not a device: expected auto, "
                                    "cpu, cuda, cuda:N or mps"),
    ("", "--device", 0, "--device  is not a device: expected auto, cpu, cuda, cuda:N or mps"),
    ("meta", "--device", 0, "--device meta but this machine has no meta device"),
])
def test_a_device_the_machine_lacks_is_a_one_line_error_naming_the_option(gpus, name, option,
                                                                          count, message):
    gpus(count)
    with pytest.raises(ConfigError) as error:
        resolve_device(name, option)
    assert str(error.value) == message


def test_mps_without_an_apple_gpu_is_an_error(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="^--device mps but this machine has no MPS device$"):
        resolve_device("mps")


def test_device_index_for_libraries_that_take_kind_and_index(monkeypatch):
    """CTranslate2 takes ("cuda", index): the named index, else the current GPU."""
    assert device_index(torch.device("cuda", 2)) == 2
    assert device_index(torch.device("cpu")) == 0
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert device_index(torch.device("cuda")) == 0  # without setting CUDA up
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert device_index(torch.device("cuda")) == 1


def test_each_rank_of_a_cuda_job_takes_its_local_gpu():
    rank1 = DistEnv(rank=3, world_size=4, local_rank=1)
    assert rank1.rank_device(torch.device("cuda")) == torch.device("cuda", 1)
    assert rank1.rank_device(torch.device("cpu")) == torch.device("cpu")
    assert DistEnv().rank_device(torch.device("cuda", 2)) == torch.device("cuda", 2)


def test_prefetched_keeps_the_order_and_stops_early():
    """The background thread yields make(item) in item order, the same as depth 0 does,
    raises what `make` raised, and a loop that leaves early stops the thread."""
    made = []

    def make(i: int) -> int:
        made.append(i)
        if i == 7:
            raise ValueError("bad item 7")
        return i * i

    items = list(range(7))
    assert list(prefetched(make, items, 0)) == [i * i for i in items]
    assert list(prefetched(make, items, 2)) == [i * i for i in items]
    with pytest.raises(ValueError, match="bad item 7"):
        list(prefetched(make, range(10), 3))
    made.clear()
    for value in prefetched(make, range(100), 2):
        if value == 4:
            break
    assert len(made) <= 6  # items 0..2 yielded, at most depth + 1 more made


def test_configure_cuda_sets_tf32_and_cudnn_attention():
    """The two CUDA switches, set and read back (a CPU build keeps the flags too)."""
    matmul = torch.backends.cuda.matmul
    precision = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    before = (getattr(matmul, precision), torch.backends.cuda.cudnn_sdp_enabled())
    try:
        line = configure_cuda(tf32=False, cudnn_attention=False)
        assert getattr(matmul, precision) in ("ieee", False)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert line == "float32 matrix products IEEE float32, cuDNN attention off"
        configure_cuda(tf32=True, cudnn_attention=True)
        assert getattr(matmul, precision) in ("tf32", True)
        assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        setattr(matmul, precision, before[0])
        torch.backends.cuda.enable_cudnn_sdp(before[1])


# ---- the training process's environment ---------------------------------------------------


def test_find_allocator_prefers_jemalloc_in_any_directory(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    assert find_allocator([str(first), str(second)]) is None
    (first / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert find_allocator([str(first), str(second)]) == str(first / "libtcmalloc_minimal.so.4")
    (second / "libjemalloc.so.2").write_bytes(b"")
    assert find_allocator([str(first), str(second)]) == str(second / "libjemalloc.so.2")
    assert ALLOCATOR_LIBRARIES[0] == "libjemalloc.so.2"


def test_training_environment_preloads_the_allocator_and_sizes_onednns_cache(tmp_path):
    library = tmp_path / "libjemalloc.so.2"
    library.write_bytes(b"")
    env = training_environment({"PATH": "/bin"}, str(library))
    assert env == {"PATH": "/bin", "LD_PRELOAD": str(library),
                   "ONEDNN_PRIMITIVE_CACHE_CAPACITY":
                       str(hardware.TUNING.onednn_primitive_cache),
                   "LRU_CACHE_CAPACITY": str(hardware.TUNING.ideep_cache),
                   "MALLOC_CONF": hardware.TUNING.jemalloc_conf}
    # what the user set is kept; a library preloaded already is not added twice
    env = training_environment({"LD_PRELOAD": "/x/liba.so:" + str(library),
                                "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024",
                                "LRU_CACHE_CAPACITY": "1024",
                                "MALLOC_CONF": "narenas:1"}, str(library))
    assert env == {"LD_PRELOAD": "/x/liba.so:" + str(library),
                   "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024", "LRU_CACHE_CAPACITY": "1024",
                   "MALLOC_CONF": "narenas:1"}
    assert training_environment({"LD_PRELOAD": "/x/liba.so"}, str(library))["LD_PRELOAD"] \
        == f"/x/liba.so {library}"
    assert "LD_PRELOAD" not in training_environment({}, None)  # none found: the system's
    assert "LD_PRELOAD" not in training_environment({"TRANSFORMER_ALLOCATOR": "system"},
                                                    str(library))
    chosen = tmp_path / "libtcmalloc.so.4"
    chosen.write_bytes(b"")
    env = training_environment({"TRANSFORMER_ALLOCATOR": str(chosen)}, str(library))
    assert env["LD_PRELOAD"] == str(chosen) and "MALLOC_CONF" not in env  # jemalloc's only
    with pytest.raises(ConfigError, match=r"^TRANSFORMER_ALLOCATOR=/no/lib.so: no such "):
        training_environment({"TRANSFORMER_ALLOCATOR": "/no/lib.so"}, str(library))


_NEW_SHAPES = """
import torch
def resident_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS:"))
W = torch.randn(384, 128, dtype=torch.bfloat16)
torch.randn(300, 128, dtype=torch.bfloat16) @ W.t()
start = resident_mib()
for rows in range(301, 601):  # bf16 products of 300 shapes, each new
    torch.randn(rows, 128, dtype=torch.bfloat16) @ W.t()
print(resident_mib() - start)
"""


@pytest.mark.skipif(not hardware.cpu_has_native_bf16(),
                    reason="bf16 products go through oneDNN on CPUs with native bf16 only")
def test_the_training_environment_bounds_the_memory_of_new_bf16_shapes():
    """Under the training environment's `ideep_cache`, a process that multiplies bf16
    matrices of a new shape each time (training's products under autocast: each batch
    has its own rows) grows by less than half of what PyTorch's default cache of 1,024
    computations keeps: `LRU_CACHE_CAPACITY` is the variable PyTorch reads."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    env = training_environment(environ, None)
    growth = {}
    for cache in (env["LRU_CACHE_CAPACITY"], "1024"):
        done = subprocess.run([sys.executable, "-c", _NEW_SHAPES],
                              env={**env, "LRU_CACHE_CAPACITY": cache},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        growth[cache] = int(done.stdout)
    assert growth[env["LRU_CACHE_CAPACITY"]] < growth["1024"] / 2, growth


def _train_log(tmp_path: Path, data: Path, spm: Path, **env: str) -> str:
    """The log of `python -m transformer train`, one update of a small model, in a process
    of its own with `env` added to this one's."""
    run = tmp_path / ("_".join(env) or "default")
    overrides = ["experiment=smoke", f"data.root={data}", f"data.spm_model={spm}",
                 "data.vocab_size=500", "data.max_train_pairs=100", "data.max_tokens=512",
                 "model.num_hiddens=32", "model.ffn_num_hiddens=64",
                 "model.num_encoder_layers=1", "model.num_decoder_layers=1",
                 "model.num_heads=2", "trainer.bleu_max_sentences=4", "trainer.max_updates=1",
                 f"hydra.run.dir={run}"]
    done = subprocess.run([sys.executable, "-m", "transformer", "train", *overrides],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return (run / "train.log").read_text()


@pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD and /proc are Linux's")
def test_the_train_command_runs_under_the_allocator_found(tmp_path, multi30k_dir, spm_model):
    """The command runs again under the library `find_allocator` finds (none: the system's
    malloc, as `TRANSFORMER_ALLOCATOR=system` asks), and its log says which."""
    found = find_allocator()
    expected = "the system malloc" if found is None else os.path.basename(found)
    if expected == "libjemalloc.so.2":
        expected += f" (MALLOC_CONF={hardware.TUNING.jemalloc_conf})"
    assert f"memory allocator {expected}\n" in _train_log(tmp_path, multi30k_dir, spm_model)
    assert "memory allocator the system malloc" in _train_log(
        tmp_path, multi30k_dir, spm_model, TRANSFORMER_ALLOCATOR="system")


_JEMALLOC_SETTINGS = """
import ctypes, sys
mallctl = ctypes.CDLL(None).mallctl  # jemalloc's, preloaded
for pair in sys.argv[1].split(","):
    key, value = pair.split(":")
    read, size = ctypes.c_ssize_t(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_ssize_t))
    assert mallctl(f"opt.{key}".encode(), ctypes.byref(read), ctypes.byref(size), None, 0) == 0
    print(key, read.value)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD is Linux's")
def test_jemalloc_runs_with_the_tuning_tables_settings():
    """A process in the training environment under jemalloc reads the table's
    `jemalloc_conf` as set, without a warning (jemalloc prints one for a setting it
    does not know, and goes on without it). Without jemalloc (CI installs it), the
    environment sets none."""
    found = find_allocator(names=("libjemalloc.so.2",))
    conf = hardware.TUNING.jemalloc_conf
    environ = {k: v for k, v in os.environ.items() if k not in ("MALLOC_CONF", "LD_PRELOAD")}
    if found is None:
        assert "MALLOC_CONF" not in training_environment(environ, None)
        return
    done = subprocess.run([sys.executable, "-c", _JEMALLOC_SETTINGS, conf],
                          env=training_environment(environ, found), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    assert done.stdout.split() == conf.replace(",", " ").replace(":", " ").split()
