"""What a plan says about its estimates: which throughputs are unmeasured defaults, and a GPU grid planned on a CPU."""

from __future__ import annotations

from pathlib import Path

import yaml

from sweeps import load_grid
from sweeps.plan import format_plan, human_time, plan

ROOT = Path(__file__).resolve().parents[2]


def gpu_grid(tmp_path: Path) -> Path:
    grid = yaml.safe_load((ROOT / "sweeps" / "smoke.yaml").read_text())
    grid["name"] = "gpuish"
    grid["slurm"] = {"gpus_per_node": 8, "nodes": 1, "cpus_per_task": 8, "time_min": 60}
    path = tmp_path / "gpuish.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def test_long_estimates_read_in_years():
    assert human_time(431_434.7 * 86400) == "1,181 years"
    assert human_time(3 * 86400) == "3.0d" and human_time(43.8 * 3600) == "43.8h"


def test_a_plan_on_default_gpu_throughput_says_it_is_an_unmeasured_guess(tmp_path):
    grid = load_grid(gpu_grid(tmp_path))
    text = format_plan(grid, plan(grid, None, launcher="slurm"), launcher="slurm", parallel=2)
    assert "throughput: default; the defaults are not measured here: 1.5e+14 FLOP/s per GPU" in text, text
    assert "an A100/H100-class guess, never measured on this project's runs" in text, text
    assert "once a few runs have finished the plan uses their speed, or give --flops-per-s" in text, text


def test_a_gpu_grid_planned_on_this_cpu_says_it_is_sized_for_a_cluster(tmp_path):
    grid = load_grid(gpu_grid(tmp_path))
    text = format_plan(grid, plan(grid, None, launcher="local"), launcher="local")
    assert "9.5e+10 FLOP/s and 11.5 ms a step per CPU run (fitted to the committed CPU study's runs" in text, text
    assert "note: this grid asks SLURM for 8 GPU(s) per node (slurm.gpus_per_node): it is sized for a cluster" in text
    assert "plan it with --launcher slurm" in text
    smoke = load_grid("smoke")
    assert "sized for a cluster" not in format_plan(smoke, plan(smoke, None))


def test_a_plan_given_its_throughput_says_nothing_about_defaults(tmp_path):
    grid = load_grid(gpu_grid(tmp_path))
    text = format_plan(grid, plan(grid, None, launcher="slurm", flops_per_s=1e14), launcher="slurm")
    assert "throughput: given; see --flops-per-s" in text and "not measured" not in text, text
