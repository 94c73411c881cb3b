"""Run-folder locks: exclusive, non-blocking ``flock`` files that the kernel releases when their process ends
(even by SIGKILL), so a crashed trainer never leaves a run locked.

``attnres.train`` holds ``RUN_DIR/.lock`` while it trains; the sweep launchers hold ``RUN_DIR/.claim`` around
their whole attempt (see :mod:`sweeps.runner`). No torch, no pyarrow: the launchers' status commands use it.
"""

from __future__ import annotations

import fcntl
import os
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

TRAIN_LOCK_FILE = ".lock"  # held by attnres.train.train while it trains the run
CLAIM_FILE = ".claim"  # held by a sweep launcher around its whole attempt at the run


@contextmanager
def exclusive(path: Path) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` for the block and yield True, with this process named in the file;
    yield False (holding nothing) if another process has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield True
    finally:
        os.close(fd)


def is_held(path: Path) -> bool:
    """Does some process hold the lock on ``path`` right now?"""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no such file: nobody ever locked it
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our shared lock at once
    return False


def holder(path: Path) -> str:
    """Who holds (or last held) the lock on ``path``: "pid N on HOST", or "unknown"."""
    try:
        return path.read_text(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"
