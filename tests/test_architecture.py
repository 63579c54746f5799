"""The shape of the package: modules import only lower layers (docs/DESIGN.md), importing it
changes no global state, and the evaluation tools find a run's data as the run did."""

from __future__ import annotations

import ast
import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from transformer import multi30k
from transformer.config import DataConfig, TrainConfig
from transformer.errors import CheckpointError, DataError
from transformer.evaluation import evaluation_text

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "transformer"

# Lowest first; a module may import only modules of lower layers (docs/DESIGN.md).
LAYERS = [
    {"errors"},
    {"ops", "files", "text", "train_log", "runtime", "cleaning"},
    {"tokenizer", "attention", "multi30k", "batching", "plots"},
    {"blocks", "store"},
    {"model", "mixture"},
    {"config"},
    {"checkpoint", "run_tokenizers", "optimizer", "schedule", "decoding", "config_docs"},
    {"data", "search", "loss", "attention_maps", "alignment", "vocab_map"},
    {"translator"},
    {"heads", "evaluation", "export", "hf", "serve", "workflows"},
    {"training", "engines"},
    {"cli"},  # the commands: a subpackage, one module per command
    {"__main__"},
]


def package_imports(path: Path) -> set[str]:
    """The package modules the module at `path` imports (`from .x import ...`, `from . import
    x`; in the `cli` subpackage `from ..x import ...`, and its own modules count as `cli`)."""
    level = len(path.relative_to(PACKAGE).parts)  # 1 in the package, 2 in cli/
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == level:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.add(path.parent.name)  # a sibling in its own subpackage
    found.discard("__init__")
    return found - ({"__version__"} if level == 2 else set())


def test_modules_import_only_lower_layers():
    rank = {module: i for i, layer in enumerate(LAYERS) for module in layer}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert modules | subpackages == set(rank), \
        "a module is missing from LAYERS (and from docs/DESIGN.md)"
    for module in sorted(modules):
        for imported in package_imports(PACKAGE / f"{module}.py"):
            assert rank[imported] < rank[module], f"{module} imports {imported}"
    for path in sorted((PACKAGE / "cli").glob("*.py")):  # the top layer: anything below it
        assert all(rank[m] <= rank["cli"] for m in package_imports(path)), path


def source_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_each_job_lives_in_its_module():
    """Command-line parsing lives in `cli/`; optional packages are imported through
    `errors.require` only; attention layers are recorded and masked through their own
    context managers (no module sets another's attributes); decoding options reach every
    search as one `DecodingRequest` (no search takes `beam_size` or `nbest` of its own)."""
    for path in source_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        name = str(path.relative_to(PACKAGE))
        imports = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for alias in node.names}
        assert "argparse" not in imports or name.startswith("cli/"), name
        caught = [ast.unparse(node.type) for node in ast.walk(tree)
                  if isinstance(node, ast.ExceptHandler) and node.type is not None]
        assert not any("ImportError" in c for c in caught) or name == "errors.py", name
        poked = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 for target in node.targets if isinstance(target, ast.Attribute)
                 and target.attr in ("head_mask", "need_weights")
                 and ast.unparse(target.value) != "self"]
        assert not poked, (name, poked)
        searches = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                    and node.name.endswith(("search", "search_corpus", "_search_batch"))]
        for node in searches:
            params = {arg.arg for arg in node.args.args + node.args.kwonlyargs}
            assert not params & {"beam_size", "nbest", "sampling", "alpha"}, (name, node.name)


def test_importing_the_package_switches_no_matplotlib_backend():
    """No module imports pyplot (which would pick a backend for the whole process)."""
    code = ("import sys, transformer.training, transformer.heads, transformer.plots, "
            "transformer.evaluation; print('matplotlib.pyplot' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"


def run_config(**data) -> TrainConfig:
    """A checkpoint's training config as a translator reads it, with these data settings."""
    return TrainConfig(data=DataConfig(**data))


def test_evaluation_reads_the_runs_own_data(tmp_path, multi30k_dir, multi30k_lines,
                                            monkeypatch):
    """Without --data-root the tools read the split from the run's data.root; a run whose
    data.root is gone falls back to the download cache; data=files runs use their files."""
    valid_en, valid_de = multi30k_lines("val.en.gz"), multi30k_lines("val.de.gz")
    text = evaluation_text(run_config(root=str(multi30k_dir)), data="valid")
    assert (text.src, text.tgt) == (valid_en, valid_de)
    text = evaluation_text(run_config(root=str(multi30k_dir), src_lang="de", tgt_lang="en"),
                           data="test", max_sentences=5)
    assert text.src == multi30k_lines("test_2016_flickr.de.gz")[:5]

    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("val.en.gz", "val.de.gz"):
        shutil.copy(multi30k_dir / name, cache / name)
    monkeypatch.setattr(multi30k, "DEFAULT_ROOT", str(cache))
    moved = run_config(root=str(tmp_path / "gone"))
    assert evaluation_text(moved, data="valid").tgt == valid_de
    assert evaluation_text(moved, data="valid", data_root=multi30k_dir).tgt == valid_de

    src, ref = tmp_path / "dev.en", tmp_path / "dev.de"
    src.write_text("\n".join(valid_en[:7]) + "\n", encoding="utf-8")
    ref.write_bytes(gzip.decompress((multi30k_dir / "val.de.gz").read_bytes()))
    files = run_config(name="files", root=str(tmp_path / "gone"), train_src="t.en",
                       train_tgt="t.de", valid_src=str(src), valid_tgt=str(ref))
    with pytest.raises(DataError, match="has 7 lines but"):
        evaluation_text(files, data="valid")
    ref.write_text("\n".join(valid_de[:7]) + "\n", encoding="utf-8")
    assert evaluation_text(files, data="valid").tgt == valid_de[:7]
    with pytest.raises(DataError, match="the run has no test split"):
        evaluation_text(files, data="test")
    with pytest.raises(CheckpointError, match="does not record its training data"):
        evaluation_text(None, data="valid")
