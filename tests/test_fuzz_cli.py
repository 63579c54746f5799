"""Fuzzing the commands' options: each argparse command of `transformer`, run in this process
on a small random model, with generated option values (wrong types, out of range, odd
combinations). argparse's own usage error (exit 2, a usage line) is the answer only to a
value that does not parse as its option's type; a value that parses and that the package
then rejects is `error: <one line>` on stderr and exit 1, never a traceback; a command that
fails leaves the file it was to write as it was. Every case runs a whole command, so a
failing case is reported as generated, not shrunk (it holds at most three options)."""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from conftest import fuzz, run_command  # tests/conftest.py
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

SOURCES = ["A man rides a bike.", "Two dogs play in the snow."]
REFERENCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
BEFORE = "the previous output\n"


# ---- option values --------------------------------------------------------------------------

# Values no option type reads as given ("--" is left out: argparse takes `--opt=--` for its
# end-of-options marker and drops it). Arguments are what a shell can pass: no NUL, and
# undecodable bytes as Python presents them (surrogates U+DC80-U+DCFF).
JUNK = st.sampled_from(["", "abc", "1.5", "nan", "inf", "-inf", "1e999", "0x10", " 7", "٣",
                        "\udcff", "-", "1_000"])
# Sizes that fail to allocate at once (never ones that would fill the machine's memory).
INTS = st.one_of(st.integers(-3, 8), st.sampled_from([-(2**63), 2**31, 2**63, 10**30])).map(str)
FLOATS = st.one_of(st.floats(-3, 8), st.sampled_from([math.nan, math.inf, -math.inf, 1e308,
                                                      -0.0, 5e-324])).map(repr)
TEXT = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")
               | st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF), max_size=12)
DEVICES = st.sampled_from(["cpu", "auto", "cuda", "cuda:7", "tpu", "", "cpu:0", "mps", "meta",
                           "cuda:-1", "cuda:x"])


@dataclass(frozen=True)
class Option:
    """A command-line option and the values the fuzzer gives it."""

    flag: str
    kind: str  # "int", "float", "text", "flag" (no value) or "choice"
    choices: tuple[str, ...] = ()

    def values(self) -> st.SearchStrategy[str | None]:
        if self.kind == "flag":
            return st.none()
        typed = {"int": INTS, "float": FLOATS, "text": TEXT,
                 "choice": st.sampled_from(self.choices or ("",))}[self.kind]
        if self.flag in ("--threads",):  # a million threads would be started, not refused
            typed = st.integers(-3, 3).map(str)
        if self.flag == "--device":
            typed = DEVICES
        return st.one_of(typed, JUNK)

    def parses(self, value: str | None) -> bool:
        """Whether argparse's type conversion accepts `value` for this option."""
        if self.kind in ("flag", "text"):
            return True
        if self.kind == "choice":
            return value in self.choices
        try:
            (int if self.kind == "int" else float)(value)
            return True
        except ValueError:
            return False

    def argv(self, value: str | None) -> list[str]:
        return [self.flag] if value is None else [f"{self.flag}={value}"]


def option_draws(options: list[Option]) -> st.SearchStrategy[list[tuple[Option, str | None]]]:
    """One to three distinct options of `options`, each with a value."""
    return st.lists(st.sampled_from(options), min_size=1, max_size=3,
                    unique_by=lambda o: o.flag).flatmap(
        lambda chosen: st.tuples(*[st.tuples(st.just(o), o.values()) for o in chosen]))


# ---- running a command --------------------------------------------------------------------------


def check_answer(drawn: list[tuple[Option, str | None]], status: int, err: str) -> None:
    """The property every command keeps, whatever its options."""
    assert "Traceback" not in err, err
    if all(option.parses(value) for option, value in drawn):
        assert status in (0, 1), f"exit {status} for values the parser accepts: {err}"
    else:
        assert status == 2 and "usage:" in err, err
        return
    if status == 1:
        lines = err.splitlines()
        assert lines and lines[-1].startswith("error: "), err
        assert sum(line.startswith("error:") for line in lines) == 1, err


@dataclass
class Files:
    """What the commands read and write, in a fresh folder per example."""

    folder: Path
    checkpoint: Path
    run: Path  # a run directory with two numbered checkpoints
    src: Path
    ref: Path
    output: Path  # an existing file each command would replace

    def intact(self) -> bool:
        return self.output.read_text() == BEFORE


