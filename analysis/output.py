"""Checks that an output path can be written, made before the work that would fill it.

``attnres fit`` writes fit.json and ``attnres report`` a report folder; a path that cannot be written (a
read-only folder, a file where a folder should be, a folder where the file should be, no permission) is one
:class:`analysis.errors.OutputError` naming the path and the problem, instead of a traceback after the fitting.
Nothing is created: the nearest existing folder on the way is probed with a temporary file that is removed at
once. Standard library only; never imports torch.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from analysis.errors import OutputError


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (as anything: a folder, a file, a link)."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path(path.anchor or ".")


def _probe_folder(folder: Path, what: str, target: Path) -> None:
    """Raise :class:`OutputError` unless a file can be created in the existing folder ``folder``."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".attnres-write-check-", dir=folder)
    except OSError as err:
        reason = err.strerror or str(err)
        if err.errno in (errno.EACCES, errno.EPERM):
            reason = f"no permission to write there ({reason})"
        elif err.errno == errno.EROFS:
            reason = f"it is on a read-only file system ({reason})"
        raise OutputError(
            f"cannot write {what} {str(target)!r}: folder {str(folder)!r} is not writable: {reason}"
        ) from err
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass


def check_output_file(path: str | Path, what: str = "the output file") -> Path:
    """Check that the file ``path`` can be written (atomically, through a temporary file next to it),
    creating the folders on the way if needed; returns it. Raises :class:`OutputError` naming the path and the
    problem: a folder at ``path``, a file where one of its folders should be, or a folder that is not writable."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"cannot write {what} {str(path)!r}: it is a folder; give a file name (e.g. fit.json)")
    found = _nearest_existing(path.parent)
    if not found.is_dir():
        raise OutputError(
            f"cannot write {what} {str(path)!r}: {str(found)!r} is a file, not a folder; choose another path"
        )
    _probe_folder(found, what, path)
    return path


def check_output_folder(path: str | Path, what: str = "the output folder") -> Path:
    """Check that the folder ``path`` can be written (created, or replaced by a sibling built next to it);
    returns it. Raises :class:`OutputError`: a file at ``path`` or where one of its folders should be, or a
    folder (``path``'s parent, or the nearest one that exists) that is not writable."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"cannot write {what} {str(path)!r}: a file is in the way (it is not a folder)")
    found = _nearest_existing(path.parent)
    if not found.is_dir():
        raise OutputError(
            f"cannot write {what} {str(path)!r}: {str(found)!r} is a file, not a folder; choose another path"
        )
    _probe_folder(found, what, path)
    if path.is_dir():
        _probe_folder(path, what, path)
    return path
