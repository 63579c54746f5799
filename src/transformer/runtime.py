"""Where and how the computation runs: the device, the process group, the precision, CUDA's
math switches and the background thread that prepares the next batches.

    resolve_device("auto")                      # CUDA if present, else the CPU
    resolve_device(cfg.trainer.device, "trainer.device")
    resolve_device(args.device, "--device")     # errors name the option the value came from

`resolve_device` is the package's one reading of a device name: training, the PyTorch
translator and the CTranslate2 engine (`device_index` gives it the GPU number it needs) take
a device the same way and reject one this machine lacks with a `ConfigError` naming the
setting, before any work. Distributed training (`init_distributed`, `DistEnv`) is PyTorch's:
torchrun describes the job in the environment, and each rank takes its local GPU.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from . import hardware
from .errors import ConfigError
from .hardware import cpu_has_native_bf16

__all__ = ["resolve_device", "device_index", "DistEnv", "init_distributed", "Precision",
           "resolve_precision", "configure_cuda", "ALLOCATOR_LIBRARIES", "find_allocator",
           "training_environment", "enter_training_environment", "loaded_allocator",
           "allocator_description", "peak_resident_bytes", "prefetched"]

T = TypeVar("T")
U = TypeVar("U")

DEVICE_NAMES = "auto, cpu, cuda, cuda:N or mps"
_KIND_NAMES = {"cuda": "CUDA", "mps": "MPS", "xpu": "XPU"}  # how errors name a kind


# ---- devices ----------------------------------------------------------------------------


def resolve_device(device: str | torch.device, option: str = "--device") -> torch.device:
    """The device `device` names, checked against this machine: "auto" is CUDA if PyTorch
    sees a GPU, else the CPU; "cpu", "cuda", "cuda:N", "mps", ... as PyTorch reads them
    ("cuda" without an index is the current GPU, as in PyTorch). A malformed name, or a
    device this machine does not have, raises `ConfigError` in one line that names
    `option`, the command-line option ("--device") or config key ("trainer.device") the
    value came from."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    setting = f"{option} {device}" if option.startswith("-") else f"{option}={device}"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{setting} is not a device: expected {DEVICE_NAMES}") from None
    if resolved.type == "cpu":
        return torch.device("cpu")  # one CPU device, whatever index was written
    count = _device_count(resolved.type)
    kind = _KIND_NAMES.get(resolved.type, resolved.type)
    if count == 0:
        raise ConfigError(f"{setting} but this machine has no {kind} device")
    if resolved.index is not None and resolved.index >= count:
        have = f"{resolved.type}:0" + (f" to {resolved.type}:{count - 1}" if count > 1 else "")
        raise ConfigError(f"{setting} but this machine has only {have}")
    return resolved


def device_index(device: torch.device) -> int:
    """The number of `device` among the devices of its kind, for libraries that take a kind
    and an index (CTranslate2): the index it names, else the current GPU (what
    `torch.device("cuda")` means; GPU 0 until PyTorch has set up CUDA, which this does not
    do); 0 for the CPU and other kinds without an index."""
    if device.index is not None:
        return device.index
    if device.type == "cuda" and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return 0


def _device_count(kind: str) -> int:
    """How many devices of `kind` ("cuda", "mps", "xpu", ...) this process can use."""
    if kind == "mps":
        return int(torch.backends.mps.is_available())
    backend = getattr(torch, kind, None)  # torch.cuda, torch.xpu, ...
    if not (hasattr(backend, "is_available") and hasattr(backend, "device_count")):
        return 0  # a kind PyTorch names but cannot run a model on here ("meta", "lazy")
    return backend.device_count() if backend.is_available() else 0


# ---- distributed training ---------------------------------------------------------------


