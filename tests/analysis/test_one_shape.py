"""The comparison at one shape (analysis/estimates/one_shape.py): the block-size and ablation sweeps (one size, one
budget, many variants), on synthetic results whose gaps are known."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from analysis import fit_results, load_results
from analysis.data.envelope import envelope_points, fit_envelopes
from analysis.estimates.one_shape import one_shape_comparison
from analysis.tables.tables import format_report
from tests.cli_helpers import attnres
from tests.synthetic_results import PAPER_BASELINE, write_synthetic_results

MULTIPLIERS = {"baseline": 1.0, "full": 1.3, "block": 1.2, "denseformer": 1.0}
RATES = (2e-3, 4e-3, 8e-3)


def _one_shape(tmp_path, **kw):
    return write_synthetic_results(
        tmp_path, multipliers=MULTIPLIERS, budgets=[1e15], lrs=RATES, tables=False, **{"seeds": 2, **kw}
    )


def _true_gap(sw, curve: str) -> float:
    """100 (ln L_base - ln L_curve) on the synthetic power law: the curve runs with its own FLOPs C_v at the loss of
    the baseline at M C_v."""
    flops = {r.curve: float(r.flops) for r in sw.points.itertuples()}
    return 100 * PAPER_BASELINE.alpha * math.log(MULTIPLIERS[curve] * flops[curve] / flops["baseline"])


def test_every_curve_reads_back_its_known_gap_exactly_and_seed_shifts_cancel(tmp_path):
    tree = _one_shape(tmp_path, seed_noise=0.01)  # a seed shifts every curve alike: the pairing cancels it
    sw = fit_results(tree.root, lr="envelope", chinchilla=False).sweeps[0]
    one = sw.one_shape
    assert one is not None and (one.shape, one.baseline) == ("L4-d240", "baseline") and not sw.curves
    assert {g.curve for g in one.gaps} == {"full", "block", "denseformer"}
    for g in one.gaps:
        assert g.gap.value == pytest.approx(_true_gap(sw, g.curve), abs=1e-6)
        assert g.n_pairs == 2 and g.edge == ""
        assert g.gap.low <= g.gap.value <= g.gap.high
    assert one.seed_sd == pytest.approx(0, abs=1e-6)  # nothing scatters but the shared seed shift
    assert one.df == 3  # 4 curves x 2 seeds, less 4 curve and 1 seed effects


def test_the_gap_is_the_mean_of_the_paired_seed_gaps_and_the_interval_widens_with_the_noise(tmp_path):
    quiet = fit_results(_one_shape(tmp_path / "q", noise=0.001).root, lr="envelope", chinchilla=False).sweeps[0]
    loud = fit_results(_one_shape(tmp_path / "l", noise=0.006).root, lr="envelope", chinchilla=False).sweeps[0]
    points = quiet.points.set_index("curve")
    for g in quiet.one_shape.gaps:  # balanced seeds: the additive model's contrast is the paired mean
        mine = dict(zip(points.loc[g.curve, "run_seeds"], points.loc[g.curve, "run_losses"]))
        base = dict(zip(points.loc["baseline", "run_seeds"], points.loc["baseline", "run_losses"]))
        paired = np.mean([100 * (math.log(base[s]) - math.log(mine[s])) for s in (0, 1)])
        assert g.gap.value == pytest.approx(paired, abs=1e-9)
    widths = [np.mean([g.gap.high - g.gap.low for g in sw.one_shape.gaps]) for sw in (quiet, loud)]
    assert widths[1] > 2 * widths[0]
    for g in loud.one_shape.gaps:
        assert abs(g.gap.value - _true_gap(loud, g.curve)) < 3 * (g.gap.high - g.gap.low)


def test_the_intervals_cover_the_truth_about_as_often_as_they_say(tmp_path):
    """Many small one-shape studies with per-run noise: the 90 % intervals cover each curve's gap in 0.8-0.97 of
    them (benchmarks/one_shape_power.py measures it under the noise of real studies)."""
    rng = np.random.default_rng(1)
    gaps = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 0.0])
    covered = []
    for _ in range(60):
        rows = []
        for i, gap in enumerate(gaps):
            for s in range(2):
                shift = rng.normal(0, 0.003)
                for r in RATES:
                    log_loss = math.log(1.7) - gap / 100 + 0.02 * math.log(r / 4e-3) ** 2 + shift
                    rows.append(_run(f"c{i}", s, r, math.exp(log_loss + rng.normal(0, 0.002))))
        runs = pd.DataFrame(rows)
        envelopes = fit_envelopes(runs)
        one = one_shape_comparison(envelope_points(runs, envelopes), runs, envelopes, "c0", 0.9)
        covered += [one.gap(f"c{i}").gap.contains(gaps[i]) for i in range(1, gaps.size)]
    assert 0.8 < np.mean(covered) < 0.97


def test_a_curve_that_failed_to_train_at_an_edge_is_a_bound_and_leaves_the_others_intervals_alone():
    """A variant whose loss falls towards the lowest swept rate and scatters by tenths between its seeds (the
    committed ablation study's input-dependent query): a gap without an interval, marked edge, and every other
    curve's interval as if it had not run (before, its scatter widened them all about threefold)."""
    rng = np.random.default_rng(3)
    rows = []
    for i, gap in enumerate((0.0, 1.0, -0.5)):
        for s in range(2):
            for r in RATES:
                log_loss = math.log(1.7) - gap / 100 + 0.02 * math.log(r / 4e-3) ** 2 + rng.normal(0, 0.003)
                rows.append(_run(f"c{i}", s, r, math.exp(log_loss)))
    failed = [_run("failed", s, r, 2.2 + 0.3 * k + 0.4 * s) for s in range(2) for k, r in enumerate(RATES)]
    ones = []
    for runs in (pd.DataFrame(rows), pd.DataFrame(rows + failed)):
        envelopes = fit_envelopes(runs)
        ones.append(one_shape_comparison(envelope_points(runs, envelopes), runs, envelopes, "c0", 0.9))
    alone, beside = ones
    assert (beside.df, beside.seed_sd, beside.curve_sd) == (alone.df, alone.seed_sd, alone.curve_sd)
    for c in ("c1", "c2"):
        assert beside.gap(c).gap == alone.gap(c).gap
    bound = beside.gap("failed")
    assert bound.edge == "low" and not bound.gap.has_interval
    assert -40 < bound.gap.value < -20  # its loss, about 2.2-2.6 at the lowest rate, against about 1.7


def _run(curve: str, seed: int, lr: float, loss: float) -> dict:
    return {
        "run_id": f"{curve}-s{seed}-{lr}",
        "sweep": "sim",
        "curve": curve,
        "variant": curve,
        "n_blocks": None,
        "n_layer": 6,
        "d_model": 48,
        "params": 1.7e5,
        "tokens": 1.33e6,
        "flops": 2e12,
        "flops_per_token": 1.5e6,
        "tokens_per_s": 1e4,
        "lr": lr,
        "seed": seed,
        "val_loss": loss,
    }


def test_a_sweep_with_several_budgets_or_no_baseline_has_no_one_shape_comparison(tmp_path):
    two = write_synthetic_results(tmp_path / "two", multipliers=MULTIPLIERS, budgets=[1e15, 1e16], tables=False)
    assert fit_results(two.root, chinchilla=False).sweeps[0].one_shape is None
    sw = fit_results(_one_shape(tmp_path / "one").root, chinchilla=False).sweeps[0]
    assert (
        one_shape_comparison(sw.points[sw.points["curve"] != "baseline"], pd.DataFrame(), None, "baseline", 0.9) is None
    )


def test_the_cli_prints_and_saves_it_and_exits_0(tmp_path):
    tree = _one_shape(tmp_path, noise=0.002)
    done = attnres("fit", tree.root, "--lr", "envelope")
    assert done.returncode == 0, done.stderr
    assert "every curve at L4-d240" in done.stdout and "Student t interval on 3 df" in done.stdout
    assert "not fitted" not in done.stdout  # one note for the sweep, not one per curve's single budget
    saved = json.loads((tree.root / "fit.json").read_text())["sweeps"][0]["one_shape"]
    assert saved["baseline"] == "baseline" and {g["curve"] for g in saved["gaps"]} == {"full", "block", "denseformer"}
    report = fit_results(tree.root, lr="envelope", chinchilla=False, n_boot=0)
    assert "no interval" in format_report(report)
    assert not report.sweeps[0].one_shape.gap("full").gap.has_interval


def test_the_reports_ablation_table_sets_each_gap_and_its_interval_beside_the_papers(tmp_path):
    from reports.sections.tables import GAP_COLUMNS, ablation_table

    tree = _one_shape(tmp_path, noise=0.002)
    sw = fit_results(tree.root, lr="envelope", chinchilla=False).sweeps[0]
    runs = load_results(tree.root).runs
    table = ablation_table(runs, sweep=sw.sweep, points=sw.points, one_shape=sw.one_shape).set_index("variant")
    gap, low, high, paper = GAP_COLUMNS
    for g in sw.one_shape.gaps:
        assert (table.loc[g.curve, gap], table.loc[g.curve, low], table.loc[g.curve, high]) == (
            g.gap.value,
            g.gap.low,
            g.gap.high,
        )
    assert table.loc["full", paper] == pytest.approx(100 * math.log(1.766 / 1.737))
    assert table.loc["baseline", gap] == 0 and math.isnan(table.loc["baseline", low])
    assert (table["seeds"] == 2).all()  # seeds, not the envelope's runs over 3 rates


def test_the_report_of_a_one_shape_sweep_says_why_it_has_no_multiplier_and_shows_the_gaps(tmp_path):
    """The headline, the skipped figures and the CLI name the sweep's design (one shape, one budget) instead of a
    missing second budget, and the sweep's section has the gaps; no per-curve 'not fitted' notes."""
    tree = _one_shape(tmp_path, noise=0.002)
    out = tmp_path / "report"
    done = attnres("report", tree.root, "--lr", "envelope", "--out", out, "--no-svg", "--no-html", "--n-boot", "0")
    assert done.returncode == 0, done.stderr
    assert "no multiplier: sweep `synthetic` is one shape and one budget" in done.stdout
    assert "skipped scaling_curves (sweep synthetic): one model shape and one budget" in done.stdout
    md = (out / "report.md").read_text()
    assert "No multiplier: sweep `synthetic` is one model shape and one budget" in md
    assert "### Gaps to the baseline at one shape" in md and "not fitted" not in md


def test_holm_adjusts_a_family_of_p_values_step_down():
    from analysis.estimates.one_shape import holm_adjusted

    raw = {"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.5}
    # sorted 0.01, 0.03, 0.04, 0.5 times 4, 3, 2, 1, made non-decreasing, capped at 1
    assert holm_adjusted(raw) == pytest.approx({"a": 0.04, "c": 0.09, "b": 0.09, "d": 0.5})
    assert holm_adjusted({"x": 0.7, "y": 0.6}) == pytest.approx({"y": 1.0, "x": 1.0})
    assert holm_adjusted({}) == {}
