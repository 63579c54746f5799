"""What this machine is, how many threads compute, and every measured constant that picks a
kernel or a size on it: the package's one place of hardware knowledge.

- **The CPU**: `cpu_info` (a field of /proc/cpuinfo's first processor), `cpu_vendor`,
  `cpu_has_amx`, `cpu_has_native_bf16` (AVX512-BF16 or AMX: bf16 autocast pays there),
  `float32_library` (whose matrix products are faster here: MKL's BLAS or oneDNN),
  `float32_onednn_rows` (the output projection's rows oneDNN multiplies faster than MKL).
- **Threads**: `set_threads`, the one call of `torch.set_num_threads` in the package;
  `threads_set_to` and `threads_restored` set them for a block and restore them after it.
- **The tuning table**: `TUNING`, one frozen `Tuning` of every constant a measurement chose
  (the attention paths' thresholds, the float32 library and its weights' layout, int8's
  chunk sizes, decoding's batch rows, the cache's pool, the fused loss's chunks), detected
  once per process where it depends on the CPU or on PyTorch's build. `MEASURED` says, for
  each, what it decides, the CPUs it was measured on and the section of docs/benchmarks.md
  with the numbers. Code reads `TUNING` when it runs, so a test swaps the whole table (the
  `tuning` fixture of tests/conftest.py) instead of patching constants one by one.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

__all__ = ["cpu_info", "cpu_vendor", "cpu_has_amx", "cpu_has_native_bf16", "cpu_avx2_only",
           "float32_library", "float32_onednn_rows", "set_threads", "threads_set_to",
           "threads_restored", "Tuning", "Measured", "MEASURED", "TUNING", "detect_tuning"]


# ---- the CPU ----------------------------------------------------------------------------


def cpu_info(field: str, path: str = "/proc/cpuinfo") -> str | None:
    """A field of the first processor in Linux's /proc/cpuinfo ("vendor_id", "model name",
    "model", "flags"), matched by its whole name ("model" is not "model name"); None where
    that cannot be read."""
    return _first_processor(path).get(field)


@functools.cache
def _first_processor(path: str) -> dict[str, str]:
    """The fields of the first processor's block of a cpuinfo file, read once per process
    (the CPU does not change while it runs); empty where the file cannot be read."""
    found = {}
    try:
        with open(path) as f:
            for line in f:
                if not line.strip():  # the first block ends
                    break
                key, _, value = line.partition(":")
                found[key.strip()] = value.strip()
    except OSError:
        pass
    return found


def cpu_vendor() -> str | None:
    """The CPU's vendor as the processor names itself ("GenuineIntel", "AuthenticAMD"), None
    where that cannot be read. MKL runs its AVX-512 kernels on Intel's CPUs only, so which
    library multiplies fastest depends on it."""
    return cpu_info("vendor_id")


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (Intel Xeon from Sapphire Rapids on): int8 and bf16
    matrix products in hardware, which oneDNN's kernels use."""
    return getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively: AVX512-BF16 or AMX tiles, as
    PyTorch's CPU capability probes report them. Elsewhere oneDNN emulates bf16 through
    float32 and autocast only slows training down."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def float32_library() -> str:
    """Which library multiplies float32 inference products on this CPU: "blas" (MKL) on
    Intel's CPUs and on x86 CPUs whose widest vectors are AVX2's (both libraries then run
    AVX2 kernels, MKL's with less cost a call), "onednn" elsewhere (on AMD's AVX-512 CPUs
    MKL runs its AVX2 kernels, oneDNN AVX-512 ones), and "blas" where PyTorch was built
    without oneDNN."""
    if not _has_onednn_linear():
        return "blas"
    avx2_only = torch.backends.mkl.is_available() and cpu_avx2_only()
    return "blas" if cpu_vendor() == "GenuineIntel" or avx2_only else "onednn"


