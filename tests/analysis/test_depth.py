"""The depth trend of a fixed-width ladder (analysis/estimates/depth.py) on synthetic results whose truth is known: the
variant's multiplier grows by a set factor per sublayer, so its paired gap changes by a known number of points."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from analysis import fit_results
from analysis.estimates.depth import depth_trend
from analysis.tables.tables import format_report
from tests.synthetic_results import PAPER_BASELINE, write_synthetic_results

WIDTH = 48
DEPTHS = (4, 6, 8, 10, 12)
GROWTH = 0.01  # ln M per sublayer
SPAN = 2 * (DEPTHS[-1] - DEPTHS[0])  # 16 sublayers
TRUE_CHANGE = 100 * PAPER_BASELINE.alpha * GROWTH * SPAN  # points of % over the ladder (the law has no offset)


def _budgets(depths=DEPTHS):
    """FLOPs that give each depth exactly (the synthetic writer trains about 20 tokens per parameter)."""
    return [120.0 * (12 * WIDTH * WIDTH * n) ** 2 for n in depths]


def _ladder(tmp_path, growth=GROWTH, **kw):
    return write_synthetic_results(
        tmp_path,
        multipliers={"baseline": 1.0, "block": 1.1},
        budgets=_budgets(kw.pop("depths", DEPTHS)),
        width=WIDTH,
        depth_slope={"block": growth},
        tables=False,
        **kw,
    )


def test_the_trend_reads_back_a_known_growth_exactly(tmp_path):
    tree = _ladder(tmp_path / "exact", seeds=2)
    report = fit_results(tree.root, n_boot=100, chinchilla=False)
    trend = report.sweeps[0].multiplier("block").depth
    assert trend is not None and trend.d_model == WIDTH and trend.span == (8, 24)
    assert [p.n_layer for p in trend.points] == list(DEPTHS)
    assert trend.gap_change.value == pytest.approx(TRUE_CHANGE, rel=1e-3)
    assert trend.m_ratio.value == pytest.approx(math.exp(GROWTH * SPAN), rel=2e-3)
    assert not trend.m_ratio.has_interval  # the law's slope tilts every depth's M at once: no residual interval
    assert trend.residual_sd == pytest.approx(0, abs=1e-6)
    assert trend.verdict() == "the advantage grows with depth"
    # each depth's M is the true one
    for p in trend.points:
        assert p.multiplier == pytest.approx(1.1 * math.exp(GROWTH * (2 * p.n_layer - 8)), rel=2e-3)


def test_a_noisy_ladder_covers_the_truth_and_prints_and_saves_the_trend(tmp_path):
    tree = _ladder(tmp_path / "noisy", seeds=2, noise=0.003, seed_noise=0.005, rng_seed=3)
    report = fit_results(tree.root, n_boot=100, chinchilla=False)
    trend = report.sweeps[0].multiplier("block").depth
    assert trend.gap_change.contains(TRUE_CHANGE), trend.gap_change
    assert 0 < trend.residual_sd < 0.6  # the seed shift cancels in the paired gap; 0.3 % a run, 2 seeds
    text = format_report(report)
    assert "the depth trend (one width, only depth moves)" in text
    assert "trend 8 -> 24 sublayers" in text
    saved = json.loads(json.dumps(report.to_dict()))
    block = next(m for m in saved["sweeps"][0]["multipliers"] if m["variant"] == "block")
    assert block["depth_trend"]["sublayers"] == [8, 24]
    assert len(block["depth_trend"]["depths"]) == len(DEPTHS)


def test_no_growth_is_not_called_a_trend(tmp_path):
    tree = _ladder(tmp_path / "flat", growth=0.0, seeds=2, noise=0.003, rng_seed=1)
    trend = fit_results(tree.root, n_boot=100, chinchilla=False).sweeps[0].multiplier("block").depth
    assert trend.gap_change.contains(0.0)
    assert trend.verdict() == "no trend resolved: the interval holds 0"


def test_only_a_fixed_width_ladder_of_three_depths_or_more_gets_a_trend(tmp_path):
    # sizes whose width moves with depth (the usual ladder): no trend, and no key in fit.json
    usual = write_synthetic_results(tmp_path / "usual", multipliers={"baseline": 1.0, "block": 1.25}, tables=False)
    report = fit_results(usual.root, n_boot=0, chinchilla=False)
    assert report.sweeps[0].multiplier("block").depth is None
    assert "depth_trend" not in json.dumps(report.to_dict())
    assert "the depth trend" not in format_report(report)
    # two depths: a line through two points has no scatter to build an interval from
    two = _ladder(tmp_path / "two", depths=(4, 12))
    assert fit_results(two.root, n_boot=0, chinchilla=False).sweeps[0].multiplier("block").depth is None


def test_without_a_bootstrap_the_trend_is_a_point_estimate(tmp_path):
    tree = _ladder(tmp_path / "point", seeds=1)
    report = fit_results(tree.root, n_boot=0, chinchilla=False)
    trend = report.sweeps[0].multiplier("block").depth
    assert trend.gap_change.value == pytest.approx(TRUE_CHANGE, rel=1e-3)
    assert not trend.gap_change.has_interval and trend.verdict().startswith("no interval (--n-boot 0")
    assert depth_trend(None, "block", None, 0.9) is None  # no paired M: nothing to trend
    assert np.isfinite(trend.gap_at).all()


def test_the_report_draws_the_trend_and_tables_it(tmp_path):
    import reports

    tree = _ladder(tmp_path / "report", seeds=2, noise=0.003, rng_seed=3)
    summary = reports.build_report(tree.root, tmp_path / "out", formats=("png",), n_boot=100, strict=True)
    names = {f.name for f in summary.figures}
    assert "depth_trend" in names and "architecture" not in names
    text = (tmp_path / "out" / "report.md").read_text()
    assert "The depth trend" in text and "The gap to the baseline against depth" in text
    assert "trend 8 -> 24 sublayers" in text
    saved = json.loads((tmp_path / "out" / "fit.json").read_text())
    assert saved["sweeps"][0]["multipliers"][0]["depth_trend"]["sublayers"] == [8, 24]


def test_the_interval_never_assumes_less_noise_than_the_floor(tmp_path):
    """A ladder whose gaps sit on their line almost exactly (residual sd ~0 on 3 df) gets the interval of the noise
    floor per seed (0.61 % by default, measured in cpu_envelope) with a normal quantile, not a zero-width t interval;
    ``noise_floor=0`` gives the residuals' interval; the table says which and on how many df."""
    from scipy.stats import norm

    from analysis.estimates.depth import NOISE_FLOOR

    tree = _ladder(tmp_path / "exact", seeds=2)
    trend = fit_results(tree.root, n_boot=100, chinchilla=False).sweeps[0].multiplier("block").depth
    assert trend.basis == "floor" and trend.noise == NOISE_FLOOR and trend.df == len(DEPTHS) - 2
    x = np.array([2.0 * n for n in DEPTHS])
    half = norm.ppf(0.95) * NOISE_FLOOR / math.sqrt(2 * np.sum((x - x.mean()) ** 2)) * SPAN  # 2 seeds a depth
    assert trend.gap_change.high - trend.gap_change.value == pytest.approx(half, rel=1e-9)
    report = fit_results(tree.root, n_boot=100, chinchilla=False)
    assert "(the floor; residual sd 0.00 % on 3 df)" in format_report(report)
    bare = fit_results(tree.root, n_boot=100, chinchilla=False, noise_floor=0).sweeps[0].multiplier("block").depth
    assert bare.basis == "residuals" and bare.gap_change.high - bare.gap_change.value < 1e-3


