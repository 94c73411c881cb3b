"""Facts about the machine and the code a run records, and process-level settings for CPU training."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import signal
import subprocess
import sys
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnres.config import RuntimeConfig


def uses_gpu(runtime: RuntimeConfig) -> bool:
    """Whether a run with these settings trains on a GPU: ``accelerator=gpu``, or ``auto`` with one visible."""
    import torch

    return runtime.accelerator == "gpu" or (runtime.accelerator == "auto" and torch.cuda.is_available())


def one_line_warnings(prefix: str) -> None:
    """Print warnings as one line of text, ``<prefix>: warning: <message>``, instead of Python's
    ``path/to/module.py:76: UserWarning: ...`` and the source line under it: a user reads what is wrong, not where in
    the code it was noticed. The category is kept where it says something (not for a plain UserWarning)."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001 (warnings' signature)
        text = " ".join(str(message).split())
        kind = "" if category is UserWarning else f" ({category.__name__})"
        try:
            (file or sys.stderr).write(f"{prefix}: warning: {text}{kind}\n")
        except (OSError, ValueError):  # a closed or gone stream: the warning is lost, as Python's own would be
            pass

    warnings.showwarning = show


class Terminated(SystemExit):
    """SIGTERM (or SIGHUP) arrived: raised where the main thread is, so that ``finally`` blocks run (workers stopped,
    temporary files removed) and the command ends with one line and the conventional status, 128 + the signal.

    A :class:`SystemExit`, not an ``Exception``: no ``except Exception`` on the way (a run's failure handler, Optuna's
    trial) takes it for a failure."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def raise_on_termination() -> None:
    """SIGTERM and SIGHUP raise :class:`Terminated` in the main thread, once: a second one ends the process at once
    (the default action), for a user who does not want to wait for the cleanup."""

    def handler(signum: int, frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        raise Terminated(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:  # left alone where the caller chose (nohup ignores SIGHUP)
            signal.signal(sig, handler)


# Integers that Lightning, torch.distributed and SLURM's launcher read from the environment (rank, world size, job
# ids); a stray value (an exported test variable, a copied job script) would end in int()'s traceback inside them.
INTEGER_ENVIRONMENT = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "NODE_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_NNODES",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_RESTART_COUNT",
)


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse a rank, world size or SLURM job variable that is not an integer, before Lightning reads it."""
    from attnres.config import ConfigError

    environ = os.environ if environ is None else environ
    for name in INTEGER_ENVIRONMENT:
        value = environ.get(name)
        if value is not None and not value.strip().isdigit():
            where = "SLURM sets it in a job" if name.startswith("SLURM_") else "torchrun and SLURM set it"
            raise ConfigError(
                f"environment variable {name}={value!r} is not a non-negative integer ({where}); unset it "
                f"(unset {name}) outside a job, or fix the job script that sets it"
            )


def pin_malloc() -> None:
    """Keep freed memory in glibc's heap instead of returning it to the OS after every step.

    With glibc's adaptive thresholds, the per-step activations of a CPU run are sometimes unmapped and
    faulted back in at every step (tens of thousands of page faults), which costs a few percent of step time
    and swamps side-by-side comparisons. The PyTorch CPU tuning guide recommends jemalloc/tcmalloc for the
    same reason; this is the no-dependency equivalent. No-op outside glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 << 20)  # the largest value glibc accepts on 64-bit
    libc.mallopt(m_trim_threshold, (1 << 31) - 1)


@cache
def git_sha() -> str | None:
    """The commit of the checkout this package runs from, if it is one (with '+dirty' for local edits)."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


@cache
def versions() -> str:
    import lightning
    import torch

    import attnres

    return json.dumps(
        {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "lightning": lightning.__version__,
            "attnres": attnres.__version__,
        },
        sort_keys=True,
    )


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
