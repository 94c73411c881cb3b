"""M at each measured budget from the data around that budget, not from the baseline's global fit.

The per-budget M of :mod:`analysis.estimates.study_stats` inverts the baseline's law fitted to every budget, so it
inherits that law's misfit: where the baseline's own point sits 2 % off its law, a variant with the same measured loss
gets an M far from 1. The **local** M at the variant's budget k compares the variant's measured loss there with
a baseline law fitted only to the baseline's budgets nearest to k:

* the slope: over the ``LOCAL_BUDGETS`` (3) baseline budgets nearest in log compute (ties to the smaller),
  the least-squares slope of log L in log C (with 3 points and 2 parameters a robust fit would just
  interpolate two of them); any smooth law is a power law over so short a range, so this is the same whatever
  ``--form`` says. With only 2 baseline budgets the slope is fixed at the global fit's local log-slope
  ``alpha (L - E) / L`` at C_k (``fixed_exponent``);
* the level: the line goes through the baseline's own measured point at the same budget (model shape and
  tokens) when it has one, so a variant whose measured loss is below the baseline's there gets M above
  C_base / C_var (about 0.99: the variant pays 1-2 % more FLOPs); without one, through the 3 points' least-squares
  level;
* ``M_local = exp((a - log L_var) / alpha) / C_var`` for the line ``log L = a - alpha log C``: nan where the
  baseline's loss does not fall over the budgets used (alpha <= 0).

Its interval resamples seeds, as clusters: a seed's runs at every budget involved are drawn together (they
share the seed's init and batches, and the variant shares them with the baseline), runs' deviations scaled by
sqrt(m / (m - 1)) and the expanded percentile on m - 1 degrees of freedom, as for the paired loss gap; so with
2 seeds it is rough, and with one seed there is none. It ignores how the local line misses its 3 points.

Pure numpy; never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.base.bootstrap import Estimate, estimate, json_number
from analysis.estimates.study import CurveData, Study

LOCAL_BUDGETS = 3


@dataclass(frozen=True)
class LocalMultiplier:
    """M at one budget of the variant against the baseline's law fitted to its nearest budgets."""

    multiplier: Estimate
    alpha: float  # the local exponent (or the fixed one)
    fixed_exponent: bool
    baseline_compute: tuple[float, ...]  # the baseline budgets the local law was fitted to

    def to_dict(self) -> dict[str, Any]:
        return {
            "multiplier": self.multiplier.to_dict(),
            "alpha": json_number(self.alpha),
            "fixed_exponent": self.fixed_exponent,
            "baseline_compute": [json_number(c) for c in self.baseline_compute],
        }


class _SeedDraws:
    """Replicate log mean losses of points, with one draw of seed indices per set of seeds (seeds drawn
    together across points and curves)."""

    def __init__(self, n_boot: int, rng: np.random.Generator):
        self.n_boot, self.rng, self.picks = n_boot, rng, {}

    def log_mean(self, data: CurveData, i: int) -> np.ndarray | None:
        runs = data.run_losses[i]
        if runs is None or len(runs) < 2 or self.n_boot == 0:
            return None
        runs = np.asarray(runs, dtype=float)
        seeds = data.run_seeds[i] if data.run_seeds is not None else None
        key = tuple(int(s) for s in seeds) if seeds is not None else ("runs", runs.size, data.label, i)
        if key not in self.picks:
            self.picks[key] = self.rng.integers(0, runs.size, size=(self.n_boot, runs.size))
        m = runs.size
        scaled = runs.mean() + math.sqrt(m / (m - 1)) * (runs - runs.mean())
        return np.log(scaled[self.picks[key]].mean(axis=1))


def global_log_slope(study: Study, base: str, log_c: float) -> float:
    """-d log L / d log C of the baseline's global law at log C (alpha for the paper's form)."""
    fit = study.fits[base]
    return fit.law.point_log_slope(fit.model, fit.theta[None], log_c)


def _local_fit(
    x: np.ndarray, y: np.ndarray, y_var: np.ndarray, log_c: float, slope: float | None, anchor: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, log M) per replicate: a line in log-log with the least-squares slope of the baseline's log losses
    y (B, n) at log compute x (n,) (or the fixed ``slope``), through the baseline's point ``anchor`` (or, without
    one, at the least-squares level), inverted at the variant's log loss y_var (B,) at log_c."""
    if slope is not None:
        alpha = np.full(y.shape[0], slope)
    else:
        dx = x - x.mean()
        alpha = -((y - y.mean(axis=1, keepdims=True)) @ dx) / float(dx @ dx)
    a = (y + alpha[:, None] * x).mean(axis=1) if anchor is None else y[:, anchor] + alpha * x[anchor]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_m = np.where(alpha > 0, (a - y_var) / alpha - log_c, np.nan)
    return alpha, log_m


def local_multipliers(
    study: Study, label: str, base: str, level: float, n_boot: int, rng: np.random.Generator
) -> tuple[LocalMultiplier, ...]:
    """The local M at every measured budget of ``label`` (see the module docstring)."""
    v, b = study.data[label], study.data[base]
    x_base, y_base = np.log(b.compute), np.log(b.loss)
    draws = _SeedDraws(n_boot, rng)
    out = []
    for k in range(v.compute.size):
        log_c = float(np.log(v.compute[k]))
        near = np.sort(np.argsort(np.abs(x_base - log_c), kind="stable")[:LOCAL_BUDGETS])
        x = x_base[near]
        fixed = near.size < LOCAL_BUDGETS
        slope = global_log_slope(study, base, log_c) if fixed else None
        same = [r for r, j in enumerate(near) if repr(b.budget_keys[int(j)]) == repr(v.budget_keys[k])]
        anchor = same[0] if same else None

        alpha, log_m = _local_fit(x, y_base[near][None], np.array([np.log(v.loss[k])]), log_c, slope, anchor)
        samples, df = None, None
        reps = [draws.log_mean(b, int(j)) for j in near] + [draws.log_mean(v, k)]
        if any(r is not None for r in reps):
            cols = [np.full(n_boot, y) if r is None else r for r, y in zip(reps, [*y_base[near], np.log(v.loss[k])])]
            _, rep_log_m = _local_fit(x, np.stack(cols[:-1], axis=1), cols[-1], log_c, slope, anchor)
            samples = np.exp(rep_log_m)
            counts = [len(r) for r in [*(b.run_losses[int(j)] for j in near), v.run_losses[k]] if r is not None]
            df = float(min(counts) - 1)
        value = float(np.exp(log_m[0])) if np.isfinite(log_m[0]) else math.nan
        m_est = estimate(value, samples, level, df) if math.isfinite(value) else Estimate(math.nan, level=level)
        out.append(LocalMultiplier(m_est, float(alpha[0]), fixed, tuple(float(c) for c in b.compute[near])))
    return tuple(out)