def _has_onednn_linear() -> bool:
    """Whether PyTorch's build multiplies float32 through oneDNN's linear operator."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def float32_onednn_rows(library: str) -> range:
    """The rows of a wide float32 product that oneDNN multiplies faster than `library`:
    where MKL's BLAS is the library on a CPU not Intel's (an AVX2-only AMD CPU), MKL's
    kernels for a few rows are slow, and oneDNN's are faster from 4 rows to a decoding
    batch's most (`Tuning.decode_max_rows`), given the weight packed into its layout once
    (a loaded translator's); as fast given the transposed weight from a few dozen rows on
    (at 1-3 rows their sums differ from MKL's in the last bits); none elsewhere."""
    if library == "blas" and cpu_vendor() != "GenuineIntel" and _has_onednn_linear():
        return range(4, Tuning.decode_max_rows + 1)
    return range(0)


def float32_blas_rows(library: str) -> range:
    """The rows of a narrow float32 product (every one but the output projection) that
    MKL's BLAS multiplies faster than oneDNN where oneDNN is the library: on AMD's AVX-512
    CPUs oneDNN's call costs 10-15 us more than MKL's at the 128-feature products of a
    decoding step's few rows, where MKL's AVX2 kernels take 6-14 us, and from a few dozen
    rows the two are as fast (Zen 4) or oneDNN's AVX-512 kernels faster (Zen 5); none
    elsewhere (no MKL there, or MKL the library)."""
    if (library == "onednn" and torch.backends.mkl.is_available()
            and cpu_vendor() == "AuthenticAMD"):
        return range(1, 64)
    return range(0)


def cpu_avx2_only() -> bool:
    """Whether PyTorch's kernels run AVX2 code on this CPU and no wider (an x86 CPU without
    AVX-512, or one held to AVX2 by ATEN_CPU_CAPABILITY): kernels' relative costs differ
    there."""
    return torch.backends.cpu.get_cpu_capability() == "AVX2"


# ---- threads ----------------------------------------------------------------------------


def set_threads(threads: int) -> None:
    """Compute with `threads` CPU threads from now on (PyTorch's intra-op threads: for the
    process, and for the calling thread's own operators under OpenMP)."""
    torch.set_num_threads(threads)


@contextlib.contextmanager
def threads_restored() -> Iterator[None]:
    """The thread count as it is now, set again when the block ends (exceptions included)."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        set_threads(before)


@contextlib.contextmanager
def threads_set_to(threads: int) -> Iterator[None]:
    """`set_threads(threads)` for the block, then the count it had before."""
    with threads_restored():
        set_threads(threads)
        yield


# ---- the measured constants -------------------------------------------------------------


@dataclass(frozen=True)
class Tuning:
    """Every measured constant that picks a kernel, a library or a size (what each decides,
    where it was measured: `MEASURED`)."""

    short_softmax_keys: int = 16
    small_bmm_products: int = 400
    fused_attention_min_keys: int = 48
    fused_attention_max_queries: int = 0
    float32_library: str = "blas"
    transposed_weights: bool = False
    float32_onednn_min_outputs: int = 2048
    float32_onednn_rows: range = range(0)
    float32_blas_rows: range = range(0)
    int8_onednn: bool = False
    int8_max_outputs: int = 2 ** 19
    int8_onednn_min_outputs: int = 2048
    int8_onednn_chunk_rows: int = 130
    decode_max_rows: int = 1024
    topk_block: int = 128
    cache_pool_bytes: int = 2 ** 30
    ct2_sub_batch_tokens: int = 1024
    ct2_mapped_sub_batch_tokens: int = 256
    loss_min_chunk_rows: int = 512
    loss_chunk_logits_cpu: int = 2 ** 22
    loss_chunk_logits_gpu: int = 2 ** 26
    onednn_primitive_cache: int = 128
    ideep_cache: int = 16
    jemalloc_conf: str = "muzzy_decay_ms:-1,oversize_threshold:0"


@dataclass(frozen=True)
class Measured:
    """What a constant of `Tuning` decides, the CPUs it was measured on, and where the
    measurements are: `results` names the page under docs/, then its section and subsection
    ("benchmarks.md > A > B")."""

    decides: str
    measured_on: str
    results: str


_TUNING = "benchmarks.md > The tuning table's measurements"
_UNNAMED = "the development machine (2 cores; an AMD CPU with AVX-512, family not recorded)"
MEASURED = {
    "short_softmax_keys": Measured(
        "on a CPU, softmax over rows shorter than this is computed as exp(x - max) / sum "
        "(in inference, and in training with its own backward pass): PyTorch's kernel takes "
        "3-7x as long there (decoding's first steps), 3x forward and backward in training",
        "AMD EPYC Zen 4, Intel Xeon (AMX)",
        f"{_TUNING} > Attention paths on a CPU"),
    "small_bmm_products": Measured(
        "CPU inference multiplies weights x values with fewer multiply-adds per matrix than "
        "this as a sum of products: PyTorch's bmm is 1.7-4.8x slower there",
        "AMD EPYC Zen 4, Intel Xeon (AMX)",
        f"{_TUNING} > Attention paths on a CPU"),
    "fused_attention_min_keys": Measured(
        "attention over fewer keys than this takes the explicit path on a CPU: the fused "
        "kernel loses to two bmm's there (16 keys 2.0x slower, 64 keys 0.9x)",
        _UNNAMED, f"{_TUNING} > Attention paths on a CPU"),
    "fused_attention_max_queries": Measured(
        "CPU inference over at most this many rows of queries (batch x heads x queries) takes "
        "the fused kernel whatever its keys: on AVX2-only CPUs the explicit path's dozen "
        "operators take 1.6-3.9x the fused kernel's one call at one sentence's decoding step "
        "(20 rows), 0.8-1.3x at 160 (one line 1.16x); 0 elsewhere, where the explicit path "
        "is the faster one; detected from PyTorch's CPU capability",
        "AMD EPYC Zen 3 (AVX2)", f"{_TUNING} > Attention paths on a CPU"),
    "float32_library": Measured(
        "the library of float32 inference products: MKL's BLAS on Intel's CPUs (1.2-5x "
        "faster than oneDNN at a decoding step's small products) and on AVX2-only ones (one "
        "line 1.4-1.8x, 1,000 lines 1.06-1.21x on a Zen 3), oneDNN elsewhere (1.4-2.3x "
        "faster than MKL on AMD's AVX-512 CPUs from 150 rows on); detected from the CPU's "
        "vendor and PyTorch's CPU capability",
        "Intel Xeon (AMX), AMD EPYC Zen 3, Zen 4, Zen 5",
        f"{_TUNING} > The float32 library by CPU vendor and vector width"),
    "transposed_weights": Measured(
        "whether a loaded translator keeps its float32 linear weights (out, in) as the "
        "transpose of an (in, out) matrix (`layers.transpose_linear_weights`): MKL multiplies "
        "a decoding step's few rows 1.2-1.7x faster with that layout, and as fast from a few "
        "hundred rows; detected: MKL's BLAS multiplies float32 here",
        "Intel Xeon (AMX)",
        f"{_TUNING} > Linear weights stored transposed for MKL"),
    "float32_onednn_min_outputs": Measured(
        "float32 products with at least this many outputs (the output projection) are wide: "
        "oneDNN multiplies those whose rows are in `float32_onednn_rows`",
        "AMD EPYC Zen 3 (AVX2)",
        f"{_TUNING} > The output projection's few rows through oneDNN"),
    "float32_onednn_rows": Measured(
        "the rows of a wide float32 inference product multiplied through oneDNN where MKL's "
        "BLAS is the float32 library: 4 to `decode_max_rows` on CPUs not Intel's, where "
        "MKL's kernels for a few rows are slow (x 128 -> 8,000, 1 thread: 5 rows 1.2-1.7x "
        "faster through oneDNN, 10-25 rows 1.15-1.3x; with the weight packed once, as a "
        "loaded translator's, 48-300 rows 1.03-1.11x and 500-1,000 as fast, at 2 threads "
        "1.06-1.25x from 48 to 1,000 rows; the same sums as MKL's from 4 rows on, but at 5-11 "
        "rows at 2 threads), none elsewhere; detected from the CPU's vendor and the float32 "
        "library",
        "AMD EPYC Zen 3 (AVX2)",
        f"{_TUNING} > The output projection's few rows through oneDNN"),
    "float32_blas_rows": Measured(
        "the rows of a narrow float32 inference product (fewer outputs than "
        "`float32_onednn_min_outputs`) multiplied by MKL's BLAS where oneDNN is the float32 "
        "library: 1 to 63 on AMD's AVX-512 CPUs, where oneDNN's call costs more at a few rows "
        "(5 rows x 128 -> 128, 1 thread: MKL 3x faster on a Zen 4 and a Zen 5; 40 rows "
        "1.3-1.7x; from 150 rows as fast on the Zen 4, oneDNN 1.4-2x faster on the Zen 5), "
        "none elsewhere; detected from the CPU's vendor, MKL and the float32 library",
        "AMD EPYC Zen 4 (AVX512-BF16), Zen 5",
        f"{_TUNING} > The float32 library by CPU vendor and vector width"),
    "int8_onednn": Measured(
        "whether int8's wide layers can run oneDNN's kernels: PyTorch's build has the "
        "oneDNN quantized engine; detected", "every CPU",
        f"{_TUNING} > Int8: the output projection through oneDNN"),
    "int8_max_outputs": Measured(
        "outputs (rows x features) per call of an FBGEMM int8 layer: its kernels take 2-8x "
        "longer per row past ~2-4 MB of float32 output",
        "AMD EPYC Zen 5",
        f"{_TUNING} > Int8: FBGEMM's row chunks"),
    "int8_onednn_min_outputs": Measured(
        "int8 layers with at least this many outputs (the output projection) run oneDNN's "
        "kernels, faster than FBGEMM's at a decoding step's hundreds of rows",
        "AMD EPYC Zen 4, its kernels held to AVX-512 with and without VNNI and to AVX2; "
        "Intel Xeon (AMX)",
        f"{_TUNING} > Int8: the output projection through oneDNN"),
    "int8_onednn_chunk_rows": Measured(
        "rows per chunk in which beam search consumes a oneDNN int8 layer's logits: a "
        "chunk's logits stay in the caches for their log-softmax and top-k",
        "AMD EPYC Zen 4",
        f"{_TUNING} > Int8: the output projection through oneDNN"),
    "decode_max_rows": Measured(
        "rows (sentences x beam) per decoding batch, at the most: fewer rows weigh a step's "
        "fixed costs more, many more outgrow the CPU's caches in the copied caches",
        "AMD EPYC Zen 5",
        f"{_TUNING} > Decoding batches' rows"),
    "topk_block": Measured(
        "columns per block of beam search's two-pass top-k over beam x vocabulary",
        _UNNAMED, f"{_TUNING} > Beam search's top-k"),
    "cache_pool_bytes": Measured(
        "bytes of finished decoding caches' buffers kept for the next ones to write into "
        "(fresh memory costs a page fault per page on its first write): two batches' caches",
        "AMD EPYC Zen 4",
        f"{_TUNING} > The decoding cache's buffer pool"),
    "ct2_sub_batch_tokens": Measured(
        "source tokens per CTranslate2 sub-batch: larger ones make larger matrix products",
        _UNNAMED, f"{_TUNING} > CTranslate2's sub-batches"),
    "ct2_mapped_sub_batch_tokens": Measured(
        "the same with a vocabulary map: smaller sub-batches score fewer candidates",
        _UNNAMED, f"{_TUNING} > CTranslate2's sub-batches"),
    "loss_min_chunk_rows": Measured(
        "rows per chunk of the fused output projection and loss, at the least: fewer make "
        "the gradient's (vocab, rows) x (rows, d) product too thin at a large vocabulary",
        _UNNAMED, f"{_TUNING} > The fused loss's chunks"),
    "loss_chunk_logits_cpu": Measured(
        "logits per chunk of the fused loss on a CPU (~16 MB: the chunk stays in cache)",
        _UNNAMED, f"{_TUNING} > The fused loss's chunks"),
    "loss_chunk_logits_gpu": Measured(
        "logits per chunk of the fused loss on a GPU (a batch in one or two chunks: each "
        "launches ~10 kernels); not timed on its own", "chosen for the NVIDIA H200 of the "
        "CUDA path's checks", f"{_TUNING} > The fused loss's chunks"),
    "onednn_primitive_cache": Measured(
        "primitives oneDNN keeps compiled in a training process (its default 1,024): each "
        "step's products have new shapes, so a larger cache is rarely hit but holds memory "
        "and splits the heap; 128 is more than one step's shapes (8 slows training 2x)",
        "Intel Xeon (AMX)", f"{_TUNING} > The training process's memory"),
    "ideep_cache": Measured(
        "computations PyTorch's oneDNN bridge (ideep) keeps per product shape in a training "
        "process (`LRU_CACHE_CAPACITY`, its default 1,024): under bf16 autocast every step's "
        "products of new shapes add one of ~1-2 MB each, on top of oneDNN's own cache, so "
        "the process grew by hundreds of MB (320 updates of the 30-minute command's "
        "settings: peak 1.16-1.27 GiB at 1,024, 0.68 GiB at 16, as fast)",
        "AMD EPYC Zen 4 (AVX512-BF16)", f"{_TUNING} > The training process's memory"),
    "jemalloc_conf": Measured(
        "jemalloc's settings (`MALLOC_CONF`) in a training process: the pages it has handed "
        "back lazily (MADV_FREE) stay mapped, so the next steps' tensors reuse them without a "
        "page fault each (300 updates of the 30-minute command's settings 1.15-1.38x faster in "
        "three alternating pairs, page faults 6.2-7.9M -> 1.8M; peak memory 0.60 -> 0.72 GiB, "
        "at 4,096-token batches 0.77 -> 1.05 GiB), and allocations of 8 MiB and more (the "
        "loss's logits buffer) come from the same arenas, not from a dedicated one that unmaps "
        "them at once (bf16, 320 updates: faults 2.57M -> 0.27M, 1.02x and 1.14x faster, peak "
        "+16-44 MiB)",
        "AMD EPYC Zen 3 (AVX2), AMD EPYC Zen 4 (AVX512-BF16)",
        f"{_TUNING} > The training process's memory"),
}


def detect_tuning() -> Tuning:
    """The table for this process: the measured constants, with what depends on the CPU
    and on PyTorch's build detected."""
    library = float32_library()
    return Tuning(fused_attention_max_queries=120 if cpu_avx2_only() else 0,
                  float32_library=library,
                  transposed_weights=library == "blas" and torch.backends.mkl.is_available(),
                  float32_onednn_rows=float32_onednn_rows(library),
                  float32_blas_rows=float32_blas_rows(library),
                  int8_onednn="onednn" in torch.backends.quantized.supported_engines)


TUNING = detect_tuning()
