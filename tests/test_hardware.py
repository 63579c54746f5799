"""hardware.py: the CPU read from /proc/cpuinfo, the library chosen by its vendor, the one
place that sets the threads, and the tuning table, every constant of which says what it
decides, where it was measured and which section of docs/benchmarks.md (or docs/results.md)
has the numbers."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from transformer import hardware

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _on_cpu(monkeypatch: pytest.MonkeyPatch, vendor: str | None, capability: str,
            mkl: bool = True) -> None:
    """Have the detection see a CPU of `vendor` whose widest kernels PyTorch runs are
    `capability`'s, in a build with or without MKL."""
    monkeypatch.setattr(hardware, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: mkl)


@pytest.mark.parametrize("vendor, capability, library", [
    ("GenuineIntel", "AVX512", "blas"), ("GenuineIntel", "AVX2", "blas"),
    ("AuthenticAMD", "AVX512", "onednn"), ("AuthenticAMD", "AVX2", "blas"),
    (None, "AVX512", "onednn"), (None, "DEFAULT", "onednn")])
def test_the_float32_library_follows_the_cpus_vendor_and_vectors(vendor, capability, library,
                                                                  monkeypatch):
    """MKL's BLAS on Intel's CPUs (its AVX-512 kernels run there only) and on AVX2-only x86
    CPUs (both libraries run AVX2 kernels there), oneDNN elsewhere."""
    _on_cpu(monkeypatch, vendor, capability)
    if torch.backends.mkldnn.is_available():
        assert hardware.float32_library() == library
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert hardware.float32_library() == "blas"  # PyTorch built without oneDNN


@pytest.mark.parametrize("vendor, capability, rows", [
    ("GenuineIntel", "AVX512", range(0)), ("GenuineIntel", "AVX2", range(0)),
    ("AuthenticAMD", "AVX512", range(0)), ("AuthenticAMD", "AVX2", range(4, 1025))])
def test_the_output_projections_rows_take_onednn_where_mkls_kernels_are_slow(
        vendor, capability, rows, monkeypatch):
    """Where MKL's BLAS multiplies float32 on a CPU not Intel's (an AVX2-only AMD CPU), a
    wide product of 4 rows up to a decoding batch's most (`decode_max_rows`) goes to oneDNN;
    nowhere else (oneDNN takes every product where it is the library), and nowhere in a
    build without oneDNN."""
    _on_cpu(monkeypatch, vendor, capability)
    if torch.backends.mkldnn.is_available():
        assert hardware.float32_onednn_rows(hardware.float32_library()) == rows
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert hardware.float32_onednn_rows(hardware.float32_library()) == range(0)


@pytest.mark.parametrize("vendor, capability, mkl, rows", [
    ("GenuineIntel", "AVX512", True, range(0)), ("AuthenticAMD", "AVX2", True, range(0)),
    ("AuthenticAMD", "AVX512", True, range(1, 64)), ("AuthenticAMD", "AVX512", False, range(0)),
    (None, "AVX512", True, range(0))])
def test_a_narrow_products_few_rows_take_mkl_on_amds_avx512_cpus(vendor, capability, mkl, rows,
                                                                 monkeypatch):
    """Where oneDNN multiplies float32 on an AMD CPU and PyTorch has MKL, the narrow products'
    1-63 rows go to MKL's BLAS; nowhere else (MKL takes every product where it is the
    library; a CPU of unknown vendor keeps oneDNN), and nowhere in a build without oneDNN."""
    _on_cpu(monkeypatch, vendor, capability, mkl)
    if torch.backends.mkldnn.is_available():
        assert hardware.float32_blas_rows(hardware.float32_library()) == rows
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert hardware.float32_blas_rows(hardware.float32_library()) == range(0)