@contextlib.contextmanager
def files(random_checkpoint: Path):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        run = folder / "run" / "checkpoints"
        run.mkdir(parents=True)
        for updates in (1, 2):
            shutil.copy(random_checkpoint, run / f"checkpoint_{updates}.pt")
        src, ref, output = folder / "src.txt", folder / "ref.txt", folder / "out"
        src.write_text("\n".join(SOURCES) + "\n")
        ref.write_text("\n".join(REFERENCES) + "\n")
        output.write_text(BEFORE)
        yield Files(folder, random_checkpoint, run.parent, src, ref, output)


DECODING = [Option("--beam-size", "int"), Option("--nbest", "int"), Option("--alpha", "float"),
            Option("--max-len-a", "float"), Option("--max-len-b", "int"),
            Option("--target-lang", "text")]
MODES = [Option("--sampling-topk", "int"), Option("--sampling-topp", "float"),
         Option("--temperature", "float"), Option("--seed", "int"), Option("--alignment", "flag"),
         Option("--alignment-layer", "int"), Option("--alignment-head", "int")]
MODEL = [Option("--device", "text"), Option("--threads", "int"), Option("--max-tokens", "int")]
EVALUATION = [*MODEL, Option("--max-sentences", "int"),
              Option("--data", "choice", ("valid", "test"))]


# ---- the commands -----------------------------------------------------------------------------


@fuzz(40, shrink=False)
@given(drawn=option_draws([*DECODING, *MODES, *MODEL, Option("--chunk-lines", "int"),
                           Option("--score", "flag"), Option("--engine", "choice",
                                                             ("auto", "torch", "ctranslate2"))]))
def test_translate_options(random_checkpoint, drawn):
    with files(random_checkpoint) as f:
        argv = ["translate", "--checkpoint", str(f.checkpoint), "--input", str(f.src),
                "--output", str(f.output), "--reference", str(f.ref)]
        status, err = run_command(argv + [a for o, v in drawn for a in o.argv(v)])
        check_answer(drawn, status, err)
        if status != 0:
            assert f.intact()
        else:
            assert len(f.output.read_text().splitlines()) >= len(SOURCES)


INPUT_BYTES = st.lists(st.sampled_from([b"A man rides a bike.", b"\n", b"\r", b"\x00", b"\xff",
                                         b"\xef\xbb\xbf", b"\xf0\x9f\x98\x80", b" ", b"x" * 5000]),
                       max_size=8).map(b"".join)


@fuzz(15, shrink=False)
@given(data=INPUT_BYTES, prefix=st.none() | INPUT_BYTES)
def test_translate_input_bytes(random_checkpoint, data, prefix):
    """Any bytes as `--input` (and `--prefix`): translations, or one line naming the file
    and line; the output file is written whole or left as it was."""
    with files(random_checkpoint) as f:
        f.src.write_bytes(data)
        argv = ["translate", "--checkpoint", str(f.checkpoint), "--input", str(f.src),
                "--output", str(f.output), "--beam-size", "1"]
        if prefix is not None:
            (f.folder / "prefix.txt").write_bytes(prefix)
            argv += ["--prefix", str(f.folder / "prefix.txt")]
        status, err = run_command(argv)
        check_answer([], status, err)
        if status != 0:
            assert f.intact()


@fuzz(8, shrink=False)
@given(drawn=option_draws([Option("--within", "float"), Option("--last", "int"),
                           Option("--alpha", "float"), Option("--beam-size", "int"),
                           *EVALUATION]))
def test_tune_decoding_options(random_checkpoint, drawn):
    with files(random_checkpoint) as f:
        argv = ["tune-decoding", str(f.run), "-o", str(f.output), "--src", str(f.src),
                "--ref", str(f.ref), "--last", "1", "2", "--alpha", "1"]
        status, err = run_command(argv + [a for o, v in drawn for a in o.argv(v)])
        check_answer(drawn, status, err)
        if status != 0:
            assert f.intact()


