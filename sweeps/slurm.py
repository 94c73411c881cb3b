"""The SLURM launcher: the unfinished runs of a sweep as submitit job arrays, one array per set of resources.

* Resources come from the grid's ``slurm:`` section, overridden per size (``ladder.sizes[i].slurm``); runs with
  the same resources share one array, capped at ``array_parallelism`` tasks at a time.
* Each array task calls :func:`train_task` (pickled by submitit by reference, so it must stay importable), which
  trains the run into ``RESULTS/<sweep>/<run_id>`` like any other launcher (claim, skip if done, resume).
* Time limits and pre-emption: the sbatch script asks SLURM for ``--signal=USR1@<signal_delay_s>`` and
  ``--requeue``. On SIGUSR1 the task writes an ``hpc_ckpt_*.ckpt`` into ``RUN_DIR/checkpoints`` at the end of
  the current step and runs ``scontrol requeue`` for itself (:mod:`sweeps.requeue`: Lightning's SLURM
  auto-requeue with the checkpoint moved to a step boundary); the requeued task runs the same pickled job,
  and ``attnres.training.run`` resumes from the newest checkpoint (hpc or last.ckpt). A task killed by the scheduler
  without the signal (pre-emption with PreemptMode=REQUEUE, node failure) is requeued by SLURM and resumes
  from ``last.ckpt``, written at every evaluation.
* Logs: submitit writes every task's stdout/stderr into ``RESULTS/<sweep>/.submitit/``; each run folder gets
  ``slurm/<job>.out`` and ``slurm/<job>.err`` symlinks to its task's files, ``slurm/submission.sh`` (the
  sbatch script) and ``slurm/jobs.txt`` (every job id the run was submitted as, newest last).
* Waiting and status never rely on ``sacct`` (absent without slurmdbd): they read the runs' ``run.parquet``
  and ask ``squeue`` whether the run's latest job is still alive.

Multi-GPU and multi-node runs: ``gpus_per_node`` GPUs per node, one task per GPU (``tasks_per_node`` defaults to
``gpus_per_node``), and ``runtime.devices`` / ``runtime.num_nodes`` set to match, so Lightning's DDP strategy
takes its ranks from SLURM. submitit is imported only when submitting.
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnres.config import ConfigError, RunConfig, from_dict
from attnres.runtime import say
from attnres.storage import locks

SUBMITIT_DIR = ".submitit"
JOBS_FILE = "jobs.txt"
LIVE_GONE = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
)
PENDING = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "SUSPENDED", "RESV_DEL_HOLD")


@dataclass(frozen=True)
class SlurmResources:
    """Resources of one run on SLURM (the ``slurm:`` section of a grid; every key optional)."""

    partition: str | None = None
    """sbatch --partition."""
    account: str | None = None
    """sbatch --account."""
    qos: str | None = None
    """sbatch --qos."""
    constraint: str | None = None
    """sbatch --constraint (e.g. a GPU type)."""
    time_min: int = 60
    """Time limit of one attempt in minutes; a longer run is requeued from its checkpoint at the limit."""
    nodes: int = 1
    """Nodes per run (more than one: multi-node DDP)."""
    gpus_per_node: int = 0
    """GPUs per node (0: a CPU run)."""
    tasks_per_node: int | None = None
    """Tasks per node; default one per GPU (what Lightning's DDP needs), or 1 for a CPU run."""
    cpus_per_task: int = 2
    """CPUs per task; also the torch threads of the task."""
    mem_gb: float | None = None
    """Memory per node in GB (default: the partition's default; 0: all of the node's memory)."""
    array_parallelism: int = 32
    """Most tasks of one array running at the same time."""
    signal_delay_s: int = 120
    """SIGUSR1 this many seconds before the time limit: Lightning writes a checkpoint and requeues the task."""
    exclusive: bool = False
    """sbatch --exclusive."""
    python: str | None = None
    """Command that runs Python in the job (default: this interpreter), e.g. 'apptainer exec img.sif python'."""
    additional: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Extra sbatch options, e.g. {mail-type: END, reservation: big}; they win over the ones above."""
    setup: tuple[str, ...] = ()
    """Shell lines run in the sbatch script before the task starts, e.g. ['module load cuda/12.4']."""
    env: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Environment variables exported in the sbatch script before the task starts (and before `setup`), e.g. the NCCL
    settings of sweeps/paper.yaml: {TORCH_NCCL_ASYNC_ERROR_HANDLING: 1, NCCL_SOCKET_IFNAME: ib0}."""

    def exports(self) -> list[str]:
        """The ``env`` mapping as sbatch script lines."""
        import shlex

        return [f"export {name}={shlex.quote(str(value))}" for name, value in self.env.items()]

    @property
    def tasks(self) -> int:
        return self.tasks_per_node or max(1, self.gpus_per_node)

    def runtime(self) -> dict[str, Any]:
        """The runtime.* settings that make a run use exactly these resources."""
        return {
            "accelerator": "gpu" if self.gpus_per_node else "cpu",
            "devices": self.tasks,
            "num_nodes": self.nodes,
            "threads": self.cpus_per_task,
            "progress_bar": False,
        }

    def key(self) -> tuple:
        return tuple((f.name, repr(getattr(self, f.name))) for f in dataclasses.fields(self))


_SCALARS = [f.name for f in dataclasses.fields(SlurmResources) if f.name not in ("additional", "setup", "env")]
_FIELDS = [f.name for f in dataclasses.fields(SlurmResources)]


def resources(data: Mapping[str, Any], where: str = "slurm.") -> SlurmResources:
    """Validate a ``slurm:`` mapping into :class:`SlurmResources` (clear errors naming the key)."""
    import difflib

    if not isinstance(data, Mapping):
        raise ConfigError(f"{where.rstrip('.')} must be a mapping of SLURM resources, got {data!r}")
    for key in data:
        if key not in _FIELDS:
            hint = difflib.get_close_matches(str(key), _FIELDS, n=1)
            raise ConfigError(
                f"unknown key {where}{key!r}"
                + (f" (did you mean {hint[0]!r}?)" if hint else "")
                + f"; allowed: {', '.join(_FIELDS)}"
            )

    scalars = {k: v for k, v in data.items() if k in _SCALARS}
    typed = from_dict(_scalar_class(), scalars, where)
    additional = data.get("additional") or {}
    if not isinstance(additional, Mapping):
        raise ConfigError(
            f"{where}additional must be a mapping of sbatch options, e.g. {{mail-type: END}}, got {additional!r}"
        )
    setup = data.get("setup") or ()
    if isinstance(setup, str):
        setup = (setup,)
    if not isinstance(setup, (list, tuple)) or not all(isinstance(s, str) for s in setup):
        raise ConfigError(f"{where}setup must be a list of shell lines, got {setup!r}")
    env = data.get("env") or {}
    if not isinstance(env, Mapping) or not all(str(k).isidentifier() for k in env):
        raise ConfigError(f"{where}env must be a mapping of environment variable names to values, got {env!r}")
    if any(isinstance(v, (Mapping, list, tuple)) or v is None for v in env.values()):
        raise ConfigError(f"{where}env values must be strings or numbers, got {dict(env)!r}")
    res = SlurmResources(
        **{k: getattr(typed, k) for k in _SCALARS}, additional=dict(additional), setup=tuple(setup), env=dict(env)
    )
    for name in ("time_min", "nodes", "cpus_per_task", "array_parallelism"):
        if getattr(res, name) < 1:
            raise ConfigError(f"{where}{name} must be at least 1, got {getattr(res, name)}")
    if res.gpus_per_node < 0 or res.signal_delay_s < 0:
        raise ConfigError(f"{where}gpus_per_node and signal_delay_s must be >= 0")
    if res.gpus_per_node and res.tasks != res.gpus_per_node:
        raise ConfigError(
            f"{where}tasks_per_node={res.tasks_per_node} must equal gpus_per_node={res.gpus_per_node}: "
            "Lightning's DDP runs one SLURM task per GPU (leave tasks_per_node out)"
        )
    return res


@functools.cache
def _scalar_class() -> type:
    """A dataclass of the scalar fields only, so :func:`attnres.config.from_dict` type-checks them."""
    import typing

    hints = typing.get_type_hints(SlurmResources)
    fields = [
        (f.name, hints[f.name], dataclasses.field(default=f.default))
        for f in dataclasses.fields(SlurmResources)
        if f.name in _SCALARS
    ]
    return dataclasses.make_dataclass("SlurmResources", fields, frozen=True)


def check_resources(data: Mapping[str, Any], where: str = "slurm.") -> None:
    resources(data, where)


def merge_resources(grid_slurm: Mapping[str, Any], size_slurm: Mapping[str, Any]) -> dict[str, Any]:
    """A size's resources over the grid's (``additional`` merged key by key)."""
    merged = {**dict(grid_slurm or {}), **dict(size_slurm or {})}
    if (grid_slurm or {}).get("additional") or (size_slurm or {}).get("additional"):
        merged["additional"] = {
            **dict((grid_slurm or {}).get("additional") or {}),
            **dict((size_slurm or {}).get("additional") or {}),
        }
    return merged


# ------------------------------------------------------------------------------------------------------------
# inside the job
# ------------------------------------------------------------------------------------------------------------


def train_task(cfg: RunConfig, run_dir: str) -> dict[str, Any]:
    """The job function of every array task: train one run (resuming or skipping as needed).

    Global rank 0 claims the run folder; the other DDP ranks train only if rank 0 does (it tells them through the
    run folder, :func:`attnres.storage.locks.announce`), and Lightning synchronises them.
    SIGUSR1 (the time-limit warning) checkpoints at the end of the current step and requeues the task
    (:mod:`sweeps.requeue`).
    """
    from sweeps.claim import train_claimed
    from sweeps.requeue import requeue_callback

    requeue = requeue_callback()
    callbacks = [requeue] if requeue is not None else []
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    if rank == 0:
        outcome = train_claimed(cfg, run_dir, callbacks=callbacks)
        # Busy, finished, or failed before it could train: the other ranks are waiting to hear it (after a
        # training, they heard "train" at its start and this rewrite reaches nobody).
        locks.announce(Path(run_dir), outcome.status)
        say(f"{cfg.run_id}: {outcome.status}" + (f" ({outcome.error})" if outcome.error else ""), sys.stdout)
        return dataclasses.asdict(outcome)
    from attnres.training.run import train

    result = train(cfg, run_dir, progress=False, callbacks=callbacks)
    return {"run_id": cfg.run_id, "status": result.status, "rank": rank}


# ------------------------------------------------------------------------------------------------------------
# jobs and their states
# ------------------------------------------------------------------------------------------------------------


def slurm_available() -> bool:
    return shutil.which("sbatch") is not None and shutil.which("squeue") is not None


def jobs_of(run_dir: str | Path) -> list[str]:
    """Every job id a run was submitted as, oldest first."""
    path = Path(run_dir) / "slurm" / JOBS_FILE
    if not path.is_file():
        return []
    return [line.split()[0] for line in path.read_text().splitlines() if line.strip()]


def squeue_states() -> dict[str, str] | None:
    """State of every job of this user that squeue still knows (array tasks one by one), or None without squeue."""
    if shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(
            ["squeue", "-h", "-r", "-t", "all", "-u", getpass.getuser(), "-o", "%i|%T"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    states = {}
    for line in out.stdout.splitlines():
        if "|" in line:
            job, state = line.strip().split("|", 1)
            states[job] = state.strip()
    return states


def job_alive(state: str | None) -> bool:
    return state is not None and state not in LIVE_GONE


def _record(run_dir: Path, job: Any, folder: Path) -> None:
    """Note the job in the run folder and link its log files and sbatch script there."""
    slurm_dir = run_dir / "slurm"
    slurm_dir.mkdir(parents=True, exist_ok=True)
    with open(slurm_dir / JOBS_FILE, "a") as f:
        f.write(f"{job.job_id}\t{time.strftime('%Y-%m-%dT%H:%M:%S')}\t{folder}\n")
    array_id = str(job.job_id).split("_")[0]
    links = {
        f"{job.job_id}.out": job.paths.stdout,
        f"{job.job_id}.err": job.paths.stderr,
        "submission.sh": folder / f"{array_id}_submission.sh",
    }
    for name, target in links.items():
        link = slurm_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(target, slurm_dir))


def slurm_groups(planned: list) -> list[tuple[SlurmResources, list, list[RunConfig]]]:
    """Planned runs grouped by resources (one job array each), with the runtime set to match the resources.

    Raises :class:`ConfigError` if a run's global batch does not split over its devices (nodes x tasks).
    """
    from sweeps.local_pool import with_runtime

    groups: dict[tuple, tuple[SlurmResources, list, list[RunConfig]]] = {}
    for run in planned:
        res = resources(run.slurm)
        cfg = with_runtime(run.cfg, **res.runtime())
        world = cfg.runtime.devices * cfg.runtime.num_nodes
        if cfg.train.batch_size % world:
            raise ConfigError(
                f"{cfg.run_id} (size {run.size.name}): train.batch_size={cfg.train.batch_size} does not split over its "
                f"{world} devices (slurm nodes {res.nodes} x tasks_per_node {res.tasks}); change the batch or the "
                "resources"
            )
        entry = groups.setdefault(res.key(), (res, [], []))
        entry[1].append(run)
        entry[2].append(cfg)
    return list(groups.values())


def executor_for(submitit: Any, folder: Path, res: SlurmResources, name: str, dependency: str | None = None) -> Any:
    """A submitit executor with a run's resources (one per array task): what sweep runs and tuners share.
    ``dependency``: an sbatch --dependency (a grid's WSD branches wait for their trunks)."""
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_python=res.python)
    params: dict[str, Any] = {
        "name": name,
        "timeout_min": res.time_min,
        "nodes": res.nodes,
        "tasks_per_node": res.tasks,
        "cpus_per_task": res.cpus_per_task,
        "slurm_array_parallelism": res.array_parallelism,
        "slurm_signal_delay_s": res.signal_delay_s,
        # the time-limit warning goes to sweeps.requeue's SIGUSR1 handler (submitit's default, USR2, is for its
        # own mechanism)
        "slurm_additional_parameters": {
            "signal": f"USR1@{res.signal_delay_s}",
            "requeue": True,
            **({"mem": "0"} if res.mem_gb == 0 else {}),  # --mem=0: all of the node's memory
            **({"dependency": dependency} if dependency else {}),
            **dict(res.additional),
        },
    }
    optional = {
        "gpus_per_node": res.gpus_per_node or None,
        "mem_gb": res.mem_gb or None,
        "slurm_partition": res.partition,
        "slurm_account": res.account,
        "slurm_qos": res.qos,
        "slurm_constraint": res.constraint,
        "slurm_exclusive": True if res.exclusive else None,
        "slurm_setup": res.exports() + list(res.setup) or None,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    executor.update_parameters(**params)
    return executor


def _submit_group(
    submitit: Any,
    folder: Path,
    res: SlurmResources,
    runs: list,
    cfgs: list[RunConfig],
    results: str | Path,
    sweep: str,
    submitted: list[tuple[Any, str]],
    log: Callable[[str], None],
    dependency: str | None = None,
) -> list[str]:
    """One job array of runs with the same resources (after ``dependency``, an sbatch --dependency); its job ids."""
    from attnres.training.run import run_dir_for

    dirs = [str(run_dir_for(cfg, results).resolve()) for cfg in cfgs]
    executor = executor_for(submitit, folder, res, sweep, dependency)
    jobs = executor.map_array(train_task, cfgs, dirs)
    for run, job, run_dir in zip(runs, jobs, dirs):
        _record(Path(run_dir), job, folder)
        submitted.append((run, str(job.job_id)))
    arrays = sorted({str(j.job_id).split("_")[0] for j in jobs})
    what = f"{len(jobs)} runs as job array {', '.join(arrays)}" if len(jobs) > 1 else f"1 run as job {jobs[0].job_id}"
    log(
        f"submitted {what} ({res.nodes} node(s) x {res.tasks} task(s), "
        f"{res.gpus_per_node} GPU(s)/node, {res.cpus_per_task} CPU(s)/task, {res.time_min} min, at most "
        f"{res.array_parallelism} at once)" + (f", after {dependency}" if dependency else "")
    )
    return arrays


def submit(planned: list, results: str | Path, sweep: str, log: Callable[[str], None] = print) -> list[tuple[Any, str]]:
    """Submit planned runs (:class:`sweeps.grid.PlannedRun`) as job arrays; return (run, job id) pairs."""
    slurm_groups(planned)  # validate everything before the first sbatch
    if not slurm_available():
        raise ConfigError(
            "the SLURM launcher needs sbatch and squeue on PATH (run it on a cluster login node), or use --launcher "
            "local"
        )
    try:
        import submitit
    except ModuleNotFoundError:
        raise ConfigError("the SLURM launcher needs submitit: pip install -e '.[slurm]'") from None

    folder = Path(results).resolve() / sweep / SUBMITIT_DIR
    submitted: list[tuple[Any, str]] = []
    # a grid's WSD trunks go first; their branches wait for them (afterany: a branch whose trunk failed trains
    # from step 0), so that each branch starts from its trunk's checkpoint instead of redoing the shared steps
    is_trunk = [getattr(r, "role", "run") == "trunk" for r in planned]
    after: list[str] = []
    for res, runs, cfgs in slurm_groups([r for r, t in zip(planned, is_trunk) if t]):
        after += _submit_group(submitit, folder, res, runs, cfgs, results, sweep, submitted, log)
    dependency = f"afterany:{':'.join(after)}" if after else None
    for res, runs, cfgs in slurm_groups([r for r, t in zip(planned, is_trunk) if not t]):
        _submit_group(submitit, folder, res, runs, cfgs, results, sweep, submitted, log, dependency)
    return submitted