def test_the_crossing_is_the_depth_where_a_known_deficit_turns_into_an_advantage(tmp_path):
    """Block's M is 0.9 at the shallowest depth (8 sublayers) and grows by e^0.01 a sublayer, so its paired gap rises
    along a straight line and changes sign inside the ladder (at about 17.5 sublayers: M = 1 at 18.5, and at equal
    size and tokens Block's few more parameters cost it a little compute). The crossing is the root of that line,
    the same as interpolating between the two depths on either side of it; the table prints it with its interval."""
    tree = write_synthetic_results(
        tmp_path / "cross",
        multipliers={"baseline": 1.0, "block": 0.9},
        budgets=_budgets(),
        width=WIDTH,
        depth_slope={"block": GROWTH},
        tables=False,
        seeds=2,
    )
    report = fit_results(tree.root, n_boot=100, chinchilla=False)
    trend = report.sweeps[0].multiplier("block").depth
    below, above = next((a, b) for a, b in zip(trend.points, trend.points[1:]) if a.gap < 0 <= b.gap)
    root = below.sublayers + (above.sublayers - below.sublayers) * -below.gap / (above.gap - below.gap)
    assert 16 < root < 19
    assert trend.crossing.value == pytest.approx(root, abs=1e-3)
    # the gaps change by 0.8 points over the ladder against the floor's 0.61 % a seed: resolved, but loosely
    assert trend.crossing.low < root < 24 < trend.crossing.high
    assert trend.crossing_text().endswith("sublayers (reaching outside the ladder)")
    assert "the line crosses 0" in format_report(report)
    saved = json.loads(json.dumps(report.to_dict()))
    block = next(m for m in saved["sweeps"][0]["multipliers"] if m["variant"] == "block")
    assert block["depth_trend"]["crossing_sublayers"]["value"] == pytest.approx(root, abs=1e-3)


