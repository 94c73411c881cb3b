"""``ninja`` as the native-kernel build runs it: ninja and its compilers end with the process that started the build.

torch's builder runs ``ninja`` with :func:`subprocess.run`, which kills ninja with SIGKILL when the caller is
interrupted; ninja then cannot stop its compilers (each in its own process group), and they run on for the rest of
their compile, about a minute on a busy machine. And a builder killed outright leaves ninja itself running. So
:mod:`attnres.kernels.cpu` puts a ``ninja`` first on PATH that runs this file, which

* dies with its parent (``PR_SET_PDEATHSIG``: SIGKILL), whatever ends the parent;
* starts the real ninja with ``PR_SET_PDEATHSIG`` = SIGTERM, so ninja gets SIGTERM when this guard dies, and ninja
  answers SIGTERM by stopping its compilers' process groups before it exits;
* passes SIGTERM, SIGINT and SIGHUP on to ninja.

Run as a script (``python ninja_guard.py REAL_NINJA ARGS...``): it imports nothing from the package. Linux only;
elsewhere the real ninja runs as it is.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent ends (no-op outside Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    parent = os.getppid()
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:  # the parent ended before the request was made
        return 1
    ninja = subprocess.Popen(argv, preexec_fn=lambda: die_with_parent(signal.SIGTERM))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: ninja.send_signal(signum))
    return ninja.wait()  # after a forwarded signal too: ninja stops its compilers, then exits


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
