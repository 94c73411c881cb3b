"""Facts about the machine and the code a run records, and process-level settings for CPU training."""

from __future__ import annotations

import ctypes
import json
import logging
import platform
import subprocess
import warnings
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


def allow_eager_fallback() -> None:
    """``runtime.compile``: a module torch.compile cannot compile runs eagerly instead of failing the run, with one
    warning (torch's ``suppress_errors``, whose per-frame tracebacks are folded into that warning)."""
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True
    logger = logging.getLogger(_COMPILE_LOGGER)
    if not any(isinstance(f, _FirstCompileFailure) for f in logger.filters):
        logger.addFilter(_FirstCompileFailure())


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
