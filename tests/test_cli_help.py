"""Every argparse command's `--help`: a one-sentence summary (also what `transformer --help`
lists), a help text for every option and argument, and the default of every option that has
one. `train` and `prepare-data` are Hydra apps, whose help is Hydra's."""

from __future__ import annotations

import argparse

import pytest

from transformer import cli

ARGPARSE_COMMANDS = [name for name in cli.COMMANDS if name not in ("train", "prepare-data")]


def first_paragraph(doc: str) -> str:
    """The docstring's text up to its first blank line, on one line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


@pytest.mark.parametrize("name", ARGPARSE_COMMANDS)
def test_help_starts_with_the_summary_and_exits_0(name, capsys):
    module = cli.command_module(name)
    with pytest.raises(SystemExit) as info:
        module.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ")
    assert cli.summary(module.__doc__) in " ".join(out.split())


@pytest.mark.parametrize("name", ARGPARSE_COMMANDS)
def test_every_option_has_a_help_text_and_shows_its_default(name):
    parser = cli.command_module(name).build_parser()
    formatter = parser.formatter_class(prog=parser.prog)
    for action in parser._actions:
        label = "/".join(action.option_strings) or action.dest
        assert action.help and action.help != argparse.SUPPRESS and action.help.strip(), \
            f"{name}: {label} has no help text"
        text = formatter._expand_help(action)  # what --help prints for it, unwrapped
        if cli.has_shown_default(action):
            assert cli.shown_default(action.default) in text, \
                f"{name}: {label}'s help does not show its default {action.default!r}"
            assert text.count("default") == 1, f"{name}: {label}: {text!r}"
        assert "(default: None)" not in text and "(default: False)" not in text


@pytest.mark.parametrize("name", ARGPARSE_COMMANDS)
def test_the_summary_is_one_whole_sentence_as_transformer_help_lists_it(name, capsys):
    module = cli.command_module(name)
    summary = cli.summary(module.__doc__)
    assert summary == first_paragraph(module.__doc__), \
        f"{name}: the docstring's first sentence goes on after its first line"
    assert summary.endswith(".") and summary[0].isupper()
    assert module.build_parser().description == summary
    assert cli.main(["--help"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert f"  {name:<21}{summary}" in rows


def test_defaults_are_shown_as_typed_and_flags_show_none():
    parser = cli.command_parser("A command.\n\nMore.")
    parser.add_argument("--last", type=int, nargs="+", default=[1, 2, 5], help="how many")
    parser.add_argument("--share", type=float, default=0.0, help="a share in %%")
    parser.add_argument("--flag", action="store_true", help="a switch")
    parser.add_argument("--given", help="a value")
    parser.add_argument("--placed", default="x", help="x or y (%(default)s unless told)")
    text = " ".join(parser.format_help().split())
    assert parser.description == "A command."
    assert "how many (default: 1 2 5)" in text and "a share in % (default: 0.0)" in text
    assert "a switch (default" not in text
    assert "a value (default" not in text and "x or y (x unless told)" in text
