"""Training data made by a model's translations: back-translation and distillation.

    settings = BacktranslationSettings(model="runs/de-en", engine="torch", request=request)
    progress = resume_point(Path("mono.de"), Path("bt.en"), settings)   # fresh, or resumed
    backtranslate(translator, Path("mono.de"), Path("bt.en"), settings, progress)
    distill(teacher, Path("train.en"), Path("train.de"), Path("distilled.de"), request)

- **Back-translation** (Sennrich et al. 2016): a reverse-direction model translates
  monolingual target-side text; its translations are the synthetic source of a new corpus
  (`corpus_fragment`: its `data.corpora` entry, tagged). Sampling beats beam search here
  (Edunov et al. 2018). Millions of lines are read and translated in chunks, and the work
  survives an interruption: each chunk is appended to `OUT.partial` and fsynced, then
  `OUT.progress.json` (`Progress`) records it atomically; a new run with the same input and
  settings truncates the partial file to the recorded length and goes on with the next
  chunk, so no line is translated twice and none is lost. Each chunk samples with a seed of
  its own, derived from (seed, chunk number) (`chunk_seed`), so a resumed run writes the
  same file as an uninterrupted one (with our engine: CTranslate2 seeds each of its threads
  once per process, `engines.py`). When done, the partial file is renamed to OUT.
- **Sequence-level knowledge distillation** (Kim and Rush 2016): a teacher's n-best per
  source line, the hypothesis with the highest sentence chrF against the reference kept
  (`best_by_chrf`, as mozilla/translations does); optionally the worst share of pairs by
  that chrF dropped (mozilla/translations drops by a reverse model's score instead, which
  this package does not do). The kept outputs are a small student's training targets.

Both work with any engine (`translator.BaseTranslator.translations`, one `DecodingRequest`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import tempfile
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from sacrebleu.metrics import CHRF

from ..data.text import check_aligned, count_lines, iter_line_blocks, iter_parallel
from ..decoding.corpus import DEFAULT_MAX_TOKENS
from ..decoding.request import DecodingRequest
from ..decoding.translator import BaseTranslator
from ..errors import ConfigError, DataError
from ..files import append_synced, atomic_write
from ..run.data_config import CorpusConfig

__all__ = ["count_input", "BacktranslationSettings", "Progress", "work_files", "resume_point",
           "chunk_seed", "BacktranslationReport", "backtranslate", "corpus_fragment",
           "best_by_chrf", "keep_mask", "DistillationReport", "distill"]


def count_input(path: Path, reference: Path | None = None) -> int:
    """The lines of an input file (and, given, of its reference, which must have as many:
    `DataError` naming both files otherwise), counted before any work; an input without a
    line is a `DataError`."""
    count = (count_lines(path) if reference is None else
             check_aligned(path, reference, split="the input and its reference"))
    if count == 0:
        raise DataError(f"{path} is empty: there is nothing to translate")
    return count


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """`lines` in lists of `size` (the last one shorter)."""
    it = iter(lines)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _lines(path: Path) -> Iterator[str]:
    """A file's lines, streamed (`text.iter_line_blocks`)."""
    return (line for block in iter_line_blocks(path) for line in block)


# ---- back-translation ---------------------------------------------------------------------


@dataclass(frozen=True)
class BacktranslationSettings:
    """What decides a back-translation's output, recorded with its progress so that a run
    resumes only what the same settings began: the model (as given), its engine and whether
    that runs in int8 (`quantize`), the decoding request, and the chunks and batches the
    lines are drawn in (sampling draws depend on the batches)."""

    model: str
    engine: str
    request: DecodingRequest
    chunk_lines: int = 10_000
    max_tokens: int = DEFAULT_MAX_TOKENS
    quantize: str | None = None  # `Translator`'s: outputs differ slightly from float32's

    def record(self) -> dict[str, Any]:
        """The settings as the progress record stores them (JSON values)."""
        return json.loads(json.dumps(asdict(self)))


@dataclass(frozen=True)
class Progress:
    """An unfinished back-translation, as its record (`OUT.progress.json`) says: the input
    and settings it is for, and what of the partial file is complete (whole chunks: their
    count, lines and bytes)."""

    input: str  # the input's absolute path
    input_bytes: int  # its size: another file under the same name is not resumed
    settings: dict[str, Any] = field(default_factory=dict)
    chunks: int = 0
    lines: int = 0
    bytes: int = 0

    def save(self, path: Path) -> None:
        with atomic_write(path, text=True) as f:
            json.dump(asdict(self), f, indent=1)


def work_files(output: Path) -> tuple[Path, Path]:
    """(partial file, progress record) of a back-translation into `output`, beside it."""
    return (output.with_name(output.name + ".partial"),
            output.with_name(output.name + ".progress.json"))


