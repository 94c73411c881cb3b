"""``reuse:``: a grid takes the finished runs of equal run id from another sweep (trunks included) instead of
training them again, files them under its own sweep, and trains the rest; bad ``reuse:`` and a tuned file of
another grid are refused before compute."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.data.load import load_results
from attnres.config import ConfigError
from sweeps import load_grid, run_grid
from sweeps.claim import read_status
from sweeps.plan import plan
from sweeps.tuned_values import check_writer, write_tuned

GRID = {
    "name": "paper",
    "defaults": {
        "model": {"seq_len": 64},
        "train": {"batch_size": 8, "eval_interval": 20, "eval_tokens": 2048, "warmup_frac": 0.1},
        "runtime": {"threads": 2},
    },
    "ladder": {"depths": [2], "width_per_layer": 16, "head_dim": 16},
    "budgets": [{"tokens": 10000}],  # one branch of a trunk (as many as it takes: the trunk is reused too)
    "variants": ["baseline"],
    "seeds": [0],
    "lr": 3e-3,
    "branches": {"decay_frac": 0.2},
}


def trained(run_dir) -> int:
    """Training attempts in a run's log (one header line each)."""
    return sum(line.startswith("====") for line in (run_dir / "train.log").read_text().splitlines())


def test_a_grid_reuses_the_finished_runs_of_another_sweep_and_trains_only_its_own(tmp_path):
    run_grid(load_grid(GRID), tmp_path, progress=False)
    other = {**GRID, "name": "other", "variants": ["baseline", "full"], "reuse": ["paper"]}
    planned = {(r.variant, r.status) for r in plan(load_grid(other), tmp_path)}
    assert planned == {("baseline trunk", "reuse"), ("baseline", "reuse"), ("full trunk", None), ("full", None)}
    lines: list[str] = []
    summary = run_grid(load_grid(other), tmp_path, progress=False, log=lines.append)
    assert summary.ok
    assert any("reuse: copied 2 finished run(s) with the same run id from paper, paper-trunk" in ln for ln in lines)

    for sweep in ("other", "other-trunk"):
        for run_dir in (tmp_path / sweep).glob("baseline-*"):
            source = tmp_path / sweep.replace("other", "paper") / run_dir.name
            assert trained(run_dir) == trained(source)  # copied, not trained again
            assert "reused: copied from" in (run_dir / "train.log").read_text()
            mine, theirs = read_status(run_dir), read_status(source)
            assert mine.pop("sweep") == sweep and theirs.pop("sweep") == sweep.replace("other", "paper")
            assert mine == theirs
            assert (run_dir / "config.yaml").read_text().startswith(f"sweep: {sweep}\n")
    assert len(list((tmp_path / "other").glob("full-*"))) == 1  # Full's branch was trained here
    assert not list((tmp_path / "other").glob(".*"))  # no staging folder left behind

    results = load_results(tmp_path)
    assert not results.problems  # the copies are their own (sweep, run_id), never a duplicate
    runs = results.runs
    baseline = runs[runs["variant"] == "baseline"].pivot_table(index="run_id", columns="sweep", values="val_loss")
    pd.testing.assert_series_equal(baseline["other"], baseline["paper"], check_names=False)

    again: list[str] = []
    run_grid(load_grid(other), tmp_path, progress=False, log=again.append)  # nothing left to copy or train
    assert not any("reuse:" in ln for ln in again)


def test_only_the_grids_own_sweeps_map_to_the_other_sweeps():
    from sweeps.reuse import source_sweep

    assert source_sweep("pv", "pv", "paper") == "paper"
    assert source_sweep("pv-trunk", "pv", "paper") == "paper-trunk"
    assert source_sweep("pv2", "pv", "paper") is None  # a sweep= override: filed elsewhere, not reused


def test_bad_reuse_is_refused_when_the_grid_loads():
    with pytest.raises(ConfigError, match="reuse: 'paper' is this grid's own sweep"):
        load_grid({**GRID, "reuse": ["paper"]})
    with pytest.raises(ConfigError, match="reuse: 'a b' is not a sweep name"):
        load_grid({**GRID, "reuse": ["a b"]})


def test_a_tuned_file_written_by_another_grid_is_only_read(tmp_path):
    path = tmp_path / "paper-tune" / "tuned.yaml"
    write_tuned(path, "paper", "L2-d32", "baseline", {"lr": 3e-3, "val_loss": 2.0})
    check_writer(path, "paper")  # its own grid tops it up
    with pytest.raises(ConfigError, match="written by the tuning of grid 'paper'.*attnres tune paper"):
        check_writer(path, "other")
