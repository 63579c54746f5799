"""Reading parallel text and checking it: the one place where raw lines enter the package.

- `iter_line_blocks`: a UTF-8 file (plain or `.gz`) -> its lines, streamed in blocks;
  `read_lines`: the same, as one list;
- `iter_lines`: a byte stream (standard input) -> its lines, one at a time;
- `count_lines`: a file's lines, counted without decoding them; `check_aligned`: two files'
  line counts, checked equal before any work reads them;
- `iter_parallel`: a source and a target file -> checked, aligned pairs in chunks (a corpus of
  any size); `read_parallel`: the same, as one `ParallelText`.

All readers follow one convention: lines end at "\\n" only; a "\\r" before it (Windows) is
removed and any other "\\r" becomes a space, so a stray "\\r" can never shift line alignment;
a leading UTF-8 BOM is dropped; a last line without "\\n" is a line. Everything else is text
(tabs, control characters): a training corpus's cleaning and the tokenizer decide what to do
with it. Invalid UTF-8 (a Latin-1 file) raises `DataError` naming the file and line.
"""

from __future__ import annotations

import codecs
import gzip
import logging
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Union

from ..errors import DataError

__all__ = ["open_binary", "iter_line_blocks", "read_lines", "iter_lines", "count_lines",
           "check_aligned",
           "ParallelText", "non_empty", "iter_parallel", "read_parallel"]

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]


def _invalid_utf8(name: str, line: int, raw: bytes, position: int) -> DataError:
    """The error for the undecodable byte at `position` of a line's bytes `raw`, with the
    usual cure (text in another encoding, most often Latin-1 or Windows-1252)."""
    return DataError(f"{name}, line {line}: invalid UTF-8 (byte 0x{raw[position]:02x} at "
                     f"byte {position + 1} of the line); text must be UTF-8: convert the "
                     "file, e.g. iconv -f latin1 -t utf-8")


def _clean(line: str) -> str:
    """A line without its terminator; any other "\\r" becomes a space."""
    return line.removesuffix("\n").removesuffix("\r").replace("\r", " ")


BLOCK_BYTES = 1 << 22  # bytes decoded at a time when streaming a file


def open_binary(path: PathLike) -> BinaryIO:
    """The file's bytes, decompressed on the fly for `.gz`."""
    path = Path(path)
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _raw_blocks(path: Path) -> Iterator[bytes]:
    """The file's bytes in blocks of whole lines (each ends with "\\n", except perhaps the
    last block of a file without a final newline)."""
    with open_binary(path) as f:
        rest = b""
        while True:
            try:
                block = f.read(BLOCK_BYTES)
            except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt .gz
                raise DataError(f"{path}: not a valid gzip file ({e})") from None
            if not block:
                break
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                rest += block
                continue
            yield rest + block[:cut]
            rest = block[cut:]
        if rest:
            yield rest


def iter_line_blocks(path: PathLike) -> Iterator[list[str]]:
    """The lines of a UTF-8 text file (plain or `.gz`), without terminators, in blocks:
    the file is streamed, never held whole. Invalid UTF-8 raises `DataError` naming the
    line, however deep in the file it is."""
    path = Path(path)
    first_line = 1
    for raw in _raw_blocks(path):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            start = raw.rfind(b"\n", 0, e.start) + 1
            end = raw.find(b"\n", e.start)
            raise _invalid_utf8(str(path), first_line + raw.count(b"\n", 0, e.start),
                                raw[start:end if end >= 0 else len(raw)],
                                e.start - start) from None
        if first_line == 1:
            text = text.removeprefix("\ufeff")
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()  # the final newline ends the last line, it does not start a new one
        if "\r" in text:
            lines = [_clean(line) for line in lines]
        first_line += len(lines)
        yield lines


def read_lines(path: PathLike) -> list[str]:
    """The lines of a UTF-8 text file (plain or `.gz`), without line terminators."""
    return [line for block in iter_line_blocks(path) for line in block]


def count_lines(path: PathLike) -> int:
    """The lines of a file (plain or `.gz`), as `iter_line_blocks` reads them (a last line
    without "\\n" included), counted in blocks without decoding: cheap enough to check a
    file before the work that reads it."""
    count, last = 0, b"\n"
    for block in _raw_blocks(Path(path)):
        count += block.count(b"\n")
        last = block[-1:]
    return count + (last != b"\n")


def check_aligned(src_path: PathLike, tgt_path: PathLike, *, split: str) -> int:
    """The line count of two files that must be line-aligned (`count_lines`), checked before
    any work reads them: when they differ, the `DataError` `iter_parallel` raises."""
    src_count, tgt_count = count_lines(src_path), count_lines(tgt_path)
    if src_count != tgt_count:
        raise _misaligned(split, src_path, src_count, tgt_path, tgt_count)
    return src_count


