"""docs/USAGE.md against the code: every option of every command is documented, every option
it documents for a command is one that command takes, and every key of the training
configuration is there.

What is read of USAGE.md:
- its command lines: the lines of its ```bash blocks (backslash continuations joined), the
  `$ ` lines of its other blocks, and its inline code spans; in each, a command is
  `transformer NAME` (also `python -m transformer NAME`, `torchrun ... -m transformer NAME`,
  `python scripts/NAME.py`), and its options are the `-x`/`--xyz` words after it, up to
  the end of the command (a comment, a pipe, a redirection, `;`, `&&`);
- "Every command's options", the index: one item per command (or two sharing their
  options), its options the code spans that are options;
- every other `--option` on the page: an option of one of the commands, or in a paragraph,
  list item or command line that names the other program it belongs to (torchrun, pip,
  sacreBLEU, ...; a bench/ script's option must be one that script's source declares).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from transformer import __version__, cli
from transformer.run.compose import schema_keys
from transformer.run.config_docs import REFERENCE_BEGIN, REFERENCE_END

ROOT = Path(__file__).resolve().parents[1]
USAGE = ROOT / "docs" / "USAGE.md"
HYDRA_COMMANDS = ("train", "prepare-data")
ARGPARSE_COMMANDS = [name for name in cli.COMMANDS if name not in HYDRA_COMMANDS]
INDEX = "## Every command's options"
OPTION = re.compile(r"-{1,2}[A-Za-z][\w-]*")
# a command: `transformer NAME`, `-m transformer NAME`, `scripts/NAME.py`
COMMAND = re.compile(r"(?:(?<=^)|(?<=[\s(|;&]))(?:transformer\s+(\S+)|scripts/(\w+)\.py)")
END_OF_COMMAND = re.compile(r"\s#|\||;|&&|\s\d?[<>]|\$\(|`")
# other programs whose options USAGE.md quotes, and how a line names them
OTHER_PROGRAMS = ("torchrun", "pip", "tensorboard", "huggingface-cli", "sacrebleu", "sacreBLEU",
                  "Marian", "pytest", "iconv", "bench/")


def usage_text() -> str:
    return USAGE.read_text(encoding="utf-8")


def parser_options(name: str) -> set[str]:
    """The options command `name` takes, but -h/--help: its argparse parser's, or for the
    Hydra commands those their `--help` names as Hydra's own (`cli.HYDRA_OPTIONS`)."""
    if name in HYDRA_COMMANDS:
        return set(re.findall(r"--[\w-]+", cli.HYDRA_OPTIONS))
    parser = cli.command_module(name).build_parser()
    return {option for action in parser._actions if not isinstance(action, argparse._HelpAction)
            for option in action.option_strings}


