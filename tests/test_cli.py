"""The `transformer` command: its subcommands, the `scripts/*.py` forms of them, and the one
way every command reports the package's errors."""

from __future__ import annotations

import ast
import importlib
import runpy
from pathlib import Path

import pytest

import transformer
from transformer import cli
from transformer.errors import DataError, TransformerError

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(transformer.__file__).parent


def test_help_lists_every_command_with_its_summary(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        summary = cli.command_module(name).__doc__.splitlines()[0]
        assert f"  {name:<21}{summary}" in out
    assert cli.main([]) == 2 and "usage: transformer COMMAND" in capsys.readouterr().err
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"transformer {transformer.__version__}\n"


def test_an_unknown_command_names_the_known_ones(capsys):
    assert cli.main(["trian"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'trian'" in err and "train, prepare-data, translate" in err


@pytest.mark.parametrize("name", cli.COMMANDS)
def test_each_script_is_the_packages_command(name):
    """`python scripts/<name>.py` runs `transformer <name>`: the same `main`."""
    script = REPO / "scripts" / f"{name.replace('-', '_')}.py"
    assert runpy.run_path(str(script))["main"] is cli.command_module(name).main


def test_every_command_has_a_script_and_no_script_lacks_a_command():
    """A module of `cli/` is a command, except the two the commands share: their options
    (`options.py`) and what `transformer translate` writes (`reports.py`)."""
    scripts = {p.stem.replace("_", "-") for p in (REPO / "scripts").glob("*.py")}
    modules = ({p.stem.replace("_", "-") for p in (PACKAGE / "cli").glob("*.py")}
               - {"--init--", "options", "reports"})
    assert scripts == modules == set(cli.COMMANDS)


def test_report_errors_prints_one_line_and_returns_the_exit_status(capsys):
    def fail() -> None:
        raise DataError("train.en line 7: invalid UTF-8\n(byte 0xff)")

    assert cli.report_errors(fail) == 1
    assert capsys.readouterr().err == "error: train.en line 7: invalid UTF-8 (byte 0xff)\n"
    assert cli.report_errors(lambda: open("/nonexistent/input.txt")) == 1
    assert capsys.readouterr().err.startswith("error: [Errno 2] No such file or directory")
    assert cli.report_errors(lambda: "a result, not a status") == 0

    def bug() -> None:
        raise KeyError("a bug keeps its traceback")

    with pytest.raises(KeyError):
        cli.report_errors(bug)


def test_every_exception_class_of_the_package_is_a_transformer_error():
    """So that the one handler of the commands catches whatever the package raises for a
    user to read."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        module = importlib.import_module(name.removesuffix(".__init__"))
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            cls = getattr(module, node.name, None) if isinstance(node, ast.ClassDef) else None
            if isinstance(cls, type) and issubclass(cls, BaseException):
                found.append(cls)
    assert len(found) >= 8  # the errors module's seven, and the server's ApiError
    assert all(issubclass(cls, TransformerError) for cls in found), found
