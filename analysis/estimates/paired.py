"""The paired per-size multiplier: M at each size from the paired losses of the variant and the baseline at the same
budget, and a t-interval over sizes for their mean.

At one budget (one model shape, the same tokens) the variant reaches loss L_v with compute C_v and the baseline
L_b with C_b. The baseline's law near there has the local log-slope s = -d ln L / d ln C (alpha for L = A C^-alpha),
so the compute it needs for L_v is, to first order in the (small) gap,

    ln M_k = ln C_b - ln C_v + (ln L_b - ln L_v) / s          (the equal-budget identity)

Only the slope comes from a fitted law; the level is the baseline's measured loss at the same budget, paired by
seed (the same init of shared parameters and the same batches) where both have the seed. The sizes are treated as
independent estimates of one M: their mean in log space with a Student t interval on K - 1 degrees of freedom,
widened by the slope's own uncertainty where the fit has bootstrap replicates of it (the slope scales every size's
term at once, so the spread over sizes does not see its error: without it the interval covers about 0.7 where 0.9
is asked, benchmarks/envelope_coverage.py). It needs no assumption on how the points stray from the law, so it is
the check on the power-law headline: where the two intervals do not overlap, the report says so
(docs/analysis.md, "Paired per-size M").

Pure numpy/scipy; never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.base.bootstrap import Estimate, json_number
from analysis.estimates.local import global_log_slope
from analysis.estimates.study import Study


@dataclass(frozen=True)
class SizeMultiplier:
    """M at one budget from the paired losses (``log_gap``: mean over paired seeds of ln L_b - ln L_v)."""

    budget: str
    compute: float
    baseline_compute: float
    log_gap: float
    slope: float
    multiplier: float
    n_pairs: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "compute": json_number(self.compute),
            "baseline_compute": json_number(self.baseline_compute),
            "log_gap": json_number(self.log_gap),
            "slope": json_number(self.slope),
            "multiplier": json_number(self.multiplier),
            "n_pairs": self.n_pairs,
        }


@dataclass(frozen=True)
class PairedMultiplier:
    """Every size's M, their mean with its t-interval, and whether it agrees with the power-law headline."""

    sizes: tuple[SizeMultiplier, ...]
    mean: Estimate
    agrees: bool | None = None  # the two intervals overlap (None: one of them has none)

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.to_dict(), "agrees": self.agrees, "sizes": [s.to_dict() for s in self.sizes]}


def budget_name(key: Any, compute: float) -> str:
    if isinstance(key, tuple) and len(key) == 3:
        return f"L{key[0]}-d{key[1]}"
    return f"C = {compute:.3g}"


def t_interval(values: np.ndarray, level: float) -> Estimate:
    """The mean of ``values`` with its Student t interval (no interval below two values)."""
    from scipy.stats import t as student_t

    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if values.size < 2:
        return Estimate(mean, math.nan, math.nan, level)
    half = float(student_t.ppf(0.5 + level / 2, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size))
    return Estimate(mean, mean - half, mean + half, level)


def paired_multiplier(study: Study, label: str, base: str, level: float) -> PairedMultiplier | None:
    """The paired per-size M of ``label`` over ``base`` (None without two shared budgets or a usable slope)."""
    v, b = study.data[label], study.data[base]
    where = {repr(k): j for j, k in enumerate(b.budget_keys)}
    sizes = []
    for i, key in enumerate(v.budget_keys):
        j = where.get(repr(key))
        if j is None:
            continue
        gap, n_pairs = _paired_gap(v, i, b, j)
        slope = global_log_slope(study, base, math.log(float(b.compute[j])))
        if not (math.isfinite(gap) and slope > 0):
            continue
        log_m = math.log(float(b.compute[j]) / float(v.compute[i])) + gap / slope
        sizes.append(
            SizeMultiplier(
                budget_name(key, float(v.compute[i])),
                float(v.compute[i]),
                float(b.compute[j]),
                gap,
                slope,
                math.exp(log_m),
                n_pairs,
            )
        )
    if len(sizes) < 2:
        return None
    logs = np.log([s.multiplier for s in sizes])
    plain = t_interval(logs, level)
    low, high = plain.low, plain.high
    slopes = _slope_draws(study, base, np.array([s.baseline_compute for s in sizes]))
    if slopes is not None:
        from scipy.stats import t as student_t

        compute_terms = np.log([s.baseline_compute / s.compute for s in sizes])
        gaps = np.array([s.log_gap for s in sizes])
        with np.errstate(divide="ignore", invalid="ignore"):
            centres = (compute_terms + gaps / slopes).mean(axis=1)  # (B,) the mean at each replicate's slope
        rng = np.random.default_rng(len(sizes))
        spread = (
            logs.std(ddof=1) / math.sqrt(logs.size) * student_t.rvs(logs.size - 1, size=centres.size, random_state=rng)
        )
        draws = centres[np.isfinite(centres)] + spread[np.isfinite(centres)]
        tail = (1 - level) / 2
        low, high = (float(q) for q in np.quantile(draws, [tail, 1 - tail]))
    mean = Estimate(math.exp(plain.value), math.exp(low), math.exp(high), level)
    return PairedMultiplier(tuple(sizes), mean)


def _slope_draws(study: Study, base: str, compute: np.ndarray) -> np.ndarray | None:
    """(B, K) the baseline's local slope at each compute in each bootstrap replicate of its fit (None without)."""
    if study.n_boot == 0 or base not in study.theta:
        return None
    fit = study.fits[base]
    theta = study.theta[base][study.ok[base]]
    if theta.shape[0] < 2:
        return None
    return fit.law.log_slope(fit.model, theta, np.log(compute))


def _paired_gap(v: Any, i: int, b: Any, j: int) -> tuple[float, int]:
    """Mean over the seeds both points have of ln L_b - ln L_v, and how many; the points' losses without any."""
    sv, sb = v.run_seeds[i], b.run_seeds[j]
    rv = v.run_losses[i] if v.run_losses[i] is not None else [v.loss[i]]
    rb = b.run_losses[j] if b.run_losses[j] is not None else [b.loss[j]]
    if sv is not None and sb is not None and len(sv) == len(rv) and len(sb) == len(rb):
        seeds_v, seeds_b = [int(s) for s in sv], [int(s) for s in sb]
        common = sorted(set(seeds_v) & set(seeds_b))
        if common:
            gaps = [math.log(float(rb[seeds_b.index(s)])) - math.log(float(rv[seeds_v.index(s)])) for s in common]
            return float(np.mean(gaps)), len(common)
    return math.log(float(b.loss[j])) - math.log(float(v.loss[i])), 0


def agreement(paired: PairedMultiplier, headline: Estimate) -> PairedMultiplier:
    """``paired`` with ``agrees`` set: whether its interval and the headline's overlap."""
    from dataclasses import replace

    if not (paired.mean.has_interval and headline.has_interval):
        return paired
    overlap = paired.mean.low <= headline.high and headline.low <= paired.mean.high
    return replace(paired, agrees=bool(overlap))