def _misaligned(split: str, src_path: PathLike, src_count: int, tgt_path: PathLike,
                tgt_count: int) -> DataError:
    return DataError(f"{split}: {src_path} has {src_count} lines but {tgt_path} has "
                     f"{tgt_count} lines; source and target files must be line-aligned")


def iter_lines(stream: BinaryIO, name: str) -> Iterator[str]:
    """The lines of a UTF-8 byte stream, read lazily; `name` is used in errors."""
    for number, raw in enumerate(stream, 1):
        if number == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _invalid_utf8(name, number, raw, e.start) from None
        yield _clean(line)


@dataclass
class ParallelText:
    """Line-aligned sentences of one split; `lines[i]` is pair i's 0-based line number."""

    src: list[str]
    tgt: list[str]
    lines: list[int]

    def __len__(self) -> int:
        return len(self.src)


def iter_parallel(src_path: PathLike, tgt_path: PathLike, *, split: str,
                  chunk_pairs: int = 100_000, max_pairs: int | None = None,
                  drop_empty: bool | None = None) -> Iterator[ParallelText]:
    """Stream and check one split in chunks of at most `chunk_pairs` aligned pairs: UTF-8
    and line endings as `iter_line_blocks`, equal line counts (checked when the shorter file
    ends: the error names both files and their counts, after `split`, which names the data
    in messages). With `drop_empty` (default: for split == "train"), pairs with an empty or
    whitespace-only side are dropped (and counted in the log). `max_pairs` stops after
    yielding that many pairs (the rest of the files is not read or checked)."""
    drop_empty = split == "train" if drop_empty is None else drop_empty
    src_blocks, tgt_blocks = iter_line_blocks(src_path), iter_line_blocks(tgt_path)
    src: list[str] = []
    tgt: list[str] = []
    line = kept = dropped = 0  # lines read so far; pairs yielded; pairs with an empty side
    while max_pairs is None or kept < max_pairs:
        while len(src) < chunk_pairs and (block := next(src_blocks, None)) is not None:
            src += block
        while len(tgt) < len(src) and (block := next(tgt_blocks, None)) is not None:
            tgt += block
        n = min(len(src), len(tgt), chunk_pairs)
        if n == 0:
            break
        chunk = ParallelText(src[:n], tgt[:n], list(range(line, line + n)))
        del src[:n], tgt[:n]
        line += n
        if drop_empty:
            non_empty = _non_empty(chunk)
            dropped += len(chunk) - len(non_empty)
            chunk = non_empty
        if max_pairs is not None and kept + len(chunk) > max_pairs:
            chunk = _first(chunk, max_pairs - kept)
        kept += len(chunk)
        if len(chunk):
            yield chunk
    if max_pairs is None or kept < max_pairs:  # the whole files were read
        src_count = line + len(src) + sum(map(len, src_blocks))
        tgt_count = line + len(tgt) + sum(map(len, tgt_blocks))
        if src_count != tgt_count:
            raise _misaligned(split, src_path, src_count, tgt_path, tgt_count)
    if drop_empty:
        limit = "" if max_pairs is None or kept < max_pairs else f", kept the first {kept:,}"
        log.info("%s: %d pairs read in %s / %s; dropped %d with an empty or whitespace-only "
                 "side%s", split, line, src_path, tgt_path, dropped, limit)
        if kept == 0:
            raise DataError(f"{split}: no non-empty pairs in {src_path} / {tgt_path}")
    else:
        log.info("%s: %d pairs in %s / %s", split, line, src_path, tgt_path)


def _first(text: ParallelText, n: int) -> ParallelText:
    return ParallelText(text.src[:n], text.tgt[:n], text.lines[:n])


def non_empty(src: Sequence[str], tgt: Sequence[str]) -> list[bool]:
    """For each pair, whether both sides have a non-space character (the one rule for a
    pair with an empty side)."""
    return [bool(s.strip() and t.strip()) for s, t in zip(src, tgt, strict=True)]


def _non_empty(text: ParallelText) -> ParallelText:
    """The pairs of `text` whose two sides both have a non-space character."""
    keep = [i for i, ok in enumerate(non_empty(text.src, text.tgt)) if ok]
    if len(keep) == len(text):
        return text
    return ParallelText([text.src[i] for i in keep], [text.tgt[i] for i in keep],
                        [text.lines[i] for i in keep])


def read_parallel(src_path: PathLike, tgt_path: PathLike, *, split: str) -> ParallelText:
    """Read and check a whole split (see `iter_parallel`; for splits that fit in memory)."""
    out = ParallelText([], [], [])
    for chunk in iter_parallel(src_path, tgt_path, split=split):
        out.src += chunk.src
        out.tgt += chunk.tgt
        out.lines += chunk.lines
    return out
