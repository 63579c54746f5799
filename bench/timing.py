"""What the benchmarks share: timing repeated passes, peak memory, the machine's load and
CPU, and the package's names in its current layout or an earlier one.

- **Timing**: `timed` (one pass: its seconds and result), `timed_passes` (repeated passes:
  the best, or the first, is read from their seconds), `paired_passes` (contenders in turn,
  round after round, so that the machine's drift falls on all of them alike),
  `ratio_summary` (one contender's time over another's in each round, and their median),
  `profiled` and `operator_table` (where a pass's time goes, by operator).
- **Memory** (Linux's /proc): `status_mib` (a field of a process's status: VmRSS, VmHWM),
  `peak_rss_mib`, `reset_peak_rss`.
- **The machine**: `load_average`, `cpu_description` (the CPU, and the kernels and libraries
  the package picks on it: `transformer.hardware`), `add_isa_argument` / `hold_to_isa`
  (`--isa`: the kernels of a CPU with fewer instruction sets, on this one).
- **The package's layout**: `package_name`, a name found where the package keeps it now or
  where an earlier layout kept it, for a process that imports another checkout's package
  (`engines.py --baseline-src`, `paired.py --baseline-src`).

Nothing of the package is imported at this module's top: a baseline's process imports this
file with the package of another checkout.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

# ---- timing ---------------------------------------------------------------------------------


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """The seconds `fn()` takes, and what it returns."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def timed_passes(fn: Callable[[], T], repeats: int) -> tuple[list[float], T]:
    """The seconds of each of `repeats` passes of `fn()`, in order (`min`: the best pass, the
    least disturbed by other processes; `[0]`: the first, kernels for new shapes still being
    made), and the last pass's result."""
    seconds, result = [], None
    for _ in range(repeats):
        elapsed, result = timed(fn)
        seconds.append(elapsed)
    return seconds, result


def paired_passes(passes: dict[str, Callable[[], T]], rounds: int, flip: bool = True
                  ) -> tuple[dict[str, list[float]], dict[str, T]]:
    """The seconds of each named pass in every round, the passes run in turn (their order
    reversed every other round where `flip`), and each pass's last result: on a machine
    whose speed drifts by more than a change gains, only passes run back to back compare."""
    seconds: dict[str, list[float]] = {name: [] for name in passes}
    results: dict[str, T] = {}
    for r in range(rounds):
        order = list(passes)[::-1] if flip and r % 2 else list(passes)
        for name in order:
            elapsed, results[name] = timed(passes[name])
            seconds[name].append(elapsed)
    return seconds, results


def percentile(values: Sequence[float], q: int) -> float:
    """The `q`-th percentile of `values` (inclusive method; one value: itself): latencies'
    median and tail."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 \
        else values[0]


def ratio_summary(ours: Sequence[float], theirs: Sequence[float]) -> str:
    """`theirs / ours` of each round's seconds (above 1x, ours is faster), smallest first,
    and their median: "median 1.020x (rounds 0.97x 1.01x 1.04x)". The rounds' spread says
    how far the machine's drift moves the ratio."""
    ratios = sorted(t / o for o, t in zip(ours, theirs, strict=True))
    return (f"median {statistics.median(ratios):.3f}x "
            f"(rounds {' '.join(f'{r:.2f}x' for r in ratios)})")


def profiled(fn: Callable[[], object], record_shapes: bool = False) -> tuple[float, Any]:
    """`fn()` under torch.profiler on the CPU -> its wall seconds (profiled) and the
    profile (`operator_table` reads it; `record_shapes` keeps every call's input shapes)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes) as prof:
        wall, _ = timed(fn)
    return wall, prof


def operator_table(prof: Any, top: int, width: int = 40) -> list[str]:
    """Where a profiled pass's time went: its `top` operators by self CPU time (seconds,
    share, calls), and the operators' time in all (the rest of the wall time is Python and
    the profiler)."""
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    rows = [f"  {e.key:<{width}}{e.self_cpu_time_total / 1e6:>8.3f}s"
            f"{100 * e.self_cpu_time_total / total:>7.1f}%{e.count:>9} calls"
            for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]]
    return [*rows, f"  (operator self time {total / 1e6:.2f}s; the rest of the wall time is "
                   "Python and the profiler)"]


# ---- memory -------------------------------------------------------------------------------


def status_mib(field: str, pid: int | str = "self") -> float:
    """A memory field of /proc/PID/status in MiB, e.g. "VmRSS" (resident now) or "VmHWM"
    (the peak resident set since the process started or `reset_peak_rss`)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def peak_rss_mib() -> float:
    """This process's peak resident set in MiB."""
    return status_mib("VmHWM")


def reset_peak_rss() -> float:
    """Reset this process's peak RSS (VmHWM) to its current RSS, so that a measurement's
    peak excludes what came before it; returns the current RSS in MiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_mib("VmRSS")


# ---- the machine ----------------------------------------------------------------------------


def load_average() -> float:
    """The 1-minute load average: other processes' demand for the cores (above the threads
    a benchmark uses, its numbers are not the machine's)."""
    return os.getloadavg()[0]


