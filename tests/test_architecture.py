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

from transformer.data import multi30k
from transformer.errors import CheckpointError, DataError
from transformer.run.config import TrainConfig
from transformer.run.data_config import DataConfig
from transformer.tools.evaluation import evaluation_text

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "transformer"

# The package's folders, lowest first ("" is the package's own modules): a module imports
# only modules of its own folder and of lower ones (docs/DESIGN.md).
LAYERS = [
    {""},  # errors, files, hardware, runtime: what every folder may use
    {"data"},  # parallel text, from files to batches
    {"model"},  # the book's Transformer, its kernels, cache, loss and int8 form
    {"run"},  # a run's config, tokenizers, prepared data and checkpoints
    {"decoding"},  # searches, the corpus runner, the translator
    {"tools"},  # looking inside models, evaluating them, data made with them
    {"training", "deploy"},  # the trainer; export, other engines, serving
    {"cli"},  # the commands: one module per command
    {"__main__"},
]


def module_name(path: Path) -> str:
    """transformer's dotted name of a module file: "data.text", "errors", "cli"."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def folder(module: str) -> str:
    """The folder of a module ("" for the package's own modules; "__main__" its own)."""
    return module.split(".")[0] if "." in module or module in {"cli"} else (
        "__main__" if module == "__main__" else "")


def package_imports(path: Path) -> set[str]:
    """The package's modules (dotted, as `module_name`) that the module at `path` imports,
    wherever in it (functions too): relative imports resolved from its place."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = package[:len(package) - (node.level - 1)]
        if node.module:
            found.add(".".join([*base, node.module]))
        else:
            found.update(".".join([*base, alias.name]) for alias in node.names)
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {m if m in modules else m.rpartition(".")[0] for m in found} - {"", "__version__"}


def test_modules_import_only_lower_layers_and_no_cycle():
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    paths = sorted(PACKAGE.rglob("*.py"))
    folders = {folder(module_name(p)) for p in paths} - {""}
    assert folders | {""} == set(rank), "a folder is missing from LAYERS (and docs/DESIGN.md)"
    graph = {module_name(p): package_imports(p) for p in paths}
    for module, imported in sorted(graph.items()):
        for other in imported:
            assert (folder(other) == folder(module)
                    or rank[folder(other)] < rank[folder(module)]), f"{module} imports {other}"
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"an import cycle: {' -> '.join([*path, module])}"
        if module in done:
            return
        for other in graph.get(module, ()):
            visit(other, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())


def test_the_folders_are_the_layers():
    """At least three subpackages besides the commands; no module of the package over 600
    lines, the one defining MultiHeadAttention at most 350."""
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")} - {"cli"}
    assert len(subpackages) >= 3
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines())
             for p in PACKAGE.rglob("*.py")}
    assert max(sizes.values()) <= 600, {k: v for k, v in sizes.items() if v > 600}
    defining = [name for name in sizes if "class MultiHeadAttention" in
                (PACKAGE / name).read_text(encoding="utf-8")]
    assert len(defining) == 1 and sizes[defining[0]] <= 350, (defining, sizes)


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
    code = ("import sys, transformer.training.trainer, transformer.tools.heads, "
            "transformer.tools.plots, transformer.tools.evaluation; "
            "print('matplotlib.pyplot' in sys.modules)")
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
