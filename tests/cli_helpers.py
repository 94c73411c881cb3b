"""``attnres ARGS`` run in the test's own process: what a test of a command's output, files and exit status needs,
without a fresh interpreter's imports each time: 0.8 s for a command refused before training and 5 s for a tiny
`attnres train` in a subprocess, 0.01 s and 1.7 s in-process (2 cores, nearly idle, back to back on 2026-12-05; a
loaded machine multiplies the subprocess's share several times).

A subprocess stays where the process boundary is what a test is about: signals and kill-and-resume, a closed pipe, the
exit status of the real console script, what happens at import time or to environment variables read when a process
starts, several processes at once (locks, distributed launches, SLURM), the README tour and the one-answer BLAS test.

:func:`attnres` restores what a command changes in the process it runs in, so that a test stays independent of the
ones before it (in any order, on any xdist worker): the SIGTERM/SIGHUP handlers (attnres.runtime.raise_on_termination),
the warnings filters and printer (one_line_warnings, training's filters), torch's thread count (runtime.threads; where
torch was imported before), the environment, the current folder, and the root and Lightning loggers' handlers and
levels.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import sys
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# the signals a command (or a sweep's launcher) may take over in the process that runs it
SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1)
# loggers whose level a run sets (attnres.training.run._quiet_lightning), besides the root
LOGGERS = ("", "lightning", "lightning.pytorch", "lightning.fabric")


@dataclass
class Ran:
    """What :func:`subprocess.run` would return for the same command (the attributes the tests read)."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def fresh_interpreters_warning_filters() -> None:
    """The warnings filters of ``python -m attnres.cli`` (Python's defaults, no -W), not pytest's: pytest shows every
    DeprecationWarning, which a user's command (and a test of what it prints) never sees."""
    warnings.resetwarnings()
    for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning, DeprecationWarning):
        warnings.simplefilter("ignore", category)  # each goes first: the same order as Python's own list
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")


@contextlib.contextmanager
def process_state_restored() -> Iterator[None]:
    """Whatever the body changes in the process-wide state listed in this module's docstring is put back after it."""
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    environ = dict(os.environ)
    cwd = os.getcwd()
    loggers = {name: (logging.getLogger(name).level, list(logging.getLogger(name).handlers)) for name in LOGGERS}
    torch = sys.modules.get("torch")  # not imported here: `attnres fit` runs without torch
    threads = torch.get_num_threads() if torch is not None else None
    try:
        with warnings.catch_warnings():  # the filters and warnings.showwarning
            fresh_interpreters_warning_filters()
            yield
    finally:
        os.chdir(cwd)
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        os.environ.update(environ)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        for name, (level, kept) in loggers.items():
            logger = logging.getLogger(name)
            logger.setLevel(level)
            logger.handlers[:] = kept
        # where the command imported torch first, its count stays as the command set it (as after a test's own
        # train() call): the fresh import's count is not known here without importing torch for every command
        if threads is not None:
            torch.set_num_threads(threads)


def attnres(*args: str | Path, cwd: Path | str | None = None) -> Ran:
    """``attnres ARGS`` (``attnres.cli.main``) in this process, from ``cwd`` if given: its exit status as a process
    would end with it (SystemExit's code: argparse's 2 and --help's 0; 1 and the traceback on stderr for an uncaught
    exception, as Python prints it), and what it printed to stdout and stderr (not a terminal, as in a pipe)."""
    from attnres.cli import main

    argv = [str(arg) for arg in args]
    out, err = io.StringIO(), io.StringIO()
    with process_state_restored(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if cwd is not None:
            os.chdir(cwd)
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
        except Exception:  # a fresh interpreter prints the traceback and ends with status 1
            traceback.print_exc(file=err)
            code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): the message on stderr, status 1
        err.write(f"{code}\n")
        code = 1
    return Ran(argv, code, out.getvalue(), err.getvalue())
