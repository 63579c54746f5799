"""Every error the package raises for its user to read, in one place.

Each message is one line that names what is wrong: the file and line, the config key, the
checkpoint, the request field. All derive from `TransformerError`, so a caller catches the
package's errors with one `except`, and the `transformer` command has one handler for them
(`cli.report_errors`: `error: <message>` on stderr, exit status 1, no traceback). Each also
derives from the built-in exception it refines (`DataError` is a `ValueError`, `WriteError`
an `OSError`), so code that catches those keeps working.

Optional packages (the extras in pyproject.toml: `export`, `serve`, `hf`, `paper`, `clean`) are
imported through `require`, so a missing one always reads the same way, as a
`MissingDependency` that says which extra brings it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["TransformerError", "ConfigError", "DataError", "WriteError", "CheckpointError",
           "ExportError", "TrainingError", "SearchProcessError", "MissingDependency", "require"]


class TransformerError(Exception):
    """Base of the package's errors: a one-line message for the user."""


class ConfigError(TransformerError, ValueError):
    """A configuration value out of range or of the wrong kind; names the key
    (`optim.lr must be > 0, got -1.0`)."""


class DataError(TransformerError, ValueError):
    """Bad input data: misaligned files, invalid UTF-8, a failed checksum, ...; names the
    file and, where there is one, the line."""


class WriteError(TransformerError, OSError):
    """A file could not be written (disk full, permissions, ...); names the file. The
    previous version of the file, if any, is intact."""


class CheckpointError(TransformerError, RuntimeError):
    """A checkpoint file that is missing, corrupt, unsafe or incompatible; names the file."""


class ExportError(TransformerError, RuntimeError):
    """An export that cannot be written or an export directory that is unusable; says
    why."""


class TrainingError(TransformerError, RuntimeError):
    """Training cannot go on (e.g. too many non-finite losses in a row, a full disk)."""


class SearchProcessError(TransformerError, RuntimeError):
    """A search process (`--workers`) that could not load its model, ended (killed, out of
    memory) or failed during a search; names the process, and its exit code or the error."""


class MissingDependency(TransformerError, ImportError):
    """An optional package is not installed; names it and the package's extra that brings
    it (`the ctranslate2 engine needs the optional package ctranslate2: pip install
    'transformer[export]'`)."""


def require(module: str, extra: str, feature: str = "this feature") -> ModuleType:
    """Import the optional `module` (e.g. "ctranslate2", "safetensors.torch") and return it;
    if it is not installed, raise `MissingDependency` naming its package, `feature` (what
    needs it, e.g. "the ctranslate2 engine") and the `extra` that installs it."""
    package = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = e.name is not None and e.name.split(".")[0] == package
        broken = "" if missing else f" (installed, but its import fails: {e})"
        raise MissingDependency(f"{feature} needs the optional package {package}{broken}: "
                                f"pip install 'transformer[{extra}]'", name=package) from None
