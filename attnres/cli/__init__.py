"""The ``attnres`` command: one entry point, one sub-command per job.

Each part of the suite registers its own sub-commands (a ``register(subparsers)`` function next to the code
it runs), and heavy imports happen inside the commands, so ``attnres --help`` starts fast.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
from importlib import import_module

# (module, what it adds); a module registers its sub-parsers and sets ``func`` to a callable(args) -> int
COMMAND_MODULES = [
    "attnres.cli.train",  # attnres train
    "attnres.cli.data",  # attnres data prepare
    "sweeps.cli",  # attnres sweep plan|run|status, attnres tune
    "analysis.cli",  # attnres fit
    "reports.cli",  # attnres report
    "attnres.cli.demo",  # attnres demo
    "attnres.cli.generate",  # attnres generate
]


TRAINING_COMMANDS = ("train", "tune", "demo")  # with `sweep run` and `sweep throughput`: they start Lightning
MODEL_COMMANDS = (*TRAINING_COMMANDS, "generate")  # the environment they read is checked first (check_environment)
PATH_OPTIONS = ("results", "out")  # folders every command that takes them would otherwise read '' as '.'


def check_paths(args: argparse.Namespace) -> None:
    """An empty --results or --out (``--results ''``, a shell variable that was never set) is refused: read as a path
    it is the current folder, and `attnres train --results ''` put its run under ./results as if nothing was given."""
    from attnres.config import ConfigError

    for name in PATH_OPTIONS:
        value = getattr(args, name, None)
        if isinstance(value, str) and not value.strip():
            raise ConfigError(f"--{name} {value!r} is an empty path; give one, or leave --{name} out for its default")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnres",
        description="Scaling-law suite for Attention Residuals: train baseline / Full / Block AttnRes runs, "
        "sweep them locally or on SLURM, fit scaling laws and the effective compute multiplier, and report.",
    )
    from attnres import __version__

    parser.add_argument("--version", action="version", version=f"attnres {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:  # a real import error inside the module, not a missing part
                raise
            continue
        module.register(sub)
    return parser


def _resume_hint(args: argparse.Namespace) -> str:
    """What an interrupted command left and how to go on (every command is safe to run again)."""
    command = args.command if args.command != "sweep" else f"sweep {args.sweep_command}"
    return {
        "train": "the run is resumable: the same command resumes it from its last checkpoint",
        "sweep run": "finished runs are kept; `sweep run` resumes the others from their checkpoints",
        "demo": "finished runs are kept; the same command resumes the others and goes on to the report",
        "tune": "finished trials are kept; the same command continues the search",
        "data": "finished units are kept; the same command resumes the preparation",
    }.get(command, "nothing was written; run the same command again")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse stops a positional list at the first option, so `train --no-progress model.n_layer=2` would call
    # the override unrecognized: key=value items after an option are the command's items too
    listed = next((name for name in ("items", "overrides") if isinstance(getattr(args, name, None), list)), None)
    if extra and listed and all("=" in item and not item.startswith("-") for item in extra):
        getattr(args, listed).extend(extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from analysis.base.errors import AnalysisError
    from attnres.config import ConfigError
    from attnres.runtime import Terminated, one_line_warnings, raise_on_termination

    raise_on_termination()
    one_line_warnings(f"attnres {args.command}")

    try:
        check_paths(args)
        if args.command in MODEL_COMMANDS or getattr(args, "sweep_command", None) in ("run", "throughput"):
            from attnres.runtime import check_environment

            check_environment()
        return int(args.func(args) or 0)
    except (ConfigError, AnalysisError) as err:
        print(f"attnres {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"attnres {args.command}: interrupted (Ctrl-C); {_resume_hint(args)}", file=sys.stderr)
        return 130
    except Terminated as err:
        print(f"attnres {args.command}: stopped by {err.name}; {_resume_hint(args)}", file=sys.stderr)
        return int(err.code)
    except BrokenPipeError:
        # the reader went away (`attnres fit ... | head`): stop quietly, as Unix tools do, and keep the
        # interpreter's final flush of stdout from raising again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as err:
        full = err.errno in (errno.ENOSPC, errno.EDQUOT)
        if err.filename is None and not full:  # not about a path or the disk: a bug or the machine, keep the traceback
            raise
        where = (
            f" {err.filename}" + (f" -> {err.filename2}" if err.filename2 else "") if err.filename is not None else ""
        )
        fix = "; free some space and run the same command again (finished work is kept)" if full else ""
        print(f"attnres {args.command}: error: cannot write or read{where}: {err.strerror}{fix}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
