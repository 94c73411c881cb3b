"""The SLURM launcher against a real single-node SLURM cluster (munged + slurmctld + slurmd) that the fixture
starts in a temporary directory on its own ports and always stops (tests/slurm/slurm_local.sh).

Skipped, with the reason, where the SLURM binaries are absent; ``.ci/run`` installs them
(``apt-get install slurmctld slurmd slurm-client munge``).
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from sweeps import expand, load_grid, run_grid
from sweeps.claim import read_status
from sweeps.slurm import jobs_of

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

SCRIPT = Path(__file__).parents[1] / "slurm" / "slurm_local.sh"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
SEARCH_PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/local/sbin"
MISSING = [b for b in BINARIES if shutil.which(b, path=SEARCH_PATH) is None]
if MISSING:
    pytestmark = [
        *pytestmark,
        pytest.mark.skip(
            reason=f"SLURM binaries absent ({', '.join(MISSING)}); install slurmctld slurmd slurm-client munge"
        ),
    ]


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run(cmd: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster():
    """A throw-away SLURM cluster; yields the environment (SLURM_CONF, PATH) to run commands against it."""
    # munged wants every directory above its socket world-executable, so not under pytest's 0700 tmp folders
    folder = Path(tempfile.mkdtemp(prefix="attnres-slurm-"))
    folder.chmod(0o755)
    ctld, slurmd = free_ports(2)
    env = {
        **os.environ,
        "PATH": SEARCH_PATH,
        "SLURM_CTLD_PORT": str(ctld),
        "SLURM_D_PORT": str(slurmd),
        "SLURM_CRED_EXPIRE": "5",  # a requeued job may start again after 5 s instead of 120
        "SLURM_SCHED_PARAMS": "sched_interval=1",
    }
    try:
        start = run(["bash", str(SCRIPT), "start", str(folder)], env)
        if start.returncode != 0:
            logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((folder / "log").glob("*.log")))
            pytest.fail(f"the local SLURM cluster did not start:\n{start.stdout}\n{start.stderr}\n{logs}")
        env["SLURM_CONF"] = start.stdout.strip().splitlines()[-1].split("=", 1)[1]
        yield env
    finally:
        if "SLURM_CONF" in env:  # no job may outlive the cluster
            run(["scancel", "-u", getpass.getuser()], env)
            for _ in range(60):
                live = run(["squeue", "-h", "-t", "running,completing", "-o", "%i"], env)
                if not live.stdout.strip():
                    break
                time.sleep(0.5)
        run(["bash", str(SCRIPT), "stop", str(folder)], env)
        shutil.rmtree(folder, ignore_errors=True)


def attnres(env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "attnres.cli", *args], env, timeout=timeout)


def test_the_smoke_grid_as_a_job_array_finishes_every_run(cluster, tmp_path):
    results = tmp_path / "results"
    out = attnres(
        cluster,
        "sweep",
        "run",
        "smoke",
        "--launcher",
        "slurm",
        "--results",
        str(results),
        "--wait",
        "--poll",
        "1",
        "--timeout",
        "500",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "submitted 6 runs as job array" in out.stdout
    assert "6 runs: 6 trained" in out.stdout

    runs = expand(load_grid("smoke"))
    for cfg in runs:
        run_dir = results / "smoke" / cfg.run_id
        row = read_status(run_dir)
        assert row["status"] == "done" and row["step"] == row["max_steps"]
        (job,) = jobs_of(run_dir)
        assert "_" in job  # an array task
        log = run_dir / "slurm" / f"{job}.out"
        assert log.is_symlink() and f"{cfg.run_id}: done" in log.read_text()
        assert any(LOSS_LINE.match(line) for line in log.read_text().splitlines())
        assert "#SBATCH --signal=USR1@" in (run_dir / "slurm" / "submission.sh").read_text()
    assert len({jobs_of(results / "smoke" / c.run_id)[0].split("_")[0] for c in runs}) == 1  # one array

    status = attnres(cluster, "sweep", "status", "smoke", "--results", str(results))
    assert "sweep smoke: 6 runs: 6 done" in status.stdout
    again = attnres(cluster, "sweep", "run", "smoke", "--launcher", "slurm", "--results", str(results))
    assert again.returncode == 0 and "nothing to submit" in again.stdout


LOSS_LINE = re.compile(r"step \d+/\d+  tokens [\d,]+  loss \d+\.\d{4}  lr [\d.e+-]+  tok/s [\d,-]+  eta \S+$")

REQUEUE_GRID = {
    "name": "requeue",
    "defaults": {
        "model": {"seq_len": 64},
        "train": {"batch_size": 16, "eval_interval": 10, "eval_tokens": 4096, "log_interval": 5},
    },
    "ladder": {"depths": [2], "width_per_layer": 16, "head_dim": 16},
    "budgets": [{"tokens": 400000}],  # 391 steps
    "variants": ["block2"],
    "slurm": {"cpus_per_task": 1, "time_min": 10, "signal_delay_s": 60},
}


def signal_until_heard(job: str, run_dir: Path, live: Path, env: dict) -> None:
    """SIGUSR1 to the job's tasks, what SLURM does signal_delay_s before the time limit. Sent again if no task has
    said it heard it after a while and the run still trains: once in a loaded integration run the signal never reached
    the task (the run finished without a word of it) and the same test passed alone; these tests check what the tasks
    do with the signal, not scancel's delivery."""
    for _ in range(3):
        signalled = run(["scancel", "--signal=USR1", job], env)
        assert signalled.returncode == 0, signalled.stderr
        heard = time.monotonic() + 15
        while "received signal SIGUSR1" not in live.read_text() and time.monotonic() < heard:
            time.sleep(0.2)
        row = read_status(run_dir)
        if "received signal SIGUSR1" in live.read_text() or not row or row["status"] != "running":
            return


