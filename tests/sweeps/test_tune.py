"""``attnres tune``: a few Optuna trials per (size, variant), the tuned file, and grids with ``lr: tuned``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnres.config import ConfigError
from sweeps import expand, load_grid
from sweeps.claim import read_status
from tests.cli_helpers import attnres

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
        "widen": 0,  # two trials: the best is always near an edge; widening has its own test
        "finalists": 0,  # and so do the finalists (a second seed), which would double these small studies
    },
}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tune")
    grid_file = folder / "tinytune.yaml"
    grid_file.write_text(yaml.safe_dump(GRID))
    results = folder / "results"
    from sweeps.tuning import tune

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
    out = attnres("tune", grid_file, "--results", results, "--variants", "baseline", "full", "--threads", "1")
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
    from sweeps.tuning import tune

    with pytest.raises(ConfigError, match="tune.budget is missing"):
        tune(load_grid(data), Path(tmp_path))


def test_a_pruned_trial_stops_its_run_part_way(tmp_path, monkeypatch):
    import optuna

    import sweeps.tuning as tune_module

    monkeypatch.setattr(tune_module, "_pruner", lambda grid: optuna.pruners.ThresholdPruner(upper=0.0))  # prune at once
    data = {**GRID, "name": "prune", "tune": {**GRID["tune"], "trials": 1}}
    best = tune_module.tune(load_grid(data), tmp_path, threads=1, log=lambda _: None)
    assert best == {}  # nothing complete, nothing written
    assert not (tmp_path / "prune-tune" / "tuned.yaml").exists()
    (trial,) = [p for p in (tmp_path / "prune-tune").iterdir() if (p / "run.parquet").exists()]
    row = read_status(trial)
    # 16 steps, evaluated every 5: not pruned at step 5, stopped at its first evaluation after half of its steps
    assert row["status"] == "running" and row["step"] == 10 < row["max_steps"]


KILLED_TUNER = """
import os, sys
import sweeps.tuning as tune
from sweeps import load_grid

make_callback = tune.pruning_callback


def dies_at_step_10(trial, **kwargs):
    callback = make_callback(trial, **kwargs)
    report = callback.on_validation_end

    def on_validation_end(trainer, module):
        report(trainer, module)
        if trainer.global_step >= 10:  # after the step-5 checkpoint, before this evaluation's
            os._exit(9)  # like SIGKILL: no clean-up, the trial stays RUNNING in the journal

    callback.on_validation_end = on_validation_end
    return callback


