"""Atomic file writes: every file the package writes appears whole or not at all.

    with atomic_write(path) as f:      # a temporary file beside `path`
        f.write(data)                  # renamed to `path` only when this block succeeds

On any failure (a full disk, a file-size limit, an exception in the block) the temporary
file is removed and `path` keeps its previous contents. `atomic_directory` does the same for
a directory of files (an export). `append_synced` grows a file that a resumable job
writes piece by piece, each piece on disk before the job records it. A failed write raises
`WriteError`,
an `OSError` whose one-line message names the file and the reason, so entry points can print
it without a traceback.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Union

from .errors import WriteError

__all__ = ["atomic_write", "atomic_directory", "append_synced"]

PathLike = Union[str, "os.PathLike[str]"]


class _RecordingFile:
    """A file object that remembers the OSError of a failed write. Some writers (torch.save)
    catch it and raise an unrelated RuntimeError; this keeps the real reason."""

    def __init__(self, f: IO) -> None:
        self._f = f
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            self.error = e
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def _failed(path: Path, error: OSError) -> WriteError:
    return WriteError(f"could not write {path}: {error.strerror or error}")


@contextmanager
def atomic_write(path: PathLike, *, text: bool = False) -> Iterator[IO]:
    """Write `path` through a temporary file in the same folder, renamed over `path` after
    the block (fsync'ed first). Binary by default; `text=True` writes UTF-8 with "\\n".
    An exception raised by the block itself passes through unchanged, unless a write
    failed (then `WriteError`)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise _failed(path, e) from e
    f = os.fdopen(fd, "w" if text else "wb", **({"encoding": "utf-8", "newline": "\n"}
                                                 if text else {}))
    recorder = _RecordingFile(f)
    try:
        try:
            yield recorder
        except Exception as e:  # any: torch.save re-raises a failed write as RuntimeError
            if recorder.error is not None:
                raise _failed(path, recorder.error) from e
            raise
        try:
            f.flush()
            os.fsync(f.fileno())
            f.close()
            os.replace(tmp, path)
        except OSError as e:
            raise _failed(path, e) from e
    finally:
        try:
            f.close()  # a no-op when closed above
        except OSError:
            pass  # the error that matters was raised already
        Path(tmp).unlink(missing_ok=True)  # a no-op after os.replace


@contextmanager
def atomic_directory(path: PathLike) -> Iterator[Path]:
    """Build a directory in a temporary folder beside `path`, renamed to `path` after the
    block; an existing `path` is moved aside first, then deleted. On failure the temporary
    folder is removed and `path` is left as it was; an OSError becomes `WriteError`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
        build.chmod(0o755)  # mkdtemp's is 0o700
    except OSError as e:
        raise _failed(path, e) from e
    try:
        yield build
        old = path.with_name(f".{path.name}.old")
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(build, path)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        raise _failed(path, e) from e
    finally:
        shutil.rmtree(build, ignore_errors=True)  # a no-op after the rename


def append_synced(path: PathLike, data: bytes) -> int:
    """Append `data` to `path` (created if missing) and fsync it; returns the file's size,
    all of it on disk: what a resumable job may record as done. A failed write raises
    `WriteError` naming the file (a piece written in part stays: the job's record says
    where the complete ones end)."""
    path = Path(path)
    try:
        with open(path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            return f.tell()
    except OSError as e:
        raise _failed(path, e) from e