@fuzz(15, shrink=False)
@given(drawn=option_draws([Option("--last", "int")]))
def test_average_checkpoints_options(random_checkpoint, drawn):
    with files(random_checkpoint) as f:
        argv = ["average-checkpoints", str(f.run / "checkpoints"), "-o", str(f.output)]
        status, err = run_command(argv + [a for o, v in drawn for a in o.argv(v)])
        check_answer(drawn, status, err)
        if status != 0:
            assert f.intact()


@fuzz(15, shrink=False)
@given(drawn=option_draws([Option("--format", "choice", ("ctranslate2", "hf")),
                           Option("--quantization", "choice", ("float32", "int8", "float16")),
                           Option("--vocab-map-size", "int"),
                           Option("--vocab-map-always", "int")]),
       vocab_map=st.booleans())
def test_export_options(random_checkpoint, drawn, vocab_map):
    with files(random_checkpoint) as f:
        output = f.folder / "export"
        argv = ["export", "--checkpoint", str(f.checkpoint), "--output", str(output)]
        argv += ["--vocab-map", str(f.src), str(f.ref)] if vocab_map else []
        status, err = run_command(argv + [a for o, v in drawn for a in o.argv(v)])
        check_answer(drawn, status, err)
        if status != 0:
            assert not output.exists()


@fuzz(10, shrink=False)
@given(hf_dir=TEXT, output=TEXT)
def test_import_hf_paths(random_checkpoint, hf_dir, output):
    """Any text as the two paths (none of them a Marian directory)."""
    with files(random_checkpoint) as f:
        status, err = run_command(["import-hf", f"{f.folder}/{hf_dir}/",
                                   f"--output={f.folder}/{output}/run"])
        check_answer([], status, err)
        assert status != 0


@fuzz(15, shrink=False)
@given(drawn=option_draws([Option("--port", "int"), Option("--host", "text"), *MODEL[:2],
                           Option("--engine", "choice", ("auto", "torch", "ctranslate2"))]))
def test_serve_options(random_checkpoint, drawn):
    """Argument errors only: a server that would start is replaced by a recorder, which
    checks that the port is one a socket can bind."""
    ports = []
    with mock.patch("uvicorn.run", lambda app, host, port, **kw: ports.append(port)):
        status, err = run_command(["serve", "--checkpoint", str(random_checkpoint)]
                                  + [a for o, v in drawn for a in o.argv(v)])
    check_answer(drawn, status, err)
    if status == 0:
        assert len(ports) == 1 and 0 <= ports[0] <= 65535


@fuzz(4, shrink=False)
@given(drawn=option_draws([Option("--source", "text"), Option("--target", "text"),
                           Option("--beam-size", "int"), *MODEL[:2]]))
def test_attention_maps_options(random_checkpoint, drawn):
    with files(random_checkpoint) as f:
        output = f.folder / "maps"
        argv = ["attention-maps", "--checkpoint", str(f.checkpoint), "--source", SOURCES[0],
                "--output-dir", str(output)]
        status, err = run_command(argv + [a for o, v in drawn for a in o.argv(v)])
        check_answer(drawn, status, err)


@fuzz(4, shrink=False)
@given(drawn=option_draws([Option("--beam-size", "int"), *EVALUATION]))
def test_head_importance_options(random_checkpoint, drawn):
    with files(random_checkpoint) as f:
        argv = ["head-importance", "--checkpoint", str(f.checkpoint), "--src", str(f.src),
                "--ref", str(f.ref), "--output-dir", str(f.folder / "heads")]
        status, err = run_command(argv + [a for o, v in drawn for a in o.argv(v)])
        check_answer(drawn, status, err)


@fuzz(10, shrink=False)
@given(drawn=option_draws([Option("--fraction", "float"), Option("--no-normalize", "flag"),
                           *EVALUATION]))
def test_prune_heads_options(random_checkpoint, drawn):
    with files(random_checkpoint) as f:
        argv = ["prune-heads", "--checkpoint", str(f.checkpoint), "--src", str(f.src),
                "--ref", str(f.ref), "--output", str(f.output), "--fraction", "0.25"]
        status, err = run_command(argv + [a for o, v in drawn for a in o.argv(v)])
        check_answer(drawn, status, err)
        if status != 0:
            assert f.intact()


