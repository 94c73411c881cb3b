"""Each local worker gets its own GPUs (sweeps/worker_devices.py): the assignment, without a GPU; and its own CPU
cores when the pool fills them."""

from __future__ import annotations

import os
import time
from collections import deque

import pytest

from sweeps.worker_devices import pin_worker_gpus, visible_gpus, worker_cpus, worker_gpus


@pytest.mark.parametrize(
    "workers, gpus, expected",
    [
        (2, 8, [["0", "1", "2", "3"], ["4", "5", "6", "7"]]),
        (3, 8, [["0", "1", "2"], ["3", "4", "5"], ["6", "7"]]),
        (8, 8, [[str(i)] for i in range(8)]),
        (3, 2, [["0"], ["1"], ["0"]]),  # more workers than GPUs: shared round-robin
        (2, 0, [[], []]),  # no GPU: nothing to pin
    ],
)
def test_workers_get_disjoint_shares_of_every_gpu(workers, gpus, expected):
    names = [str(i) for i in range(gpus)]
    shares = [worker_gpus(w, workers, names) for w in range(workers)]
    assert shares == expected
    if workers <= gpus:
        assert sorted(sum(shares, []), key=int) == names  # every GPU used, none twice


def test_a_worker_sees_only_its_share_of_what_was_visible():
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}  # the launcher itself was given four of eight
    assert pin_worker_gpus(1, 2, env) == ["6", "7"] and env["CUDA_VISIBLE_DEVICES"] == "6,7"
    cpu = {"CUDA_VISIBLE_DEVICES": ""}
    assert pin_worker_gpus(0, 2, cpu) == [] and cpu["CUDA_VISIBLE_DEVICES"] == ""  # a CPU machine stays one
    assert visible_gpus({}, count=3) == ["0", "1", "2"] and visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []
    with pytest.raises(ValueError, match="not one of 2"):
        worker_gpus(2, 2, ["0"])


@pytest.mark.parametrize(
    "workers, threads, cpus, expected",
    [
        (2, 1, [0, 1], [[0], [1]]),
        (2, 2, [0, 1, 2, 3], [[0, 1], [2, 3]]),
        (3, 1, [2, 5, 7], [[2], [5], [7]]),  # a taskset or SLURM allocation: its own cores, in order
        (1, 2, [0, 1], [[0, 1]]),  # one worker on every core: bound to all of them, as it was
        (1, 1, [0, 1], [None]),  # a pool that leaves cores free is not bound (others would stack on core 0)
        (4, 1, [0, 1], [None] * 4),  # more workers than cores: the scheduler shares them out
        (2, 2, [0, 1], [None, None]),
    ],
)
def test_workers_are_bound_to_their_own_cores_only_when_they_fill_them(workers, threads, cpus, expected):
    shares = [worker_cpus(w, workers, threads, cpus) for w in range(workers)]
    assert shares == expected
    if expected[0] is not None:
        assert sorted(sum(shares, [])) == cpus  # every core used, none twice
    with pytest.raises(ValueError, match="not one of 2"):
        worker_cpus(2, 2, 1, cpus)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="Linux, 2 cores")
def test_the_pools_workers_run_on_their_own_cores():
    """The launcher's worker processes bind themselves at start, before torch starts any thread: the pool of one
    one-thread worker per core (the demo's choice) puts each on a different core."""
    from sweeps.local_pool import _Launcher, _stop

    cpus = sorted(os.sched_getaffinity(0))
    launcher = _Launcher([], [], {}, deque(), {}, print, 0.1)
    launcher.workers = launcher.size = len(cpus)
    launcher.bind_threads = 1
    pool = [launcher.start_worker(slot) for slot in range(len(cpus))]
    try:
        deadline = time.monotonic() + 120  # a spawned worker imports the launcher's modules first
        while time.monotonic() < deadline:
            bound = [os.sched_getaffinity(w.process.pid) for w in pool]
            if all(len(b) == 1 for b in bound):
                break
            time.sleep(0.2)
        assert bound == [{c} for c in cpus]
    finally:
        _stop(pool)
    assert os.sched_getaffinity(0) == set(cpus)  # the launcher itself stays free