def accepted_options(name: str) -> set[str]:
    """What a command line of `name` may give: its options, -h/--help, and for the Hydra
    commands every option of Hydra's own parser."""
    if name in HYDRA_COMMANDS:
        from hydra._internal.utils import get_args_parser

        return {option for action in get_args_parser()._actions
                for option in action.option_strings}
    return parser_options(name) | {"-h", "--help"}


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block."""
    return re.findall(r"^ *```(\w*)\n(.*?)^ *```", text, re.S | re.M)


def without_code_blocks(text: str) -> str:
    return re.sub(r"^ *```\w*\n.*?^ *```", "", text, flags=re.S | re.M)


def command_lines(text: str) -> list[str]:
    """The page's command lines: bash blocks' lines, `$ ` lines of other blocks, inline code."""
    lines = []
    for language, body in code_blocks(text):
        body = body.replace("\\\n", " ")
        if language in ("bash", "sh"):  # comments dropped: they name commands in words
            lines += [re.sub(r"(^|\s)#.*", "", line) for line in body.splitlines()]
        elif language == "":
            lines += [line.strip()[2:] for line in body.splitlines()
                      if line.strip().startswith("$ ")]
    spans = re.findall(r"`([^`]+)`", without_code_blocks(text))
    return lines + [" ".join(span.split()) for span in spans]


def commands_in(line: str) -> list[tuple[str, list[str]]]:
    """Each command of `line` with the options given it: [(name, [option, ...]), ...]."""
    found = []
    for match in COMMAND.finditer(line):
        name = match[1] or match[2].replace("_", "-")
        rest = line[match.end():]
        end = END_OF_COMMAND.search(rest)
        words = (rest[:end.start()] if end else rest).split()
        options = [OPTION.match(word.strip("[]()'\""))[0] for word in words
                   if OPTION.match(word.strip("[]()'\""))]
        found.append((name, options))
    return found


def prose_blocks(text: str) -> list[str]:
    """The page in the units an option is read in: each command line of a code block
    (comments kept), each list item and each paragraph of the rest."""
    blocks = [line for _, body in code_blocks(text)
              for line in body.replace("\\\n", " ").splitlines()]
    for paragraph in re.split(r"\n\s*\n", without_code_blocks(text)):
        blocks += re.split(r"\n(?=\s*(?:[-*]|\d+\.) )", paragraph)
    return blocks


def documented_commands(text: str) -> list[tuple[str, list[str], str]]:
    """(command, options, line) of every command line of the page."""
    return [(name, options, line) for line in command_lines(text)
            for name, options in commands_in(line)]


def index_items(text: str) -> dict[str, set[str]]:
    """The index section: {command: the options it lists}."""
    start = text.index(INDEX)
    end = text.find("\n## ", start + len(INDEX))
    section = text[start:end if end >= 0 else len(text)]
    items = {}
    for item in re.split(r"\n- ", section)[1:]:
        spans = re.findall(r"`([^`]+)`", " ".join(item.split()))
        names = [span.split()[1] for span in spans if span.startswith("transformer ")]
        assert names, f"an item of the index names no command: {item[:60]!r}"
        options = {option for span in spans for option in span.split("/")
                   if OPTION.fullmatch(option)}
        for name in names:
            items[name] = items.get(name, set()) | options
    return items


def test_the_extraction_reads_options_and_ends_commands_where_the_shell_does():
    line = ("transformer translate --checkpoint runs/x --input t.en [--nbest 8] < in.txt "
            "| transformer export --format hf  # --not-this")
    assert commands_in(line) == [("translate", ["--checkpoint", "--input", "--nbest"]),
                                 ("export", ["--format"])]
    assert commands_in("torchrun --nproc-per-node=2 -m transformer train --cfg job") == [
        ("train", ["--cfg"])]
    assert commands_in("python scripts/tune_decoding.py runs/x -o c.pt") == [
        ("tune-decoding", ["-o"])]
    assert commands_in("pip install 'transformer[hf]'") == []


def test_every_command_is_documented_with_its_help():
    text = usage_text()
    names = {name for name, _, _ in documented_commands(text)}
    for name in cli.COMMANDS:
        assert name in names, f"docs/USAGE.md shows no `transformer {name}` command line"
        assert f"| `{name}` |" in text, f"the command table of docs/USAGE.md lacks {name}"
    assert "transformer COMMAND --help" in text and "transformer --version" in text


def test_every_command_line_names_a_command_and_its_own_options():
    """Every option a command line of USAGE.md gives a command is one that command takes:
    an option removed from a parser, or misspelled in the docs, fails here."""
    wrong = []
    for name, options, line in documented_commands(usage_text()):
        if name in ("COMMAND", "--help", "-h", "--version"):
            continue
        if name not in cli.COMMANDS:
            wrong.append(f"unknown command {name!r} in: {line}")
            continue
        accepted = accepted_options(name)
        wrong += [f"transformer {name} has no {option}: {line}" for option in options
                  if option not in accepted]
    assert not wrong, "\n".join(wrong)


def test_the_index_lists_every_option_of_every_command_and_no_other():
    items = index_items(usage_text())
    assert set(items) == set(cli.COMMANDS)
    for name in cli.COMMANDS:
        missing, extra = parser_options(name) - items[name], items[name] - parser_options(name)
        assert not missing, f"USAGE.md's index lacks {name}'s {sorted(missing)}"
        assert not extra, f"USAGE.md's index gives {name} options it lacks: {sorted(extra)}"


@pytest.mark.parametrize("name", cli.COMMANDS)
def test_every_option_is_described_outside_the_index(name):
    text = usage_text()
    described = text[:text.index(INDEX)]
    for option in parser_options(name):
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", described), \
            f"docs/USAGE.md describes {name}'s {option} nowhere but in the index"


def test_every_other_option_on_the_page_belongs_to_a_command_or_names_its_program():
    """A `--option` in prose is one of some command's (or Hydra's), or sits in a paragraph,
    list item or command line that names the program it belongs to; a bench/ script's
    option is one that a bench/ script declares."""
    known = set().union(*(accepted_options(name) for name in cli.COMMANDS))
    bench = "\n".join(path.read_text(encoding="utf-8") for path in (ROOT / "bench").rglob("*.py"))
    wrong = []
    for block in prose_blocks(usage_text()):
        for option in re.findall(r"(?<![\w/-])(--[A-Za-z][\w-]*)", block):
            if option in known:
                continue
            if "bench/" in block and f'"{option}"' in bench:
                continue
            if any(program in block for program in OTHER_PROGRAMS if program != "bench/"):
                continue
            wrong.append(f"{option}: {' '.join(block.split())[:160]}")
    assert not wrong, "options of no command or program:\n" + "\n".join(wrong)


def test_every_config_key_is_in_usage_and_in_its_reference():
    text = usage_text()
    begin, end = text.index(REFERENCE_BEGIN), text.index(REFERENCE_END)
    reference, prose = text[begin:end], text[:begin] + text[end:]
    for key in (k.key for k in schema_keys()):
        assert f"| `{key}` |" in reference, f"{key} is not in USAGE.md's configuration reference"
        if "[]." not in key:  # an entry's keys are described with their list
            assert re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", prose), \
                f"docs/USAGE.md names {key} only in the generated reference"


def test_every_config_key_the_page_writes_exists():
    """The keys of the page's `transformer train`/`prepare-data` overrides and of its code
    spans that are a key (`optim.lr`, `trainer.max_time=1800`) are keys of the schema."""
    keys = {k.key for k in schema_keys()}
    groups = {"model", "data", "optim", "trainer"}
    text = usage_text()
    written = []
    for line in command_lines(text):
        for match in COMMAND.finditer(line):
            if (match[1] or "") in HYDRA_COMMANDS:
                written += [word.strip("'\"[]").split("=")[0].lstrip("+~")
                            for word in line[match.end():].split() if "=" in word]
    spans = re.findall(r"`([^`\s]+)`", without_code_blocks(text))
    written += [span.split("=")[0] for span in spans  # files (model.bin) are not keys
                if re.fullmatch(r"(model|data|optim|trainer)\.[a-z_0-9]+(\[[^\]]*\]\.[a-z_0-9]+)?"
                                r"(=\S*)?", span) and not span.endswith((".bin", ".safetensors"))]
    wrong = []
    for key in written:
        key = re.sub(r"\[[^\]]*\]", "[]", key)
        if "." not in key or key.startswith("hydra.") or key.split(".")[0] not in groups:
            continue  # presets (model=small), top-level keys (seed) and Hydra's keys
        if key not in keys:
            wrong.append(key)
    assert not wrong, f"docs/USAGE.md writes keys the schema lacks: {sorted(set(wrong))}"


def test_citation_cff_parses_and_its_references_are_usages():
    """CITATION.cff is YAML of the Citation File Format 1.2.0, and every work it references
    is in USAGE.md's References, by the same link."""
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert citation["cff-version"] == "1.2.0" and citation["type"] == "software"
    assert citation["license"] == "MIT" and citation["message"] and citation["authors"]
    assert str(citation["version"]) == __version__
    text = usage_text()
    references = text[text.index("\n## References"):]
    for work in citation["references"]:
        assert work["title"] and work["authors"] and work["year"]
        assert f"({work['url']})" in references, f"USAGE.md's References lack {work['url']}"