def test_a_signalled_task_checkpoints_requeues_and_resumes_to_the_same_result(cluster, tmp_path):
    grid_file = tmp_path / "requeue.yaml"
    grid_file.write_text(yaml.safe_dump(REQUEUE_GRID))
    results = tmp_path / "results"
    out = attnres(cluster, "sweep", "run", str(grid_file), "--launcher", "slurm", "--results", str(results))
    assert out.returncode == 0, out.stdout + out.stderr
    (cfg,) = expand(load_grid(grid_file))
    run_dir = results / "requeue" / cfg.run_id
    (job,) = jobs_of(run_dir)
    deadline = time.monotonic() + 300
    live = run_dir / "slurm" / f"{job}.out"
    while time.monotonic() < deadline:
        row = read_status(run_dir)
        if row and row["step"] >= 20:
            break
        time.sleep(0.1)
    assert row and row["step"] < row["max_steps"], "the run finished before it could be signalled"
    # the task's log shows the loss while the run trains (plain lines, not a progress bar)
    lines = [line for line in live.read_text().splitlines() if LOSS_LINE.match(line)]
    assert lines and int(lines[-1].split()[1].split("/")[0]) < row["max_steps"], live.read_text()[-2000:]
    signal_until_heard(job, run_dir, live, cluster)

    waited = attnres(
        cluster,
        "sweep",
        "run",
        str(grid_file),
        "--launcher",
        "slurm",
        "--results",
        str(results),
        "--wait",
        "--poll",
        "1",
        "--timeout",
        "300",
    )
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "nothing to submit" in waited.stdout  # queued (requeued) runs are not submitted twice
    row = read_status(run_dir)
    assert row["status"] == "done"
    log = (run_dir / "slurm" / f"{job}.out").read_text()
    assert "received signal SIGUSR1" in log and f"job {job} requeued" in log and "resuming from" in log
    assert list((run_dir / "checkpoints").glob("hpc_ckpt_*.ckpt"))
    assert jobs_of(run_dir) == [job]  # requeued as the same job, not resubmitted

    # the interrupted-and-requeued run ends exactly where an uninterrupted local run does (same threads)
    local = tmp_path / "local"
    run_grid(load_grid(grid_file), local, workers=1, threads=1, progress=False, log=lambda _: None)
    reference = read_status(local / "requeue" / cfg.run_id)
    assert (row["step"], row["val_loss"]) == (reference["step"], reference["val_loss"])


