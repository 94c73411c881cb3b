"""Facts about the machine and the code a run records, and process-level settings for CPU training."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from attnres.config import RuntimeConfig


def uses_gpu(runtime: RuntimeConfig) -> bool:
    """Whether a run with these settings trains on a GPU: ``accelerator=gpu``, or ``auto`` with one visible."""
    import torch

    return runtime.accelerator == "gpu" or (runtime.accelerator == "auto" and torch.cuda.is_available())


def cpu_cores() -> int:
    """The cores this process may run on (its affinity: a SLURM allocation or taskset, not the whole machine)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def busy_cores(seconds: float = 0.3) -> float | None:
    """Of the cores this process may use, how many are busy with other work over the next ``seconds``, from the
    kernel's per-core time counters (/proc/stat; None elsewhere). The load average lags a minute behind a process that
    has just started, and counts the whole machine, where a SLURM allocation or taskset gives a few of its cores."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None

    def counters() -> dict[str, tuple[int, int]]:
        out = {}
        for line in Path("/proc/stat").read_text().splitlines():
            name, *values = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and (allowed is None or int(name[3:]) in allowed):
                fields = [int(v) for v in values]
                out[name] = (sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0))  # all, idle + iowait
        return out

    try:
        before = counters()
        time.sleep(seconds)
        after = counters()
    except (OSError, ValueError, IndexError):
        return None
    if not after:
        return None
    return sum(1 - (after[c][1] - before[c][1]) / max(1, after[c][0] - before[c][0]) for c in after if c in before)


LONGER_SAMPLE_S = 1.0  # the second look CpuShare.now takes when the load average and the first sample disagree


@dataclass(frozen=True)
class CpuShare:
    """What the CPU can give new work now: its cores, and the load other work puts on them: the larger of the 1-minute
    load average (processes running or waiting for a core; only where these cores are the whole machine) and the
    cores busy over a short sample (:func:`busy_cores`)."""

    cores: int
    load: float

    @classmethod
    def now(cls) -> CpuShare:
        """The cores' load now. The sample decides: the 1-minute load average trails finished work by minutes (a
        ``pip install`` that has just ended leaves it near 1 for a minute, and the demo's first line said "this
        machine is busy" from it), so where it says more than the sample it only asks for a longer sample (1 s), and
        the larger of the two samples is the load: work that stays is seen, work that has ended is not. Where no
        sample can be taken (not Linux), the load average is the load."""
        cores = cpu_cores()
        sampled = busy_cores()
        # the load average is the whole machine's: it speaks for these cores only when they are the whole machine
        whole = cores == (os.cpu_count() or cores) and hasattr(os, "getloadavg")
        average = os.getloadavg()[0] if whole else 0.0
        if sampled is None:
            return cls(cores, average)
        if round(average) > round(sampled):  # busy a minute ago, idle in the sample: does it stay idle?
            sampled = max(sampled, busy_cores(LONGER_SAMPLE_S) or 0.0)
        return cls(cores, sampled)

    @property
    def free(self) -> int:
        """Cores nothing else uses, rounded: a little background noise (load 0.3) keeps a core free."""
        return max(0, min(self.cores, self.cores - round(self.load)))

    @property
    def busy(self) -> bool:
        return self.free < self.cores

    def threads(self, workers: int) -> int:
        """Torch threads for each of ``workers`` processes: the free cores shared out, at least one. More threads than
        free cores do not add speed: they wait for the cores other work holds, and OpenMP threads spin while they
        wait (a demo took 1 h 38 min beside a 2-process sweep with 2 threads per worker, 6.5 min alone)."""
        return max(1, self.free // max(1, workers))

    def workers_for(self, runs: int, most: int = 4) -> int:
        """Worker processes for ``runs`` small runs: one per core, busy or not (at most ``most``); tiny models gain
        more from running side by side than from more threads each. On a busy machine each gets one thread
        (:meth:`threads`), and a one-thread worker that waits for a core only waits (it is a multi-threaded worker's
        OpenMP threads that spin), so the workers take the share of the cores the scheduler gives each process, where
        fewer would take less. The local pool then binds each one-thread worker to its own core
        (:mod:`sweeps.worker_devices`): the demo beside one CPU-bound process took 1.60x its quiet time with one worker,
        1.56x with two (the scheduler's share alone makes 1.5x), 1.42x with two bound (docs/performance.md)."""
        return max(1, min(self.cores, runs, most))

    def note(self, workers: int, threads: int) -> str | None:
        """One line when the machine is busy: what this pass will use, and that it is slower (None when idle)."""
        if not self.busy:
            return None
        return (
            f"this machine is busy (load {self.load:.1f} on {self.cores} core(s), {self.free} free): {workers} "
            f"worker(s) x {threads} thread(s), and training will take longer than on an idle machine; --workers and "
            "--threads choose otherwise"
        )


def say(line: str, file: TextIO | None = None) -> None:
    """Print ``line`` with its newline in one write (to stderr unless ``file`` is given), for what is printed while
    work runs. ``print`` writes the text and its newline apart, and a signal's handler (:func:`raise_on_termination`)
    can run between the two: the stop's own message then continued the half-printed line."""
    stream = sys.stderr if file is None else file
    stream.write(line + "\n")
    stream.flush()


def one_line_warnings(prefix: str) -> None:
    """Print warnings as one line of text, ``<prefix>: warning: <message>``, instead of Python's
    ``path/to/module.py:76: UserWarning: ...`` and the source line under it: a user reads what is wrong, not where in
    the code it was noticed. The category is kept where it says something (not for a plain UserWarning). Each text
    is printed once per command: a warning raised again by code that runs more than once (``attnres fit`` chooses a
    sweep's points for each of its analyses, and printed one dropped run 4 times) is not repeated."""

    said: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001 (warnings' signature)
        text = " ".join(str(message).split())
        kind = "" if category is UserWarning else f" ({category.__name__})"
        if (text, kind) in said:  # the same words again (attnres fit re-reads a sweep's points per analysis): once
            return
        said.add((text, kind))
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


# The values of the project's own switches, as documented (docs/training.md, "Environment variables").
NATIVE_VALUES = ("0", "1")  # ATTNRES_NATIVE: 0 turns the native CPU kernels off, 1 (the default) uses them


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse a rank, world size or SLURM job variable that is not an integer, before Lightning reads it, and a value
    of ``ATTNRES_NATIVE`` other than the documented ones."""
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
    native = environ.get("ATTNRES_NATIVE")
    if native is not None and native not in NATIVE_VALUES:
        # anything but "0" turned the kernels on: ATTNRES_NATIVE=off or =false meant the opposite of what it did
        raise ConfigError(
            f"environment variable ATTNRES_NATIVE={native!r} is not one of {', '.join(NATIVE_VALUES)} (0: the torch "
            "ops instead of the native CPU kernels; 1, the default: the native kernels); set one of them, or unset "
            "ATTNRES_NATIVE"
        )


INTERACTIVE_JOB_NAMES = ("bash", "interactive")  # SLURM job names for which Lightning ignores SLURM's variables


def check_slurm(runtime: RuntimeConfig, environ: Mapping[str, str] | None = None) -> None:
    """Refuse SLURM task variables that Lightning would read and then fail on, or train the wrong world with, before
    anything is prepared or written.

    Lightning takes its ranks from SLURM wherever ``SLURM_NTASKS`` is set (unless the job is named ``bash`` or
    ``interactive``): exported by hand or left over outside a job, or in a batch script whose task count does not
    match the run, it ended in a 33-line traceback after the corpus, the model and the run folder were made. Refused:
    several tasks without ``SLURM_NTASKS_PER_NODE`` (Lightning stops on it); a multi-device run whose tasks (count,
    per node, nodes, rank variables) are not the run's devices x nodes; a one-device run in a task of rank > 0
    (every task would train the same run). A one-device run in the first task of a larger allocation (a batch
    script's one process, a local sweep inside an allocation) trains as before."""
    from attnres.config import ConfigError

    env = os.environ if environ is None else environ
    if "SLURM_NTASKS" not in env or env.get("SLURM_JOB_NAME") in INTERACTIVE_JOB_NAMES:
        return
    check_environment(env)  # integers, before they are read as such
    ntasks = int(env["SLURM_NTASKS"])
    world = runtime.devices * runtime.num_nodes
    run = f"the run trains on runtime.devices x runtime.num_nodes = {runtime.devices} x {runtime.num_nodes}"
    outside = (
        "outside a SLURM job, unset the SLURM variables (unset SLURM_NTASKS SLURM_JOB_ID ...); in one, set "
        "SLURM_JOB_NAME=interactive to train without SLURM's ranks"
    )
    if ntasks > 1 and "SLURM_NTASKS_PER_NODE" not in env:
        raise ConfigError(
            f"environment variable SLURM_NTASKS={ntasks} says this is one of {ntasks} SLURM tasks, but "
            "SLURM_NTASKS_PER_NODE is not set, and Lightning cannot place the tasks without it (a job asked with "
            f"--ntasks, not --ntasks-per-node); {run} device(s): {outside}, or start {world} task(s) with srun "
            f"--nodes={runtime.num_nodes} --ntasks-per-node={runtime.devices}"
        )
    if world == 1:
        rank = env.get("SLURM_PROCID", "0").strip() or "0"
        if ntasks > 1 and rank != "0":
            raise ConfigError(
                f"this is SLURM task {rank} of {ntasks} (SLURM_PROCID, SLURM_NTASKS), and {run} = 1 device: every "
                f"task would train the same run; start one task (srun --ntasks=1), or set runtime.devices={ntasks} "
                "to train on all of them"
            )
        return
    per_node, nodes = env.get("SLURM_NTASKS_PER_NODE"), env.get("SLURM_NNODES")
    missing = [name for name in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID") if name not in env]
    wrong = []
    if ntasks != world:
        wrong.append(f"SLURM_NTASKS={ntasks}")
    if per_node is not None and int(per_node) != runtime.devices:
        wrong.append(f"SLURM_NTASKS_PER_NODE={per_node}")
    if nodes is not None and int(nodes) != runtime.num_nodes:
        wrong.append(f"SLURM_NNODES={nodes}")
    if wrong or missing:
        said = "; ".join([*wrong, *([f"no {'/'.join(missing)}"] if missing else [])])
        raise ConfigError(
            f"SLURM's tasks do not match the run ({said}): {run} = {world} devices, one SLURM task each; start "
            f"them with srun --nodes={runtime.num_nodes} --ntasks-per-node={runtime.devices}, or set "
            f"runtime.devices and runtime.num_nodes to the job's tasks; {outside}"
        )


def torch_threads(requested: int, cores: int | None = None) -> tuple[int, str | None]:
    """The torch threads a run uses for ``runtime.threads=requested`` (0: torch's default, left alone), and a warning
    when the request is capped: more threads than the cores this process may run on (:func:`cpu_cores`) add no speed
    (they wait for each other, and OpenMP threads spin while they wait) and change no number (docs/training.md,
    "Threads and numerics"), so a request above them is capped, with one line, rather than refused: the same config
    then runs on a machine with fewer cores (a grid's threads planned on a login node, trained on a SLURM node)."""
    cores = cpu_cores() if cores is None else cores
    if requested <= cores:
        return requested, None
    return cores, (
        f"runtime.threads={requested} is more than the {cores} core(s) this process may run on; training with "
        f"{cores} thread(s) (more threads than cores only wait for each other, and the numbers do not depend on "
        "the threads)"
    )


def terminal_ok(stream: object) -> bool:
    """Whether ``stream`` is a terminal a progress bar can be drawn on: a TTY that reports a size. A TTY that reports
    0 columns or 0 rows (a pseudo-terminal nobody sized: some CI runners, ``docker run -t``, ``script``) made tqdm
    draw nothing for the whole run (it takes the width less one, -1, and hides every line beyond the rows), so there
    the plain lines of a log are printed instead."""
    try:
        if not stream.isatty():  # type: ignore[attr-defined]
            return False
        size = os.get_terminal_size(stream.fileno())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False
    return size.columns > 0 and size.lines > 0


MEMORY_HEADROOM = 0.9  # a run fits in this share of a device's memory (attnres.training.memory)


def available_memory_gib() -> float | None:
    """Memory this machine can give a new process now, in GiB: Linux's MemAvailable (free memory plus the caches
    it can drop), within the cgroup's limit when a container or a job has one; None where neither is known."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        available = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(available, 0) / 2**30


def resolve_precision(precision: str, gpu: bool, bf16_supported: bool | None = None) -> tuple[str, str | None]:
    """The Lightning precision a run trains with, and a warning when ``auto`` had to fall back.

    ``auto``: bf16 autocast on a GPU that supports bf16 (Ampere and later), fp32 on older GPUs and on CPU.
    ``bf16-mixed`` on a GPU without bf16 is refused (``ConfigError``) before anything is computed: emulated bf16 is
    slow and not what the run asked for. ``bf16_supported`` None: ask torch (without counting emulation).
    """
    from attnres.config import ConfigError

    if not gpu:
        return ("32-true" if precision == "auto" else precision), None
    if bf16_supported is None:
        import torch

        bf16_supported = torch.cuda.is_bf16_supported(including_emulation=False)
    if precision == "bf16-mixed" and not bf16_supported:
        raise ConfigError(
            "runtime.precision=bf16-mixed: this GPU does not support bf16 (it needs compute capability 8.0, Ampere, "
            "or later); use runtime.precision=32-true (or auto, which picks it here)"
        )
    if precision == "auto":
        if bf16_supported:
            return "bf16-mixed", None
        return "32-true", "runtime.precision=auto: this GPU has no bf16, so the run trains in fp32 (slower, same run)"
    return precision, None


_COMPILE_LOGGER = "torch._dynamo.convert_frame"


class _FirstCompileFailure(logging.Filter):
    """Turns torch.compile's first suppressed failure into one Python warning and drops every later one (dynamo logs
    one traceback per failing frame, and every sublayer is a frame)."""

    def __init__(self) -> None:
        super().__init__()
        self.warned = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if not self.warned:
            self.warned = True
            first = next((line for line in record.getMessage().splitlines() if line.strip()), "unknown error")
            warnings.warn(
                f"runtime.compile: torch.compile failed ({first.strip()[:300]}); what failed runs eagerly "
                "(the same run, slower). Set runtime.compile=false to skip compiling.",
                RuntimeWarning,
                stacklevel=2,
            )
        return False


@contextmanager
def eager_fallback() -> Iterator[None]:
    """``runtime.compile``, for the block: a module torch.compile cannot compile runs eagerly instead of failing the
    run, with one warning (torch's ``suppress_errors``, whose per-frame tracebacks are folded into that warning).

    Both are undone when the block ends. They used to be set for the whole process, so a script or notebook that
    trained a compiled run and then compiled something of its own had every later compile failure hidden too.
    """
    import torch._dynamo

    logger = logging.getLogger(_COMPILE_LOGGER)
    first_failure = _FirstCompileFailure()
    logger.addFilter(first_failure)
    try:
        with torch._dynamo.config.patch(suppress_errors=True):
            yield
    finally:
        logger.removeFilter(first_failure)


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
