"""Pooling results trees (``load_results(root, pool=...)``, ``attnres fit/report --pool``): a study carried on in a
folder of its own is fitted with the runs it extends, exactly as if every run lay under one root."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from analysis import ResultsError, fit_results, load_results
from tests.cli_helpers import attnres
from tests.synthetic_results import write_synthetic_results

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """One synthetic sweep, whole under ``whole/``, and the same runs split between ``first/`` (the smaller
    budgets) and ``second/`` (the largest two), both under the sweep's own name."""
    base = tmp_path_factory.mktemp("pool")
    whole = base / "whole"
    tree = write_synthetic_results(whole, seeds=2, noise=0.004, multipliers={"baseline": 1.0, "block": 1.2})
    first, second = base / "first", base / "second"
    shutil.copytree(whole, first)
    largest = sorted(tree.runs["flops"].unique())[-2:] if "flops" in tree.runs else None
    assert largest is not None
    for _, run in tree.runs.iterrows():
        if run["flops"] in largest:
            target = second / run["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(first / run["path"]), str(target))
    return whole, first, second


def test_a_pooled_tree_loads_and_fits_as_one_tree(split):
    whole, first, second = split
    alone = load_results(first)
    pooled = load_results(first, pool=[second])
    together = load_results(whole)
    assert len(alone.runs) < len(pooled.runs) == len(together.runs)
    assert pooled.inputs_hash == together.inputs_hash != alone.inputs_hash  # the hash is of the runs, not folders
    assert pooled.pooled == (second,)
    assert pooled.runs["path"].str.startswith("../second/").sum() == len(together.runs) - len(alone.runs)
    for path in pooled.runs["path"]:  # root / path is the run folder, pooled or not
        assert (first / path / "run.parquet").is_file()
    assert len(pooled.layers) == len(together.layers) and len(pooled.metrics) == len(together.metrics)
    a, b = fit_results(pooled, n_boot=50), fit_results(together, n_boot=50)
    (ma,), (mb,) = (r.sweeps[0].multipliers for r in (a, b))
    assert ma.multiplier == mb.multiplier and ma.paired == mb.paired
    assert a.to_dict()["pooled_dirs"] == [str(second)] and "pooled_dirs" not in b.to_dict()


def test_bad_pools_are_refused_before_any_fit(split, tmp_path):
    _, first, second = split
    with pytest.raises(ResultsError, match="pooled results directory .* does not exist"):
        load_results(first, pool=[tmp_path / "nowhere"])
    with pytest.raises(ResultsError, match="is RESULTS_DIR itself"):
        load_results(first, pool=[first])
    with pytest.raises(ResultsError, match="would count more than once"):
        load_results(first, pool=[second, split[0]])  # the whole tree holds the same runs again


def test_attnres_fit_pool(split, tmp_path):
    _, first, second = split
    out = tmp_path / "fit.json"
    cmd = ["fit", first, "--pool", second, "--n-boot", "20"]
    proc = attnres(*cmd, "--out", out)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads(out.read_text())
    assert saved["pooled_dirs"] == [str(second)] and saved["n_runs"] == len(load_results(first, pool=[second]).runs)
    bad = attnres(*cmd[:-4], "--pool", tmp_path / "nowhere")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--pool" in bad.stderr
