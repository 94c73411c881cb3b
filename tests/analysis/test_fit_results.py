"""fit_results: every number `attnres fit` reports, on synthetic results trees (analysis.fitting.sweep_fits)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest

from analysis import AnalysisError, ChinchillaLaw, PowerLaw, fit_results, format_report, load_results
from analysis.laws.laws import PFLOP_S_DAY
from attnres.variants import Variant
from tests.synthetic_results import write_synthetic_results

TRUTH = {"baseline": 1.0, "full": 1.27, "block": 1.25}


@pytest.fixture(scope="module")
def clean_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("clean")
    write_synthetic_results(root, multipliers=TRUTH, tables=False)
    return root


@pytest.mark.parametrize("form", ["A*C^-alpha", "E+A*C^-alpha"])
def test_noise_free_tree_recovers_every_multiplier(tmp_path, form):
    law = PowerLaw(A=25.0, alpha=0.057) if form == "A*C^-alpha" else PowerLaw(A=60.0, alpha=0.12, E=1.0)
    write_synthetic_results(tmp_path, law=law, multipliers=TRUTH, tables=False)
    report = fit_results(tmp_path, form=form, n_boot=50)
    sweep = report.sweep("synthetic")
    assert [c.curve for c in sweep.curves] == ["baseline", "block", "full"]
    baseline = sweep.curve("baseline").fit
    assert baseline.status == "converged"
    assert math.isclose(baseline.law.alpha, law.alpha, rel_tol=1e-6) and math.isclose(
        baseline.law.A, law.A, rel_tol=1e-6
    )
    assert sweep.joint.status == "converged" and math.isclose(sweep.joint.alpha.value, law.alpha, rel_tol=1e-6)
    for m in sweep.multipliers:
        truth = TRUTH[m.variant]
        assert m.exponent == "shared"
        assert math.isclose(m.multiplier.value, truth, rel_tol=1e-6)
        assert math.isclose(m.multiplier_unshared.value, truth, rel_tol=1e-6)
        assert all(math.isclose(b.multiplier.value, truth, rel_tol=1e-6) for b in m.budgets)
        assert len(m.budgets) == 7 and m.n_runs_variant == 7 and m.n_runs_baseline == 7
        # wall clock: the synthetic variants run at 0.85 / 0.95 of the baseline's tokens/s with 2% / 1% more FLOPs
        ratio = {"full": 0.85 * 1.02, "block": 0.95 * 1.01}[m.variant]
        assert math.isclose(m.throughput_ratio, ratio, rel_tol=1e-9)
        assert math.isclose(m.wall_clock.value, truth * ratio, rel_tol=1e-6)


def test_the_curves_of_a_block_size_sweep_carry_their_variant_and_fit_json_keeps_the_names(tmp_path):
    write_synthetic_results(tmp_path, multipliers={"baseline": 1.0, "block": 1.25}, n_blocks=4, tables=False)
    results = load_results(tmp_path, tables=())
    runs = results.runs
    more = runs[runs["variant"] == "block"].assign(
        run_id=lambda r: r["run_id"] + "-n8", n_blocks=8, val_loss=lambda r: r["val_loss"] * 0.99
    )
    sweep = fit_results(dataclasses.replace(results, runs=pd.concat([runs, more])), n_boot=0).sweeps[0]
    carried = {c.curve: c.curve_variant for c in sweep.curves}
    assert carried == {
        "baseline": Variant("baseline"),
        "block-N4": Variant("block", 4),
        "block-N8": Variant("block", 8),
    }
    assert {m.variant: m.curve_variant.title for m in sweep.multipliers} == {
        "block-N4": "Block AttnRes (N=4)",
        "block-N8": "Block AttnRes (N=8)",
    }
    written = sweep.to_dict()
    assert [(c["curve"], c["variant"]) for c in written["curves"]] == [
        ("baseline", "baseline"),
        ("block-N4", "block"),
        ("block-N8", "block"),
    ]
    assert [m["variant"] for m in written["multipliers"]] == ["block-N4", "block-N8"]


def test_a_block_curve_of_one_n_carries_that_n(clean_tree):
    sweep = fit_results(clean_tree, n_boot=0).sweeps[0]
    assert sweep.curve("block").curve_variant == Variant("block", 4)
    assert sweep.multiplier("block").curve_variant.title == "Block AttnRes (N=4)"
    assert sweep.curve("full").curve_variant == Variant("full") and sweep.curve_variants["full"] == Variant("full")


def test_noisy_tree_with_seeds_covers_the_truth_and_counts_runs(tmp_path):
    write_synthetic_results(tmp_path, multipliers=TRUTH, seeds=3, noise=0.003, tables=False, rng_seed=1)
    report = fit_results(tmp_path, n_boot=400)
    sweep = report.sweeps[0]
    for m in sweep.multipliers:
        assert m.multiplier.contains(TRUTH[m.variant]), (m.variant, m.multiplier)
        assert m.n_runs_variant == 21 and all(b.n_runs_variant == 3 for b in m.budgets)
        assert m.exponent_test.difference.contains(0.0) and 0 <= m.exponent_test.p_value <= 1


def test_identical_variants_give_one_within_the_interval(tmp_path):
    write_synthetic_results(tmp_path, multipliers={"baseline": 1.0, "twin": 1.0}, noise=0.003, tables=False, rng_seed=7)
    m = fit_results(tmp_path, n_boot=500).sweeps[0].multiplier("twin")
    assert m.multiplier.contains(1.0) and m.multiplier_unshared.contains(1.0)


def test_isoflop_grid_uses_the_frontier_and_fits_the_chinchilla_surface(tmp_path):
    law = ChinchillaLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
    write_synthetic_results(
        tmp_path,
        law=law,
        multipliers={"baseline": 1.0, "block": 1.25},
        budgets=np.geomspace(1e17, 1e20, 6),
        sizes_per_budget=5,
        tables=False,
    )
    sweep = fit_results(tmp_path, form="E+A*C^-alpha", n_boot=50).sweeps[0]
    assert sweep.frontier
    m = sweep.multiplier("block")
    assert abs(m.multiplier.value / 1.25 - 1) < 0.01  # the frontier is a quadratic approximation of the minimum
    surface = sweep.chinchilla["baseline"]
    for name in ("E", "A", "B", "alpha", "beta"):
        assert math.isclose(getattr(surface.law, name), getattr(law, name), rel_tol=1e-6), name
    # the multiplier read between the surfaces' frontiers (analysis.estimates.frontier): exact where both optima are
    # inside
    inside = [f for f in sweep.frontier_multipliers if f.variant == "block" and not f.edge]
    assert inside and all(abs(f.M.value / 1.25 - 1) < 0.005 for f in inside)
    assert "frontier_multipliers" in sweep.to_dict()


def test_pflops_days_rescale_compute_only(clean_tree):
    flops = fit_results(clean_tree, n_boot=0).sweeps[0]
    days = fit_results(clean_tree, n_boot=0, compute_unit="pflops_days").sweeps[0]
    for a, b in zip(flops.curves, days.curves):
        assert math.isclose(a.fit.law.in_units(PFLOP_S_DAY).A, b.fit.law.A, rel_tol=1e-9)
        assert math.isclose(a.points[0].compute / PFLOP_S_DAY, b.points[0].compute, rel_tol=1e-12)
    for a, b in zip(flops.multipliers, days.multipliers):
        assert math.isclose(a.multiplier.value, b.multiplier.value, rel_tol=1e-9)


def test_problems_notes_and_statuses_are_carried_into_the_report(tmp_path):
    write_synthetic_results(tmp_path, multipliers=TRUTH, unfinished=1, nan_loss=1, broken=1, tables=False)
    with pytest.warns(UserWarning, match="val_loss"):
        report = fit_results(load_results(tmp_path, tables=()), n_boot=20)
    data = report.to_dict()
    assert len(data["problems"]) == 3
    sweep = data["sweeps"][0]
    assert any("val_loss" in n for n in sweep["notes"])
    assert all(c["status"] == "converged" for c in sweep["curves"]) and sweep["joint"]["status"] == "converged"
    assert all(set(m["status"]) == {"baseline", "variant", "joint"} for m in sweep["multipliers"])
    json.dumps(data, allow_nan=False)  # strictly valid JSON
    table = format_report(report)
    assert "runs left out" in table and "broken-0" in table and "M [90% CI]" in table


def test_sweeps_are_fitted_separately_and_unfittable_ones_do_not_fail(tmp_path):
    write_synthetic_results(tmp_path, sweep="scaling", multipliers={"baseline": 1.0, "block": 1.2}, tables=False)
    write_synthetic_results(
        tmp_path, sweep="one-budget", multipliers={"baseline": 1.0, "block": 1.2}, budgets=[1e16], tables=False
    )
    report = fit_results(tmp_path, n_boot=20)
    assert [s.sweep for s in report.sweeps] == ["one-budget", "scaling"]
    one = report.sweep("one-budget")  # one shape and one budget: its gaps, and one note saying so
    assert one.curves == () and one.one_shape is not None and any("no law" in n for n in one.notes)
    assert math.isclose(report.sweep("scaling").multiplier("block").multiplier.value, 1.2, rel_tol=1e-6)
    only = fit_results(tmp_path, n_boot=0, sweeps=["scaling"])
    assert [s.sweep for s in only.sweeps] == ["scaling"]
    with pytest.raises(ValueError, match="not found"):
        fit_results(tmp_path, sweeps=["nope"])


def test_without_a_fitted_baseline_curves_are_fitted_but_no_multiplier(tmp_path):
    write_synthetic_results(tmp_path, multipliers={"baseline": 1.0, "block": 1.2}, tables=False)
    # a variant "reference" with runs at one budget only: a real name, but no curve to invert
    write_synthetic_results(tmp_path, multipliers={"reference": 1.1}, budgets=[2e16], tables=False)
    sweep = fit_results(tmp_path, baseline="reference", n_boot=0).sweeps[0]
    assert len(sweep.curves) == 2 and sweep.multipliers == ()
    assert any("no fitted baseline curve 'reference'" in n for n in sweep.notes)


def test_an_unknown_baseline_is_one_clear_error_before_any_fitting(tmp_path, monkeypatch):
    import analysis.fitting.curve_fits

    write_synthetic_results(tmp_path, multipliers={"baseline": 1.0, "block": 1.2, "full": 1.27}, tables=False)

    def no_fitting(*args, **kwargs):
        raise AssertionError("fitted before checking the variant names")

    monkeypatch.setattr(analysis.fitting.curve_fits, "run_study", no_fitting)
    with pytest.raises(AnalysisError) as err:
        fit_results(tmp_path, baseline="basline", n_boot=0)
    message = str(err.value)
    assert "'basline'" in message and "did you mean 'baseline'?" in message
    assert "variants found: baseline, block, full" in message and "\n" not in message
    with pytest.raises(AnalysisError, match="variants found: baseline, block, full") as err:
        fit_results(tmp_path, baseline="something-else", n_boot=0)
    assert "did you mean" not in str(err.value)  # no suggestion when nothing is close
    with pytest.raises(AnalysisError, match="did you mean 'synthetic'"):
        fit_results(tmp_path, sweeps=["synthetc"], n_boot=0)


def test_bad_settings_are_clear_errors(clean_tree):
    for kwargs, match in [
        ({"select": "mode"}, "select"),
        ({"exponent": "both"}, "exponent"),
        ({"lr": "tuned"}, "lr="),
        ({"protocol": "paper's"}, "protocol"),
        ({"stall_margin": -0.1}, "stall_margin"),
        ({"stall_marign": 0.1}, "did you mean 'stall_margin'"),
        ({"level": 90}, "level"),
        ({"compute_unit": "gpu_hours"}, "compute_unit"),
        ({"form": "L=B"}, "unknown form"),
    ]:
        with pytest.raises(ValueError, match=match):
            fit_results(clean_tree, **kwargs)


def test_wall_clock_m_uses_the_side_by_side_throughput_and_flags_an_implausible_ratio(tmp_path):
    import json

    from analysis.tables.tables import multiplier_table

    write_synthetic_results(tmp_path, multipliers=TRUTH, tables=False)
    before = fit_results(tmp_path, n_boot=0).sweep("synthetic")
    assert any("tokens/s each run logged" in n for n in before.notes)  # the fallback says what it is
    points = before.points
    measured = []
    for row in points[["variant", "n_blocks", "n_layer", "d_model", "flops_per_token"]].drop_duplicates().itertuples():
        rate = {"baseline": 1e9, "full": 2.5e9, "block": 0.9e9}[row.variant]  # full: 2.5x, implausible
        measured.append(
            {
                "residual": row.variant,
                "n_blocks": int(row.n_blocks) if row.variant == "block" else None,
                "n_layer": int(row.n_layer),
                "d_model": int(row.d_model),
                "flops_per_s": rate,
            }
        )
    (tmp_path / "synthetic" / "throughput.json").write_text(json.dumps({"measured": measured}))
    report = fit_results(tmp_path, n_boot=0)
    sweep = report.sweep("synthetic")
    m = {v.variant: v for v in sweep.multipliers}
    table = multiplier_table(sweep, report.settings)
    wall = table.header.index("wall-clock M")
    flagged = {row[0]: row[wall].endswith(" !") for row in table.rows}
    assert flagged == {"block": False, "full": True}
    assert math.isclose(m["block"].throughput_ratio, 0.9) and math.isclose(m["full"].throughput_ratio, 2.5)
    assert math.isclose(m["block"].wall_clock.value, m["block"].multiplier.value * 0.9, rel_tol=1e-9)
    assert any("side by side (throughput.json)" in n for n in sweep.notes)
    assert any(n.startswith("full: FLOP/s ratio 2.5") and "outside [0.5, 2]" in n for n in sweep.notes)
    assert not any(n.startswith("block: FLOP/s ratio") for n in sweep.notes)


@pytest.mark.parametrize(("fail_every", "reliable"), [(50, True), (8, False)])
def test_failed_replicates_are_counted_beside_the_interval_they_feed(tmp_path, monkeypatch, fail_every, reliable):
    """A replicate whose refit fails is left out of every statistic it feeds and counted there: beside the headline's
    interval in the table and fit.json, and an interval that lost more than 5 % of its replicates is unreliable
    (the fit before 2026-12-04 reported 0 for the headline while its joint fit had dropped up to 12 %)."""
    import analysis.estimates.study

    real = analysis.estimates.study.refit

    def failing(*args, **kwargs):
        theta, ok = real(*args, **kwargs)
        ok = ok.copy()
        ok[::fail_every] = False  # every fail_every-th replicate of every refit
        return theta, ok

    monkeypatch.setattr(analysis.estimates.study, "refit", failing)
    tree = write_synthetic_results(tmp_path, multipliers={"baseline": 1.0, "block": 1.25}, seeds=2, tables=False)
    report = fit_results(tree.root, n_boot=200, chinchilla=False)
    m = report.sweeps[0].multiplier("block")
    failed = len(range(0, 200, fail_every))
    assert m.multiplier.failed == m.n_boot_failed == failed and m.multiplier.replicates == 200
    assert m.reliable is reliable
    assert f"{failed} of 200 replicates failed" in format_report(report)
    saved = next(x for x in json.loads(report.to_json())["sweeps"][0]["multipliers"] if x["variant"] == "block")
    head = saved["largest_budget"]["multiplier"]
    assert head["failed"] == failed and head["replicates"] == 200 and saved["n_boot_failed"] == failed
    if not reliable:
        assert "bootstrap replicates failed to refit" in m.why


def test_wall_clock_m_has_an_interval_only_when_the_logged_throughputs_are_comparable(tmp_path):
    """Runs of one variant and shape do the same work: the FLOP/s they logged differ only by the machine's load. Within
    10 % of each other wall-clock M keeps M's interval; past it, or with no shape trained twice, it is a point and a
    note says why (docs/analysis.md)."""
    from analysis.tables.tables import budget_table, multiplier_table

    write_synthetic_results(tmp_path, multipliers=TRUTH, seeds=2, tables=False)
    results = load_results(tmp_path, tables=())
    steady_report = fit_results(results, n_boot=50)
    steady, settings = steady_report.sweep("synthetic"), steady_report.settings
    for m in steady.multipliers:
        assert m.wall_clock.has_interval and all(b.wall_clock.has_interval for b in m.budgets)
    assert any("spread within a shape is at most 10%" in n for n in steady.notes)
    for table in (multiplier_table(steady, settings), budget_table(steady, settings)):
        assert "wall-clock M [90% CI]" in table.header and "M [90% CI]" in table.header

    runs = results.runs.copy()
    busy = runs.index[(runs["variant"] == "block") & (runs["seed"] == 1)][:1]
    runs.loc[busy, "tokens_per_s"] *= 1.3  # one seed timed beside a neighbour that left
    loaded = fit_results(dataclasses.replace(results, runs=runs), n_boot=50).sweep("synthetic")
    for m in loaded.multipliers:
        assert not m.wall_clock.has_interval and not any(b.wall_clock.has_interval for b in m.budgets)
        assert m.multiplier.has_interval  # M itself keeps its interval
        assert math.isclose(m.wall_clock.value, m.multiplier.value * m.throughput_ratio, rel_tol=1e-9)
    assert any("up to 30% apart" in n and "a point without an interval" in n for n in loaded.notes)
    for table in (multiplier_table(loaded, settings), budget_table(loaded, settings)):  # no interval over points
        assert "wall-clock M" in table.header and "M [90% CI]" in table.header

    one = tmp_path / "one"
    write_synthetic_results(one, multipliers=TRUTH, seeds=1, tables=False)
    single = fit_results(one, n_boot=50).sweep("synthetic")
    assert not any(m.wall_clock.has_interval for m in single.multipliers)
    assert any("cannot be judged" in n for n in single.notes)
