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
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from .errors import ConfigError
from .hardware import cpu_has_native_bf16

__all__ = ["resolve_device", "device_index", "DistEnv", "init_distributed", "Precision",
           "resolve_precision", "configure_cuda", "peak_resident_bytes", "prefetched"]

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