def test_cpu_info_reads_the_first_processors_field_by_its_whole_name(tmp_path):
    """/proc/cpuinfo lists "model" before "model name": each is found by its own name, in
    the first processor's block only; a missing field or file is None."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n"
                       "model\t\t: 17\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx2\n\n"
                       "processor\t: 1\nmodel\t\t: 99\nmicrocode\t: 0xa101\n")
    read = lambda field: hardware.cpu_info(field, str(cpuinfo))
    assert (read("model"), read("model name"), read("cpu family")) == ("17", "AMD EPYC 9R14", "25")
    assert read("flags").split() == ["fpu", "avx2"] and read("vendor_id") == "AuthenticAMD"
    assert read("microcode") is None
    assert hardware.cpu_info("model", str(tmp_path / "missing")) is None


def _headings(page: Path) -> list[tuple[int, str]]:
    """A page's headings outside code blocks: (level, text)."""
    headings, in_code = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            headings.append((level, line[level:].strip()))
    return headings


def _section_exists(headings: list[tuple[int, str]], parts: list[str]) -> bool:
    """Whether `parts` name a heading, each under the one before it (a "A > B" path: a
    heading B inside A's section, before the next heading of A's level or above)."""
    def find(start: int, end: int, depth: int, part: int) -> bool:
        for i in range(start, end):
            level, text = headings[i]
            if level <= depth or not text.startswith(parts[part]):
                continue
            if part == len(parts) - 1:
                return True
            close = next((j for j in range(i + 1, end) if headings[j][0] <= level), end)
            if find(i + 1, close, level, part + 1):
                return True
        return False
    return find(0, len(headings), 0, 0)


def test_every_measured_constant_says_what_it_decides_and_where_it_was_measured():
    """One entry of MEASURED per field of the table, each naming a page of docs/ (results.md
    or benchmarks.md) and a section of it that exists (a "page > A > B" entry: the heading B
    inside the section A)."""
    names = [f.name for f in dataclasses.fields(hardware.Tuning)]
    assert list(hardware.MEASURED) == names
    for name, measured in hardware.MEASURED.items():
        assert measured.decides and measured.measured_on, name
        page, *parts = measured.results.split(" > ")
        assert page in ("benchmarks.md", "results.md") and parts, (name, measured.results)
        assert _section_exists(_headings(DOCS / page), parts), (name, measured.results)


def test_the_table_is_detected_once_with_what_depends_on_this_machine():
    detected = hardware.detect_tuning()
    assert detected == hardware.TUNING
    assert detected.float32_library == hardware.float32_library()
    assert detected.fused_attention_max_queries == (120 if hardware.cpu_avx2_only() else 0)
    assert detected.int8_onednn == ("onednn" in torch.backends.quantized.supported_engines)
    assert detected.transposed_weights == (detected.float32_library == "blas"
                                           and torch.backends.mkl.is_available())
    assert detected.float32_onednn_rows == hardware.float32_onednn_rows(
        detected.float32_library)
    assert detected.float32_blas_rows == hardware.float32_blas_rows(detected.float32_library)
    defaults = hardware.Tuning()
    same = {f.name for f in dataclasses.fields(defaults)} - {
        "float32_library", "int8_onednn", "transposed_weights", "fused_attention_max_queries",
        "float32_onednn_rows", "float32_blas_rows"}
    assert all(getattr(detected, name) == getattr(defaults, name) for name in same)


def test_the_tuning_fixture_swaps_the_table_for_one_test(tuning):
    before = hardware.TUNING
    table = tuning(short_softmax_keys=0, decode_max_rows=24)
    assert hardware.TUNING is table and table == dataclasses.replace(
        before, short_softmax_keys=0, decode_max_rows=24)


def test_threads_are_set_in_one_place_and_restored_after_a_block():
    threads = torch.get_num_threads()
    with hardware.threads_set_to(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads
    package = Path(hardware.__file__).parent
    setting = [str(path.relative_to(package)) for path in package.rglob("*.py")
               if re.search(r"set_num_threads\(", path.read_text(encoding="utf-8"))]
    assert setting == ["hardware.py"]
