"""The `transformer` command: one subcommand per tool.

    transformer train experiment=smoke hydra.run.dir=runs/x     # Hydra overrides
    transformer translate --checkpoint runs/x < test.en > test.hyp
    transformer --help                                          # every command
    python -m transformer ...                                   # the same, without the script

Each command is a module of this package with a `main(argv) -> int`; `scripts/*.py` in the
repository call the same functions. The two commands that take the training configuration
(`train`, `prepare-data`) are Hydra apps over the package's configs (`compose.CONFIG_DIR`;
`--config-dir DIR` adds a user's own presets, under new names); the others use argparse.
Every command reports the package's errors the same way (`report_errors`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .. import __version__
from ..errors import TransformerError

if TYPE_CHECKING:
    from ..run.config import TrainConfig

__all__ = ["COMMANDS", "main", "command_module", "summary", "command_parser",
           "DefaultsHelpFormatter", "shown_default", "has_shown_default", "report_errors",
           "hydra_command"]

COMMANDS = ("train", "prepare-data", "translate", "tune-decoding", "average-checkpoints",
            "export", "import-hf", "serve", "attention-maps", "head-importance",
            "prune-heads", "plot-curves", "backtranslate", "distill")


def command_module(name: str) -> ModuleType:
    """The module of command `name` ("prepare-data" -> `transformer.cli.prepare_data`)."""
    return importlib.import_module(f"{__name__}.{name.replace('-', '_')}")


def summary(doc: str) -> str:
    """A command's one-line summary: the first line of its module's docstring, a whole
    sentence (`transformer --help` lists it, the command's `--help` starts with it)."""
    return doc.strip().splitlines()[0]


def shown_default(default: object) -> str:
    """A default as a user would type it: a list's items separated by spaces."""
    if isinstance(default, (list, tuple)):
        return " ".join(map(str, default))
    return str(default)


def has_shown_default(action: argparse.Action) -> bool:
    """Whether `--help` shows the default of `action`: an option's (or an optional
    positional's) default that says something, not None, False or a suppressed one."""
    default = action.default
    if default is None or default is False or default == argparse.SUPPRESS:
        return False
    return bool(action.option_strings) or action.nargs in (argparse.OPTIONAL,
                                                           argparse.ZERO_OR_MORE)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Each option's help followed by its default, `(default: 5)`, where it has one
    (`has_shown_default`) and the help does not place it itself with `%(default)s`: what an
    option does when left out is read where the option is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or not has_shown_default(action):
            return text
        default = shown_default(action.default).replace("%", "%%")
        return f"{text} (default: {default})" if text else f"default: {default}"


def command_parser(doc: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of a command whose module's docstring is `doc`: its summary as
    the description, and every option's default in `--help` (`DefaultsHelpFormatter`)."""
    return argparse.ArgumentParser(description=summary(doc), epilog=epilog,
                                   formatter_class=DefaultsHelpFormatter)


def _usage() -> str:
    rows = [f"  {name:<21}{summary(command_module(name).__doc__)}" for name in COMMANDS]
    return "\n".join(["usage: transformer COMMAND [ARGS ...]   (transformer COMMAND --help)",
                      "", "commands:", *rows])


def main(argv: Sequence[str] | None = None) -> int:
    """`transformer COMMAND [ARGS ...]`: run one command, return its exit status. Typed as a
    command (`argv` None), `train` first enters `runtime.enter_training_environment`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0] == "--version":
        print(f"transformer {__version__}")
        return 0
    name = args[0]
    if name not in COMMANDS:
        print(f"transformer: unknown command {name!r}; the commands are: "
              f"{', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if name == "train" and argv is None and not {"-h", "--help"} & set(args):
        from ..runtime import enter_training_environment

        status = report_errors(enter_training_environment)  # may run the command again
        if status:
            return status
    sys.argv[0] = f"transformer {name}"  # the program name usage and help messages show
    return command_module(name).main(args[1:])


def report_errors(run: Callable[[], object]) -> int:
    """Run a command's body and return the command's exit status: 0 when it returns; the
    one place the package's errors meet the user. A `TransformerError` (or an `OSError`
    about a file the user named) prints `error: <its message on one line>` on stderr and
    gives 1, without a traceback (a decoding option is named as the option: `--nbest`); a
    reader that goes away (`| head`) ends the command quietly; Ctrl-C gives 130."""
    try:
        run()
        return 0
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error
        return 1
    except (TransformerError, OSError) as e:
        message = " ".join(_command_line_message(e).split("\n"))
        print(f"error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _command_line_message(error: Exception) -> str:
    """The error's message; a decoding request's names its fields as the commands' options
    ("--nbest", not "nbest")."""
    from ..decoding.request import RequestError, option_name

    return error.message(option_name) if isinstance(error, RequestError) else str(error)


def hydra_command(task: Callable[[TrainConfig, Path], object]) -> Callable[..., int]:
    """A command over the training configuration: Hydra composes the package's configs
    (and those of `--config-dir DIR`) with the command line's overrides, and
    `task(config, run_dir)` runs on the validated `TrainConfig` in Hydra's run directory,
    its errors reported by `report_errors`. Hydra names the job after `task`'s module.
    `--help` (`-h`) is answered before Hydra sees the command line: the presets and every
    key with its default and meaning (`_hydra_help`). A run that fails with the package's
    error before its first checkpoint removes the run directory it created
    (`_NewRunDirectory`)."""
    command = task.__module__.rpartition(".")[2].replace("_", "-")  # e.g. prepare-data

    def main(argv: Sequence[str] | None = None) -> int:
        args = list(sys.argv[1:] if argv is None else argv)
        if argv is not None:  # Hydra reads its arguments from sys.argv
            sys.argv[1:] = args
        if "-h" in args or "--help" in args:
            doc = sys.modules[task.__module__].__doc__ or command
            return report_errors(lambda: print(_hydra_help(command, doc, args)))
        from ..run.compose import register_configs

        register_configs()
        new_run_dir = _NewRunDirectory.before(args)
        return report_errors(lambda: _run_hydra(task, new_run_dir))  # e.g. `--cfg job | head`

    return main


def _run_hydra(task: Callable[[TrainConfig, Path], object],
               new_run_dir: _NewRunDirectory | None) -> None:
    """Hydra's app over `task`, run once. Told to raise its errors about the command line (a
    bad override, a missing preset) rather than print them over several lines, it gets them
    reported as ConfigError on one line."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException

    from ..run.compose import CONFIG_DIR, load_config, override_error

    def run_task(cfg: DictConfig) -> None:
        run_dir = Path(HydraConfig.get().runtime.output_dir)

        def body() -> None:
            try:
                task(load_config(cfg), run_dir)
            except TransformerError:
                if new_run_dir is not None:
                    new_run_dir.remove(run_dir)
                raise

        status = report_errors(body)
        if status:
            sys.exit(status)

    run_task.__module__ = task.__module__  # e.g. transformer.cli.train: the job "train"
    hydra_main = hydra.main(config_path=str(CONFIG_DIR), config_name="config",
                            version_base="1.3")(run_task)
    previous = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra_main()
    except (HydraException, OmegaConfBaseException) as e:
        raise override_error(e) from None
    finally:
        if previous is None:
            del os.environ["HYDRA_FULL_ERROR"]
        else:
            os.environ["HYDRA_FULL_ERROR"] = previous


