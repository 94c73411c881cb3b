"""Point selection (best LR, mean or best over seeds), curve labels, and the IsoFLOP frontier (analysis.data.select)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import ChinchillaLaw, isoflop_frontier, load_results, select_points
from analysis.data.select import budget_groups, curve_labels, curve_variants, needs_frontier
from attnres.variants import Variant
from tests.synthetic_results import write_synthetic_results


def test_selection_picks_the_best_lr_then_averages_or_takes_the_best_seed(tmp_path):
    tree = write_synthetic_results(
        tmp_path,
        multipliers={"baseline": 1.0},
        budgets=[1e15, 1e16],
        seeds=3,
        lrs=(1e-3, 3e-3, 1e-2),
        noise=0.002,
        tables=False,
    )
    runs = load_results(tmp_path, tables=()).runs
    truth = tree.runs
    for method in ("mean", "best"):
        points = select_points(runs, method=method)
        assert len(points) == 2 and (points["n_runs_total"] == 9).all() and (points["n_runs"] == 3).all()
        for _, p in points.iterrows():
            same = truth[(truth["tokens"] == p["tokens"]) & np.isclose(truth["lr"], p["lr"])]
            expected = same["val_loss"].mean() if method == "mean" else same["val_loss"].min()
            assert p["loss"] == pytest.approx(expected, rel=1e-12)
            assert len(p["run_ids"]) == 3 and len(p["run_losses"]) == 3
            assert p["lr"] == 3e-3  # the synthetic LR penalty makes the middle LR best


def test_unknown_selection_is_an_error():
    with pytest.raises(ValueError, match="'mean'.*'best'"):
        select_points(pd.DataFrame(), method="mode")


def _runs(rows):
    base = {"sweep": "s", "status": "done", "lr": 1e-3, "flops_per_token": 6.0, "tokens_per_s": 1.0, "seed": 0}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_block_size_ablation_is_split_into_curves():
    runs = _runs(
        [
            {
                "run_id": "a",
                "variant": "block",
                "n_blocks": 2,
                "n_layer": 4,
                "d_model": 64,
                "tokens": 10,
                "params": 1,
                "flops": 60,
                "val_loss": 2.0,
            },
            {
                "run_id": "b",
                "variant": "block",
                "n_blocks": 8,
                "n_layer": 4,
                "d_model": 64,
                "tokens": 10,
                "params": 1,
                "flops": 60,
                "val_loss": 2.1,
            },
            {
                "run_id": "c",
                "variant": "full",
                "n_blocks": 8,
                "n_layer": 4,
                "d_model": 64,
                "tokens": 10,
                "params": 1,
                "flops": 60,
                "val_loss": 2.0,
            },
            {
                "run_id": "d",
                "variant": "full",
                "n_blocks": 16,
                "n_layer": 8,
                "d_model": 64,
                "tokens": 20,
                "params": 2,
                "flops": 240,
                "val_loss": 1.9,
            },
            {
                "run_id": "e",
                "variant": "baseline",
                "n_blocks": None,
                "n_layer": 4,
                "d_model": 64,
                "tokens": 10,
                "params": 1,
                "flops": 60,
                "val_loss": 2.2,
            },
        ]
    )
    assert list(curve_labels(runs)) == ["block-N2", "block-N8", "full", "full", "baseline"]


def test_curve_variants_are_read_from_the_variant_and_n_blocks_columns_not_the_curve_name():
    rows = [
        ("block-N4", "block", 4),  # one N of several: the variant with that N
        ("block-N4", "block", 4),
        ("block", "block", 4),  # one N per size: the most common N
        ("block", "block", 8),
        ("block", "block", 4),
        ("block+heads16", "block+heads16", 4),  # N only for Block AttnRes itself
        ("full", "full", 8),
        ("baseline", "baseline", None),
        ("odd-N3", "odd-N3", None),  # an unsplit curve is its variant, whatever its name reads as
        ("x-N2", "x", 5),  # a split curve's N is its rows', not its name's
    ]
    points = pd.DataFrame(rows, columns=["curve", "variant", "n_blocks"])
    assert curve_variants(points) == {
        "baseline": Variant("baseline"),
        "block": Variant("block", 4),
        "block+heads16": Variant("block+heads16"),
        "block-N4": Variant("block", 4),
        "full": Variant("full"),
        "odd-N3": Variant("odd-N3"),
        "x-N2": Variant("x", 5),
    }
    assert curve_variants(points.iloc[:0]) == {}


def test_finished_runs_with_nan_loss_are_dropped_with_a_warning_naming_them():
    runs = _runs(
        [
            {
                "run_id": "good",
                "variant": "baseline",
                "n_blocks": None,
                "n_layer": 4,
                "d_model": 64,
                "tokens": 10,
                "params": 1,
                "flops": 60,
                "val_loss": 2.0,
            },
            {
                "run_id": "nan-run",
                "variant": "baseline",
                "n_blocks": None,
                "n_layer": 4,
                "d_model": 64,
                "tokens": 20,
                "params": 1,
                "flops": 120,
                "val_loss": float("nan"),
            },
        ]
    )
    with pytest.warns(UserWarning, match="nan-run"):
        points = select_points(runs)
    assert list(points["run_ids"]) == [("good",)]


def test_budget_groups_tolerate_step_rounding():
    assert list(budget_groups(np.array([1.0e18, 1.02e18, 3e18, 2.99e18, 1e19]))) == [0, 0, 1, 1, 2]


def test_isoflop_frontier_finds_the_compute_optimal_loss(tmp_path):
    law = ChinchillaLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
    budgets = np.geomspace(1e18, 1e20, 3)
    write_synthetic_results(
        tmp_path,
        law=law,
        multipliers={"baseline": 1.0},
        budgets=budgets,
        sizes_per_budget=7,
        size_spread=8.0,
        tables=False,
    )
    points = select_points(load_results(tmp_path, tables=()).runs)
    assert needs_frontier(points)
    frontier, notes = isoflop_frontier(points)
    assert notes == () and len(frontier) == 3
    for _, row in frontier.iterrows():
        n_grid = np.geomspace(1e6, 1e11, 20001)
        best = law.loss(n_grid, row["flops"] / (6 * n_grid)).min()
        assert row["loss"] == pytest.approx(best, rel=2e-3)  # a quadratic in log N is close to the true minimum
        assert row["n_sizes"] == 7 and row["n_runs"] == 7


def test_isoflop_budgets_with_the_minimum_at_the_edge_or_too_few_sizes_are_dropped():
    rows = []
    for i, (params, loss) in enumerate([(1, 3.0), (2, 2.5), (4, 2.2), (8, 2.1)]):  # still falling at the largest size
        rows.append({"run_id": f"e{i}", "params": params, "loss": loss})
    for i, (params, loss) in enumerate([(1, 2.5), (2, 2.0), (4, 2.3)]):  # a proper minimum
        rows.append({"run_id": f"m{i}", "params": params, "loss": loss, "flops": 1e19})
    for i, (params, loss) in enumerate([(1, 2.0), (2, 1.9)]):  # two sizes only
        rows.append({"run_id": f"t{i}", "params": params, "loss": loss, "flops": 1e20})
    points = pd.DataFrame(
        [
            {
                "sweep": "s",
                "curve": "baseline",
                "variant": "baseline",
                "n_blocks": None,
                "n_layer": r["params"],
                "d_model": 64,
                "params": float(r["params"]),
                "tokens": 1e18 / r["params"],
                "flops": r.get("flops", 1e18),
                "flops_per_token": 6.0,
                "loss": r["loss"],
                "lr": 1e-3,
                "n_runs": 1,
                "n_runs_total": 1,
                "run_ids": (r["run_id"],),
                "run_losses": (r["loss"],),
                "flops_per_s": 1.0,
            }
            for r in rows
        ]
    )
    frontier, notes = isoflop_frontier(points)
    assert len(frontier) == 1 and frontier["flops"].iloc[0] == pytest.approx(1e19)
    assert any("C=1e+18" in n and "largest size" in n for n in notes)
    assert any("C=1e+20" in n and "at least 3" in n for n in notes)
