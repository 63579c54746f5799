"""Reading parallel text and checking it: the one place where raw lines enter the package.

- `read_lines`: a whole UTF-8 file (plain or `.gz`) -> its lines;
- `iter_lines`: a byte stream (standard input, a large file) -> its lines, lazily;
- `read_parallel`: a source and a target file -> a `ParallelText` of aligned pairs.

Both readers follow one convention: lines end at "\\n" only; a "\\r" before it (Windows) is
removed and any other "\\r" becomes a space, so a stray "\\r" can never shift line alignment;
a leading UTF-8 BOM is dropped. Invalid UTF-8 raises `DataError` naming the file and line.
"""

from __future__ import annotations

import codecs
import gzip
import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Union

__all__ = ["DataError", "read_lines", "iter_lines", "ParallelText", "read_parallel"]

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]


class DataError(ValueError):
    """Bad input data: misaligned files, invalid UTF-8, failed checksum, ..."""


def _invalid_utf8(name: str, line: int, raw: bytes, position: int) -> DataError:
    """The error for the undecodable byte at `position` of a line's bytes `raw`."""
    return DataError(f"{name}, line {line}: invalid UTF-8 (byte 0x{raw[position]:02x} at "
                     f"byte {position + 1} of the line)")


def _clean(line: str) -> str:
    """A line without its terminator; any other "\\r" becomes a space."""
    return line.removesuffix("\n").removesuffix("\r").replace("\r", " ")


def read_lines(path: PathLike) -> list[str]:
    """The lines of a UTF-8 text file (plain or `.gz`), without line terminators."""
    path = Path(path)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{path}: not a valid gzip file ({e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        start = raw.rfind(b"\n", 0, e.start) + 1
        raise _invalid_utf8(str(path), raw.count(b"\n", 0, e.start) + 1, raw[start:],
                            e.start - start) from None
    lines = text.removeprefix("\ufeff").split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start a new one
    if "\r" in text:
        lines = [_clean(line) for line in lines]
    return lines


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


def read_parallel(src_path: PathLike, tgt_path: PathLike, *, split: str) -> ParallelText:
    """Read and check one split. Only for split == "train", pairs with an empty or
    whitespace-only side are dropped (and counted in the log)."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"{split}: {src_path} has {len(src)} lines but {tgt_path} has {len(tgt)} lines; "
            "source and target files must be line-aligned"
        )
    lines = list(range(len(src)))
    if split == "train":
        lines = [i for i in lines if src[i].strip() and tgt[i].strip()]
        log.info(
            "%s: %d pairs in %s / %s; dropped %d with an empty or whitespace-only side",
            split, len(src), src_path, tgt_path, len(src) - len(lines),
        )
        if len(lines) < len(src):
            src, tgt = [src[i] for i in lines], [tgt[i] for i in lines]
        if not lines:
            raise DataError(f"{split}: no non-empty pairs in {src_path} / {tgt_path}")
    else:
        log.info("%s: %d pairs in %s / %s", split, len(src), src_path, tgt_path)
    return ParallelText(src, tgt, lines)