@dataclass
class DistEnv:
    """This process's place in a torchrun job (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # we initialized the process group, so we destroy it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def rank_device(self, device: torch.device) -> torch.device:
        """The device this rank trains on: under torchrun each rank of a CUDA job takes the
        GPU of its local rank, whatever index `device` names; otherwise `device`."""
        if self.distributed and device.type == "cuda":
            return torch.device("cuda", self.local_rank)
        return device


def init_distributed(device: torch.device) -> DistEnv:
    """Join the process group torchrun describes in the environment (nccl on CUDA, gloo on
    the CPU); a plain `python` run is a world of one. On CUDA each rank needs a GPU of its
    own: a node with fewer GPUs than processes raises `ConfigError`."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return DistEnv()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device.type == "cuda"
    if use_cuda:
        gpus = torch.cuda.device_count()
        if local_rank >= gpus:
            raise ConfigError(
                f"torchrun started local rank {local_rank} but this node has {gpus} CUDA "
                "device(s): --nproc-per-node must be at most the node's number of GPUs")
        torch.cuda.set_device(local_rank)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, owns)


# ---- precision and CUDA switches --------------------------------------------------------


@dataclass(frozen=True)
class Precision:
    """The autocast dtype of a run (None: float32) and why it was chosen, for the log."""

    dtype: torch.dtype | None
    why: str


def resolve_precision(name: str, device: torch.device) -> Precision:
    """`trainer.precision` on `device`. `auto`: bf16 on CUDA (fp16 where bf16 is missing);
    on CPU bf16 where the CPU computes it natively (`hardware.cpu_has_native_bf16`), else
    float32."""
    dtypes = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    if name != "auto":
        return Precision(dtypes[name], f"trainer.precision={name}")
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return Precision(torch.bfloat16, "auto: the GPU supports bf16")
        return Precision(torch.float16, "auto: the GPU lacks bf16, fp16 with loss scaling")
    if device.type == "cpu" and cpu_has_native_bf16():
        return Precision(torch.bfloat16, "auto: the CPU has native bf16 (AVX512-BF16 or AMX)")
    return Precision(None, f"auto: no native bf16 on {device.type}")


