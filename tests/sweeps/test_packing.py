"""`attnres sweep plan --gpus N`: a sweep's runs packed onto N devices (sweeps/packing.py), without a GPU."""

from __future__ import annotations

import json

import pytest

from attnres.config import ConfigError
from sweeps.packing import Job, file_rates, pack
from tests.cli_helpers import attnres


def test_runs_that_fit_side_by_side_share_the_devices():
    jobs = [Job("a", 32, 10.0), Job("b", 32, 10.0), Job("c", 32, 5.0), Job("d", 32, 5.0)]
    packed = pack(jobs, 64)
    assert packed.elapsed_s == 15.0 and packed.utilisation == pytest.approx(1.0)  # a+b, then c+d in b's place
    assert packed.starts == {"a": 0.0, "b": 0.0, "c": 10.0, "d": 10.0} and not packed.stranded
    assert pack(jobs, 32).elapsed_s == 30.0  # one at a time: the sum


def test_a_run_that_leaves_too_few_devices_for_any_other_strands_them():
    """64 GPUs, runs of 48 and 32 (paper.yaml's 6 and 4 nodes x 8): beside the 48, 16 idle."""
    jobs = [Job("big", 48, 20.0), Job("s1", 32, 10.0), Job("s2", 32, 10.0)]
    packed = pack(jobs, 64)
    assert packed.stranded == {"big": 16} and packed.elapsed_s == 30.0  # the 32s run together after it
    assert packed.busy_device_s == 48 * 20 + 2 * 32 * 10


def test_a_run_larger_than_the_cluster_never_starts_and_is_named():
    packed = pack([Job("huge", 128, 1.0), Job("ok", 8, 2.0)], 64)
    assert packed.too_big == ("huge",) and packed.elapsed_s == 2.0
    with pytest.raises(ConfigError, match="at least 1"):
        pack([], 0)


def test_a_measured_file_gives_per_device_rates(tmp_path):
    simple = tmp_path / "one.json"
    simple.write_text(json.dumps({"flops_per_s": 3e14}))
    assert file_rates(simple) == {("*",): 3e14}
    measured = tmp_path / "throughput.json"
    rows = [
        {"n_layer": 12, "d_model": 896, "variant": "baseline", "flops_per_s": 2e14},
        {"n_layer": 12, "d_model": 896, "variant": "block8", "flops_per_s": 1.8e14},
        {"n_layer": 13, "d_model": 960, "variant": "baseline", "flops_per_s": 2.2e14},
    ]
    measured.write_text(json.dumps({"device": "NVIDIA H100", "measured": rows}))
    rates = file_rates(measured)
    assert rates[(12, 896, "block8")] == 1.8e14 and rates[("*",)] == 2e14
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="expected"):
        file_rates(tmp_path / "bad.json")


def test_the_paper_grid_packed_onto_64_gpus_prints_its_elapsed_time(tmp_path):
    rate = tmp_path / "rate.json"
    rate.write_text(json.dumps({"flops_per_s": 3e14}))
    args = ["sweep", "plan", "paper", "runtime.device_memory_gb=null", "--gpus", "64", "--results", str(tmp_path)]
    out = attnres(*args)
    assert out.returncode == 0, out.stderr
    packed = [line for line in out.stdout.splitlines() if line.startswith("packed onto 64 devices")]
    assert packed and "(32/48 per run)" in packed[0] and "elapsed" in packed[0], out.stdout
    assert "strands 16 device(s)" in out.stdout  # each 6-node run beside 4-node ones
    assert "guess, never measured" in out.stdout  # the default GPU rate says what it is
    measured = attnres(*args, "--flops-file", rate)
    assert measured.returncode == 0 and "throughput: file" in measured.stdout, measured.stdout + measured.stderr
