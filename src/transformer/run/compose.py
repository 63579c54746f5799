"""The training configuration from Hydra: composing `configs/config.yaml` with a command
line's overrides (`compose_config`; the commands' own through `cli.hydra_command`), typed
and validated once (`load_config` -> `config.TrainConfig`), and every error of Hydra and
OmegaConf turned into one line naming the override and the key (`override_error`), with the
closest real key for a mistyped one (`unknown_key_error`, over the schema's keys:
`schema_keys`).

Hydra composes `configs/config.yaml` (package data, `CONFIG_DIR`; `--config-dir DIR` adds a
user's own directory, searched after it, so its presets take new names) with one option per
group (`model/`, `data/`, `optim/`, `trainer/`, `experiment/`) onto `TrainConfig`,
registered in Hydra's ConfigStore as `train_schema`. Hydra and OmegaConf are imported here
only: translating, serving and exporting read configs as dataclasses and never need them.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .config import ModelSettings, TrainConfig

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["CONFIG_DIR", "register_configs", "model_preset", "load_config", "compose_config",
           "override_error", "SchemaKey", "schema_keys", "unknown_key_error"]

# The package data: config.yaml and the groups' presets.
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

# -- the schema's keys, and the one closest to a mistyped key --

@dataclass(frozen=True)
class SchemaKey:
    """One key of the training config: its dotted name ("optim.lr"; a key of the entries of
    a list-valued key: "data.corpora[].weight"), the dataclass that declares it, its field."""

    key: str
    schema: type
    field: dataclasses.Field


def schema_keys(schema: type = TrainConfig, prefix: str = "") -> list[SchemaKey]:
    """Every key of `schema`, in its fields' order: a group's keys (a field that is itself a
    dataclass) in the group's place, and after a list of dataclass entries (`data.corpora`)
    the keys of an entry. What the configuration's documentation lists and a mistyped key
    is matched against."""
    keys = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            keys += schema_keys(kind, f"{prefix}{f.name}.")
            continue
        keys.append(SchemaKey(f"{prefix}{f.name}", schema, f))
        entry = typing.get_args(kind)[0] if typing.get_origin(kind) is list else None
        if dataclasses.is_dataclass(entry):
            keys += schema_keys(entry, f"{prefix}{f.name}[].")
    return keys


def _general(key: str) -> str:
    """A key with its list positions as "[]": data.corpora[0].name -> data.corpora[].name."""
    return re.sub(r"\[[^\]]*\]", "[]", key)


def _closest_keys(key: str) -> list[str]:
    """The keys a mistyped `key` most likely meant: in its group (the group's name itself
    corrected: "optimm.lr" -> "optim.lr"), the key of that name, else the keys of that name
    in other groups ("lr" -> "optim.lr"), else the closest name of its group ("optim.lrr"
    -> "optim.lr"; the top level includes the config groups: "optimm" -> "optim"), else the
    keys of the closest name in any group; none when nothing is close."""
    keys = [k.key for k in schema_keys()]
    config_groups = {p.name for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name[0] != "_"}
    names: dict[str, list[str]] = {"": sorted({k.split(".")[0] for k in keys} | config_groups)}
    for k in keys:
        group, _, name = k.rpartition(".")
        if group:
            names.setdefault(group, []).append(name)
    group, _, name = _general(key).rpartition(".")
    if group not in names:
        found = difflib.get_close_matches(group, [g for g in names if g], n=1)
        group = found[0] if found else None
    if group and name in names[group]:
        return [f"{group}.{name}"]
    by_name: dict[str, list[str]] = {}
    for k in keys:
        if "[]" not in k:  # an entry's keys are set within their list
            by_name.setdefault(k.rpartition(".")[2], []).append(k)
    if name in by_name:
        return by_name[name][:3]
    found = difflib.get_close_matches(name, names[group], n=1) if group is not None else []
    if found:
        return [f"{group}.{found[0]}" if group else found[0]]
    found = difflib.get_close_matches(name, by_name, n=1)
    return by_name[found[0]][:3] if found else []


def _keys_under(group: str) -> tuple[str, list[str]]:
    """(the innermost group of `group` the schema has, the names of its keys): ("optim",
    ["betas", ...]); ("", the top-level keys) when `group` is none of the schema's."""
    prefix = f"{_general(group)}." if group else ""
    names = sorted({re.split(r"[.\[]", k.key[len(prefix):])[0] for k in schema_keys()
                    if k.key.startswith(prefix)})
    if names or not group:
        return group, names
    return _keys_under(group.rpartition(".")[0])


