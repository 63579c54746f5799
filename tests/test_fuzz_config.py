"""Fuzzing the training configuration: every key of the schema, enumerated from the
dataclasses of `transformer.run.config` (a new key is covered without a change here), given
values of the wrong type and out of range, must raise `ConfigError` on one line naming the
key, both through `load_config` (OmegaConf's merge onto the schema, every key) and through
`compose_config` (Hydra's override grammar and composition, a sample of keys)."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

import pytest
from conftest import fuzz, run_command  # tests/conftest.py
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from transformer.data.cleaning import FILTER_PRESETS
from transformer.errors import ConfigError
from transformer.run.compose import compose_config, load_config
from transformer.run.config import TrainConfig

CHOICES = {"data.name", "data.src_lang", "data.tgt_lang", "data.spm_model_type",
           "optim.name", "optim.schedule", "trainer.device", "trainer.precision",
           "model.activation"}
SIGNED = {"seed", "data.seed"}  # integers that may be negative


def schema_keys(schema: type = TrainConfig, prefix: str = "") -> dict[str, Any]:
    """Every leaf key of the schema ("optim.lr") -> its type, the groups recursively."""
    keys: dict[str, Any] = {}
    for name, kind in typing.get_type_hints(schema).items():
        if dataclasses.is_dataclass(kind):
            keys.update(schema_keys(kind, f"{prefix}{name}."))
        else:
            keys[f"{prefix}{name}"] = kind
    return keys


KEYS = schema_keys()


def _plain(kind: Any) -> tuple[Any, bool]:
    """(the type without `None`, whether None is allowed)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return kind, False


WORDS = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz_"), min_size=1, max_size=12
                ).filter(lambda w: w not in {"true", "false", "null", "nan", "inf", "e"})
CONTAINERS = st.sampled_from(["[1,2]", "{a:1}", "[]", "{}"])
NEGATIVE_INTS = st.integers(max_value=-1).map(str)
NON_INTEGRAL = st.floats(allow_nan=False, allow_infinity=False).filter(
    lambda x: x != int(x)).map(repr)
NON_FINITE = st.sampled_from(["nan", "inf", "-inf"])
NEGATIVE_FLOATS = st.floats(max_value=-1e-9, allow_infinity=False).map(repr)


def bad_values(key: str) -> st.SearchStrategy[str]:
    """Override values (Hydra/YAML literals) that `key` must reject: of the wrong type for
    it, or out of the range every key of its type shares."""
    kind, optional = _plain(KEYS[key])
    wrong = [CONTAINERS] + ([] if optional else [st.just("null")])
    if kind is bool:  # OmegaConf reads integers as booleans (0 false, others true), as C
        return st.one_of(*wrong, WORDS, st.sampled_from(["1.5", "nan", "-inf"]))
    if kind is int:
        out = [WORDS, NON_INTEGRAL, NON_FINITE]
        return st.one_of(*wrong, *out, *([] if key in SIGNED else [NEGATIVE_INTS]))
    if kind is float:
        return st.one_of(*wrong, WORDS, NON_FINITE, NEGATIVE_FLOATS)
    if kind is str:
        return st.one_of(*wrong, *([WORDS] if key in CHOICES else []))
    if kind is Any:  # data.filters: a preset's name or a mapping of single filters
        return st.one_of(st.just("null"), WORDS.filter(lambda w: w not in FILTER_PRESETS),
                         st.sampled_from(["[1,2]", "{langid: 2}", "{nope: true}", "{copies: 3}",
                                          "{max_ratio: 0.5}", "{preset: nope}"]))
    if typing.get_origin(kind) is list and dataclasses.is_dataclass(typing.get_args(kind)[0]):
        return st.sampled_from([  # data.corpora, data.valid_sets, data.test_sets
            "{a: 1}", "abc", "[1]", "[{name: a}]", "[{nosuch: 1}]",
            "[{name: 'a b', src: x, tgt: y}]", "[{name: a, src: x, tgt: ''}]",
            "[{name: a, src: x, tgt: y}, {name: a, src: x, tgt: y}]",
            "[{name: a, src: x, tgt: y, src_lang: 'd e'}]"])
    if typing.get_origin(kind) is list:  # optim.betas: two numbers in [0, 1)
        return st.one_of(st.sampled_from(["{a:1}", "abc", "[0.9]", "[nan,0.9]", "[0.9,1]",
                                          "[a,b]", "[-0.1,0.5]", "[0.9,0.98,0.99]"]))
    raise AssertionError(f"no bad values for {key} of type {kind}: add them here")


def assert_names_key(error: ConfigError, key: str) -> None:
    message = str(error)
    assert key in message, message
    assert "\n" not in message and message.strip() == message


def test_the_schema_has_keys_of_every_kind():
    """The enumeration reaches into every group (so `bad_values` meets every type)."""
    assert {"optim.lr", "trainer.max_updates", "data.joint_vocab", "model.num_heads",
            "model.name", "seed", "init_from", "optim.betas", "data.corpora",
            "data.filters"} <= KEYS.keys()
    assert all(bad_values(key) is not None for key in KEYS)


@pytest.mark.parametrize("key", sorted(KEYS))
@fuzz(2)
@given(data=st.data())
def test_every_key_rejects_bad_values(key, data):
    """A merged config (as a notebook would build one) with one bad value fails with the
    key named."""
    value = data.draw(bad_values(key), label="value")
    cfg = OmegaConf.from_dotlist([f"{key}={value}"])
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert_names_key(info.value, key)


@fuzz(12)
@given(data=st.data())
def test_bad_overrides_fail_while_composing(data):
    """`transformer train key=value`'s path: Hydra's grammar and composition, then the
    schema's validation; every failure is ConfigError naming the key."""
    key = data.draw(st.sampled_from(sorted(KEYS)), label="key")
    value = data.draw(bad_values(key), label="value")
    with pytest.raises(ConfigError) as info:
        compose_config([f"{key}={value}"])
    assert_names_key(info.value, key)


@fuzz(5, shrink=False)
@given(data=st.data())
def test_bad_overrides_on_the_command_line_are_one_line(data, tmp_path_factory):
    """`transformer prepare-data key=value` (a Hydra app, as `transformer train`): Hydra's
    own errors and the schema's alike end as `error: <one line>` naming the key, exit 1."""
    key = data.draw(st.sampled_from(sorted(KEYS)), label="key")
    value = data.draw(bad_values(key), label="value")
    run_dir = tmp_path_factory.mktemp("run")
    status, err = run_command(["prepare-data", f"{key}={value}", f"hydra.run.dir={run_dir}"])
    assert status == 1, err
    assert err.count("\n") == 1 and err.startswith("error: ") and key in err, err


@fuzz(10)
@given(text=st.text(min_size=1, max_size=20))
def test_arbitrary_override_text_is_a_config_error_or_a_config(text):
    """Any text as an override: a valid config, or ConfigError on one line."""
    try:
        assert isinstance(compose_config([text]), TrainConfig)
    except ConfigError as e:
        assert "\n" not in str(e)


@pytest.mark.parametrize("override, key", [
    ("optim.lr=inf", "optim.lr"),
    ("trainer.decode_max_len_a=inf", "trainer.decode_max_len_a"),
    ("trainer.max_time=inf", "trainer.max_time"),
    ("optim.clip_norm=inf", "optim.clip_norm"),
    ("+foo=1", "foo"),
    ("~optim.lr", "optim.lr"),
])
def test_found_by_fuzzing(override, key):
    """Inputs the fuzzing above once found accepted or failing with another error."""
    with pytest.raises(ConfigError) as info:
        compose_config([override])
    assert_names_key(info.value, key)