def configure_cuda(tf32: bool, cudnn_attention: bool) -> str:
    """Set PyTorch's process-wide CUDA math switches: TF32 for float32 matrix products
    (10-bit mantissa products, float32 accumulation) and whether scaled_dot_product_attention
    may choose cuDNN's kernel. CPU computation is untouched. Returns a line for the log."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9; the older flag is deprecated there
        matmul.fp32_precision = "tf32" if tf32 else "ieee"
    else:
        matmul.allow_tf32 = tf32
    torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)
    return (f"float32 matrix products {'TF32' if tf32 else 'IEEE float32'}, cuDNN attention "
            f"{'allowed' if cudnn_attention else 'off'}")


# ---- the training process's memory -----------------------------------------------------

# Memory allocators that keep a training process's memory from growing, most preferred
# first: glibc's malloc fragments under the varying batch shapes of training (its heap grows
# for the whole run), these do not. The libraries' names as Debian/Ubuntu (libjemalloc2,
# libtcmalloc-minimal4), Fedora, conda and Homebrew install them.
ALLOCATOR_LIBRARIES = ("libjemalloc.so.2", "libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                "/usr/lib", "/usr/local/lib")
ALLOCATOR_VARIABLE = "TRANSFORMER_ALLOCATOR"  # "auto" (default), "system", or a library
ONEDNN_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
IDEEP_CACHE_VARIABLE = "LRU_CACHE_CAPACITY"  # PyTorch's oneDNN bridge (ideep) reads it
JEMALLOC_VARIABLE = "MALLOC_CONF"  # jemalloc's settings (other allocators ignore it)


def find_allocator(dirs: Sequence[str] | None = None,
                   names: Sequence[str] = ALLOCATOR_LIBRARIES) -> str | None:
    """The path of the first of `names` (by default `ALLOCATOR_LIBRARIES`, in their order)
    found in `dirs` (by default this Python's own lib/, where conda installs them, then
    `LIBRARY_DIRS`), or None."""
    if dirs is None:
        dirs = (os.path.join(sys.prefix, "lib"), *LIBRARY_DIRS)
    for name in names:
        for directory in dirs:
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                return path
    return None


def training_environment(environ: Mapping[str, str], found: str | None) -> dict[str, str]:
    """The environment `transformer train` runs in: `environ` with the allocator library
    `found` preloaded (`LD_PRELOAD`) and oneDNN's primitive cache at the tuning table's
    `onednn_primitive_cache` entries. Each training step multiplies matrices of new shapes,
    and oneDNN compiles and keeps a primitive per shape (1,024 by default): a smaller cache
    holds less and lets the allocator reuse more. PyTorch's bridge to oneDNN (ideep) keeps
    a cache of its own per shape (`LRU_CACHE_CAPACITY`, 1,024 by default: under bf16
    autocast hundreds of MB that make no step faster), at the table's `ideep_cache`. Under
    jemalloc, its settings are the table's `jemalloc_conf`: the pages it hands back lazily
    stay mapped, where by default every step's tensors fault in pages it has just unmapped.
    A variable the user set is kept; `TRANSFORMER_ALLOCATOR=system` keeps the system's
    malloc, `=PATH` preloads that library (a missing one is a `ConfigError`)."""
    env = dict(environ)
    env.setdefault(ONEDNN_CACHE_VARIABLE, str(hardware.TUNING.onednn_primitive_cache))
    env.setdefault(IDEEP_CACHE_VARIABLE, str(hardware.TUNING.ideep_cache))
    choice = env.get(ALLOCATOR_VARIABLE, "auto")
    if choice == "system":
        return env
    if choice != "auto":
        if not os.path.isfile(choice):
            raise ConfigError(f"{ALLOCATOR_VARIABLE}={choice}: no such library; expected "
                              f"auto, system or the path of a malloc library")
        found = choice
    preloaded = env.get("LD_PRELOAD", "").replace(":", " ").split()
    if found is not None and found not in preloaded:
        env["LD_PRELOAD"] = " ".join([*preloaded, found])
    if found is not None and _is_jemalloc(found):
        env.setdefault(JEMALLOC_VARIABLE, hardware.TUNING.jemalloc_conf)
    return env


def enter_training_environment() -> None:
    """Put this process in `training_environment`: a library can be preloaded only when a
    process starts, so where one is to be added the process runs again, the same command
    line (`sys.orig_argv`) in the same process id, under it (Linux only); otherwise the
    variables are set here, before oneDNN reads them."""
    env = training_environment(os.environ, find_allocator())
    if env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD") and sys.platform == "linux":
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    os.environ.update(env)


def loaded_allocator() -> str | None:
    """The file name of the allocator library this process runs under (one of
    `ALLOCATOR_LIBRARIES` mapped into it), or None: the system's malloc."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return None
    return next((name for name in ALLOCATOR_LIBRARIES if "/" + name in maps), None)


def allocator_description() -> str:
    """The allocator as `transformer train` logs it: the library this process runs under,
    with jemalloc's settings (`MALLOC_CONF`) where they are set, or the system's malloc."""
    name = loaded_allocator()
    if name is None:
        return "the system malloc"
    conf = os.environ.get(JEMALLOC_VARIABLE) if _is_jemalloc(name) else None
    return f"{name} ({JEMALLOC_VARIABLE}={conf})" if conf else name


def _is_jemalloc(library: str) -> bool:
    """Whether the allocator library `library` (a path or a file name) is jemalloc, the one
    that reads `MALLOC_CONF`."""
    return os.path.basename(library).startswith("libjemalloc")


# ---- the prefetch thread ----------------------------------------------------------------


def peak_resident_bytes() -> int | None:
    """This process's peak resident memory (Linux's VmHWM: the most RAM it has held at
    once), or None where /proc cannot tell."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def prefetched(make: Callable[[T], U], items: Sequence[T], depth: int) -> Iterator[U]:
    """`make(item)` for each item, in order, computed up to `depth` items ahead on one
    background thread (the next batches are collated while the model trains on this one);
    depth 0 calls `make` here, on demand. Leaving the loop early cancels what is queued."""
    if depth == 0:
        yield from map(make, items)
        return
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
    try:
        pending: deque[Future[U]] = deque()
        for item in items:
            pending.append(pool.submit(make, item))
            if len(pending) > depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
