"""Checkpoints a full disk cannot poison (written beside, verified, renamed) and damaged ones set aside on resume.

The full-disk case runs for real on a small tmpfs (mounting needs root; elsewhere it is skipped), and is also
simulated in-process (a writer that fills the disk part way), which runs everywhere.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnres.storage import schema
from attnres.training.checkpoints import (
    checkpoint_problem,
    checkpoint_state,
    resume_checkpoint,
    write_verified,
)
from sweeps.status import folder_state

ROOT = Path(__file__).resolve().parents[2]
ATTNRES = [sys.executable, "-m", "attnres.cli"]
TINY = ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.seq_len=64", "model.residual=baseline"]
TINY += ["train.eval_tokens=4096"]


def save(path: Path, value: float = 1.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"w": torch.full((1000,), value)}, path)


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # what a disk that filled during a copy leaves


def test_a_write_that_meets_a_full_disk_leaves_the_previous_checkpoint_whole(tmp_path):
    """In-process ENOSPC: the writer fails part way, as torch.save does when the disk fills."""
    path = tmp_path / "checkpoints" / "last.ckpt"
    save(path, 1.0)
    before = path.read_bytes()

    def fills_the_disk(f) -> None:
        f.write(b"PK\x03\x04" + b"\0" * 5000)
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        finally:  # as torch.save does: closing its archive fails too, and that error hides the disk's
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 96384 vs 96336")

    with pytest.raises(OSError) as caught:
        write_verified(path, fills_the_disk)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)  # the CLI names the file
    assert path.read_bytes() == before and checkpoint_problem(path) is None
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]  # no temporary file left


def test_a_write_that_does_not_read_back_is_not_renamed_into_place(tmp_path):
    path = tmp_path / "last.ckpt"
    save(path, 1.0)
    before = path.read_bytes()
    with pytest.raises(OSError, match="does not read back"):
        write_verified(path, lambda f: f.write(before[: len(before) // 2]))  # a short write that raised nothing
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    write_verified(path, lambda f: torch.save({"w": torch.zeros(3)}, f))
    assert torch.load(path)["w"].tolist() == [0.0, 0.0, 0.0]


def test_a_damaged_checkpoint_is_set_aside_and_the_one_before_used(tmp_path, capsys):
    folder = tmp_path / "run" / schema.CHECKPOINT_DIR
    save(folder / "step-00000020.ckpt", 2.0)
    save(folder / "last.ckpt", 3.0)
    truncate(folder / "last.ckpt")
    usable, damaged = checkpoint_state(tmp_path / "run")  # what status reads: nothing moved
    assert usable.name == "step-00000020.ckpt" and [p.name for p, _ in damaged] == ["last.ckpt"]
    assert (folder / "last.ckpt").exists()
    said = []
    assert resume_checkpoint(tmp_path / "run", said.append) == str(folder / "step-00000020.ckpt")
    assert len(said) == 1 and "checkpoint last.ckpt is damaged (it is not a whole checkpoint" in said[0], said
    assert "set aside as last.ckpt.damaged-" in said[0] and said[0].endswith("resuming from step-00000020.ckpt")
    assert not (folder / "last.ckpt").exists() and len(list(folder.glob("last.ckpt.damaged-*"))) == 1
    truncate(folder / "step-00000020.ckpt")
    assert resume_checkpoint(tmp_path / "run", said.append) is None and said[-1].endswith("training from step 0")


def test_temporary_files_a_killed_write_left_are_removed_when_the_run_resumes(tmp_path, capsys):
    """kill -9 while a checkpoint is written leaves its `.last.ckpt.<random>.tmp` (as large as a checkpoint), which no
    rerun removed. The run here was killed after its last checkpoint and before its final row (status running at its
    last step), with a checkpoint and a parquet file half written; the rerun resumes it and removes both."""
    import pyarrow as pa

    from attnres.config import resolve_run_config
    from attnres.training.run import train

    run = tmp_path / "run"
    cfg = resolve_run_config(None, [*TINY, "train.tokens=1024"])
    assert train(cfg, run, progress=False).status == "done"
    table = schema.read_table(run / schema.RUN_FILE)
    index = table.schema.get_field_index("status")
    schema.write_table(run / schema.RUN_FILE, table.set_column(index, table.schema.field(index), pa.array(["running"])))
    stale = [run / schema.CHECKPOINT_DIR / ".last.ckpt.k3x_9q2a.tmp", run / ".metrics.parquet.0b1c2d3e.tmp"]
    for path in stale:
        path.write_bytes(b"\0" * 100_000)  # what the write had got to
    keep = run / schema.CHECKPOINT_DIR / "notes.tmp"  # not a temporary name of ours
    keep.write_text("mine")
    capsys.readouterr()
    result = train(cfg, run, progress=False)
    err = capsys.readouterr().err
    assert result.status == "done" and result.trained, result
    assert not any(path.exists() for path in stale) and keep.exists()
    assert "run: removed 2 temporary file(s) a killed write left: .metrics.parquet.0b1c2d3e.tmp, " in err, err
    assert "checkpoints/.last.ckpt.k3x_9q2a.tmp" in err, err
    assert sorted(p.name for p in run.rglob("*.tmp")) == ["notes.tmp"]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*ATTNRES, *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


def has_checkpoint(run: Path) -> bool:
    return (run / "checkpoints" / "last.ckpt").exists() and (run / schema.RUN_FILE).exists()


def train_until_checkpoint(args: list[str], run: Path) -> subprocess.Popen:
    """``attnres ARGS`` in the background, returned (still training) once ``run`` has its first checkpoint."""
    proc = subprocess.Popen(
        [*ATTNRES, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 240
    while not has_checkpoint(run):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc


@pytest.mark.integration  # kill and resume: pytest -m integration
def test_a_run_whose_checkpoint_was_cut_short_trains_again_and_says_so(tmp_path):
    """The issue's case: a truncated last.ckpt failed every rerun (Errno 22) while status promised a resume."""
    run = tmp_path / "run"
    args = ["train", *TINY, "train.tokens=100000", "train.eval_interval=10", "--no-progress", "--out", str(run)]
    proc = train_until_checkpoint(args, run)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143
    truncate(run / "checkpoints" / "last.ckpt")
    state = folder_state(run, "L2-d32", "baseline", None)
    assert state.state == "interrupted" and "its checkpoint last.ckpt is damaged" in state.detail, state
    assert "sets it aside and trains it again from step 0" in state.detail, state
    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "checkpoint last.ckpt is damaged" in again.stderr and "training from step 0" in again.stderr, again.stderr
    row = schema.read_table(run / schema.RUN_FILE).to_pylist()[0]
    assert row["status"] == "done" and row["step"] == row["max_steps"], row


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
@pytest.mark.integration  # kill and resume: pytest -m integration
def test_a_disk_that_fills_mid_run_leaves_a_checkpoint_the_run_resumes_from(tmp_path):
    """A real full disk: a tmpfs of 4 MiB, filled by another file once the run has its first checkpoint."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        run = disk / "run"
        args = ["train", *TINY, "train.tokens=200000", "train.eval_interval=20", "--no-progress", "--out", str(run)]
        proc = train_until_checkpoint(args, run)
        stat = os.statvfs(disk)
        free = stat.f_bavail * stat.f_frsize
        (disk / "filler").write_bytes(b"\0" * max(0, free - 100_000))  # less room than one checkpoint
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, err
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines[-1].startswith("attnres train: error: cannot write or read ") and "No space left" in lines[-1]
        assert "free some space and run the same command again" in lines[-1] and "Traceback" not in err, err
        assert checkpoint_problem(run / "checkpoints" / "last.ckpt") is None  # the previous one, whole
        assert not list((run / "checkpoints").glob(".*.tmp"))
        (disk / "filler").unlink()
        state = folder_state(run, "L2-d32", "baseline", None)
        assert "resumes from last.ckpt" in state.detail or state.state == "failed", state
        again = run_cli(*args, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        row = schema.read_table(run / schema.RUN_FILE).to_pylist()[0]
        assert row["status"] == "done" and row["step"] == row["max_steps"], row
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
