"""``attnres tune --launcher slurm``: tuners as one SLURM job array sharing the Optuna storage.

Each array task runs :func:`tune_task`, the same tuner as ``attnres tune`` on a login node (:mod:`sweeps.tuning`);
the tasks share the storage (a journal file on the shared file system, or an RDB URL), so every study fills up to
``tune.trials`` across them. A task killed mid-trial leaves that trial ``RUNNING`` and its tuner lock released; the
next tuner (of either launcher) retries it and its run resumes from its checkpoint.

Devices: a tuner is one process, because Optuna chooses each trial inside it, so it is one task on one node; on a
GPU grid it gets one GPU and its trials train on it (``runtime.accelerator=gpu``, one device, the grid's
``cpus_per_task`` threads; the global batch and its micro-batches as in the grid, accumulated on the one GPU).
``--workers N`` runs N tuners, so N GPUs tune N trials at once: trials are independent, so that uses the GPUs at
least as well as one trial over several. (Before, a trial got only the thread count and trained on whatever its
process found, with the grid's GPU count ignored.)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from attnres.config import ConfigError
from sweeps.slurm import SUBMITIT_DIR, SlurmResources, executor_for, merge_resources, resources, slurm_available


def tuner_resources(grid: Any) -> tuple[SlurmResources, dict[str, Any]]:
    """What one tuner task asks SLURM for, and the runtime.* settings its trials train with (module docstring)."""
    res = resources(merge_resources(grid.slurm, grid.sizes[0].slurm if grid.sizes else {}))
    gpus = 1 if res.gpus_per_node else 0
    res = dataclasses.replace(res, nodes=1, gpus_per_node=gpus, tasks_per_node=1)
    return res, {**res.runtime(), "strategy": "ddp"}  # one device: a grid's fsdp would be refused


def tune_task(grid: Any, results: str, options: dict[str, Any]) -> int:
    """The job function of a tuning array task: one tuner, the same as ``attnres tune`` on a login node, sharing the
    Optuna storage with the other tasks (its trials are ordinary runs, claimed and resumable as any)."""
    from sweeps.tuning import tune

    return len(tune(grid, results, **options))


def submit_tuners(grid: Any, results: str | Path, workers: int, options: dict[str, Any], log=print) -> list[str]:
    """``workers`` tuners as one job array with the grid's SLURM resources; their job ids."""
    if not slurm_available():
        raise ConfigError("--launcher slurm needs sbatch and squeue on PATH (a cluster login node), or use local")
    try:
        import submitit
    except ModuleNotFoundError:
        raise ConfigError("the SLURM launcher needs submitit: pip install -e '.[slurm]'") from None
    res, runtime = tuner_resources(grid)
    folder = Path(results).resolve() / grid.tune_sweep / SUBMITIT_DIR
    executor = executor_for(submitit, folder, res, grid.tune_sweep)
    options = {**options, "threads": options.get("threads") or res.cpus_per_task, "runtime": runtime}
    jobs = executor.map_array(
        tune_task, [grid] * workers, [str(Path(results).resolve())] * workers, [options] * workers
    )
    ids = [str(j.job_id) for j in jobs]
    device = f"1 GPU and {res.cpus_per_task} CPU(s)" if res.gpus_per_node else f"{res.cpus_per_task} CPU(s)"
    log(f"submitted {workers} tuner(s) as job array {ids[0].split('_')[0]} ({device} each)")
    return ids
