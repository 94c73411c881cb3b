"""The deposit (forward and backward), phase 1 and the phase-2 merge of the depth attention, and RMSNorm's backward, as
native CPU kernels (``cpu.cpp``), and the token attention's (``attention.cpp``, :mod:`attnres.kernels.attention`),
built on use into one module.

On CPU the depth attention is bound by memory traffic: eager PyTorch makes about ten passes over (tokens, D)
tensors per merge, and inside a training step most of them come from memory, not cache. The kernels read each
token's rows once. RMSNorm's backward (:mod:`attnres.kernels.rms_norm`, every variant's norms) is the same kind of
work: autograd's dozen passes over the composite norm become two. torch.compile's fused kernels
(:mod:`attnres.kernels.fused`) do the depth attention's math too but measured no faster on CPU, so CPU training uses
these and GPU training those. What they buy is measured by the ``-eager`` variants of ``benchmarks/bench_step.py``
(docs/performance.md).

It is compiled with ``torch.utils.cpp_extension`` the first time a CPU fp32 training step runs in a process, into
``$ATTNRES_CACHE_DIR/native/`` (about 20 s, once per build key; later processes load the build). The
key is what the build depends on: the torch version, the CPU type, the source and the flags; a change of any gives a
new folder, so a build happens exactly when the folder has no module yet, and says so. It needs a C++ compiler and
ninja: always the ninja of this package's environment (a dependency), never whichever is first on PATH, because
two ninja versions read each other's build log as stale and rebuild everything. If the build fails, one warning
says why and torch ops run instead (the eager code of :mod:`attnres.kernels.two_phase`, torch's own norm), with the
same results to rounding. ``ATTNRES_NATIVE=0`` turns the kernels off. A local sweep builds them up front
(:func:`build_for`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shlex
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnres.runtime import cpu_cores, say

if TYPE_CHECKING:
    from attnres.config import RunConfig

SOURCES = tuple(Path(__file__).with_name(name) for name in ("cpu.cpp", "attention.cpp"))
BUILD_LOCK_FILE = "build.flock"  # held (attnres.storage.locks) by the process building or loading the kernels
enabled = os.environ.get("ATTNRES_NATIVE", "1") != "0"  # tests and benchmarks switch it to compare with eager


def usable(*tensors: Tensor | None) -> bool:
    """Whether work on these tensors runs natively: all CPU fp32 (None is skipped), the kernels on, and built."""
    cpu_fp32 = all(x is None or (x.device.type == "cpu" and x.dtype == torch.float32) for x in tensors)
    return enabled and cpu_fp32 and ops() is not None


def build_for(runs: Iterable[RunConfig]) -> None:
    """Build the kernels now if any of ``runs`` will use them (any run on CPU: every model's norms do).

    A launcher calls this before it starts its workers, so that a fresh cache's one-time build is announced on
    its console, rather than in the first workers' logs while the sweep seems to stall.
    """
    from attnres.runtime import uses_gpu

    if enabled and any(not uses_gpu(cfg.runtime) for cfg in runs):
        ops()


@functools.cache
def ops() -> ModuleType | None:
    """The compiled module, or None (after one warning) where it cannot be built."""
    from torch.utils import cpp_extension

    from attnres.storage import locks

    try:
        build = build_dir()

        def waiting(who: str) -> None:
            say(f"attnres: waiting for {who}, which is building the native CPU kernels in {build}")

        # One build at a time, across processes and nodes sharing the cache, under a lock the kernel drops when its
        # holder dies. torch's own lock file (``lock``) is not: a builder killed mid-build (SIGKILL, pre-emption)
        # leaves it behind, and torch then waits on it forever in every later process. Holding ours, no live
        # build owns that file, so it is removed.
        with locks.exclusive(build / BUILD_LOCK_FILE, wait=waiting):
            (build / "lock").unlink(missing_ok=True)
            _use_package_ninja(build)
            if not (build / "attnres_depth_native.so").exists():
                say(f"attnres: building the CPU kernels (once{_build_time()}) in {build}")
            cflags, ldflags = _flags()
            return cpp_extension.load(
                name="attnres_depth_native",
                sources=[str(path) for path in SOURCES],
                build_directory=str(build),
                extra_cflags=cflags,
                extra_ldflags=ldflags,
                verbose=False,
            )
    except Exception as err:  # no compiler, no ninja, a compile error: say so once, then run eagerly
        first_line = (str(err).strip().splitlines() or [""])[0]
        warnings.warn(
            f"attnres: could not build the native CPU kernels ({type(err).__name__}: {first_line}); using torch ops "
            "for the depth attention, RMSNorm's backward and the token attention instead (same results to rounding, "
            "slower). Set ATTNRES_NATIVE=0 to skip the attempt.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def _flags() -> tuple[list[str], list[str]]:
    openmp = ["-fopenmp"] if sys.platform.startswith("linux") else []  # Apple's clang has no OpenMP
    native = ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else []
    return ["-O3", *native, *openmp], openmp


def build_key() -> str:
    """What a build depends on: torch, the CPU type (``-march=native`` ties a build to its CPU, so a home folder
    shared by different nodes keeps one each), the sources and the flags."""
    cflags, ldflags = _flags()
    digest = hashlib.sha1(
        b"".join(path.read_bytes() for path in SOURCES) + " ".join(cflags + ["|"] + ldflags).encode()
    ).hexdigest()[:10]
    return f"torch-{torch.__version__}-{_cpu_tag()}-{digest}"


def build_dir() -> Path:
    """Where the build of :func:`build_key` lives: ``$ATTNRES_NATIVE_DIR``, else ``native/`` of the cache."""
    from attnres.data.corpus import cache_dir

    path = Path(os.environ.get("ATTNRES_NATIVE_DIR") or cache_dir() / "native") / build_key()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _build_time() -> str:
    """How long the build takes here: about 20 s on 2 idle cores, and several minutes on a busy machine (416 s
    measured beside a 2-worker sweep), which the message says rather than promising 20 s."""
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    cores = cpu_cores()
    if busy >= 0.5 * cores:
        return f"; ~20 s on an idle machine, minutes on this one: load {busy:.1f} on {cores} core(s)"
    return ", ~20 s"


def _use_package_ninja(build: Path) -> None:
    """Put this environment's ninja first on PATH, where torch's builder looks for it: an activated venv and
    ``.venv/bin/attnres`` then use the same one (the pip package's binary is not on PATH without activation).
    On Linux it is run through :mod:`attnres.kernels.ninja_guard`, so that the compilers end with this process."""
    import ninja  # the PyPI package (a dependency); its binary lives in ninja.BIN_DIR

    first = ninja.BIN_DIR
    if sys.platform.startswith("linux"):
        first = str(build / "bin")
        guard = Path(__file__).with_name("ninja_guard.py")
        real = Path(ninja.BIN_DIR) / "ninja"
        script = (
            f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(guard))} {shlex.quote(str(real))} "$@"\n'
        )
        path = build / "bin" / "ninja"
        if not path.is_file() or path.read_text() != script:
            from attnres.storage.schema import atomic_write_bytes

            atomic_write_bytes(path, script.encode())
            path.chmod(0o755)
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != first:
        os.environ["PATH"] = first + os.pathsep + path


def _cpu_tag() -> str:
    """A short name for this CPU type (its model and instruction-set flags)."""
    text = platform.machine() + platform.processor()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        text += next((line for line in lines if line.startswith("model name")), "")
        text += next((line for line in lines if line.startswith("flags")), "")
    except OSError:
        pass
    return hashlib.sha1(text.encode()).hexdigest()[:10]
