"""Optional packages: `errors.require` and the commands that use it report a missing one in
one line naming the package and the extra that installs it."""

from __future__ import annotations

import json
import sys

import pytest

from transformer.cli import serve as serve_command
from transformer.deploy import hf
from transformer.deploy.export import require_ctranslate2
from transformer.errors import MissingDependency, TransformerError, require


def test_require_returns_the_module():
    assert require("json", extra="none") is json


def test_a_missing_package_is_one_line_naming_it_and_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` fails
    with pytest.raises(MissingDependency) as caught:
        require("ctranslate2", extra="export", feature="the ctranslate2 engine")
    assert str(caught.value) == ("the ctranslate2 engine needs the optional package "
                                 "ctranslate2: pip install 'transformer[export]'")
    assert isinstance(caught.value, TransformerError) and isinstance(caught.value, ImportError)
    assert caught.value.name == "ctranslate2"
    with pytest.raises(MissingDependency, match="the ctranslate2 engine needs"):
        require_ctranslate2()


def test_a_submodule_names_its_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(MissingDependency, match=r"needs the optional package safetensors: "
                                                r"pip install 'transformer\[hf\]'$"):
        require("safetensors.torch", extra="hf")


def test_an_installed_package_that_fails_to_import_says_why(tmp_path, monkeypatch):
    (tmp_path / "broken_extra").mkdir()
    (tmp_path / "broken_extra" / "__init__.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingDependency) as caught:
        require("broken_extra", extra="x", feature="a tool")
    message = str(caught.value)
    assert "\n" not in message and "broken_extra (installed, but its import fails" in message
    assert "no_such_dependency_xyz" in message


@pytest.mark.parametrize("module", ["fastapi", "uvicorn"])
def test_serve_without_its_extra_is_a_one_line_error(module, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, module, None)
    assert serve_command.main(["--checkpoint", str(tmp_path / "nowhere")]) == 1
    error = capsys.readouterr().err.strip()
    assert error == (f"error: transformer serve needs the optional package {module}: "
                     f"pip install 'transformer[serve]'")


def test_the_hf_bridge_without_safetensors_names_the_file(monkeypatch, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(MissingDependency, match=r"reading .*model\.safetensors needs the "
                                                r"optional package safetensors"):
        hf._read_weights(tmp_path)