HYDRA_OPTIONS = ("Hydra's own options: --hydra-help (Hydra's help), --cfg job (print the "
                 "composed config; runs nothing), hydra.run.dir=DIR (the run directory; "
                 "default outputs/DATE/TIME), --config-dir DIR (a directory of your own "
                 "presets, under new names).")


def _hydra_help(command: str, doc: str, args: Sequence[str]) -> str:
    """`transformer COMMAND --help` of a Hydra command: the usage line, the command's
    summary, the presets of each group and every key with its default (of the config the
    other arguments compose, `--config-dir` included) and meaning (`config_docs`), then
    where Hydra's own options are."""
    from hydra._internal.utils import get_args_parser

    from ..run.config_docs import config_help

    parsed, _ = get_args_parser().parse_known_args(list(args))
    config_dir = Path(parsed.config_dir) if parsed.config_dir else None
    return "\n".join([f"usage: transformer {command} [--config-dir DIR] [GROUP=PRESET ...] "
                      "[KEY=VALUE ...]", "", summary(doc), "",
                      config_help(parsed.overrides, config_dir), "",
                      *textwrap.wrap(HYDRA_OPTIONS, 100)])


@dataclass(frozen=True)
class _NewRunDirectory:
    """Where the run directory of a Hydra command will be, known before Hydra creates it:
    the `hydra.run.dir` override's path, or inside Hydra's default `outputs/` of the
    current directory; and which directories there existed before the command started. A
    run that fails before its first checkpoint removes the directory it created, so that a
    mistyped value leaves no empty run behind; never one that existed before (a run being
    resumed) nor one holding checkpoints/."""

    within: Path  # the run directory is this one or lies inside it
    existed: frozenset[Path]  # the directories there (and above) that existed before

    @classmethod
    def before(cls, args: Sequence[str]) -> _NewRunDirectory | None:
        """Before Hydra runs: None when the run directory cannot be known beforehand (an
        interpolation in the `hydra.run.dir` override)."""
        value = _run_dir_override(args)
        if value is None:
            outputs = Path(os.path.abspath("outputs"))  # Hydra's outputs/<date>/<time>
            dates = _subdirectories(outputs)
            found = [outputs, *dates, *(run for date in dates for run in _subdirectories(date))]
            return cls(outputs, frozenset(p for p in found if p.is_dir()))
        if "${" in value:
            return None
        path = Path(os.path.abspath(value))
        return cls(path, frozenset(p for p in (path, *path.parents) if p.exists()))

    def remove(self, run_dir: Path) -> None:
        """Remove `run_dir` if this command created it and it holds no checkpoints/, then
        its parents this command created that are empty, up to the current directory."""
        run_dir = Path(os.path.abspath(run_dir))
        if (run_dir in self.existed or not run_dir.is_relative_to(self.within)
                or (run_dir / "checkpoints").exists()):
            return
        shutil.rmtree(run_dir, ignore_errors=True)
        for parent in run_dir.parents:
            if parent == Path.cwd() or parent in self.existed:
                break
            try:
                parent.rmdir()
            except OSError:  # not empty
                break


def _run_dir_override(args: Sequence[str]) -> str | None:
    """The value of the last `hydra.run.dir=VALUE` on the command line, unquoted."""
    values = [found[1] for arg in args
              if (found := re.fullmatch(r"\+{0,2}hydra\.run\.dir=(.*)", arg))]
    if not values:
        return None
    value = values[-1]
    quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
    return value[1:-1] if quoted else value


def _subdirectories(path: Path) -> list[Path]:
    return [p for p in path.iterdir() if p.is_dir()] if path.is_dir() else []
