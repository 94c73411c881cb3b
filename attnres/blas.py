"""MKL's strict reproducible mode, so that a CPU run's losses do not depend on the torch threads it was given.

torch's CPU matrix products are Intel MKL's. By default MKL splits a product's long inner dimension (the tokens, in
a weight gradient) over the threads, so the sums are formed in another order with 2 threads than with 1: the same run
gave val_loss 2.578560 with 1 thread and 2.582414 with 2, and the local pool picks the threads from the load it sees
at start. MKL's strict conditional-numerical-reproducibility mode (``MKL_CBWR=<branch>,STRICT``) gives the same bits
whatever the thread count. MKL reads ``MKL_CBWR`` once, at its first call in a process, so this module asks for it
(:func:`request_strict_mode`) when the ``attnres`` package is imported, before anything of this package calls torch;
a value already in the environment wins. :func:`in_effect` says which mode MKL actually runs with, which a run
records in run.parquet (``blas``) and warns about when it is not strict (docs/training.md, "Threads and numerics").

Torch-free to import: ``attnres/__init__.py`` imports it first.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

VARIABLE = "MKL_CBWR"
STRICT = "AUTO,STRICT"
"""MKL's best code branch for this CPU, strict: the branch does not change between machines of one CPU type."""

# mkl_cbwr.h: the code branches (the low bits) and the strict flag
_BRANCHES = {
    1: "off",  # MKL_CBWR_BRANCH_OFF: MKL's default, not reproducible
    2: "AUTO",
    3: "COMPATIBLE",
    4: "SSE2",
    6: "SSSE3",
    7: "SSE4_1",
    8: "SSE4_2",
    9: "AVX",
    10: "AVX2",
    11: "AVX512_MIC",
    12: "AVX512",
    13: "AVX512_MIC_E1",
    14: "AVX512_E1",
}
_STRICT_FLAG = 0x10000
_ALL = -1  # MKL_CBWR_ALL


def request_strict_mode() -> None:
    """Ask MKL for its strict mode unless the environment already says otherwise (``MKL_CBWR=`` empty: MKL's
    default). Effective only before MKL's first call in this process: :func:`in_effect` tells."""
    os.environ.setdefault(VARIABLE, STRICT)


def in_effect() -> str:
    """The mode torch's MKL runs with in this process: ``AUTO,STRICT`` (thread-independent), ``AVX2`` (reproducible
    for a fixed thread count only), ``off`` (MKL's default), or ``no MKL`` (a torch built without it, whose BLAS this
    project does not make thread-independent). Reading it fixes MKL's mode for the process, as its first call would."""
    import torch

    get = _cbwr_get(torch) if torch.backends.mkl.is_available() else None
    if get is None:
        return "no MKL" if not torch.backends.mkl.is_available() else "MKL (mode unknown)"
    mode = get(_ALL)
    if mode < 0:
        return "MKL (mode unknown)"
    branch = _BRANCHES.get(mode & 0xFFFF, f"branch {mode & 0xFFFF}")
    return branch + (",STRICT" if mode & _STRICT_FLAG else "")


def is_strict(mode: str) -> bool:
    """Whether :func:`in_effect`'s ``mode`` makes the matrix products independent of the thread count."""
    return mode.endswith(",STRICT")


def problem(mode: str, threads: int) -> str | None:
    """A one-line warning when this process's MKL mode lets the thread count change the results (None when it does
    not, or where there is no MKL mode to read)."""
    if is_strict(mode) or mode.split(",")[0] not in _BRANCHES.values():
        return None
    asked = os.environ.get(VARIABLE)
    cause = (
        f"{VARIABLE}={asked!r} in the environment"
        if asked != STRICT
        else "MKL had run before attnres was imported: import attnres before the first torch matrix product"
    )
    return (
        f"MKL runs in mode {mode}, not strict ({cause}): this run's losses depend on its thread count ({threads}) in "
        f"the last bits, so a rerun with another count gives other numbers; unset {VARIABLE} (attnres then sets "
        f"{STRICT}) for results that do not depend on it"
    )


def _cbwr_get(torch_module: object) -> object | None:
    """MKL's ``mkl_cbwr_get`` in torch's own library (torch links MKL statically and exports it as
    ``mkl_serv_cbwr_get``), or None where it is not there."""
    lib_dir = Path(torch_module.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        if (lib_dir / name).exists():
            try:
                get = ctypes.CDLL(str(lib_dir / name)).mkl_serv_cbwr_get
            except (OSError, AttributeError):
                return None
            get.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
            return get
    return None