TUNE_GRID = {
    "name": "slurmtune",
    "defaults": {"model": {"seq_len": 64}, "train": {"batch_size": 16, "eval_interval": 5, "eval_tokens": 4096}},
    "ladder": {"depths": [2], "width_per_layer": 16, "head_dim": 16},
    "budgets": [{"tokens": 30000}],
    "variants": ["baseline"],
    "seeds": [0],
    "lr": "tuned",
    "tune": {"budget": {"tokens": 200000}, "trials": 2, "lr": [1e-3, 1e-2], "pruner": "none", "widen": 0,
             "finalists": 0},
    "slurm": {"cpus_per_task": 1, "time_min": 10},
}  # fmt: skip


@pytest.mark.slow  # about 20 s; the default suite's budget is 10 minutes (pytest -m slow runs it)
def test_tuning_on_slurm_completes_a_study_and_a_killed_tuner_job_resumes_its_trial(cluster, tmp_path):
    import optuna

    from sweeps.tuning import storage_for

    grid_file = tmp_path / "slurmtune.yaml"
    grid_file.write_text(yaml.safe_dump(TUNE_GRID))
    results = tmp_path / "results"
    args = ("tune", str(grid_file), "--launcher", "slurm", "--results", str(results), "--workers", "1")
    out = attnres(cluster, *args)
    assert out.returncode == 0 and "submitted 1 tuner(s) as job array" in out.stdout, out.stdout + out.stderr
    trials = results / "slurmtune-tune"
    deadline = time.monotonic() + 300
    row = None
    while time.monotonic() < deadline:  # the first trial part way, past a checkpoint
        folders = [p for p in trials.glob("baseline-*") if (p / "run.parquet").exists()]
        row = read_status(folders[0]) if folders else None
        if row and row["step"] >= 30 and list((folders[0] / "checkpoints").glob("*.ckpt")):
            break
        time.sleep(0.2)
    assert row and row["step"] < row["max_steps"], "the trial finished before its job could be killed"
    run(["scancel", "--signal=KILL", "--full", "-u", getpass.getuser()], cluster)
    for _ in range(120):
        if not run(["squeue", "-h", "-u", getpass.getuser()], cluster).stdout.strip():
            break
        time.sleep(0.5)
    killed = folders[0]
    assert read_status(killed)["status"] == "running"  # interrupted, not finished

    done = attnres(cluster, *args[:-1], "2", "--wait", "--poll", "1")  # two tuners share the study now
    assert done.returncode == 0 and "tuned 1 (size, variant) pair(s)" in done.stdout, done.stdout + done.stderr
    assert read_status(killed)["status"] == "done"
    assert "resuming from" in (killed / "train.log").read_text()  # the retry resumed the killed run
    tuned = yaml.safe_load((trials / "tuned.yaml").read_text())
    assert tuned["sizes"]["L2-d32"]["baseline"]["lr"] > 0
    grid = load_grid(grid_file)
    study = optuna.load_study(study_name="slurmtune/L2-d32/baseline", storage=storage_for(grid, results, None))
    complete = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) >= 2 and {t.params["lr"] for t in complete} >= {study.get_trials()[0].params["lr"]}


@pytest.mark.slow  # about 30 s (pytest -m slow runs it)
def test_wsd_branches_on_slurm_wait_for_their_trunk_and_start_from_its_checkpoints(cluster, tmp_path):
    """The trunks go first; the branches' array waits for them (afterany) and starts from the trunk's checkpoints."""
    from sweeps.expansion import expand_runs
    from tests.attnres.test_branches import GRID

    grid_file = tmp_path / "wsd.yaml"
    grid_file.write_text(yaml.safe_dump({**GRID, "slurm": {"cpus_per_task": 1, "time_min": 10}}))
    results = tmp_path / "results"
    out = attnres(
        cluster, "sweep", "run", str(grid_file), "--launcher", "slurm", "--results", str(results), "--wait",
        "--poll", "1", "--timeout", "500",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "submitted 1 run as job" in out.stdout and ", after afterany:" in out.stdout
    for run in expand_runs(load_grid(grid_file))[1:]:
        run_dir = results / run.cfg.sweep / run.cfg.run_id
        assert read_status(run_dir)["status"] == "done"
        (job,) = jobs_of(run_dir)
        assert "starting from its trunk's checkpoint" in (run_dir / "slurm" / f"{job}.err").read_text()
