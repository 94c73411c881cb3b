"""How long a sweep takes on a cluster of N devices: its runs packed onto them (``attnres sweep plan --gpus N``).

Each run holds its devices (nodes x GPUs per node) for its estimated time. The schedule is greedy, longest run first
(LPT list scheduling, what a scheduler that starts the longest waiting job that fits does): whenever devices free up,
the longest waiting run that fits in them starts. The elapsed time is when the last run ends. A run **strands**
devices when, once it has started, the devices left free are too few for any run still waiting: they idle until a
run ends (e.g. a 48-GPU run on 64 GPUs beside runs of 32). A run that needs more devices than the cluster has never
starts and is listed on its own.

Also here: per-device FLOP/s from a measured file (``--flops-file``), so the plan's times rest on a measurement
rather than the default guess of :data:`sweeps.plan.DEFAULT_FLOPS_PER_S`.
"""

from __future__ import annotations

import heapq
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnres.config import ConfigError


@dataclass(frozen=True)
class Job:
    name: str
    devices: int
    seconds: float


@dataclass(frozen=True)
class Packing:
    devices: int
    elapsed_s: float  # when the last run that fits ends
    busy_device_s: float  # sum over runs of devices x seconds
    starts: dict[str, float] = field(default_factory=dict)  # run -> start time
    stranded: dict[str, int] = field(default_factory=dict)  # run -> devices left idle while it started alone
    too_big: tuple[str, ...] = ()  # runs that need more devices than the cluster has

    @property
    def utilisation(self) -> float:
        return self.busy_device_s / (self.devices * self.elapsed_s) if self.elapsed_s > 0 else 0.0


def pack(jobs: Sequence[Job], devices: int) -> Packing:
    """Longest-first list scheduling of ``jobs`` on ``devices`` devices (module docstring)."""
    if devices < 1:
        raise ConfigError(f"--gpus must be at least 1, got {devices}")
    too_big = tuple(j.name for j in jobs if j.devices > devices)
    waiting = sorted((j for j in jobs if j.devices <= devices), key=lambda j: (-j.seconds, -j.devices, j.name))
    running: list[tuple[float, int, str]] = []  # (end time, devices, name), a heap
    free, now = devices, 0.0
    starts: dict[str, float] = {}
    stranded: dict[str, int] = {}
    while waiting or running:
        started = None
        for job in waiting:
            if job.devices <= free:
                started = job
                break
        if started is not None:
            waiting.remove(started)
            free -= started.devices
            starts[started.name] = now
            heapq.heappush(running, (now + started.seconds, started.devices, started.name))
            if free and waiting and all(j.devices > free for j in waiting):
                stranded[started.name] = free
            continue
        end, used, _ = heapq.heappop(running)  # nothing fits: wait for the next run to end
        now, free = end, free + used
        while running and running[0][0] == now:
            free += heapq.heappop(running)[1]
    elapsed = max((starts[j.name] + j.seconds for j in jobs if j.name in starts), default=0.0)
    busy = sum(j.devices * j.seconds for j in jobs if j.name in starts)
    return Packing(devices, elapsed, busy, starts, stranded, too_big)


def file_rates(path: str | Path) -> dict[tuple, float]:
    """Per-device training FLOP/s from a measured file: ``{"flops_per_s": R}`` (one rate for every run), or the
    ``throughput.json`` that ``attnres sweep throughput`` writes (one rate per size and variant, measured on one
    device). Keys: (n_layer, d_model, variant label), and ``("*",)`` for the median (what other shapes get)."""
    path = Path(path)
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"--flops-file {path}: cannot read it as JSON ({err})") from None
    if isinstance(data, dict) and isinstance(data.get("flops_per_s"), (int, float)):
        rates = {("*",): float(data["flops_per_s"])}
    elif isinstance(data, dict) and isinstance(data.get("measured"), list) and data["measured"]:
        rates = {(m["n_layer"], m["d_model"], m["variant"]): float(m["flops_per_s"]) for m in data["measured"]}
        rates[("*",)] = statistics.median(rates.values())
    else:
        raise ConfigError(
            f'--flops-file {path}: expected {{"flops_per_s": R}} or the throughput.json of `attnres sweep '
            "throughput` (a 'measured' list)"
        )
    if any(not rate > 0 for rate in rates.values()):
        raise ConfigError(f"--flops-file {path}: every flops_per_s must be positive")
    return rates
