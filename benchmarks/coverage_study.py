"""Coverage of the multiplier's interval on simulated studies with a known multiplier.

    python benchmarks/coverage_study.py                       # every scenario x method, 1,000 replicates each
    python benchmarks/coverage_study.py --reps 200 --n-boot 300 --scenario a-power --method budgets

Each replicate simulates the points of a baseline and one variant (flops and the loss of every seed at every
budget; no parquet tree), fits them with :func:`analysis.fitting.curve_fits.fit_curves`, the function ``attnres fit``
runs per sweep once its points are chosen, and checks whether the headline's interval (M at the largest
budget, exponent "auto") contains the true M. The variant is the baseline's true curve at M times the compute,
``L_var(C) = L_base(M C)``, so M is the same at every budget, also for the bending law: "the truth" is M at the
largest budget of the true curves, 0.8 here.

Scenarios (log-loss noise; seeds are shared by the variants, as in the suite: seed noise correlated 0.5):

* a-power: L = A C^-alpha, seed noise only (0.4% per run);
* b-bend: L = E + A C^-alpha (E = 0.55: the top budget ~3% above the pure power law through the other four),
  fitted with the pure form A C^-alpha;
* c-common: budget-level deviations from the law of 1.5% RMS, the same for both variants (shared seeds' data
  order, a size that trains well for everyone), plus seed noise;
* c-indep: budget-level deviations of 1% RMS drawn independently per (variant, budget), plus seed noise;
* d-study: the committed study's shape: 5 budgets, 2 seeds, common deviations 2% RMS and 0.5% per variant.

Prints, per scenario and method: coverage of the nominal interval over all replicates, the share marked
unreliable, coverage among the replicates not marked, the median width of the interval (high / low) and the
median estimate over the truth.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.estimates.study import INTERVAL_METHODS, CurveData  # noqa: E402
from analysis.fitting.curve_fits import fit_curves  # noqa: E402
from analysis.fitting.settings import FitSettings  # noqa: E402

TRUE_M = 0.8
C_MIN, C_MAX = 2.6e11, 3.6e13  # the committed study's budgets
A, ALPHA = 48.87, 0.1193  # the committed study's baseline fit


@dataclass(frozen=True)
class Scenario:
    name: str
    budgets: int = 5
    seeds: int = 3
    bend: bool = False
    common: float = 0.0  # RMS of the budget-level deviation shared by the variants (log loss)
    indep: float = 0.0  # RMS of the budget-level deviation drawn per (variant, budget)
    seed_sd: float = 0.004  # per-run noise (log loss)
    seed_corr: float = 0.5  # correlation of a seed's noise between variants (same init and batches)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("a-power"),
        Scenario("b-bend", bend=True),
        Scenario("c-common", common=0.015),
        Scenario("c-indep", indep=0.01),
        Scenario("d-study", seeds=2, common=0.02, indep=0.005),
    )
}


def _bend_law() -> tuple[float, float, float]:
    """(E, A, alpha) of a bending law through the study's smallest and largest budget losses."""
    e_value = 0.55
    l_lo, l_hi = A * C_MIN**-ALPHA, A * C_MAX**-ALPHA
    alpha = math.log((l_lo - e_value) / (l_hi - e_value)) / math.log(C_MAX / C_MIN)
    return e_value, (l_hi - e_value) * C_MAX**alpha, alpha


def true_loss(compute: np.ndarray, bend: bool) -> np.ndarray:
    if not bend:
        return A * compute**-ALPHA
    e_value, a, alpha = _bend_law()
    return e_value + a * compute**-alpha


def simulate(s: Scenario, rng: np.random.Generator) -> list[CurveData]:
    """The baseline's and the variant's points: mean over seeds of each budget, and the seeds' losses."""
    compute = np.geomspace(C_MIN, C_MAX, s.budgets)
    common_dev = s.common * rng.standard_normal(s.budgets)
    shared_seed = rng.standard_normal((s.budgets, s.seeds))
    curves = []
    for label, m, flops_factor in (("baseline", 1.0, 1.0), ("variant", TRUE_M, 1.02)):
        c = compute * flops_factor
        log_l = np.log(true_loss(m * c, s.bend)) + common_dev + s.indep * rng.standard_normal(s.budgets)
        own = rng.standard_normal((s.budgets, s.seeds))
        noise = s.seed_sd * (math.sqrt(s.seed_corr) * shared_seed + math.sqrt(1 - s.seed_corr) * own)
        runs = np.exp(log_l[:, None] + noise)
        curves.append(
            CurveData(
                label,
                c,
                runs.mean(axis=1),
                [r for r in runs],
                np.full(s.budgets, s.seeds),
                "mean",
                run_seeds=[np.arange(s.seeds) for _ in range(s.budgets)],
            )
        )
    return curves


def replicate(
    s: Scenario, method: str, rep: int, n_boot: int, form: str = "A*C^-alpha"
) -> tuple[bool, bool, float, float]:
    """One simulated study: (covered, reliable, width high/low, estimate / truth) of the headline M."""
    rng = np.random.default_rng([rep, s.budgets, s.seeds, int(s.bend), int(1e4 * s.common), int(1e4 * s.indep)])
    data = simulate(s, rng)
    settings = FitSettings(form=form, n_boot=n_boot, seed=rep, resample=method, chinchilla=False)
    _, _, multipliers = fit_curves(data, settings)
    m = multipliers[0]
    est = m.multiplier
    return est.contains(TRUE_M), m.reliable, est.high / est.low, est.value / TRUE_M


def coverage(
    s: Scenario, method: str, reps: int, n_boot: int, start: int = 0, form: str = "A*C^-alpha"
) -> dict[str, float]:
    rows = [replicate(s, method, start + r, n_boot, form) for r in range(reps)]
    covered = np.array([r[0] for r in rows])
    reliable = np.array([r[1] for r in rows])
    return {
        "coverage": float(covered.mean()),
        "unreliable": float(1 - reliable.mean()),
        "coverage_reliable": float(covered[reliable].mean()) if reliable.any() else math.nan,
        "width": float(np.median([r[2] for r in rows])),
        "bias": float(np.median([r[3] for r in rows])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1000)
    parser.add_argument("--n-boot", type=int, default=400)
    parser.add_argument("--scenario", action="append", choices=list(SCENARIOS), default=None)
    parser.add_argument("--method", action="append", choices=list(INTERVAL_METHODS), default=None)
    parser.add_argument("--form", default="A*C^-alpha", help="the form fitted (default: the paper's)")
    args = parser.parse_args()
    print(
        f"true M {TRUE_M}; {args.reps} replicates of {args.n_boot} bootstrap resamples; nominal 90% intervals; "
        f"form {args.form}"
    )
    header = (
        "scenario",
        "budgets",
        "seeds",
        "method",
        "coverage",
        "unreliable",
        "coverage if reliable",
        "width",
        "est/true",
    )
    print("  ".join(header))
    for name in args.scenario or list(SCENARIOS):
        s = SCENARIOS[name]
        for method in args.method or list(INTERVAL_METHODS):
            t0 = time.perf_counter()
            r = coverage(s, method, args.reps, args.n_boot, form=args.form)
            print(
                f"{name}  {s.budgets}  {s.seeds}  {method}  {r['coverage']:.3f}  {r['unreliable']:.3f}  "
                f"{r['coverage_reliable']:.3f}  {r['width']:.3f}  {r['bias']:.3f}  ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
