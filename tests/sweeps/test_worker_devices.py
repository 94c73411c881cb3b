"""Each local worker gets its own GPUs (sweeps/worker_devices.py): the assignment, without a GPU."""

from __future__ import annotations

import pytest

from sweeps.worker_devices import pin_worker_gpus, visible_gpus, worker_gpus


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
