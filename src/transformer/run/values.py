"""Checks of configuration values that the schemas share (`config`, `data_config`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError

__all__ = ["check", "known_fields", "is_int", "is_finite"]


def check(ok: bool, message: str) -> None:
    """Raise ConfigError with `message` unless `ok`."""
    if not ok:
        raise ConfigError(message)


def known_fields(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `values` that are fields of the dataclass `cls` (a stored config may
    come from another version of the package, with keys this one does not know)."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"expected the fields of {cls.__name__} as a mapping, got {values!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in values.items() if k in names}


def is_int(value: Any) -> bool:
    """An integer, not a bool (YAML's `true` is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite(value: Any) -> bool:
    """A real number, not NaN or infinite (Hydra parses `inf` and `nan` as floats)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


