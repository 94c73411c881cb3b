"""What can change a fit's last digits, recorded in fit.json (``environment``): the versions of numpy, scipy and
pandas, and every BLAS library loaded with the kernel it picked (threadpoolctl: OpenBLAS chooses SkylakeX, Haswell,
... kernels by the CPU, or by ``OPENBLAS_CORETYPE``). The fits are built so that none of them moves a printed digit
(docs/analysis.md, "One answer per fit"); this says where to look if one ever does. Never imports torch.
"""

from __future__ import annotations

import platform
from typing import Any


def fit_environment() -> dict[str, Any]:
    """The packages and BLAS kernels the fit ran with."""
    import numpy
    import pandas
    import scipy
    from threadpoolctl import threadpool_info

    # the BLAS numpy and scipy call (a process that imported torch has MKL loaded too, which no fit uses)
    # sorted: threadpoolctl lists libraries in load order, which depends on what the process imported first
    blas = sorted(
        (
            {
                "library": info.get("internal_api"),
                "version": info.get("version"),
                "kernel": info.get("architecture"),  # OpenBLAS's core type: SkylakeX, Haswell, ...
                "threading": info.get("threading_layer"),
            }
            for info in threadpool_info()
            if info.get("user_api") == "blas" and any(pkg in str(info.get("filepath")) for pkg in ("numpy", "scipy"))
        ),
        key=lambda lib: tuple(str(v) for v in lib.values()),
    )
    return {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "pandas": pandas.__version__,
        "blas": blas,
    }