def test_the_crossing_interval_is_the_set_of_depths_the_line_cannot_tell_from_zero():
    """Fieller's interval, checked against its definition on a grid of depths: x is in it exactly when 0 lies in the
    line's own interval at x. Where the slope is not resolved from 0 the set is unbounded, and the text says the
    crossing is not resolved rather than printing a number."""
    from scipy.stats import norm

    from analysis.estimates.depth import line_change

    x = np.array([8.0, 16.0, 24.0, 48.0])
    w = np.array([1.0, 1.0, 1.0, 2.0])
    y = np.array([-1.5, -0.8, -0.2, 0.4])
    line = line_change(x, y, 40.0, 0.9, True, w, noise_floor=0.61)
    q = norm.ppf(0.95) * 0.61
    xm = float(w @ x / w.sum())
    sxx = float(w @ (x - xm) ** 2)
    slope = float(w @ ((x - xm) * (y - w @ y / w.sum()))) / sxx
    g = lambda u: float(w @ y / w.sum()) + slope * (u - xm)  # noqa: E731
    grid = np.linspace(-200, 400, 60001)
    inside = [u for u in grid if abs(g(u)) <= q * math.sqrt(1 / w.sum() + (u - xm) ** 2 / sxx)]
    assert line.root.low == pytest.approx(min(inside), abs=0.02)
    assert line.root.high == pytest.approx(max(inside), abs=0.02)
    assert line.root.low < line.root.value < line.root.high
    flat = line_change(x, np.array([-0.2, 0.3, -0.1, 0.1]), 40.0, 0.9, True, w, noise_floor=0.61)
    assert math.isinf(flat.root.low) and math.isinf(flat.root.high)


def test_the_crossing_interval_covers_the_true_depth_as_often_as_it_says():
    """Lines with a known root at 30 sublayers, observed at cpu_depth_deep's depths with 0.61 % noise a seed: from
    the residuals alone (noise_floor=0, a t quantile) the 90 % interval holds the root in 90 % (+-2.5 points over
    4,000 draws) of them, counting the unbounded ones; with the floor at the true noise it never claims less (the
    larger of the two noises: conservative where the residuals scatter more than the floor)."""
    from analysis.estimates.depth import line_change

    x = np.array([8.0, 12.0, 16.0, 20.0, 24.0, 48.0])
    w = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 2.0])
    truth, slope = 30.0, 0.08
    for floor, low, high in ((0.0, 0.875, 0.925), (0.61, 0.875, 0.97)):
        rng = np.random.default_rng(0)
        hits = 0
        for _ in range(4000):
            y = slope * (x - truth) + rng.normal(0, 0.61, x.size) / np.sqrt(w)
            root = line_change(x, y, 40.0, 0.9, True, w, noise_floor=floor).root
            hits += root.low <= truth <= root.high
        assert low < hits / 4000 < high, floor
