"""Run the fits with single-threaded BLAS.

The fits solve thousands of tiny problems (a handful of parameters). A multi-threaded BLAS wakes its thread
pool for each of them; on a busy 2-core machine that made one L-BFGS-B call ~100x slower (28 ms instead of
0.3 ms). threadpoolctl limits every loaded BLAS to one thread for the duration of a fit and restores it after.
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits


def single_threaded_blas() -> threadpool_limits:
    """A context manager: within it, every loaded BLAS uses one thread (restored on exit)."""
    return threadpool_limits(limits=1, user_api="blas")