# `--isa`: the environment variables that hold each library's kernels (PyTorch's own,
# oneDNN's, MKL's, FBGEMM's, CTranslate2's) to an instruction set, so that a machine with
# more runs the kernels a CPU with less would, with its own clock and caches. "AVX512":
# AVX-512 without VNNI (a Skylake-class Xeon's int8 kernels).
ISA_LIMITS = {
    "AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
             "CT2_FORCE_CPU_ISA": "AVX2"},
    "AVX512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
               "MKL_ENABLE_INSTRUCTIONS": "AVX512", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512",
               "CT2_FORCE_CPU_ISA": "AVX512"},
}
ISA_VARIABLES = tuple(ISA_LIMITS["AVX2"])  # every instruction set sets the same ones
# /proc/cpuinfo's flags that choose PyTorch's, oneDNN's, FBGEMM's and CTranslate2's kernels
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def add_isa_argument(parser: argparse.ArgumentParser) -> None:
    """`--isa AVX2|AVX512`: run on the kernels of a CPU with only that instruction set."""
    parser.add_argument("--isa", choices=list(ISA_LIMITS),
                        help="hold every library's kernels to this instruction set (AVX512: "
                             "without VNNI), as a CPU with only it would run them")


def hold_to_isa(isa: str | None) -> None:
    """Start this script over with `ISA_LIMITS[isa]` in its environment (the libraries read
    them when they load, which has happened by now); nothing when `isa` is None or the
    environment holds them already."""
    if isa is None:
        return
    limits = ISA_LIMITS[isa]
    if any(os.environ.get(key) != value for key, value in limits.items()):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **limits})


def cpu_description() -> str:
    """The CPU (/proc/cpuinfo's model name, else `platform.processor()`; its family, model
    and the instruction sets of `KERNEL_FLAGS` it has) and what runs on it: PyTorch's CPU
    capability (e.g. AVX512), native bf16 (`hardware.cpu_has_native_bf16`, what `precision:
    auto` decides by), the libraries of our float32 and int8 products (the tuning table's
    `float32_library`, `transposed_weights` and `int8_onednn`), and any `--isa` limits in
    force."""
    import torch

    from transformer.hardware import TUNING, cpu_has_amx, cpu_has_native_bf16, cpu_info

    name = cpu_info("model name") or platform.processor() or "unknown CPU"
    if cpu_info("cpu family") is not None:  # a VM's generic name ("AMD EPYC") says little
        flags = set((cpu_info("flags") or "").split())
        isa = " ".join(flag for flag in KERNEL_FLAGS if flag in flags) or "no AVX2"
        name += f" (family {cpu_info('cpu family')}, model {cpu_info('model')}; {isa})"
    limits = [f"{key}={os.environ[key]}" for key in ISA_VARIABLES if key in os.environ]
    int8 = "oneDNN (AMX)" if cpu_has_amx() else "oneDNN"
    # a baseline's package may be older than the weights' layout
    weights = (" (weights stored transposed)" if getattr(TUNING, "transposed_weights", False)
               else "")
    return (f"CPU: {name}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}, "
            f"native bf16 (AVX512-BF16 or AMX) {cpu_has_native_bf16()}; our float32 products "
            f"through {'oneDNN' if TUNING.float32_library == 'onednn' else 'BLAS'}"
            f"{weights}, int8 wide "
            f"layers through {int8 if TUNING.int8_onednn else 'FBGEMM'}"
            + (f"; instruction sets limited by {' '.join(limits)}" if limits else ""))


# ---- the package's layout -------------------------------------------------------------------

# Where a checkout from before the package's folders (transformer/translator.py, not
# transformer/decoding/translator.py) kept what a baseline's process reads, by the module of
# the current layout: candidates in order, the first that holds the name wins (Sampling and
# AlignmentOptions lived in `decoding`, earlier in `search` and `alignment`).
EARLIER_MODULES = {
    "data.multi30k": ("multi30k",),
    "data.text": ("text",),
    "decoding.corpus": ("decoding.search", "search"),
    "decoding.request": ("decoding", "search", "alignment"),
    "decoding.translator": ("translator",),
    "deploy.engines": ("engines",),
}


def package_name(module: str, name: str, package: str = "transformer") -> Any:
    """`name` from `package.module` (`module` as the current layout names it, e.g.
    "decoding.translator"), else from the first of its `EARLIER_MODULES` that holds it:
    the one place where the benchmarks read a package of either layout. `package`: the
    package's name where it is imported under another (`paired.py`'s copy)."""
    for path in (module, *EARLIER_MODULES.get(module, ())):
        found = _module(f"{package}.{path}")
        if found is not None and hasattr(found, name):
            return getattr(found, name)
    raise ImportError(f"{package} has no {name} in {module}, nor where its earlier layout "
                      f"kept it")


def _module(path: str) -> ModuleType | None:
    """The module `path`, or None where the package has no such module (an import that
    fails inside it, e.g. of a missing dependency, is raised)."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as error:
        if error.name is None or not (path == error.name or path.startswith(error.name + ".")):
            raise
        return None
