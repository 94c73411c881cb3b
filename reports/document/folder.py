"""A report folder is always one whole report: each build is made in a temporary sibling folder and swapped in.

:func:`build_into` runs a build in ``.<name>.building-<pid>-<token>`` next to the report folder; when it is
done, the old folder is renamed aside (``.<name>.replaced-<pid>-<token>``), the new one renamed into place,
the files the builder did not write are moved over from the old folder (a note of yours stays where it was)
and the old folder is removed. A build that fails, or is killed, never leaves a mix of two reports: the old
report stays as it was until the rename, and the next build removes what a killed build left (a temporary
folder whose process is gone) or, killed between the two renames, puts the old report back first.

Because a build replaces its folder as a whole, it refuses a folder that is neither empty nor a report
(one with files but no ``report.json`` / ``.report-files.json`` of ``attnres report``), the current folder
or one holding it, and one that holds the results being reported. Standard library and the project's output
checks (:mod:`analysis.tables.output`) only; never imports torch.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from analysis.base.errors import OutputError
from analysis.tables.output import check_output_folder

REPORT_FORMAT = "attnres-report/1"
FILES_LIST = ".report-files.json"  # the files one build wrote, relative to its folder
BUILDING, REPLACED = "building", "replaced"

T = TypeVar("T")


def _siblings(out: Path, kind: str) -> Iterator[tuple[Path, int | None]]:
    """The temporary siblings of ``out`` of one kind, with the process id in their name."""
    prefix = f".{out.name}.{kind}-"
    if not out.parent.is_dir():
        return
    for entry in sorted(out.parent.iterdir()):
        if entry.name.startswith(prefix) and entry.is_dir() and not entry.is_symlink():
            pid = entry.name[len(prefix) :].split("-", 1)[0]
            yield entry, int(pid) if pid.isdigit() else None


def _alive(pid: int | None) -> bool:
    """Whether another process with this id is running (its build may still be going on)."""
    if pid is None or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, under another user
        return True
    return True


def _written_by_builder(folder: Path) -> set[str] | None:
    """The files (relative paths) the build that made ``folder`` wrote, from its list or its report.json; None
    when ``folder`` is not a report folder."""
    names: set[str] = set()
    found = False
    listing = folder / FILES_LIST
    if listing.is_file():
        try:
            names |= {str(x) for x in json.loads(listing.read_text())}
            found = True
        except (OSError, ValueError, TypeError):
            pass
    record = folder / "report.json"
    if record.is_file():
        try:
            data = json.loads(record.read_text())
            if isinstance(data, dict) and data.get("format") == REPORT_FORMAT:
                names |= {str(x) for x in data.get("files", [])}
                found = True
        except (OSError, ValueError, TypeError):
            pass
    return names | {FILES_LIST} if found else None


def check_report_folder(out: str | Path, results_root: str | Path | None = None) -> Path:
    """Check, before any work, that a build may replace ``out`` as a whole; returns ``out`` resolved.

    Raises :class:`OutputError` when ``out`` (or a folder on its way) cannot be written
    (:func:`analysis.tables.output.check_output_folder`), is the current folder or holds it, holds the results
    (``results_root``), or is a folder with files that is not a report folder."""
    check_output_folder(out, "the report folder")
    real = Path(os.path.realpath(out))
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        raise OutputError(
            f"cannot use {str(out)!r} as the report folder: it is the current folder or holds it, and a build "
            "replaces its folder as a whole; give a folder of its own (e.g. --out report)"
        )
    if results_root is not None:
        root = Path(os.path.realpath(results_root))
        if root == real or real in root.parents:
            raise OutputError(
                f"cannot use {str(out)!r} as the report folder: it holds the results {str(results_root)!r}, and a "
                "build replaces its folder as a whole; give a folder of its own (the default is RESULTS_DIR/report)"
            )
    if real.is_dir() and any(real.iterdir()) and _written_by_builder(real) is None:
        sample = sorted(p.name for p in real.iterdir())[:3]
        raise OutputError(
            f"cannot use {str(out)!r} as the report folder: it already holds files that are not a report "
            f"({', '.join(sample)}{', ...' if len(list(real.iterdir())) > 3 else ''}), and a build replaces its "
            "folder as a whole; give a new or empty folder, or the folder of an earlier report"
        )
    return real


def recover(out: Path) -> None:
    """Clean up after a build of ``out`` that was killed: remove its temporary folder; an old report renamed
    aside but not removed goes back into place when ``out`` is missing (killed between the two renames), else
    its files of yours are moved over and it is removed."""
    for stale, pid in _siblings(out, BUILDING):
        if not _alive(pid):
            shutil.rmtree(stale, ignore_errors=True)
    for aside, pid in _siblings(out, REPLACED):
        if _alive(pid):
            continue
        if not out.exists():
            os.rename(aside, out)
        else:
            _carry_over(aside, out)
            shutil.rmtree(aside, ignore_errors=True)


def _carry_over(old: Path, new: Path) -> None:
    """Move every file of ``old`` that its build did not write into ``new`` (same relative path), unless the
    new build wrote that path; a folder holding no builder file moves as a whole."""
    written = _written_by_builder(old) or set()
    prefixes = {str(Path(w).parent.as_posix()) for w in written}
    holders = {p for w in prefixes for p in _ancestors(w)}

    def walk(folder: Path, rel: str) -> None:
        for entry in sorted(folder.iterdir()):
            name = f"{rel}/{entry.name}" if rel else entry.name
            target = new / name
            if entry.is_dir() and not entry.is_symlink() and (name in holders or target.is_dir()):
                walk(entry, name)  # a folder the builder writes into: file by file
            elif name in written or target.exists() or target.is_symlink():
                continue  # the old build's own file, or a path the new build wrote
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(entry, target)

    walk(old, "")


def _ancestors(rel: str) -> list[str]:
    """``a/b/c`` -> ``["a", "a/b", "a/b/c"]`` (nothing for ``.``)."""
    parts = [p for p in rel.split("/") if p and p != "."]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def build_into(out: Path, build: Callable[[Path], T]) -> T:
    """Run ``build(work)`` in a new temporary sibling of ``out`` and swap the result into place (module
    docstring); on any error (or interruption) the temporary folder is removed and ``out`` is left as it was."""
    recover(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    work = out.parent / f".{out.name}.{BUILDING}-{token}"
    work.mkdir()
    aside = out.parent / f".{out.name}.{REPLACED}-{token}"
    try:
        result = build(work)
        if out.exists():
            os.rename(out, aside)
        os.rename(work, out)
    except BaseException:
        if aside.exists() and not out.exists():
            os.rename(aside, out)  # interrupted between the two renames: the old report goes back
        shutil.rmtree(work, ignore_errors=True)
        raise
    if aside.exists():
        _carry_over(aside, out)
        shutil.rmtree(aside, ignore_errors=True)
    return result
