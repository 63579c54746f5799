"""The `transformer` command: one subcommand per tool.

    transformer train experiment=smoke hydra.run.dir=runs/x     # Hydra overrides
    transformer translate --checkpoint runs/x < test.en > test.hyp
    transformer --help                                          # every command
    python -m transformer ...                                   # the same, without the script

Each command is a module of this package with a `main(argv) -> int`; `scripts/*.py` in the
repository call the same functions. The two commands that take the training configuration
(`train`, `prepare-data`) are Hydra apps over the package's configs (`config.CONFIG_DIR`;
`--config-dir DIR` adds a user's own presets, under new names); the others use argparse.
Every command reports the package's errors the same way (`report_errors`).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .. import __version__
from ..errors import TransformerError

if TYPE_CHECKING:
    from ..config import TrainConfig

__all__ = ["COMMANDS", "main", "command_module", "report_errors", "hydra_command"]

COMMANDS = ("train", "prepare-data", "translate", "tune-decoding", "average-checkpoints",
            "export", "import-hf", "serve", "attention-maps", "head-importance",
            "prune-heads", "plot-curves", "backtranslate", "distill")


def command_module(name: str) -> ModuleType:
    """The module of command `name` ("prepare-data" -> `transformer.cli.prepare_data`)."""
    return importlib.import_module(f"{__name__}.{name.replace('-', '_')}")


def _usage() -> str:
    rows = [f"  {name:<21}{command_module(name).__doc__.splitlines()[0]}"
            for name in COMMANDS]
    return "\n".join(["usage: transformer COMMAND [ARGS ...]   (transformer COMMAND --help)",
                      "", "commands:", *rows])


def main(argv: Sequence[str] | None = None) -> int:
    """`transformer COMMAND [ARGS ...]`: run one command, return its exit status."""
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
    from ..decoding import RequestError, option_name

    return error.message(option_name) if isinstance(error, RequestError) else str(error)


def hydra_command(task: Callable[[TrainConfig, Path], object]) -> Callable[..., int]:
    """A command over the training configuration: Hydra composes the package's configs
    (and those of `--config-dir DIR`) with the command line's overrides, and
    `task(config, run_dir)` runs on the validated `TrainConfig` in Hydra's run directory,
    its errors reported by `report_errors`. Hydra names the job after `task`'s module."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig

    from ..config import CONFIG_DIR, load_config, override_error, register_configs

    def run_task(cfg: DictConfig) -> None:
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        status = report_errors(lambda: task(load_config(cfg), run_dir))
        if status:
            sys.exit(status)

    run_task.__module__ = task.__module__  # e.g. transformer.cli.train: the job "train"
    hydra_main = hydra.main(config_path=str(CONFIG_DIR), config_name="config",
                            version_base="1.3")(run_task)

    def run_hydra() -> None:
        """Hydra's app. Told to raise its errors about the command line (a bad override, a
        missing preset) rather than print them over several lines, it gets them reported
        as ConfigError on one line."""
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

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

    def main(argv: Sequence[str] | None = None) -> int:
        if argv is not None:  # Hydra reads its arguments from sys.argv
            sys.argv[1:] = list(argv)
        register_configs()
        return report_errors(run_hydra)  # e.g. `--help | head`

    return main