tune.pruning_callback = dies_at_step_10
tune.tune(load_grid(sys.argv[1]), sys.argv[2], threads=1)
"""


@pytest.mark.integration  # kill and resume: pytest -m integration
def test_a_trial_whose_tuner_was_killed_resumes_its_run_with_the_same_values(tmp_path, capsys):
    import optuna

    import sweeps.tuning as tune_module
    from sweeps.tuning import storage_for

    data = {**GRID, "name": "killed", "tune": {**GRID["tune"], "trials": 1, "pruner": "none"}}
    grid_file = tmp_path / "killed.yaml"
    grid_file.write_text(yaml.safe_dump(data))
    results = tmp_path / "results"
    died = subprocess.run(
        [sys.executable, "-c", KILLED_TUNER, str(grid_file), str(results)], capture_output=True, text=True, timeout=300
    )
    assert died.returncode == 9, died.stderr

    def runs() -> list[Path]:
        return [p for p in (results / "killed-tune").iterdir() if (p / "run.parquet").exists()]

    (run_dir,) = runs()
    assert read_status(run_dir)["status"] == "running"  # interrupted part way
    grid = load_grid(grid_file)
    study = optuna.load_study(study_name="killed/L2-d32/baseline", storage=storage_for(grid, results, None))
    (lost,) = study.get_trials()
    assert lost.state == optuna.trial.TrialState.RUNNING

    said = []
    best = tune_module.tune(grid, results, threads=1, log=said.append)
    assert any("trial(s) 0 were interrupted; their values go first" in line for line in said), said
    assert runs() == [run_dir]  # no new point: the same run
    row = read_status(run_dir)
    assert row["status"] == "done"
    assert (
        f"{run_dir.name}: resuming from" in capsys.readouterr().out
    )  # (pytest's capture, not train.log, gets it here)
    lost, retry = study.get_trials()
    assert lost.state == optuna.trial.TrialState.FAIL
    assert retry.state == optuna.trial.TrialState.COMPLETE and retry.params == lost.params
    assert retry.user_attrs["retry_of"] == 0 and retry.user_attrs["run_id"] == run_dir.name
    assert best[("L2-d32", "baseline")]["lr"] == lost.params["lr"]
    assert best[("L2-d32", "baseline")]["val_loss"] == row["val_loss"]


def test_only_the_trials_of_a_tuner_that_is_gone_are_retried(tmp_path):
    import optuna

    from attnres.storage import locks
    from sweeps.tuning import TUNERS_DIR, retry_abandoned

    study = optuna.create_study()
    live, gone, unnamed = study.ask(), study.ask(), study.ask()
    for trial, tuner in ((live, "live"), (gone, "gone"), (unnamed, None)):
        trial.suggest_float("lr", 1e-3, 1e-2, log=True)
        if tuner:
            trial.set_user_attr("tuner", tuner)
    with locks.exclusive(tmp_path / TUNERS_DIR / "gone"):
        pass  # a tuner that lived and died
    with locks.exclusive(tmp_path / TUNERS_DIR / "live"):  # another tuner, still training its trial
        assert retry_abandoned(study, tmp_path) == [1]
    states = [t.state for t in study.get_trials()]
    assert states == [
        optuna.trial.TrialState.RUNNING,
        optuna.trial.TrialState.FAIL,
        optuna.trial.TrialState.RUNNING,
        optuna.trial.TrialState.WAITING,
    ]
    retry = study.ask()  # the enqueued one comes first, with the lost trial's value
    assert retry.user_attrs == {"retry_of": 1} and retry.suggest_float("lr", 1e-3, 1e-2, log=True) == gone.params["lr"]


def test_a_best_lr_at_the_edge_widens_the_range_and_the_optimum_beyond_it_is_found(tmp_path, monkeypatch):
    """A synthetic objective (no training) with its optimum at 2e-2, above the first range [1e-3, 6e-3]."""
    import math

    import sweeps.tuning as tuning

    seen: dict[str, list[float]] = {}

    def synthetic(grid, size, label, results, threads, tuner, lr_range):
        def objective(trial):
            lr = trial.suggest_float("lr", *lr_range, log=True)
            seen.setdefault(size.name, []).append(lr)
            return (math.log(lr) - math.log(2e-2)) ** 2

        return objective

    monkeypatch.setattr(tuning, "_objective", synthetic)
    grid = {**GRID, "ladder": {"depths": [2, 3], "width_per_layer": 16, "head_dim": 16}}
    grid["tune"] = {**GRID["tune"], "trials": 8, "lr": [1e-3, 6e-3], "widen": 2, "finalists": 0}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(grid))
    logs: list[str] = []
    best = tuning.tune(load_grid(path), tmp_path / "results", variants=["baseline"], threads=1, log=logs.append)
    for entry in best.values():
        assert entry["widened"] >= 1 and entry["lr_range"][1] >= 2e-2  # widened upwards past the optimum
        assert abs(math.log(entry["lr"] / 2e-2)) < math.log(1.3)  # and found it within 30 %
        assert entry["lr_at_edge"] is None
    assert any("at the high edge of the range searched; widening it" in line for line in logs)
    sizes = sorted(seen)
    assert len(sizes) == 2 and set(seen[sizes[0]]).isdisjoint(seen[sizes[1]])  # other points at every size


def test_no_trial_is_pruned_before_its_learning_rate_warm_up_ends():
    from types import SimpleNamespace

    from sweeps.tuning import pruning_callback

    class AlwaysPrune:
        reported: list = []

        def report(self, value, step):
            self.reported.append(step)

        def should_prune(self):
            return True

    callback = pruning_callback(AlwaysPrune(), no_pruning_before=20)
    module = SimpleNamespace(val_loss=3.0)
    for step in (10, 19, 20):
        trainer = SimpleNamespace(sanity_checking=False, global_step=step, should_stop=False)
        callback.on_validation_end(trainer, module)
        assert trainer.should_stop == (step >= 20)  # reported at every evaluation, pruned only after warm-up
    assert AlwaysPrune.reported == [10, 19, 20] and callback.pruned_at == 20


def test_the_finalists_are_trained_again_with_a_second_seed_and_the_mean_picks_the_winner(tmp_path, monkeypatch):
    """Synthetic: with seed 0 the largest lr tried wins; seed 1 penalises large rates twice as hard, so over both
    seeds the runner-up wins."""
    import sweeps.tuning as tuning

    calls: list[tuple[float, int]] = []

    def synthetic(grid, size, label, results, threads, tuner, lr_range):
        def objective(trial):
            lr = trial.suggest_float("lr", *lr_range, log=True)
            seed = int(trial.user_attrs.get("seed", 0))
            calls.append((lr, seed))
            return -lr if seed == 0 else 2 * lr

        return objective

    monkeypatch.setattr(tuning, "_objective", synthetic)
    grid = {**GRID, "seeds": [0, 1]}
    grid["tune"] = {**GRID["tune"], "trials": 6, "lr": [1e-3, 1e-2], "widen": 0, "finalists": 2}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(grid))
    logs: list[str] = []
    (entry,) = tuning.tune(load_grid(path), tmp_path / "results", threads=1, log=logs.append).values()
    searched = sorted(lr for lr, seed in calls if seed == 0)
    assert sorted(lr for lr, seed in calls if seed == 1) == searched[-2:]  # the two best, again with seed 1
    assert entry["lr"] == searched[-2]  # not the search's winner, searched[-1]: the mean over seeds decides
    assert entry["val_loss"] == searched[-2] / 2 and entry["seeds"] == [0, 1]
    assert sorted(f["lr"] for f in entry["finalists"]) == searched[-2:]
    assert any("again with seed 1" in line for line in logs)
    before = len(calls)  # running tune again trains nothing more: the finalists' study is full
    tuning.tune(load_grid(path), tmp_path / "results", threads=1, log=lambda _: None)
    assert len(calls) == before


def test_the_per_variant_protocol_needs_every_variants_own_values_and_an_unknown_protocol_is_refused(tuned, tmp_path):
    grid_file, results, _ = tuned  # tuned baseline and full, not block2
    data = {**yaml.safe_load(grid_file.read_text()), "lr": "tuned-per-variant"}
    path = tmp_path / "tinytune.yaml"
    path.write_text(yaml.safe_dump(data))
    grid = load_grid(path)
    assert grid.tune_command("R").endswith("--variants all")  # tune every variant, the same trials each
    with pytest.raises(ConfigError, match=r"no value for size L2-d32 \(variant block2\)"):
        expand(grid, results=results)
    from sweeps.tuning import _labels

    assert _labels(grid, grid.sizes[0], None) == ["baseline", "full", "block2"]
    data["lr"] = "tuned-everything"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"not a tuning protocol; choose tuned-baseline .* tuned-per-variant"):
        load_grid(path)


def test_no_trial_is_pruned_before_half_of_its_steps_or_its_warm_up():
    from attnres.config import RunConfig, from_dict
    from sweeps.tuning import _no_pruning_before

    def run_of(warmup_frac):  # 100 steps of 8 x 128 tokens
        return from_dict(
            RunConfig,
            {"model": {"seq_len": 128}, "train": {"tokens": 100 * 1024, "batch_size": 8, "warmup_frac": warmup_frac}},
        )

    run = run_of(0.05)
    assert _no_pruning_before(run, 0.5) == 50
    assert _no_pruning_before(run, 0.0) == 5  # the warm-up alone (what committed studies' tuning did)
    late = run_of(0.6)
    assert _no_pruning_before(late, 0.5) == 60


def test_finalists_are_at_least_the_spacing_apart():
    from types import SimpleNamespace

    from sweeps.tuning import pick_finalists

    trials = [SimpleNamespace(value=v, params={"lr": lr}) for lr, v in ((1.97e-3, 1.0), (1.985e-3, 1.01), (4e-3, 1.1))]
    assert [t.params["lr"] for t in pick_finalists(trials, 2, 1.25)] == [1.97e-3, 4e-3]
    assert [t.params["lr"] for t in pick_finalists(trials, 2, 1.0)] == [1.97e-3, 1.985e-3]  # the old rule


def test_trials_take_the_warm_up_and_decay_of_the_runs_they_tune_for(tmp_path):
    """A grid of WSD branches at 8 and 16 tokens/param: its runs warm up over a shared number of tokens (10 % of
    the shortest branch) and decay 20 %; a trial at 4 tokens/param copies both instead of its own 5 %."""
    from sweeps.tuning import run_schedule

    data = {
        **GRID,
        "lr": [3e-3],
        "budgets": [{"tokens_per_param": [8, 16]}],
        "branches": {"decay_frac": 0.2},
        "defaults": {**GRID["defaults"], "train": {**GRID["defaults"]["train"], "warmup_frac": 0.05}},
    }
    grid = load_grid(data)
    size = grid.sizes[0]
    schedule = run_schedule(grid, size, "baseline")
    branch = next(r for r in expand(grid, tmp_path) if r.sweep == grid.name and r.model.residual == "baseline")
    assert schedule["warmup_tokens"] == branch.train.warmup_tokens > 0
    assert schedule["schedule"] == "wsd" and schedule["wsd_decay_frac"] == 0.2


def test_a_slurm_tuner_on_a_gpu_grid_trains_its_trials_on_its_own_gpu():
    """Each tuner is one task with one GPU of the grid's nodes, and its trials train there (not just its threads)."""
    from sweeps.tune_slurm import tuner_resources

    res, runtime = tuner_resources(load_grid("paper"))
    assert (res.nodes, res.tasks, res.gpus_per_node, res.cpus_per_task) == (1, 1, 1, 12)
    assert runtime == {
        "accelerator": "gpu", "devices": 1, "num_nodes": 1, "threads": 12, "progress_bar": False, "strategy": "ddp"
    }  # fmt: skip
    res, runtime = tuner_resources(load_grid("smoke"))
    assert res.gpus_per_node == 0 and runtime["accelerator"] == "cpu" and runtime["devices"] == 1
