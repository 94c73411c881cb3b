"""Which GPUs and which CPU cores each local worker trains on (``attnres sweep run --workers N``).

Without this every worker would train on ``cuda:0`` (each process's first visible device). The visible GPUs
(``CUDA_VISIBLE_DEVICES``, else all of them) are split into ``workers`` contiguous groups, as even as possible, and a
worker sees only its group (its runs' ``cuda:0`` is then its own first GPU). With more workers than GPUs the workers
share them round-robin, each seeing one. The split is a pure function of the worker's index, so it is decided before
the worker imports anything that initialises CUDA.

CPU cores: when the workers' threads fill the cores this process may use exactly (``workers x threads`` of them, the
local pool's choice on a quiet or a busy machine), each worker is bound to its own ``threads`` of them, as SLURM's
``--cpu-bind=cores`` or OpenMP's ``OMP_PROC_BIND`` bind a job's tasks. The scheduler then shares each core between the
processes on it, and never runs two workers on one core while another is left to other work: beside one CPU-bound
process on two cores, the two workers keep a core and half of the other (1.5 cores; unbound, each of the three
processes gets 2/3 of a core, 1.33 for the workers), and on a quiet machine nothing moves a worker's caches to another
core. A pool that does not fill the cores (fewer workers, or more threads than cores) is not bound: binding it would
stack smaller pools and other bound work on the first cores.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def visible_gpus(env: Mapping[str, str] | None = None, count: int | None = None) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs); ``count``: how many
    torch sees, for when the variable is unset (None: ask torch)."""
    env = os.environ if env is None else env
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    if count is None:
        import torch

        count = torch.cuda.device_count()
    return [str(i) for i in range(count)]


def worker_gpus(worker: int, workers: int, gpus: list[str]) -> list[str]:
    """The GPUs worker ``worker`` (0-based) of ``workers`` trains on: its contiguous share of ``gpus`` (the first
    ``len(gpus) % workers`` workers get one more), or one GPU round-robin when the workers outnumber them."""
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} is not one of {workers} workers")
    if not gpus:
        return []
    if workers >= len(gpus):
        return [gpus[worker % len(gpus)]]
    size, extra = divmod(len(gpus), workers)
    start = worker * size + min(worker, extra)
    return gpus[start : start + size + (1 if worker < extra else 0)]


def pin_worker_gpus(worker: int, workers: int, env: dict[str, str] | None = None) -> list[str]:
    """Restrict this process to its share of the GPUs (sets ``CUDA_VISIBLE_DEVICES``, so it must run before CUDA
    is initialised: first thing in a worker). Nothing changes where no GPU is visible. Returns the share."""
    env = os.environ if env is None else env
    gpus = visible_gpus(env)
    share = worker_gpus(worker, workers, gpus)
    if share:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(share)
    return share


def worker_cpus(worker: int, workers: int, threads: int, cpus: list[int]) -> list[int] | None:
    """The cores worker ``worker`` (0-based) of ``workers``, with ``threads`` torch threads each, is bound to: its own
    ``threads`` consecutive ones of ``cpus`` when ``workers x threads == len(cpus)``, else None (not bound)."""
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} is not one of {workers} workers")
    if threads < 1 or workers * threads != len(cpus):
        return None
    return cpus[worker * threads : (worker + 1) * threads]


def pin_worker_cpus(worker: int, workers: int, threads: int) -> list[int] | None:
    """Bind this process to its cores (:func:`worker_cpus` of the cores it may use now); first thing in a worker, so
    that every thread torch starts later inherits them. Returns them, or None where nothing was bound (a pool that
    does not fill the cores, or a system without ``sched_setaffinity``)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    share = worker_cpus(worker, workers, threads, sorted(os.sched_getaffinity(0)))
    if share is not None:
        os.sched_setaffinity(0, share)
    return share
