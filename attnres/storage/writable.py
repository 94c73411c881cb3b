"""Whether an output path can be written, checked before the work that would fill it (no torch, no pyarrow).

Nothing is created: the nearest existing folder on the way is probed with a temporary file that is removed at
once (``os.access`` says yes to root on a read-only mount, and to paths like /sys that refuse ``mkdir``).
``attnres train`` checks its run folder with :func:`folder_problem`; ``analysis.tables.output`` builds the checks of
``attnres fit`` and ``attnres report`` on :func:`nearest_existing` and :func:`write_problem`.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (as anything: a folder, a file, a link)."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path(path.anchor or ".")


def write_problem(folder: Path) -> str | None:
    """Why no file can be created in the existing folder ``folder``, in plain words (None: one can)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".attnres-write-check-", dir=folder)
    except OSError as err:
        reason = err.strerror or str(err)
        if err.errno in (errno.EACCES, errno.EPERM):
            return f"no permission to write there ({reason})"
        if err.errno == errno.EROFS:
            return f"it is on a read-only file system ({reason})"
        return reason
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass
    return None


def folder_problem(folder: str | Path) -> str | None:
    """Why the folder ``folder`` could not be created or written (None: it can): a file in the way, or a
    folder on the way that is not writable."""
    path = Path(folder).absolute()
    found = nearest_existing(path)
    if not found.is_dir():
        return f"{found} is a file, not a folder"
    if why := write_problem(found):
        return f"{found} is not writable: {why}"
    return None
