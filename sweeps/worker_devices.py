"""Which GPUs each local worker trains on, when one machine has several (``attnres sweep run --workers N``).

Without this every worker would train on ``cuda:0`` (each process's first visible device). The visible GPUs
(``CUDA_VISIBLE_DEVICES``, else all of them) are split into ``workers`` contiguous groups, as even as possible, and a
worker sees only its group (its runs' ``cuda:0`` is then its own first GPU). With more workers than GPUs the workers
share them round-robin, each seeing one. The split is a pure function of the worker's index, so it is decided before
the worker imports anything that initialises CUDA.
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
