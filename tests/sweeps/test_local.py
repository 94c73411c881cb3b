"""The local launcher: a sweep finishes, a re-run trains nothing, a SIGKILLed sweep resumes to the same rows,
two launchers at once share the work without training a run twice, and ``sweep status`` says where runs stand."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sweeps import expand, expand_runs, load_grid, run_grid
from sweeps.claim import read_status
from sweeps.plan import plan
from sweeps.status import sweep_status
from tests.cli_helpers import attnres

GRID = {
    "name": "tiny",
    "defaults": {
        "model": {"seq_len": 64},
        "train": {"batch_size": 16, "eval_interval": 10, "eval_tokens": 4096, "log_interval": 5},
    },
    "ladder": {"depths": [2], "width_per_layer": 16, "head_dim": 16},
    "budgets": [{"tokens": 120000}],  # 118 steps: a few seconds per run, a checkpoint every 10 steps
    "variants": ["baseline", "full", {"block": [1, 2]}],
    "seeds": [0],
    "lr": 3e-3,
}
ROW = ("status", "step", "val_loss", "max_steps", "tokens")


def cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """``attnres ARGS`` in a fresh process, beside a launcher the test kills (the integration tier's tests; the others
    run the command in-process, tests.cli_helpers.attnres)."""
    return subprocess.run(
        [sys.executable, "-m", "attnres.cli", *args], capture_output=True, text=True, timeout=600, **kwargs
    )


def launch(*args: str) -> subprocess.Popen:
    """A launcher in its own process group (so the test can kill it with its workers)."""
    return subprocess.Popen(
        [sys.executable, "-m", "attnres.cli", "sweep", "run", *args, "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def rows(results: Path) -> dict[str, dict]:
    return {p.parent.name: read_status(p.parent) for p in sorted((results / "tiny").glob("*/run.parquet"))}


def attempts(run_dir: Path) -> list[str]:
    """One header line per training attempt in the run's log."""
    log = run_dir / "train.log"
    return [line for line in log.read_text().splitlines() if line.startswith("====")] if log.exists() else []


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def grid_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("grid") / "tiny.yaml"
    path.write_text(yaml.safe_dump(GRID))
    return path


@pytest.fixture(scope="module")
def reference(grid_file, tmp_path_factory):
    """The grid trained once, uninterrupted, through the Python API (two workers of one thread each).

    One thread per worker everywhere in these tests: the numbers must match across launches, and a second
    thread only slows tiny models down when the machine is busy.
    """
    results = tmp_path_factory.mktemp("reference")
    summary = run_grid(grid_file, results, workers=2, threads=1, progress=False, log=lambda _: None)
    return results, summary


def test_a_local_sweep_finishes_every_run(reference, grid_file):
    results, summary = reference
    runs = expand(load_grid(grid_file))
    assert summary.ok and summary.total == len(runs) == 4
    assert summary.trained == 4 and summary.skipped_done == 0
    assert summary.counts["done"] == 4 and set(summary.statuses.values()) == {"done"}
    found = rows(results)
    assert set(found) == {r.run_id for r in runs}
    for row in found.values():
        assert row["status"] == "done" and row["step"] == row["max_steps"] == 118
    for run in runs:
        log = results / "tiny" / run.run_id / "train.log"
        assert log.exists() and len(attempts(log.parent)) == 1


def test_running_a_finished_sweep_again_trains_nothing_and_says_so(reference, grid_file):
    results, _ = reference
    files = sorted(p for p in (results / "tiny").rglob("*") if p.is_file())
    before = {p: p.stat().st_mtime_ns for p in files}
    out = attnres("sweep", "run", str(grid_file), "--results", str(results))
    assert out.returncode == 0, out.stderr
    assert "nothing to train: all 4 runs of sweep tiny are already finished" in out.stdout
    assert {p: p.stat().st_mtime_ns for p in files} == before
    summary = run_grid(grid_file, results, progress=False)
    assert summary.trained == 0 and summary.skipped_done == 4 and summary.ok