@fuzz(10, shrink=False)
@given(drawn=option_draws([Option("--title", "text"), Option("--labels", "text")]))
def test_plot_curves_options(random_checkpoint, drawn):
    """Runs without TensorBoard logs: refused on one line, the PNG left as it was."""
    with files(random_checkpoint) as f:
        argv = ["plot-curves", str(f.run), "-o", str(f.output)]
        status, err = run_command(argv + [a for o, v in drawn for a in o.argv(v)])
        check_answer(drawn, status, err)
        assert status != 0 and f.intact()


# ---- what the fuzzing above once found ----------------------------------------------------------

HUGE = str(2**63)


@pytest.mark.parametrize("command, options", [
    ("translate", ["--chunk-lines=0"]),  # was argparse's usage error (exit 2)
    ("translate", ["--threads=-1"]),  # was argparse's usage error (exit 2)
    ("translate", ["--nbest=" + HUGE, "--beam-size=" + HUGE]),  # was an OverflowError
    ("translate", ["--device=cuda:x"]),  # was torch's RuntimeError
    ("translate", ["--score"]),  # no --reference: was argparse's usage error (exit 2)
    ("translate", ["--score", "--alignment", "--reference={ref}"]),  # likewise
    ("average-checkpoints", ["--last=0"]),  # was argparse's usage error (exit 2)
    ("export", ["--format=hf", "--quantization=int8"]),  # was argparse's usage error
    ("export", ["--vocab-map-size=0"]),  # was argparse's usage error
    ("tune-decoding", ["--alpha=-inf"]),  # was argparse's usage error
    ("tune-decoding", ["--max-tokens=" + HUGE]),  # was an OverflowError
    ("attention-maps", ["--beam-size=" + HUGE]),  # was an OverflowError
    ("head-importance", ["--device=1.5"]),  # was torch's RuntimeError
    ("prune-heads", ["--device=cuda:-1"]),  # was torch's RuntimeError
    ("serve", ["--device=-inf"]),  # was torch's RuntimeError
], ids=lambda value: value if isinstance(value, str) else " ".join(value)[:30])
def test_found_by_fuzzing(random_checkpoint, command, options):
    """Values the parser accepts and the command cannot use: `error: <one line>`, exit 1."""
    with files(random_checkpoint) as f:
        base = {
            "translate": ["--checkpoint", str(f.checkpoint), "--input", str(f.src),
                          "--output", str(f.output)],
            "average-checkpoints": [str(f.run / "checkpoints"), "-o", str(f.output)],
            "export": ["--checkpoint", str(f.checkpoint), "--output", str(f.folder / "e"),
                       "--vocab-map", str(f.src), str(f.ref)],
            "tune-decoding": [str(f.run), "-o", str(f.output), "--src", str(f.src), "--ref",
                              str(f.ref), "--last", "1", "--alpha", "1"],
            "attention-maps": ["--checkpoint", str(f.checkpoint), "--source", SOURCES[0],
                               "--output-dir", str(f.folder / "maps")],
            "head-importance": ["--checkpoint", str(f.checkpoint), "--src", str(f.src),
                                "--ref", str(f.ref), "--output-dir", str(f.folder / "h")],
            "prune-heads": ["--checkpoint", str(f.checkpoint), "--src", str(f.src), "--ref",
                            str(f.ref), "--output", str(f.output), "--fraction", "0.25"],
            "serve": ["--checkpoint", str(f.checkpoint)],
        }[command]
        options = [option.format(ref=f.ref) for option in options]
        with mock.patch("uvicorn.run", lambda *a, **kw: None):
            status, err = run_command([command, *base, *options])
        assert status == 1, err
        assert err.splitlines()[-1].startswith("error: ") and "Traceback" not in err, err
        assert f.intact()


def test_found_by_fuzzing_a_vocabulary_map_of_every_frequent_piece(random_checkpoint):
    """`--vocab-map-always` at least the corpus's distinct target pieces (here a two-line
    corpus): a map, or one line; it was a ValueError from zip()."""
    with files(random_checkpoint) as f:
        output = f.folder / "export"
        status, err = run_command(["export", "--checkpoint", str(f.checkpoint), "--output",
                                   str(output), "--vocab-map", str(f.src), str(f.ref),
                                   "--vocab-map-always=5"])
        check_answer([], status, err)
        assert output.is_dir() if status == 0 else not output.exists()
