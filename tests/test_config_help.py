"""The training configuration documented from one source, the attribute docstrings of its
schema: `transformer train --help`, the configuration reference of docs/USAGE.md, and the
errors that name the closest real key; and a run that fails its checks before its first
checkpoint leaves no run directory of its own behind."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from conftest import run_command  # tests/conftest.py
from omegaconf import OmegaConf

from transformer import cli
from transformer.errors import ConfigError
from transformer.model.transformer import Hyperparameters
from transformer.run.compose import compose_config, load_config, schema_keys
from transformer.run.config import DecodingSettings, TrainConfig
from transformer.run.config_docs import (
    KEY_COLUMN,
    attribute_docs,
    format_value,
    group_docs,
    with_reference,
)

USAGE = Path(__file__).resolve().parents[1] / "docs" / "USAGE.md"
KEY_LINE = re.compile(r"  (?P<key>[\w.\[\]]+)=(?P<rest>.*)")


def command_help(capsys, *args: str, command: str = "train") -> str:
    assert cli.main([command, *args, "--help"]) == 0
    return capsys.readouterr().out


def help_entries(text: str) -> dict[str, list[str]]:
    """{key: [default, doc]} of `--help`'s key lines (`  key=default   doc`, the doc going
    on in lines indented to its column)."""
    entries: dict[str, list[str]] = {}
    key = None
    for line in text.splitlines():
        found = KEY_LINE.fullmatch(line)
        if found:
            key = found["key"]
            default, _, doc = found["rest"].partition("  ")
            entries[key] = [default, doc.strip()]
        elif key is not None and line.startswith(" " * KEY_COLUMN) and line.strip():
            entries[key][1] = f"{entries[key][1]} {line.strip()}".strip()
        else:
            key = None
    return entries


def leaves(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of a composed config (a list is one value)."""
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("overrides", [[], ["data=files"], ["experiment=multi30k_en_xx"]])
def test_help_documents_every_key_cfg_job_prints_with_its_composed_default(overrides, capsys):
    """Every key `transformer train ... --cfg job` prints appears in `--help` with a doc,
    and with the default of the same composed config (data=files's without its paths)."""
    status = cli.main(["train", *overrides, "--cfg", "job"])
    assert status == 0
    printed = leaves(OmegaConf.to_container(OmegaConf.create(capsys.readouterr().out)))
    entries = help_entries(command_help(capsys, *overrides))
    assert {"optim.lr", "data.corpora", "seed", "model.name"} <= printed.keys()
    for key, value in printed.items():
        assert key in entries, key
        default, doc = entries[key]
        assert doc and doc != "-", key
        assert default == format_value(value), key
    assert {"data.corpora[].weight", "data.valid_sets[].tgt_lang"} <= entries.keys()


def test_help_shows_the_presets_and_where_hydras_options_are(capsys, tmp_path):
    text = command_help(capsys)
    lines = text.splitlines()
    assert lines[0].startswith("usage: transformer train ")
    assert lines[2] == "Train (or resume) a translation model; Hydra overrides as arguments."
    assert "  model       auto*  base  big  small  tiny" in lines
    assert any(line.startswith("  experiment  ") and "multi30k*" in line for line in lines)
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    closing = " ".join(text.split("\n\n")[-1].split())
    for option in ("--hydra-help", "--cfg job", "hydra.run.dir=DIR", "--config-dir DIR"):
        assert option in closing
    assert command_help(capsys, "-h") == text
    files = help_entries(command_help(capsys, "data=files"))
    assert files["data.name"][0] == "files" and files["trainer.max_time"][0] == "null"

    own = tmp_path / "my_configs" / "model"
    own.mkdir(parents=True)
    (own / "mini.yaml").write_text("name: mini\nnum_hiddens: 64\n", encoding="utf-8")
    text = command_help(capsys, "--config-dir", str(tmp_path / "my_configs"), "model=mini",
                        command="prepare-data")
    assert text.startswith("usage: transformer prepare-data ")
    assert "  model       auto  base  big  small  tiny  mini*" in text.splitlines()
    assert help_entries(text)["model.num_hiddens"][0] == "64"


def test_help_with_a_mistyped_key_is_one_line(capsys):
    assert cli.main(["train", "optim.lrr=1", "--help"]) == 1
    assert capsys.readouterr().err == (
        "error: optim.lrr is not a config key; did you mean optim.lr?\n")


def test_every_field_of_the_schema_has_a_docstring_and_no_comment():
    """Each key's doc is the docstring on the line after its field (the one source of
    `--help` and the reference); no trailing comment documents it a second time."""
    for k in schema_keys():
        assert attribute_docs(k.schema).get(k.field.name), k.key
    assert all(group_docs().values())
    for cls in {k.schema for k in schema_keys()} | {TrainConfig, Hyperparameters,
                                                    DecodingSettings}:
        docs = attribute_docs(cls)
        assert all(docs.get(f.name) for f in fields(cls)), cls
        source = textwrap.dedent(inspect.getsource(cls))
        lines = source.splitlines()
        body = ast.parse(source).body[0].body
        commented = [lines[node.lineno - 1] for node in body
                     if isinstance(node, ast.AnnAssign) and "#" in lines[node.lineno - 1]]
        assert not commented, (cls, commented)