@pytest.mark.integration  # kill and resume: pytest -m integration
def test_sigkill_part_way_then_rerun_finishes_without_retraining(reference, grid_file, tmp_path):
    ref_results, _ = reference
    results = tmp_path / "results"
    proc = launch(str(grid_file), "--results", str(results), "--workers", "2", "--threads", "1")
    interrupted = None
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            found = rows(results) if (results / "tiny").exists() else {}
            done = [k for k, r in found.items() if r and r["status"] == "done"]
            # early in its run (at most half way), so it cannot finish before the kill below lands
            mid = [
                k
                for k, r in found.items()
                if r
                and r["status"] == "running"
                and 20 <= r["step"] <= 60
                and (results / "tiny" / k / "checkpoints" / "last.ckpt").exists()
            ]
            if done and mid:
                interrupted = mid[0]
                break
            time.sleep(0.05)
        assert interrupted, (
            f"never caught the sweep part way: {proc.poll()} {rows(results) if results.exists() else {}}"
        )
        states = {s.run_id: s.state for s in sweep_status(expand_runs(load_grid(grid_file)), results)}
        assert "running" in states.values() and "done" in states.values(), states
        workers = children(proc.pid)
        assert workers, "the launcher has no worker process"
        os.kill(proc.pid, signal.SIGKILL)  # the launcher first: its workers must die with it
        proc.wait(timeout=30)
        for _ in range(100):
            if not any(alive(w) for w in workers):
                break
            time.sleep(0.05)
        assert not any(alive(w) for w in workers), "a worker outlived its launcher"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group, whatever is left
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    killed = rows(results)
    finished = {k for k, r in killed.items() if r["status"] == "done"}
    assert finished and killed[interrupted]["status"] == "running" and killed[interrupted]["step"] < 118
    untouched = {
        k: (
            killed[k]["updated_at"],
            (results / "tiny" / k / "run.parquet").stat().st_mtime_ns,
            (results / "tiny" / k / "metrics.parquet").stat().st_mtime_ns,
        )
        for k in finished
    }
    status = cli("sweep", "status", str(grid_file), "--results", str(results))
    assert status.returncode == 0
    line = next(line for line in status.stdout.splitlines() if line.startswith(interrupted))
    assert "interrupted" in line and "resumes" in line

    out = cli(
        "sweep", "run", str(grid_file), "--results", str(results), "--workers", "2", "--threads", "1", "--no-progress"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    final = rows(results)
    assert all(r["status"] == "done" for r in final.values()) and len(final) == 4
    for k in finished:  # no finished run was trained again
        assert (
            final[k]["updated_at"],
            (results / "tiny" / k / "run.parquet").stat().st_mtime_ns,
            (results / "tiny" / k / "metrics.parquet").stat().st_mtime_ns,
        ) == untouched[k]
        assert len(attempts(results / "tiny" / k)) == 1
    log = (results / "tiny" / interrupted / "train.log").read_text()
    assert len(attempts(results / "tiny" / interrupted)) == 2 and "resuming from" in log and "last.ckpt" in log
    reference_rows = rows(ref_results)
    for k, row in final.items():  # the same numbers as the uninterrupted sweep
        assert {c: row[c] for c in ROW} == {c: reference_rows[k][c] for c in ROW}, k


@pytest.mark.integration
def test_two_launchers_at_once_share_the_work(grid_file, tmp_path):
    results = tmp_path / "results"
    procs = [launch(str(grid_file), "--results", str(results), "--threads", "1") for _ in range(2)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=600)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [0, 0], outputs
    final = rows(results)
    assert len(final) == 4 and all(r["status"] == "done" and r["step"] == 118 for r in final.values())
    for run_id in final:  # one training attempt per run: never trained twice, nor by both at once
        assert len(attempts(results / "tiny" / run_id)) == 1, run_id
    trained = []
    for text in outputs:
        summary = next(line for line in text.splitlines() if line.startswith("sweep tiny:"))
        trained.append(int(summary.split("runs: ")[1].split(" trained")[0]))
    assert sum(trained) == 4, outputs


def test_status_shows_every_run(reference, grid_file, tmp_path):
    results, _ = reference
    out = attnres("sweep", "status", str(grid_file), "--results", str(results))
    assert out.returncode == 0
    runs = expand(load_grid(grid_file))
    for run in runs:
        line = next(line for line in out.stdout.splitlines() if line.startswith(run.run_id))
        assert " done " in line and "118/118" in line
    assert "sweep tiny: 4 runs: 4 done" in out.stdout
    fresh = attnres("sweep", "status", str(grid_file), "--results", str(tmp_path / "empty"))
    assert "4 queued" in fresh.stdout and "not started" in fresh.stdout


def test_the_plan_is_calibrated_from_finished_runs(reference, grid_file):
    results, _ = reference
    rows_ = plan(load_grid(grid_file), results)
    assert {r.rate_source for r in rows_} == {"calibrated"} and {r.status for r in rows_} == {"done"}
    fresh = plan(load_grid(grid_file), None)
    assert {r.rate_source for r in fresh} == {"default"}


def test_an_ablation_switch_is_timed_by_its_own_runs_not_by_its_residual_kinds():
    """The plan calibrates each run by the finished runs of its own variant (the results' variant column): an
    ablation switch runs another code path (cpu_ablations: 3-4x slower than plain Full), so plain Full's speed
    must not time it; unmeasured, it takes the median of every run measured."""
    from sweeps.plan import plan_rows

    scalar = {"name": "full+scalar", "model": {"residual": "full", "depth_mixing": "scalar"}}
    runs = expand_runs(load_grid({**GRID, "variants": ["full", scalar]}))
    full = next(r.cfg.model for r in runs if r.variant == "full")
    key = ("cpu", full.n_layer, full.d_model, full.seq_len, full.variant, full.effective_n_blocks)
    rows = {r.variant: r for r in plan_rows(runs, {key: 1e9, ("*", "cpu"): 1e8}, None, "local", None)}
    assert rows["full"].rate_source == rows["full+scalar"].rate_source == "calibrated"
    seconds = {v: (r.est_s - 0.3) / r.flops for v, r in rows.items()}  # less the fixed overhead, per FLOP
    assert seconds["full+scalar"] / seconds["full"] == pytest.approx(10, rel=0.05)


def test_a_failing_run_is_reported_and_the_others_finish(tmp_path):
    data = {**GRID, "budgets": [{"tokens": 20000}], "variants": ["baseline", "full"]}
    grid = load_grid(data)
    broken, fine = expand(grid)
    folder = tmp_path / "tiny" / broken.run_id
    folder.mkdir(parents=True)  # a folder that holds another run's config: attnres.training.run refuses it
    (folder / "config.yaml").write_text(yaml.safe_dump({"model": {"n_layer": 3}}))
    summary = run_grid(grid, tmp_path, threads=1, progress=False, log=lambda _: None)
    assert summary.statuses == {broken.run_id: "failed", fine.run_id: "done"}
    assert not summary.ok and summary.failed == 1
    (failed,) = [r for r in summary.runs if r.status == "failed"]
    assert "holds a different run" in failed.error


def test_the_largest_runs_are_handed_out_first():
    """Longest-processing-time order: in grid order (smallest first) the last large run would train alone at the
    end while the other workers idle (the demo's largest size is 3/4 of its compute). run_local queues its pending
    runs in this order and the launcher hands out the first that waits for nothing."""
    from collections import deque

    from attnres.costs import run_budget
    from sweeps.local_pool import _Launcher, largest_first

    grid = load_grid({**GRID, "budgets": [{"tokens": [6000, 12000, 3000]}], "variants": ["baseline", "full"]})
    runs = expand(grid)
    order = largest_first(runs, range(len(runs)))
    flops = [run_budget(runs[i]).flops for i in order]
    assert flops == sorted(flops, reverse=True) and order != list(range(len(runs)))
    launcher = _Launcher(runs, [None] * len(runs), {}, deque(order), {}, print, 0.1)
    launcher.after = {}
    assert [launcher.next_pending() for _ in runs] == order


def test_the_progress_bar_counts_steps_and_names_the_runs_in_training(grid_file, tmp_path, capsys, monkeypatch):
    """The bar moves during a run (steps, not runs: it sat at 9/12 for the whole of a 15-minute run) and says
    which runs train at which step."""
    import sweeps.local_pool as pool

    monkeypatch.setattr(pool, "terminal_ok", lambda stream: True)  # a bar is drawn on a (sized) terminal only

    grid = load_grid(grid_file)
    runs = expand(grid)[:2]
    summary = pool.run_local(runs, tmp_path, workers=1, threads=1, progress=True, poll_s=0.2)
    assert summary.ok
    err = capsys.readouterr().err
    assert "236/236" in err and "step" in err  # two runs of 118 steps
    assert f"{runs[0].run_id} " in err and "/118" in err  # a run in training with its step


def test_a_workers_train_log_has_a_loss_line_every_log_interval(reference):
    """Batch jobs (sweep workers, SLURM tasks) have no progress bar: train.log gets a plain line per log_interval."""
    results, _ = reference
    log = next((results / "tiny").glob("*/train.log")).read_text()
    lines = [line for line in log.splitlines() if line.startswith("step ")]
    assert len(lines) >= 118 // GRID["defaults"]["train"]["log_interval"]
    assert lines[-1].startswith("step 118/118") and all(f" {k} " in lines[0] for k in ("tokens", "loss", "lr", "eta"))


def test_a_branch_is_handed_out_once_its_trunk_has_finished():
    """Two workers: the second must not take a branch while the first trains its trunk (it would train the branch
    from step 0); it takes other work, or waits."""
    from collections import deque

    from sweeps import expand, load_grid
    from sweeps.local_pool import _Launcher, _trunks

    grid = load_grid(
        {
            "name": "br",
            "defaults": {"model": {"seq_len": 64}, "train": {"batch_size": 16, "eval_interval": 1000000}},
            "ladder": {"depths": [2], "width_per_layer": 16, "head_dim": 16},
            "budgets": [{"tokens": [20000, 40000]}],
            "branches": {"decay_frac": 0.2},
            "variants": ["baseline"],
            "seeds": [0, 1],
            "lr": 3e-3,
        }
    )
    runs = expand(grid)
    kinds = ["trunk" if r.sweep.endswith("-trunk") else "branch" for r in runs]
    assert kinds == ["trunk", "trunk", "branch", "branch", "branch", "branch"]
    launcher = _Launcher(runs, [None] * len(runs), {}, deque(range(len(runs))), {}, print, 0.1)
    launcher.after = _trunks(runs)
    assert set(launcher.after.values()) == {0, 1} and len(launcher.after) == 4
    first, second = launcher.next_pending(), launcher.next_pending()
    assert (first, second) == (0, 1)  # the two trunks
    launcher.pool = [type("W", (), {"task": 0})(), type("W", (), {"task": 1})()]  # both training
    assert launcher.next_pending() is None  # every branch waits for a trunk in training
    launcher.pool[0].task = None  # trunk 0 finished
    branch = launcher.next_pending()
    assert launcher.after[branch] == 0
