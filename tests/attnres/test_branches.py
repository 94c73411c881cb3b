"""WSD cooldown branches: a grid's trunk and branches, and a branch from its trunk equal to the branch from step 0."""

from __future__ import annotations

import pandas as pd
import pytest

from attnres.config import ConfigError
from attnres.training.branches import TRUNK_SUFFIX, branch_step, trunk_of
from attnres.training.run import train
from sweeps import expand_runs, load_grid, run_grid

GRID = {
    "name": "wsd",
    "defaults": {
        "model": {"seq_len": 64},
        "train": {"batch_size": 8, "micro_batch_size": 4, "eval_interval": 20, "eval_tokens": 4096, "warmup_frac": 0.1},
        "runtime": {"threads": 2},
    },
    "ladder": {"depths": [2], "width_per_layer": 16, "head_dim": 16},
    "budgets": [{"tokens": 12000}, {"tokens": 24000}],
    "variants": ["block2"],
    "seeds": [0],
    "branches": {"decay_frac": 0.2},
}


def val_loss(run_dir) -> float:
    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    return float(metrics[metrics["split"] == "val"]["loss"].iloc[-1])


def test_a_grid_with_branches_has_one_trunk_first_and_branches_sharing_its_warmup():
    runs = expand_runs(load_grid(GRID))
    assert [r.role for r in runs] == ["trunk", "branch", "branch"]
    trunk, *branches = (r.cfg for r in runs)
    assert trunk.sweep == "wsd" + TRUNK_SUFFIX and trunk.train.schedule == "constant"
    assert {b.train.schedule for b in branches} == {"wsd"} and {b.sweep for b in branches} == {"wsd"}
    assert len({c.train.warmup_tokens for c in runs_cfgs(runs)}) == 1  # one warm-up: 10 % of the longest branch
    assert trunk.train.save_at_steps == tuple(sorted(branch_step(b) for b in branches))
    assert all(trunk_of(b).run_id == trunk.run_id for b in branches)  # each branch finds its trunk
    # the trunk runs up to the last branch's decay start: 80 % of the longest branch
    assert trunk.train.tokens == branch_step(branches[-1]) * 8 * 64


def runs_cfgs(runs):
    return [r.cfg for r in runs]


# Muon's case (a checkpoint of two optimizers' states) in the integration tier: the default suite's budget is 10 minutes
@pytest.mark.parametrize("optimizer", ["adamw", pytest.param("muon", marks=pytest.mark.integration)])
def test_a_branch_from_its_trunk_ends_where_the_branch_from_step_0_ends(tmp_path, capfd, optimizer):
    """The trunk's checkpoint at a branch's decay start (mid-run, under gradient accumulation, and the trunk's very
    last step) continues to exactly the loss the branch reaches trained alone from step 0, with either optimizer
    (Muon's checkpoint holds two optimizers' states, whose learning rates the branch's schedule sets)."""
    grid = {**GRID, "defaults": {**GRID["defaults"], "train": {**GRID["defaults"]["train"], "optimizer": optimizer}}}
    summary = run_grid(load_grid(grid), tmp_path / "res", threads=2, progress=False)  # the threads `alone` uses
    assert summary.counts.get("done") == 3
    for run in expand_runs(load_grid(grid))[1:]:
        branch_dir = tmp_path / "res" / run.cfg.sweep / run.cfg.run_id
        log = (branch_dir / "train.log").read_text()
        assert f"starting from its trunk's checkpoint at step {branch_step(run.cfg)}" in log
        capfd.readouterr()
        alone = train(run.cfg, tmp_path / "alone" / run.cfg.run_id, progress=False)
        assert "no trunk checkpoint" in capfd.readouterr().err
        assert alone.status == "done" and val_loss(branch_dir) == pytest.approx(alone.val_loss, rel=1e-6, abs=0)


def test_branch_budgets_beyond_the_stable_trunk_are_refused():
    with pytest.raises(ConfigError, match="beyond its stable trunk"):
        expand_runs(load_grid({**GRID, "branches": {"stable": {"tokens": 5000}}}))
    uncapped = {"decay_frac": 0.2, "max_warmup_frac": None}
    short_and_long = [{"tokens": 1024}, {"tokens": 60000}]
    with pytest.raises(ConfigError, match="inside the 12-step warm-up it shares"):
        expand_runs(load_grid({**GRID, "budgets": short_and_long, "branches": uncapped}))
    # the default cap (10 % of the shortest branch) keeps the shared warm-up inside every branch
    runs = expand_runs(load_grid({**GRID, "budgets": short_and_long}))
    assert {r.cfg.train.warmup_tokens for r in runs} == {round(0.1 * 1024)}
    with pytest.raises(ConfigError, match="branches.decay_frac must be a fraction"):
        load_grid({**GRID, "branches": {"decay_frac": 1.5}})


def test_a_branch_start_cut_short_leaves_nothing_and_a_whole_one_is_the_only_file(tmp_path, monkeypatch):
    """The branch's start checkpoint is written as the run's own are (verified, then moved into place): a full disk
    part way leaves no file (it left a checkpoint-sized ``branch-start.tmp`` that nothing removed) and says so."""
    import contextlib
    import errno
    import os

    import torch

    from attnres.training.branches import BRANCH_START, branch_start, step_checkpoint

    branch = expand_runs(load_grid(GRID))[1].cfg
    run_dir = tmp_path / "res" / branch.sweep / branch.run_id
    trunk = trunk_of(branch)
    start = branch_step(branch)
    source = step_checkpoint(tmp_path / "res" / trunk.sweep / trunk.run_id, start)
    source.parent.mkdir(parents=True)
    torch.save(  # a trunk's checkpoint as branch_start reads it: its step, its optimizer's groups, its loop's state
        {
            "global_step": start,
            "optimizer_states": [{"param_groups": [{"lr": 1e-3, "params": [0]}], "state": {}}],
            "loops": {"fit_loop": {"epoch_loop.batch_progress": {"is_last_batch": True}}},
            "callbacks": {"ModelCheckpoint{}": {}},
            "state_dict": {"w": torch.ones(4096)},
        },
        source,
    )
    saved = torch.save

    def full_disk(obj, f):  # noqa: ANN001 (torch.save's signature: a path or a file)
        with open(f, "wb") if isinstance(f, (str, os.PathLike)) else contextlib.nullcontext(f) as out:
            out.write(b"PK\x03\x04" + b"\0" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="No space left on device") as raised:
        branch_start(branch, run_dir)
    assert raised.value.filename == str(run_dir / "checkpoints" / BRANCH_START)
    folder = run_dir / "checkpoints"
    assert not folder.is_dir() or list(folder.iterdir()) == [], list(folder.iterdir())

    monkeypatch.setattr(torch, "save", saved)
    assert branch_start(branch, run_dir) == str(folder / BRANCH_START)
    assert [p.name for p in folder.iterdir()] == [BRANCH_START]
    ready = torch.load(folder / BRANCH_START, weights_only=False)
    assert ready["loops"]["fit_loop"]["epoch_loop.batch_progress"]["is_last_batch"] is False
    assert ready["callbacks"] == {} and torch.equal(ready["state_dict"]["w"], torch.ones(4096))