def unknown_key_error(key: str) -> ConfigError:
    """ConfigError for a key the schema lacks, on one line naming it and the closest real
    key (`optim.lrr is not a config key; did you mean optim.lr?`), or, when none is close,
    the keys of its group."""
    found = _closest_keys(key)
    if found:
        alternatives = " or ".join([", ".join(found[:-1]), found[-1]] if found[1:] else found)
        return ConfigError(f"{key} is not a config key; did you mean {alternatives}?")
    group, names = _keys_under(key.rpartition(".")[0])
    return ConfigError(f"{key} is not a config key (the keys of {group or 'the config'}: "
                       f"{', '.join(names)})")



# Hydra and OmegaConf are imported where they are used: translating, serving and exporting
# read configs as dataclasses and never need them.

def register_configs() -> None:
    """Register the schema that configs/config.yaml names in its defaults list (before
    Hydra composes; `compose_config` and the training commands call it)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def load_config(cfg: DictConfig | TrainConfig) -> TrainConfig:
    """A composed Hydra config -> validated `TrainConfig` (ConfigError naming the key: an
    unknown key, a value of the wrong type or out of range)."""
    if isinstance(cfg, TrainConfig):
        cfg.validate()
        return cfg
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _check_known_keys(cfg, TrainConfig)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg)  # types
        return OmegaConf.to_object(merged)  # runs every validate()
    except OmegaConfBaseException as e:
        raise _omegaconf_error(e, _rejected_key(cfg)) from None


def _leaves(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested mapping ("optim.lr", 0.1)."""
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _rejected_key(cfg: Mapping[str, Any]) -> str | None:
    """The first key of `cfg` whose value alone the schema rejects (for OmegaConf's errors
    that do not say which key, e.g. a mapping given where a list belongs)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for key, value in _leaves(cfg):
        single = OmegaConf.create()
        OmegaConf.update(single, key, value, force_add=True)
        try:
            OmegaConf.merge(OmegaConf.structured(TrainConfig), single)
        except OmegaConfBaseException:
            return key
    return None


def _check_known_keys(values: Mapping[str, Any], schema: type, prefix: str = "") -> None:
    """Raise ConfigError naming the first key of `values` that `schema` (a dataclass, its
    groups recursively) does not have: a key added with Hydra's `+key=value` would
    otherwise be carried along unused."""
    fields = typing.get_type_hints(schema)
    for key, value in values.items():
        if key not in fields:
            raise unknown_key_error(f"{prefix}{key}")
        if dataclasses.is_dataclass(fields[key]) and isinstance(value, Mapping):
            _check_known_keys(value, fields[key], f"{prefix}{key}.")


def _omegaconf_error(error: Exception, key: str | None = None) -> ConfigError:
    """OmegaConf's error about a value -> one line naming the key (`full_key`, else `key`:
    the key given, whose value holds the error); about a key the schema lacks ->
    `unknown_key_error`."""
    if _is_missing_key(error):
        missing = _missing_key(key, getattr(error, "full_key", None))
        if missing is not None:
            return unknown_key_error(missing)
    key = getattr(error, "full_key", None) or key
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return ConfigError(f"{key}: {reason}" if key else reason)


def override_error(error: Exception) -> ConfigError:
    """Hydra's error about an override (a parse error, a missing preset, a value OmegaConf
    rejects, a key the schema lacks) -> ConfigError on one line naming the override and its
    key, and for a mistyped key or preset the closest real one (`compose_config` and the
    Hydra commands report them so)."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(error, OverrideParseException):
        reason = error.message.splitlines()[0]
        return ConfigError(f"invalid override {error.override!r}: {reason}")
    if isinstance(error, MissingConfigException):
        return _missing_preset_error(error)
    message = str(error)
    deleted = re.search(r"Could not delete from config. '([^']+)' does not exist", message)
    missing = _missing_key(None, deleted[1]) if deleted else None
    if missing is not None and missing not in {k.key for k in schema_keys()}:
        return unknown_key_error(missing)  # ~optim.lrr
    first = message.strip().splitlines()[0].rstrip(".") if message.strip() else repr(error)
    cause = error.__cause__
    if cause is None:
        return ConfigError(first)
    overridden = re.match(r"Could not override '([^']+)'", message)
    if overridden and _is_missing_key(cause):
        missing = _missing_key(overridden[1], getattr(cause, "full_key", None))
        if missing is not None:
            return unknown_key_error(missing)
    return ConfigError(f"{first}: {_omegaconf_error(cause)}")


