"""Checkpoints a full disk cannot poison: written to a temporary file, verified, then renamed into place; and the one a
run resumes from, checked first, a damaged one set aside.

Lightning writes ``last.ckpt`` through fsspec, whose local "transaction" writes to the system's temporary folder
(``tempfile.mkstemp()``) and then moves the file into place: across file systems that move is a copy, and a disk
that fills during it leaves a truncated ``last.ckpt``, from which every later attempt failed to resume
(``OSError: [Errno 22] Invalid argument``) until it was deleted by hand. Here (:func:`verified_checkpoint_io`, given
to the Trainer) a checkpoint is serialized into ``.NAME.<random>.tmp`` beside its final name, flushed to disk, read
back as a zip archive with every member's CRC checked, and only then renamed over the old one; a failure at any
point (ENOSPC included) removes the temporary file and leaves the previous checkpoint as it was.

A checkpoint damaged anyway (written by an older version, a disk error, a copy cut short) is found before a run
resumes from it (:func:`resume_checkpoint`): it is renamed ``NAME.damaged-<time>`` with one line saying so, and the
run resumes from the next usable one (a SLURM pre-emption checkpoint, a kept ``train.save_at_steps`` checkpoint, a WSD
branch's start) or from step 0. ``attnres sweep status`` reads the same check (:func:`checkpoint_state`), without
moving anything.

No torch at import (status reads it); the CheckpointIO class is built on first use.
"""

from __future__ import annotations

import os
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnres import runtime
from attnres.storage import schema

LAST = "last.ckpt"
BRANCH_START = "branch-start.ckpt"  # in a branch's checkpoint folder: the trunk's checkpoint, its schedule rebuilt


def checkpoint_problem(path: Path, thorough: bool = True) -> str | None:
    """Why ``path`` cannot be resumed from (None: it can). A checkpoint is a zip archive (torch.save's format): a
    truncated one has no readable directory at its end; ``thorough`` also reads every member and checks its CRC."""
    try:
        if path.stat().st_size == 0:
            return "it is empty"
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip() if thorough else None
    except (zipfile.BadZipFile, EOFError) as err:
        return f"it is not a whole checkpoint, as a write cut short leaves it ({err})"
    except OSError as err:
        return f"it cannot be read ({err.strerror or err})"
    return f"its member {bad} fails its checksum" if bad else None


def candidates(run_dir: Path) -> list[Path]:
    """The checkpoints a run could resume from, best first: the newest of ``last.ckpt`` and SLURM pre-emption
    (``hpc_ckpt*``) checkpoints, then kept ``step-*.ckpt`` checkpoints from the latest step, then a WSD branch's
    start."""
    folder = run_dir / schema.CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    latest = [p for p in folder.glob("*.ckpt") if p.name == LAST or p.name.startswith("hpc_ckpt")]
    latest.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    kept = sorted(folder.glob("step-*.ckpt"), reverse=True)  # the step is zero-padded in the name
    start = [folder / BRANCH_START] if (folder / BRANCH_START).is_file() else []
    return latest + kept + start


def checkpoint_state(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the checkpoint a resume would use, or None; the damaged ones before it, with why), moving nothing. The quick
    check only (a truncated file), since a status reads every run's."""
    damaged = []
    for path in candidates(run_dir):
        why = checkpoint_problem(path, thorough=False)
        if why is None:
            return path, damaged
        damaged.append((path, why))
    return None, damaged


def resume_checkpoint(run_dir: Path, say: Callable[[str], None] = runtime.say) -> str | None:
    """The checkpoint to resume ``run_dir`` from, each damaged one before it set aside as ``NAME.damaged-<time>``
    with one line (to stderr, the run's log in a sweep); None: train from step 0."""
    found = candidates(run_dir)
    for i, path in enumerate(found):
        why = checkpoint_problem(path)
        if why is None:
            return str(path)
        aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(path, aside)
        except FileNotFoundError:  # another rank of the same run set it aside first, and said so
            continue
        usable = next((p for p in found[i + 1 :] if checkpoint_problem(p) is None), None)
        then = f"resuming from {usable.name}" if usable else "training from step 0"
        say(f"{run_dir.name}: checkpoint {path.name} is damaged ({why}); set aside as {aside.name}, {then}")
    return None


# the temporary names write_verified and schema.atomic_write_bytes give (tempfile.mkstemp: ".NAME." + 8 characters
# + ".tmp"); a kill -9 in the middle of a write leaves one, which nothing else removes
TEMPORARY = ".*.tmp"


def remove_temporaries(run_dir: Path, say: Callable[[str], None] = runtime.say) -> list[Path]:
    """Remove the temporary files killed writes left in a run folder and its checkpoints (a ``.last.ckpt.<random>.tmp``
    of a checkpoint half written when the process was killed, as large as a checkpoint; a parquet file's), with one
    line naming them. Called by :func:`attnres.training.run.train` with the run's lock held, before the run starts or
    resumes: only the lock's holder writes them, so none is being written."""
    found = sorted(
        p
        for folder in (run_dir, run_dir / schema.CHECKPOINT_DIR)
        if folder.is_dir()
        for p in folder.glob(TEMPORARY)
        if p.is_file() and not p.is_symlink()
    )
    for path in found:
        path.unlink(missing_ok=True)
    if found:
        names = ", ".join(str(p.relative_to(run_dir)) for p in found)
        say(f"{run_dir.name}: removed {len(found)} temporary file(s) a killed write left: {names}")
    return found


def write_verified(path: Path, write: Any) -> None:
    """``write(file)`` into a temporary file beside ``path``, flushed, checked as a whole checkpoint, then renamed
    over ``path``; on any failure the temporary file is removed and ``path`` is left as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if why := checkpoint_problem(Path(tmp)):
            raise OSError(f"the checkpoint written to {tmp} does not read back: {why}")
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        # torch.save meets a full disk as an OSError and then fails to close its archive with a RuntimeError
        # ("unexpected pos"), which hides it: the disk's error is said, naming the checkpoint it stopped
        cause = _os_error_in(err)
        if cause is not None and (cause.filename is None or cause is not err):
            raise OSError(cause.errno, cause.strerror or str(cause), str(path)) from err
        raise


def _os_error_in(err: BaseException | None) -> OSError | None:
    """The first OSError with an errno in ``err``'s chain (itself, then what it was raised from or during)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno is not None:
            return err
        err = err.__cause__ or err.__context__
    return None


def verified_checkpoint_io() -> Any:
    """A Lightning ``CheckpointIO`` whose saves go through :func:`write_verified` (local paths)."""
    import torch
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    class VerifiedCheckpointIO(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            write_verified(Path(path), lambda f: torch.save(checkpoint, f))

    return VerifiedCheckpointIO()
