"""Checks that an output path can be written, made before the work that would fill it.

``attnres fit`` writes fit.json and ``attnres report`` a report folder; a path that cannot be written (a
read-only folder, a file where a folder should be, a folder where the file should be, no permission) is one
:class:`analysis.base.errors.OutputError` naming the path and the problem, instead of a traceback after the fitting.
Nothing is created: the nearest existing folder on the way is probed (:mod:`attnres.storage.writable`, which
``attnres train`` uses too). Never imports torch.
"""

from __future__ import annotations

from pathlib import Path

from analysis.base.errors import OutputError
from attnres.storage.writable import nearest_existing, write_problem


def _probe_folder(folder: Path, what: str, target: Path) -> None:
    """Raise :class:`OutputError` unless a file can be created in the existing folder ``folder``."""
    if reason := write_problem(folder):
        raise OutputError(f"cannot write {what} {str(target)!r}: folder {str(folder)!r} is not writable: {reason}")


def check_output_file(path: str | Path, what: str = "the output file") -> Path:
    """Check that the file ``path`` can be written (atomically, through a temporary file next to it),
    creating the folders on the way if needed; returns it. Raises :class:`OutputError` naming the path and the
    problem: a folder at ``path``, a file where one of its folders should be, or a folder that is not writable."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"cannot write {what} {str(path)!r}: it is a folder; give a file name (e.g. fit.json)")
    _check_parents(path, what)
    return path


def _check_parents(path: Path, what: str) -> None:
    """The nearest existing folder above ``path`` is a folder and writable (a file there is named)."""
    found = nearest_existing(path.parent)
    if not found.is_dir():
        raise OutputError(
            f"cannot write {what} {str(path)!r}: {str(found)!r} is a file, not a folder; choose another path"
        )
    _probe_folder(found, what, path)


def check_output_folder(path: str | Path, what: str = "the output folder") -> Path:
    """Check that the folder ``path`` can be written (created, or replaced by a sibling built next to it);
    returns it. Raises :class:`OutputError`: a file at ``path`` or where one of its folders should be, or a
    folder (``path``'s parent, or the nearest one that exists) that is not writable."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"cannot write {what} {str(path)!r}: a file is in the way (it is not a folder)")
    _check_parents(path, what)
    if path.is_dir():
        _probe_folder(path, what, path)
    return path
