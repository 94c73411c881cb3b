"""SIGTERM and Ctrl-C end every command with one line, the conventional exit status (130 for Ctrl-C, 143 for
SIGTERM; never 0 for an interrupted run), and what was interrupted resumable; a killed kernel build leaves no
compiler running.

Each case starts the real command, waits until it is doing its work (training, tokenizing, compiling), signals it
and reads what it says. Baseline models only, except for the kernel build, so that no test waits for a build.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from attnres.storage import schema
from sweeps.status import folder_state

pytestmark = pytest.mark.integration  # the integration tier: pytest -m integration (.ci/run's second step)

ROOT = Path(__file__).resolve().parents[1]
ATTNRES = [sys.executable, "-m", "attnres.cli"]
TINY = ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.seq_len=64", "model.residual=baseline"]
GRID = {
    "name": "tinysig",
    "defaults": {"model": {"seq_len": 64}, "train": {"batch_size": 16, "eval_interval": 10, "eval_tokens": 4096}},
    "ladder": {"depths": [2], "width_per_layer": 16, "head_dim": 16},
    "budgets": [{"tokens": 400_000}],
    "variants": ["baseline"],
    "seeds": [0, 1],
    "lr": "tuned",
    "tune": {"budget": {"tokens": 400_000}, "trials": 3, "lr": [1e-3, 1e-2], "eval_interval": 10, "finalists": 0},
}


def start(args: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*ATTNRES, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        # Ctrl-C as at a terminal: a test run started in the background inherits SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def wait_until(condition, proc: subprocess.Popen, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the command ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.1)


def stop(proc: subprocess.Popen, sig: int) -> tuple[int, list[str]]:
    """Signal the command; its exit status and its stderr's lines (progress bars and blank lines dropped)."""
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, [line for line in err.splitlines() if line.strip()]


def training(run_dir: Path) -> bool:
    """The run has written its row and a checkpoint (so it is past its start-up)."""
    try:
        row = schema.read_table(run_dir / schema.RUN_FILE).to_pylist()[0]
    except (OSError, ValueError, IndexError):
        return False
    return row["step"] >= 10 and (run_dir / "checkpoints" / "last.ckpt").exists()


@pytest.mark.parametrize(
    ("sig", "code", "said"), [(signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "interrupted (Ctrl-C)")]
)
def test_train_stopped_part_way_exits_with_the_signal_and_leaves_the_run_resumable(tmp_path, sig, code, said):
    run = tmp_path / "run"
    proc = start(
        ["train", *TINY, "train.tokens=2000000", "train.eval_interval=10", "--no-progress", "--out", "run"], tmp_path
    )
    wait_until(lambda: training(run), proc, "a checkpoint")
    status, lines = stop(proc, sig)
    assert status == code, lines
    assert (
        lines[-1]
        == f"attnres train: {said}; the run is resumable: the same command resumes it from its last checkpoint"
    ), lines
    assert "Traceback" not in "\n".join(lines), lines
    state = folder_state(run, "L2-d32", "baseline", None)
    assert state.state == "interrupted" and "resumes from last.ckpt on the next `sweep run`" in state.detail, state


@pytest.mark.parametrize(
    ("sig", "code", "said"), [(signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "interrupted (Ctrl-C)")]
)
def test_a_local_sweep_stopped_part_way_says_so_in_one_line(tmp_path, sig, code, said):
    grid = dict(GRID, lr=3e-3)
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    proc = start(["sweep", "run", "g.yaml", "--workers", "2", "--threads", "1", "--no-progress"], tmp_path)
    sweep = tmp_path / "results" / "tinysig"
    wait_until(lambda: sweep.is_dir() and any(training(d) for d in sweep.iterdir()), proc, "a checkpoint")
    status, lines = stop(proc, sig)
    assert status == code, lines
    assert lines == [
        f"attnres sweep: {said}; finished runs are kept; `sweep run` resumes the others from their checkpoints"
    ], lines
    states = [folder_state(d, "L2-d32", "baseline", None).state for d in sorted(sweep.iterdir())]
    assert "interrupted" in states and "running" not in states, states  # the workers are gone


def test_tune_interrupted_says_so_in_one_line(tmp_path):
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(GRID))
    proc = start(["tune", "g.yaml", "--threads", "1"], tmp_path)
    trials = tmp_path / "results" / "tinysig-tune"
    wait_until(lambda: trials.is_dir() and any(training(d) for d in trials.iterdir() if d.is_dir()), proc, "a trial")
    status, lines = stop(proc, signal.SIGINT)
    assert status == 130, lines
    assert (
        lines[-1]
        == "attnres tune: interrupted (Ctrl-C); finished trials are kept; the same command continues the search"
    ), lines
    assert "Traceback" not in "\n".join(lines), lines


def test_data_prepare_stopped_says_so_in_one_line_and_resumes(tmp_path):
    (tmp_path / "text").mkdir()
    for i in range(40):  # many small units, so that it is stopped part way
        (tmp_path / "text" / f"{i:02d}.txt").write_text(
            "".join(f"line {j} of file {i}, with words\n" for j in range(20000))
        )
    args = ["data", "prepare", "text", "--out", "tokens", "--unit-mib", "0.5", "--no-progress"]
    proc = start(args, tmp_path)
    wait_until(
        lambda: (
            len(list((tmp_path / "tokens" / "units").glob("*.json"))) >= 1
            if (tmp_path / "tokens" / "units").is_dir()
            else False
        ),
        proc,
        "a unit",
    )
    status, lines = stop(proc, signal.SIGTERM)
    assert status == 143, lines
    assert (
        lines[-1]
        == "attnres data: stopped by SIGTERM; finished units are kept; the same command resumes the preparation"
    ), lines
    again = subprocess.run(
        [*ATTNRES, *args], cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert again.returncode == 0 and "already prepared" in again.stderr, again.stderr


def processes_in(folder: Path) -> list[str]:
    """The processes working in ``folder`` (their current directory is in it): ninja and the compilers of a build."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if cwd.startswith(str(folder)):
            found.append(f"{pid} {name}")
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_kernel_build_leaves_no_compiler_running(tmp_path, sig):
    cache = tmp_path / "cache"  # a fresh cache: the run builds the native kernels first
    proc = start(
        ["train", *TINY[:-1], "model.residual=block", "model.n_blocks=2", "--no-progress", "--out", "run"],
        tmp_path,
        ATTNRES_CACHE_DIR=str(cache),
        ATTNRES_NATIVE_DIR=str(cache / "native"),
    )
    wait_until(lambda: any("cc1plus" in p or "c++" in p or "g++" in p for p in processes_in(cache)), proc, "a compiler")
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while processes_in(cache) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_in(cache), processes_in(cache)
