"""``attnres tune``: a few Optuna trials per (size, variant), the tuned file, and grids with ``lr: tuned``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnres.config import ConfigError
from sweeps import expand, load_grid
from sweeps.runner import read_status

GRID = {
    "name": "tinytune",
    "defaults": {"model": {"seq_len": 64}, "train": {"batch_size": 16, "eval_interval": 10, "eval_tokens": 4096}},
    "ladder": {"depths": [2], "width_per_layer": 16, "head_dim": 16},
    "budgets": [{"tokens": 30000}],
    "variants": ["baseline", "full", {"block": [2]}],
    "seeds": [0],
    "lr": "tuned",
    "tune": {
        "budget": {"tokens": 16000},
        "trials": 2,
        "lr": [1e-3, 1e-2],
        "pruner": {"type": "median", "startup_trials": 1},
        "eval_interval": 5,
    },
}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tune")
    grid_file = folder / "tinytune.yaml"
    grid_file.write_text(yaml.safe_dump(GRID))
    results = folder / "results"
    from sweeps.tune import tune

    best = tune(load_grid(grid_file), results, variants=["baseline", "full"], threads=1, log=lambda _: None)
    return grid_file, results, best


def test_tune_writes_the_best_values_per_size_and_variant(tuned):
    grid_file, results, best = tuned
    assert set(best) == {("L2-d32", "baseline"), ("L2-d32", "full")}
    path = results / "tinytune-tune" / "tuned.yaml"
    data = yaml.safe_load(path.read_text())
    entry = data["sizes"]["L2-d32"]["baseline"]
    assert 1e-3 <= entry["lr"] <= 1e-2 and entry["trials"] == 2 and entry["complete"] + entry["pruned"] == 2
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(results / "tinytune-tune" / "optuna.journal")))
    study = optuna.load_study(study_name="tinytune/L2-d32/baseline", storage=storage)
    assert study.best_value == entry["val_loss"] and study.best_params["lr"] == entry["lr"]
    # the trials are ordinary runs in their own sweep folder, apart from the study's runs
    trial_dirs = [p for p in (results / "tinytune-tune").iterdir() if (p / "run.parquet").exists()]
    assert len(trial_dirs) == 4
    assert {read_status(p)["sweep"] for p in trial_dirs} == {"tinytune-tune"}
    assert read_status(results / "tinytune-tune" / entry["run_id"])["val_loss"] == pytest.approx(entry["val_loss"])
    assert (results / "tinytune-tune" / "optuna.journal").exists()
    assert not (results / "tinytune").exists()


def test_a_grid_with_lr_tuned_picks_the_values_up(tuned):
    grid_file, results, _ = tuned
    data = yaml.safe_load((results / "tinytune-tune" / "tuned.yaml").read_text())["sizes"]["L2-d32"]
    runs = {r.model.residual: r for r in expand(load_grid(grid_file), results)}
    assert runs["baseline"].train.lr == data["baseline"]["lr"]
    assert runs["full"].train.lr == data["full"]["lr"]  # tuned on its own
    assert runs["block"].train.lr == data["baseline"]["lr"]  # not tuned: the baseline's (the paper's protocol)
    shared = yaml.safe_load(grid_file.read_text()) | {"lr": "tuned-baseline"}
    runs = expand(load_grid(shared), results)
    assert {r.train.lr for r in runs} == {data["baseline"]["lr"]}


def test_tuning_again_tops_up_instead_of_starting_over(tuned):
    grid_file, results, _ = tuned
    before = sorted(p.name for p in (results / "tinytune-tune").iterdir())
    out = subprocess.run(
        [sys.executable, "-m", "attnres.cli", "tune", str(grid_file), "--results", str(results), "--variants", "baseline", "full", "--threads", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "tuned 2 (size, variant) pair(s)" in out.stdout
    assert sorted(p.name for p in (results / "tinytune-tune").iterdir()) == before  # no new trial


def test_an_untuned_size_is_a_clear_error(tuned, tmp_path):
    grid_file, results, _ = tuned
    bigger = yaml.safe_load(grid_file.read_text())
    bigger["ladder"] = {"depths": [2, 3], "width_per_layer": 16, "head_dim": 16}
    with pytest.raises(ConfigError, match=r"no value for size L3-d48.*attnres tune"):
        expand(load_grid(bigger), results)


def test_tune_needs_a_budget(tmp_path):
    data = dict(GRID)
    data["tune"] = {"trials": 2}
    from sweeps.tune import tune

    with pytest.raises(ConfigError, match="tune.budget is missing"):
        tune(load_grid(data), Path(tmp_path))


def test_a_pruned_trial_stops_its_run_part_way(tmp_path, monkeypatch):
    import optuna

    import sweeps.tune as tune_module

    monkeypatch.setattr(tune_module, "_pruner", lambda grid: optuna.pruners.ThresholdPruner(upper=0.0))  # prune at once
    data = {**GRID, "name": "prune", "tune": {**GRID["tune"], "trials": 1}}
    best = tune_module.tune(load_grid(data), tmp_path, threads=1, log=lambda _: None)
    assert best == {}  # nothing complete, nothing written
    assert not (tmp_path / "prune-tune" / "tuned.yaml").exists()
    (trial,) = [p for p in (tmp_path / "prune-tune").iterdir() if (p / "run.parquet").exists()]
    row = read_status(trial)
    assert row["status"] == "running" and row["step"] == 5 < row["max_steps"]  # stopped at its first evaluation