def test_the_usage_reference_is_the_schemas():
    """docs/USAGE.md's generated block equals what the schema says now."""
    text = USAGE.read_text(encoding="utf-8")
    assert with_reference(text) == text, (
        "docs/USAGE.md's configuration reference differs from the schema's docstrings: "
        "run python docs/config_reference.py")
    for k in schema_keys():
        assert f"| `{k.key}` |" in text, k.key
    assert "| `model.num_hiddens` | `512` |" in text  # the schema's, not a preset's
    assert "| `optim.lr` | `null` |" in text and "| `optim.cooldown` | `0.2` |" in text
    assert "(#configuration-reference)" in text


@pytest.mark.parametrize("override, message", [
    ("optim.lrr=1", "optim.lrr is not a config key; did you mean optim.lr?"),
    ("+optim.lrr=1", "optim.lrr is not a config key; did you mean optim.lr?"),
    ("~optim.lrr", "optim.lrr is not a config key; did you mean optim.lr?"),
    ("optim={lrr: 1}", "optim.lrr is not a config key; did you mean optim.lr?"),
    ("optimm.lr=3", "optimm.lr is not a config key; did you mean optim.lr?"),
    ("optimm=adam", "optimm is not a config key; did you mean optim?"),
    ("lr=0.1", "lr is not a config key; did you mean optim.lr?"),
    ("optim.max_updates=5", "optim.max_updates is not a config key; did you mean "
                            "trainer.max_updates?"),
    ("model.num_hidden=64", "model.num_hidden is not a config key; did you mean "
                            "model.num_hiddens?"),
    ("data.corpora=[{name: a, src: x, tgt: y, wieght: 2}]",
     "data.corpora[].wieght is not a config key; did you mean data.corpora[].weight?"),
    ("data=filez", "data=filez is not a preset; did you mean data=files? (the presets of "
                   "data: files, multi30k, multi30k_tok)"),
    ("experiment=smok", "experiment=smok is not a preset; did you mean experiment=smoke? "
                        "(the presets of experiment: files, large, multi30k, multi30k_en_xx, "
                        "multi30k_paper, multi30k_tok, smoke)"),
    ("+foo=1", "foo is not a config key (the keys of the config: data, init_from, model, "
               "optim, seed, trainer)"),
])
def test_a_mistyped_key_or_preset_names_the_closest_real_one(override, message):
    with pytest.raises(ConfigError) as info:
        compose_config([override])
    assert str(info.value) == message


def test_a_mistyped_entry_key_of_a_merged_config_names_its_list():
    with pytest.raises(ConfigError) as info:
        load_config(OmegaConf.from_dotlist(["data.corpora=[{nosuch: 1}]"]))
    assert str(info.value).startswith("data.corpora[].nosuch is not a config key (the keys "
                                      "of data.corpora[]: filters, max_pairs, name, ")


@pytest.mark.parametrize("argv, message", [
    (["train", "optim.lrr=0.1"], "optim.lrr is not a config key; did you mean optim.lr?"),
    (["train", "+optim.lrr=1"], "optim.lrr is not a config key; did you mean optim.lr?"),
    (["prepare-data", "optimm.lr=3"], "optimm.lr is not a config key; did you mean optim.lr?"),
])
def test_the_commands_report_the_closest_key_in_one_line(argv, message, tmp_path):
    status, err = run_command([*argv, f"hydra.run.dir={tmp_path / 'run'}"])
    assert (status, err) == (1, f"error: {message}\n")


@pytest.mark.parametrize("argv", [["train", "optim.lr=-1"], ["train", "+foo=1"],
                                  ["prepare-data", "data=files"]])
def test_a_run_that_fails_its_checks_leaves_no_run_directory(argv, tmp_path, monkeypatch):
    """Hydra creates outputs/<date>/<time>/ before the config is checked; the failed run
    removes it, and the parents it created."""
    monkeypatch.chdir(tmp_path)
    status, err = run_command(argv)
    assert status == 1 and err.startswith("error: ") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_a_failed_run_removes_only_what_it_created(tmp_path, monkeypatch):
    """A run directory that existed before (a run being resumed) stays, and so do the
    outputs/ of earlier runs and a directory holding checkpoints/."""
    monkeypatch.chdir(tmp_path)
    existing = tmp_path / "runs" / "x"
    existing.mkdir(parents=True)
    (existing / "train.log").write_text("an earlier run\n", encoding="utf-8")
    assert run_command(["train", "optim.lr=-1", "hydra.run.dir=runs/x"])[0] == 1
    assert (existing / "train.log").read_text(encoding="utf-8") == "an earlier run\n"
    assert run_command(["train", "optim.lr=-1", "hydra.run.dir=runs/new/y"])[0] == 1
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["x"]

    earlier = tmp_path / "outputs" / "2020-01-01" / "00-00-00"
    earlier.mkdir(parents=True)
    assert run_command(["train", "+foo=1"])[0] == 1
    assert sorted(tmp_path.rglob("outputs/**/*")) == [earlier.parent, earlier]

    planned = cli._NewRunDirectory.before(["hydra.run.dir=runs/z"])
    (tmp_path / "runs" / "z" / "checkpoints").mkdir(parents=True)
    planned.remove(tmp_path / "runs" / "z")
    assert (tmp_path / "runs" / "z" / "checkpoints").is_dir()