def resume_point(source: Path, output: Path, settings: BacktranslationSettings) -> Progress:
    """Where a back-translation of `source` into `output` starts: after the chunks an
    earlier run with the same input and settings completed (its progress record), else at
    the beginning. An unfinished run with another input or other settings is refused in one
    line naming the first difference (`ConfigError`), a record that does not fit its
    partial file too (`DataError`): both say how to start over."""
    partial, record = work_files(output)
    fresh = Progress(str(source.resolve()), source.stat().st_size, settings.record())
    if not record.exists():
        return fresh
    start_over = f"delete {record} and {partial} to start over"
    try:
        found = Progress(**json.loads(record.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as e:
        raise DataError(f"{record} is not a progress record ({e}); {start_over}") from None
    expected = asdict(replace(fresh, chunks=found.chunks, lines=found.lines, bytes=found.bytes))
    difference = _first_difference(asdict(found), expected)
    if difference:
        raise ConfigError(f"{record} records an unfinished back-translation with another "
                          f"{difference}: give the same input and options to resume it, or "
                          f"{start_over}")
    size = partial.stat().st_size if partial.exists() else 0
    if size < found.bytes:
        raise DataError(f"{partial} has {size} bytes, fewer than the {found.bytes} that "
                        f"{record} records; {start_over}")
    return found


def _first_difference(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> str:
    """"KEY (OLD then, NEW now)" for the first key whose values differ, nested keys dotted
    (settings.request.sampling.seed); "" when none does."""
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            if found := _first_difference(a, b, f"{prefix}{key}."):
                return found
        elif a != b:
            return f"{prefix}{key} ({a!r} then, {b!r} now)"
    return ""


def chunk_seed(seed: int, chunk: int) -> int:
    """The sampling seed of chunk `chunk` (from 0) of a run seeded `seed`: a function of
    the two alone, so a resumed run draws as an uninterrupted one; different chunks draw
    independently (numpy's `SeedSequence`, as `mixture.Mixture.draw` seeds epochs)."""
    return int(np.random.SeedSequence([seed, chunk]).generate_state(1)[0])


def _chunk_request(request: DecodingRequest, chunk: int) -> DecodingRequest:
    """`request` for chunk `chunk`: its sampling seeded by `chunk_seed`."""
    if request.sampling is None:
        return request
    seed = chunk_seed(request.sampling.seed, chunk)
    return replace(request, sampling=replace(request.sampling, seed=seed))


@dataclass(frozen=True)
class BacktranslationReport:
    """A finished back-translation: the output's lines, those an earlier run had done, and
    this run's seconds."""

    lines: int
    resumed: int
    seconds: float

    @property
    def per_second(self) -> float:
        """This run's sentences per second."""
        return (self.lines - self.resumed) / max(self.seconds, 1e-9)


def backtranslate(translator: BaseTranslator, source: Path, output: Path,
                  settings: BacktranslationSettings, progress: Progress, *,
                  on_progress: Callable[[int], None] | None = None) -> BacktranslationReport:
    """Translate every line of `source` into `output` (one line per input line, in order),
    chunk by chunk from `progress` (`resume_point`) on, as the module docstring describes.
    `on_progress(n)` is called as sentences are done."""
    start, resumed = time.perf_counter(), progress.lines
    partial, record = work_files(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(partial, "ab") as f:
        f.truncate(progress.bytes)  # what a crash left after the last complete chunk
    lines = itertools.islice(_lines(source), progress.lines, None)
    for number, chunk in enumerate(_chunks(lines, settings.chunk_lines), progress.chunks):
        results = translator.translations(
            chunk, _chunk_request(settings.request, number), max_tokens=settings.max_tokens,
            line_offset=progress.lines, on_progress=on_progress)
        size = append_synced(partial, "".join(hyps[0].text + "\n" for hyps in results)
                             .encode("utf-8"))
        progress = replace(progress, chunks=number + 1, lines=progress.lines + len(chunk),
                           bytes=size)
        progress.save(record)
    os.replace(partial, output)
    record.unlink()
    return BacktranslationReport(progress.lines, resumed, time.perf_counter() - start)


def corpus_fragment(corpus: CorpusConfig) -> str:
    """The YAML a run's config needs to train on a synthetic corpus: a preset (`# @package
    _global_`) whose `data.corpora` lists `corpus` (its fields that differ from the
    defaults, strings quoted) below a commented line for the real corpus, which the user
    must list too: the synthetic corpus adds to the real one, never replaces it."""
    defaults = CorpusConfig(name="x", src="x", tgt="x")
    values = {key: value for key, value in asdict(corpus).items()
              if key in ("name", "src", "tgt", "weight") or value != getattr(defaults, key)}
    entry = ", ".join(f"{key}: {json.dumps(value)}" for key, value in values.items())
    return "\n".join([
        "# @package _global_",
        "# data.corpora with the synthetic corpus. List the real corpus too (the commented",
        "# line, with its files): the synthetic corpus adds to it. As a preset: save this as",
        "# DIR/experiment/NAME.yaml and train with --config-dir DIR experiment=NAME (add",
        "# \"defaults: [multi30k]\" to keep the Multi30k recipe).",
        "data:",
        "  corpora:",
        "    # - {name: real, src: REAL_SOURCE_FILE, tgt: REAL_TARGET_FILE, weight: 1.0}",
        f"    - {{{entry}}}",
        ""])


# ---- distillation -------------------------------------------------------------------------


def best_by_chrf(hypotheses: Sequence[str], reference: str, metric: CHRF | None = None
                 ) -> tuple[int, list[float]]:
    """(index of the hypothesis with the highest sentence chrF against `reference`, every
    hypothesis's chrF): sacrebleu's `sentence_chrf` (`metric`: a `CHRF()` to reuse). Of
    equal scores the first wins: the teacher ranked it higher."""
    metric = metric or CHRF()
    scores = [metric.sentence_score(hyp, [reference]).score for hyp in hypotheses]
    return max(range(len(scores)), key=scores.__getitem__), scores


def keep_mask(scores: Sequence[float], drop_worst: float) -> np.ndarray:
    """Which pairs to keep when the share `drop_worst` in [0, 1) of them with the lowest
    `scores` is dropped: floor(share x pairs) of them, of equal scores the earlier line
    first."""
    order = np.argsort(np.asarray(scores, dtype=np.float64), kind="stable")
    keep = np.ones(len(scores), dtype=bool)
    keep[order[:int(len(scores) * drop_worst)]] = False
    return keep


@dataclass(frozen=True)
class DistillationReport:
    """A finished distillation: lines read, pairs written, seconds, and the mean sentence
    chrF of the chosen hypotheses (all lines, and the kept ones) and of the teacher's 1-best
    (all lines), for comparison."""

    lines: int
    kept: int
    seconds: float
    chosen_chrf: float
    first_chrf: float
    kept_chrf: float

    @property
    def per_second(self) -> float:
        """Sentences translated per second."""
        return self.lines / max(self.seconds, 1e-9)


def distill(translator: BaseTranslator, source: Path, reference: Path, output: Path,
            request: DecodingRequest, *, drop_worst: float = 0.0,
            output_source: Path | None = None, chunk_lines: int = 10_000,
            max_tokens: int = DEFAULT_MAX_TOKENS,
            on_progress: Callable[[int], None] | None = None) -> DistillationReport:
    """Translate `source` (line-aligned with `reference`) with the teacher's n-best
    (`request.nbest`) chunk by chunk, keep per line the hypothesis `best_by_chrf` picks, drop
    the `drop_worst` share of lines with the lowest chosen chrF (`keep_mask`), and write the
    kept hypotheses to `output` and, given `output_source`, their source lines to it, each
    atomically. The chosen lines wait in a temporary file beside `output` until every
    score is known; memory holds two floats per line."""
    start, metric = time.perf_counter(), CHRF()
    chosen, first = array("d"), array("d")
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile("w+", encoding="utf-8", newline="\n", dir=output.parent,
                                prefix=f".{output.name}.") as hypotheses:
        for chunk in iter_parallel(source, reference, split="the input and its reference",
                                   chunk_pairs=chunk_lines, drop_empty=False):
            results = translator.translations(chunk.src, request, max_tokens=max_tokens,
                                              line_offset=chunk.lines[0],
                                              on_progress=on_progress)
            for hyps, ref in zip(results, chunk.tgt, strict=True):
                best, scores = best_by_chrf([h.text for h in hyps], ref, metric)
                hypotheses.write(hyps[best].text + "\n")
                chosen.append(scores[best])
                first.append(scores[0])
        hypotheses.seek(0)
        keep = keep_mask(chosen, drop_worst)
        _write_kept(keep, (line.removesuffix("\n") for line in hypotheses), output,
                    _lines(source), output_source)
    kept = np.frombuffer(chosen, dtype=np.float64)[keep]
    return DistillationReport(len(chosen), len(kept), time.perf_counter() - start,
                              float(np.mean(chosen)), float(np.mean(first)),
                              float(kept.mean()) if len(kept) else 0.0)


def _write_kept(keep: np.ndarray, targets: Iterable[str], output: Path,
                sources: Iterable[str], output_source: Path | None) -> None:
    """The kept lines of `targets` to `output` and of `sources` to `output_source` (None:
    not written), both atomically."""
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(atomic_write(output, text=True))
        out_src = (stack.enter_context(atomic_write(output_source, text=True))
                   if output_source is not None else None)
        for kept, target, src in zip(keep, targets, sources, strict=True):
            if kept:
                out.write(target + "\n")
                if out_src is not None:
                    out_src.write(src + "\n")
