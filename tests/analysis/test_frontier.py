"""M at the compute-optimal frontier of two Chinchilla surfaces (analysis.estimates.frontier): a variant that is the
baseline with k times the data at every size is worth exactly k at every compute; its interval covers k; an
optimum on the trained sizes' edge is named; and fit_results gives a sliced sweep its whole surface."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.estimates.frontier import N_GRID, edge_note, frontier_multipliers
from analysis.laws.fit import fit_chinchilla

E, A, B, ALPHA, BETA = 1.7, 400.0, 410.0, 0.34, 0.28
SIZES = [(4, 32), (5, 40), (6, 48), (8, 64)]
RATIOS = [2, 4, 8, 16]


def law(n, d):
    return E + A / n**ALPHA + B / d**BETA


def points(k: float, noise: float, rng: np.random.Generator) -> pd.DataFrame:
    """baseline and a variant that learns from D tokens what the baseline learns from k D."""
    rows = []
    for curve, factor in (("baseline", 1.0), ("variant", k)):
        for n_layer, d_model in SIZES:
            n = 12.0 * n_layer * d_model**2
            fpt = 6 * n + 2 * 256 * d_model * 3  # the LM head's FLOPs make f(N) more than 6 N
            for r in RATIOS:
                d = r * n
                loss = law(n, factor * d) * np.exp(rng.normal(0, noise))
                rows.append(dict(curve=curve, variant=curve, n_blocks=None, n_layer=n_layer, d_model=d_model,
                                 params=n, tokens=d, flops_per_token=fpt, flops=fpt * d, loss=loss))  # fmt: skip
    return pd.DataFrame(rows)


def fits_of(p: pd.DataFrame, n_boot: int) -> dict:
    return {
        c: fit_chinchilla(g["params"], g["tokens"], g["loss"], n_boot=n_boot, seed=0) for c, g in p.groupby("curve")
    }


def test_a_variant_with_k_times_the_data_is_worth_k_at_every_compute():
    p = points(1.25, 0.0, np.random.default_rng(0))
    found, notes = frontier_multipliers(p, fits_of(p, 0), "baseline", 0.9)
    assert not notes and len(found) == 3  # the smallest, a middle and the largest compute trained
    assert [m.compute for m in found] == pytest.approx(
        [p["flops"].min(), np.sqrt(p["flops"].min() * p["flops"].max()), p["flops"].max()]
    )
    for m in found:
        assert m.M.value == pytest.approx(1.25, rel=2e-3)
        assert m.paired and not m.M.has_interval


def test_the_interval_covers_k_with_noise_and_is_paired():
    p = points(1.25, 0.01, np.random.default_rng(1))
    fits = fits_of(p, 200)
    found, _ = frontier_multipliers(p, fits, "baseline", 0.9)
    top = found[-1]
    assert top.paired and top.M.has_interval and top.M.contains(1.25)
    assert top.M.low < top.M.value < top.M.high


def test_an_optimum_at_the_edge_of_the_trained_sizes_is_named():
    assert edge_note(0, 5, "full", "baseline") == "full's optimum at the smallest size"
    assert edge_note(3, N_GRID - 1, "full", "baseline") == "baseline's optimum at the largest size"
    assert edge_note(3, 5, "full", "baseline") == ""
    assert edge_note(3, -1, "full", "baseline") == "baseline beyond the searched compute"  # M is 0 or inf there


def test_no_baseline_surface_gives_no_frontier_multiplier():
    p = points(1.25, 0.0, np.random.default_rng(0))
    fits = fits_of(p, 0)
    assert frontier_multipliers(p, {"variant": fits["variant"]}, "baseline", 0.9) == ([], [])
