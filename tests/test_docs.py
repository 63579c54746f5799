"""The Python in docs/USAGE.md and README.md runs with the package as it is: every module and
name a snippet imports exists, and the self-contained example ("Using the model from
Python") runs as printed."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

DOCS = [Path(__file__).resolve().parents[1] / name for name in ("README.md", "docs/USAGE.md")]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_name_the_docs_import_from_the_package_exists(path):
    imports = [node for block in python_blocks(path) for node in ast.walk(ast.parse(block))
               if isinstance(node, ast.ImportFrom) and node.module
               and node.module.split(".")[0] == "transformer"]
    assert imports
    for node in imports:
        module = importlib.import_module(node.module)
        for alias in node.names:
            assert hasattr(module, alias.name), f"{path.name}: {node.module}.{alias.name}"


def test_the_python_example_of_usage_runs_as_printed(capsys):
    [example] = [block for block in python_blocks(DOCS[1])
                 if block.startswith("import torch\nfrom transformer.model.attention")]
    exec(compile(example, "docs/USAGE.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == ["torch.Size([2, 4, 100])", "torch.Size([2, 5, 4, 6])"]
    assert printed[2] == "torch.Size([2, 100, 24])" and printed[3].endswith("True")
