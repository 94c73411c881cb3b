"""Loading a results tree: the contract, and unreadable / unfinished runs reported by name (analysis.data.load)."""

from __future__ import annotations

import pytest
import yaml

from analysis import ResultsError, load_results
from attnres.storage.schema import (
    DEPTH_ATTN_SCHEMA,
    LAYERS_SCHEMA,
    METRICS_SCHEMA,
    RUN_SCHEMA,
    read_table,
    to_table,
    write_table,
)
from tests.synthetic_results import write_synthetic_results


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    return write_synthetic_results(
        root, seeds=1, noise=0.003, unfinished=1, failed=1, nan_loss=1, broken=1, wrong_schema=1, no_run_file=1
    )


def test_synthetic_tree_follows_the_contract(tree):
    ok = tree.runs[tree.runs["kind"] == "ok"]
    assert len(ok) == 21  # 3 variants x 7 budgets
    for _, run in ok.iterrows():
        folder = tree.root / run["path"]
        table = read_table(folder / "run.parquet", RUN_SCHEMA)
        assert table.column_names == RUN_SCHEMA.names and table.num_rows == 1
        read_table(folder / "metrics.parquet", METRICS_SCHEMA)
        read_table(folder / "layers.parquet", LAYERS_SCHEMA)
        assert (folder / "depth_attn.parquet").exists() == (run["variant"] != "baseline")
        if run["variant"] != "baseline":
            weights = read_table(folder / "depth_attn.parquet", DEPTH_ATTN_SCHEMA).to_pandas()
            sums = weights.groupby(["step", "query"])["weight"].sum()
            assert ((sums - 1.0).abs() < 1e-9).all()  # a softmax over the sources
        config = yaml.safe_load((folder / "config.yaml").read_text())
        assert config["model"]["residual"] == run["variant"] and config["train"]["seed"] == run["seed"]


def test_synthetic_config_resolves_with_the_run_config_when_available(tree):
    config = pytest.importorskip("attnres.config")
    run = tree.runs[tree.runs["kind"] == "ok"].iloc[0]
    cfg = config.resolve_run_config(tree.root / run["path"] / "config.yaml")
    assert cfg.run_id == run["run_id"]


def test_load_reads_every_table(tree):
    results = load_results(tree.root)
    assert set(RUN_SCHEMA.names) <= set(results.runs.columns) and "path" in results.runs.columns
    assert len(results.finished) == 21
    for frame in (results.metrics, results.layers, results.depth_attn):
        assert list(frame.columns[:2]) == ["sweep", "run_id"] and len(frame) > 0
    baseline_ids = set(results.runs.loc[results.runs["variant"] == "baseline", "run_id"])
    assert not set(results.depth_attn["run_id"]) & baseline_ids
    assert results.sweeps == ["synthetic"]


def test_problems_are_reported_by_run_not_raised(tree):
    results = load_results(tree.root, tables=())
    by_kind = {row["kind"]: row for _, row in tree.runs.iterrows() if row["kind"] != "ok"}
    reasons = {p.path: p.reason for p in results.problems}
    assert "unfinished: status running" in reasons[by_kind["unfinished"]["path"]]
    assert reasons[by_kind["failed"]["path"]].startswith("failed: synthetic failure")
    assert "val_loss is missing" in reasons[by_kind["nan_loss"]["path"]]
    assert "unreadable" in reasons[by_kind["broken"]["path"]]
    assert "schema_version 99" in reasons[by_kind["wrong_schema"]["path"]]
    assert "no run.parquet" in reasons[by_kind["no_run_file"]["path"]]
    assert len(results.problems) == 6
    assert str(results.problems[0]).startswith("synthetic/")


def test_inputs_hash_is_stable_and_follows_the_numbers(tmp_path):
    tree = write_synthetic_results(
        tmp_path, multipliers={"baseline": 1.0, "block": 1.2}, budgets=[1e15, 1e16, 1e17], tables=False
    )
    first = load_results(tmp_path, tables=()).inputs_hash
    assert first == load_results(tmp_path, tables=()).inputs_hash and len(first) == 64
    path = tmp_path / tree.runs["path"].iloc[0] / "run.parquet"
    row = read_table(path).to_pylist()[0]
    write_table(path, to_table([{**row, "val_loss": row["val_loss"] * 1.001}], RUN_SCHEMA))
    assert load_results(tmp_path, tables=()).inputs_hash != first


def test_inputs_hash_depends_on_the_runs_not_on_the_folder_passed(tmp_path):
    """`attnres fit results` and `attnres fit results/demo` read the same runs: the same hash (the runs' paths
    relative to the folder passed differ, and are not part of the content)."""
    write_synthetic_results(
        tmp_path / "results", sweep="demo", multipliers={"baseline": 1.0, "block": 1.2}, budgets=[1e15, 1e16]
    )
    whole = load_results(tmp_path / "results", tables=())
    one = load_results(tmp_path / "results" / "demo", tables=())
    assert set(whole.runs["path"]) != set(one.runs["path"])  # demo/<run_id> against <run_id>
    assert whole.inputs_hash == one.inputs_hash
    # a copy of the tree somewhere else is the same runs too
    import shutil

    shutil.copytree(tmp_path / "results" / "demo", tmp_path / "elsewhere" / "deeper" / "demo")
    assert load_results(tmp_path / "elsewhere", tables=()).inputs_hash == whole.inputs_hash


def test_missing_results_dir_is_one_clear_error(tmp_path):
    with pytest.raises(ResultsError, match="does not exist"):
        load_results(tmp_path / "nope")


def test_empty_results_dir_loads_empty(tmp_path):
    results = load_results(tmp_path)
    assert results.runs.empty and results.problems == () and results.sweeps == []
    assert set(RUN_SCHEMA.names) <= set(results.runs.columns)


def test_a_sweep_folder_with_its_own_config_is_not_a_run(tmp_path):
    write_synthetic_results(tmp_path, multipliers={"baseline": 1.0}, budgets=[1e15, 1e16], tables=False)
    (tmp_path / "synthetic" / "config.yaml").write_text("sweep: synthetic\n")
    results = load_results(tmp_path, tables=())
    assert len(results.runs) == 2 and results.problems == ()


def test_reading_while_a_run_rewrites_its_file_never_sees_a_mixed_file(tmp_path):
    """A report or `sweep status` reads run folders while training replaces metrics.parquet by atomic rename;
    every read must return one whole version (pyarrow's path reader mixed one file's size with another's bytes)."""
    import threading

    path = tmp_path / "metrics.parquet"
    row = {"split": "train", "tokens": 1, "flops": 1.0, "loss": 1.0, "bpb": 1.0, "wall_s": 0.0}
    stop = threading.Event()

    def rewrite():
        n = 0
        while not stop.is_set():
            n += 1  # a different length every time, as a growing metrics file has
            write_table(path, to_table([{**row, "step": s} for s in range(n % 300 + 1)], METRICS_SCHEMA))

    write_table(path, to_table([{**row, "step": 0}], METRICS_SCHEMA))
    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    try:
        for _ in range(1500):
            steps = read_table(path).column("step").to_pylist()
            assert steps == list(range(len(steps)))
    finally:
        stop.set()
        writer.join()