def _is_missing_key(error: BaseException | None) -> bool:
    """Whether OmegaConf's `error` says a key is not in the schema."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    return (isinstance(error, (ConfigKeyError, ConfigAttributeError))
            and re.match(r"Key '[^']*' (is )?not in", str(error)) is not None)


def _missing_key(given: str | None, missing: str | None) -> str | None:
    """The dotted key the schema lacks, from the key given on the command line or in a
    config (`given`) and the one OmegaConf names (`missing`): "optimm.lr" of `optimm.lr=3`
    ("optimm" missing), "optim.lrr" of `optim={lrr: 1}`, "data.corpora[].nme" of
    `data.corpora=[{nme: a}]` ("nme" missing); None for Hydra's own keys (hydra.*)."""
    if not given or not missing or given == missing or given.startswith(f"{missing}."):
        key = given or missing
    elif missing.startswith(f"{given}."):
        key = missing
    elif any(k.key.startswith(f"{given}[].") for k in schema_keys()):
        key = f"{given}[].{missing}"
    else:
        key = f"{given}.{missing}"
    return None if not key or key == "hydra" or key.startswith("hydra.") else key


def _missing_preset_error(error: Exception) -> ConfigError:
    """Hydra's MissingConfigException about a group's option -> one line naming the option,
    the closest preset and the group's presets (`data=filez is not a preset; did you mean
    data=files? (the presets of data: files, multi30k, multi30k_tok)`)."""
    reason = str(error).splitlines()[0]
    options = list(getattr(error, "options", None) or [])
    group, _, name = (getattr(error, "missing_cfg_file", None) or "").rpartition("/")
    if not options or not group:
        return ConfigError(f"{reason}; the options are: {', '.join(options)}" if options
                           else reason)
    within = re.match(r"In '([^']+)'", reason)
    where = f"in {within[1]}: " if within and within[1] != "config" else ""
    close = difflib.get_close_matches(name, options, n=1)
    hint = f"; did you mean {group}={close[0]}?" if close else ""
    return ConfigError(f"{where}{group}={name} is not a preset{hint} (the presets of {group}: "
                       f"{', '.join(options)})")


def model_preset(name: str, over: ModelSettings | None = None) -> ModelSettings:
    """The model preset configs/model/NAME.yaml (it sets the shape, `config.SHAPE`), and
    on top of it every key of `over` (a `model=auto` group) that is not null: what the user
    set is kept."""
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "model" / f"{name}.yaml"))
    if over is not None:
        values |= {f.name: getattr(over, f.name) for f in dataclasses.fields(ModelSettings)
                   if f.name != "name" and getattr(over, f.name) is not None}
    return ModelSettings(**values)


def compose_config(overrides: Sequence[str] = (), config_dir: Path = CONFIG_DIR) -> TrainConfig:
    """Compose `config_dir` (the package's configs) with command-line style `overrides` (as
    `transformer train` would, but without starting a Hydra app: for tests and notebooks)
    -> validated `TrainConfig`. Every bad override raises ConfigError naming it."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        try:
            cfg = compose("config", overrides=list(overrides))
        except (HydraException, OmegaConfBaseException) as e:
            raise override_error(e) from None
    return load_config(cfg)
