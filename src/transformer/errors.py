"""Every error the package raises for its user to read, in one place.

Each message is one line that names what is wrong: the file and line, the config key, the
checkpoint, the request field. All derive from `TransformerError`, so a caller catches the
package's errors with one `except`, and the `transformer` command has one handler for them
(`cli.report_errors`: `error: <message>` on stderr, exit status 1, no traceback). Each also
derives from the built-in exception it refines (`DataError` is a `ValueError`, `WriteError`
an `OSError`), so code that catches those keeps working.
"""

from __future__ import annotations

__all__ = ["TransformerError", "ConfigError", "DataError", "WriteError", "CheckpointError",
           "ExportError", "TrainingError"]


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
    """CTranslate2 is missing, or an export directory is unusable; says why."""


class TrainingError(TransformerError, RuntimeError):
    """Training cannot go on (e.g. too many non-finite losses in a row, a full disk)."""
