"""Coverage of the multiplier's intervals on simulated learning-rate sweeps, under the noise real studies have.

    python benchmarks/envelope_coverage.py                          # every scenario, 300 replicates, 1,000 resamples
    python benchmarks/envelope_coverage.py --reps 100 --n-boot 200 --scenario stalls
    python benchmarks/envelope_coverage.py --sizes 8.3e4 1.68e5 4 --seeds 1    # another design (studies/cpu_muon)
    python benchmarks/envelope_coverage.py --lr split --reps 1000 --n-boot 200  # the split parabola's envelope

Each replicate simulates one tokens-per-parameter slice of a study designed like studies/cpu_envelope: 5 sizes,
the baseline and a variant each at 4 learning rates a factor 2 apart and 2 seeds, as a results table of runs (no
parquet tree), and fits it as ``attnres fit --lr envelope`` does (:func:`analysis.fitting.sweep_fits.prepare_sweep`,
then :func:`analysis.fitting.curve_fits.fit_curves`). The truth: the variant is the baseline at M = 1.25 times the
compute, so M is the same at every size. Each run's log loss is

    ln L_base(M C) + k (ln lr - ln lr*)^2 (+ asymmetry) + a seed's shift + run noise (+ a stall)

with the baseline's best rate lr* at each size on a power law in N, the variant's 1.5x lower (the committed
cpu_wsd study's L6 sweep), and k = 0.05 (a factor 2 off the best rate costs 2.4 %; cpu_wsd measured 0.5-2 %).

Scenarios:

* gauss: a seed shift of 0.5 % per (size, seed), shared by the two variants, and 0.3 % per run;
* stalls: gauss, plus a heavy tail: each run stalls with probability 0.1, ending 3-10 % high (cpu_wsd's baseline
  seed 2 ended 2-11 % high at three sizes of five);
* lr-error: gauss, plus each size's best rates off the power law by a factor exp(N(0, 0.3)) (the committed tuning
  picked rates up to 4x apart at adjacent sizes), the same for both variants;
* asymmetric: gauss, and the loss rises 2.5x faster above the best rate than below it (too high a rate costs more
  than too low), so the parabola is the wrong shape: two half-parabolas, the shape ``--lr split`` fits;
* smooth: gauss, on a smooth asymmetric curve that is neither shape fitted, k' (exp(g d) - 1 - g d) with g = 2 (a
  step of a factor 2 above the best rate costs 2.5x what a step below does, as in asymmetric; far below the best
  the loss rises linearly, far above exponentially);
* worst: stalls, lr-error and asymmetric together.

Estimators, for the headline M at the largest budget: the power-law fit with the bootstrap over budgets (the
default of ``attnres fit``), and the paired per-size M with its t-interval over sizes
(:mod:`analysis.estimates.paired`); both from the envelope's minima. Prints per scenario and estimator: the coverage of
the nominal 90 % interval, its median width (high / low) and the median estimate over the truth. 300 replicates give a
coverage a standard error of about 0.017.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.estimates.paired import paired_multiplier  # noqa: E402
from analysis.fitting.curve_fits import fit_curves  # noqa: E402
from analysis.fitting.settings import FitSettings  # noqa: E402
from analysis.fitting.sweep_points import prepare_sweep  # noqa: E402

TRUE_M = 1.25
SIZES = np.geomspace(8e4, 3.2e5, 5)  # non-embedding parameters, about cpu_envelope's ladder
TOKENS_PER_PARAM = 16
FLOPS_PER_TOKEN_PER_PARAM = 6 * 1.6  # attention and the head add to 6N at these widths
A, ALPHA = 48.87, 0.1193  # the committed cpu_wsd study's baseline fit (compute in FLOPs)
RATES = (2.5e-3, 5e-3, 1e-2, 2e-2)
BASE_BEST = 9e-3  # the baseline's best rate at the smallest size
BEST_EXPONENT = -0.25  # lr* ~ N^-0.25
VARIANT_RATIO = 1 / 1.5  # the variant's best rate over the baseline's
CURVATURE = 0.05
SEEDS = 2


@dataclass(frozen=True)
class Scenario:
    name: str
    stall_p: float = 0.0  # probability that a run stalls
    stall_range: tuple[float, float] = (0.03, 0.10)  # how far a stalled run ends above (relative)
    lr_error: float = 0.0  # SD of ln(best rate) around its power law, per size
    asymmetry: float = 1.0  # curvature above the best rate over the curvature below it
    smooth: float = 0.0  # g of the smooth asymmetric curve (0: the (half-)parabolas)
    seed_sd: float = 0.005  # a (size, seed)'s shift, shared by the variants (the same init and batches)
    run_sd: float = 0.003  # independent noise per run


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("gauss"),
        Scenario("stalls", stall_p=0.1),
        Scenario("lr-error", lr_error=0.3),
        Scenario("asymmetric", asymmetry=2.5),
        Scenario("smooth", smooth=2.0),
        Scenario("worst", stall_p=0.1, lr_error=0.3, asymmetry=2.5),
    )
}


def _penalty(lr: float, best: float, asymmetry: float, smooth: float = 0.0) -> float:
    """k (ln lr - ln best)^2, with the side above the best rate ``asymmetry`` times steeper; or, with ``smooth`` = g,
    k' (exp(g d) - 1 - g d). Normalised so that a factor 2 either way costs on average what the symmetric curve
    does."""
    d = math.log(lr / best)
    if smooth:
        step = math.log(2)
        rise = lambda x: math.exp(smooth * x) - 1 - smooth * x  # noqa: E731
        return CURVATURE * step * step * 2 / (rise(step) + rise(-step)) * rise(d)
    scale = 2 / (1 + asymmetry)
    return CURVATURE * scale * (asymmetry if d > 0 else 1.0) * d * d


@dataclass(frozen=True)
class Design:
    """The simulated study's ladder and seeds (default: cpu_envelope's)."""

    sizes: tuple[float, ...] = tuple(SIZES)
    seeds: int = SEEDS
    lr: str = "envelope"  # the fit's --lr: envelope (local parabola) or split


def simulate(s: Scenario, rng: np.random.Generator, design: Design = Design()) -> pd.DataFrame:
    """One slice's runs: every size, variant, rate and seed, as ``attnres fit`` reads them."""
    rows = []
    for k, params in enumerate(design.sizes):
        n_layer, d_model = 3 + k, 48
        tokens = TOKENS_PER_PARAM * params
        error = s.lr_error * rng.standard_normal()
        base_best = BASE_BEST * (params / design.sizes[0]) ** BEST_EXPONENT * math.exp(error)
        shifts = s.seed_sd * rng.standard_normal(design.seeds)
        for variant, m, best, overhead in (
            ("baseline", 1.0, base_best, 1.0),
            ("block", TRUE_M, base_best * VARIANT_RATIO, 1.01),
        ):
            flops = FLOPS_PER_TOKEN_PER_PARAM * params * overhead * tokens
            for lr in RATES:
                for seed in range(design.seeds):
                    log_l = math.log(A * (m * flops) ** -ALPHA) + _penalty(lr, best, s.asymmetry, s.smooth)
                    log_l += shifts[seed] + s.run_sd * rng.standard_normal()
                    if s.stall_p and rng.random() < s.stall_p:
                        log_l += math.log1p(rng.uniform(*s.stall_range))
                    rows.append(
                        {
                            "sweep": "sim",
                            "run_id": f"{variant}-{k}-{lr}-{seed}",
                            "variant": variant,
                            "n_blocks": 2 if variant == "block" else None,
                            "n_layer": n_layer,
                            "d_model": d_model,
                            "params": params,
                            "tokens": tokens,
                            "flops": flops,
                            "flops_per_token": flops / tokens,
                            "tokens_per_s": 1e5,
                            "lr": lr,
                            "seed": seed,
                            "status": "done",
                            "val_loss": math.exp(log_l),
                            "flops_convention": "simulated",
                        }
                    )
    return pd.DataFrame(rows)


def replicate(s: Scenario, rep: int, n_boot: int, design: Design = Design()) -> dict[str, tuple[bool, float, float]]:
    """One simulated slice: per estimator (covered, width high/low, estimate / truth)."""
    key = [rep, int(1e3 * s.stall_p), int(1e3 * s.lr_error), int(1e3 * s.asymmetry)]
    key += [int(1e3 * s.smooth)] if s.smooth else []  # the earlier scenarios keep their draws
    rng = np.random.default_rng(key)
    settings = FitSettings(lr=design.lr, n_boot=n_boot, seed=rep, chinchilla=False, stall_margin=0)
    prepared = prepare_sweep(simulate(s, rng, design), "sim", settings)
    study, _, (m,) = fit_curves(prepared.data, settings)
    paired = paired_multiplier(study, "block", "baseline", settings.level)
    out = {}
    for name, est in (("budgets bootstrap", m.multiplier), ("paired t", paired.mean)):
        out[name] = (est.contains(TRUE_M), est.high / est.low, est.value / TRUE_M)
    return out


def coverage(
    s: Scenario, reps: int, n_boot: int, start: int = 0, design: Design = Design()
) -> dict[str, dict[str, float]]:
    rows = [replicate(s, start + r, n_boot, design) for r in range(reps)]
    return {
        name: {
            "coverage": float(np.mean([r[name][0] for r in rows])),
            "width": float(np.median([r[name][1] for r in rows])),
            "bias": float(np.median([r[name][2] for r in rows])),
        }
        for name in rows[0]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--scenario", action="append", choices=list(SCENARIOS), default=None)
    parser.add_argument(
        "--sizes", nargs=3, metavar=("SMALLEST", "LARGEST", "COUNT"), help="the ladder: COUNT sizes, geometric"
    )
    parser.add_argument("--seeds", type=int, default=SEEDS, help=f"seeds per run (default {SEEDS})")
    parser.add_argument("--lr", choices=("envelope", "split"), default="envelope", help="the envelope fitted")
    args = parser.parse_args()
    sizes = tuple(SIZES) if not args.sizes else tuple(np.geomspace(*map(float, args.sizes[:2]), int(args.sizes[2])))
    design = Design(sizes, args.seeds, args.lr)
    print(f"true M {TRUE_M}; {args.reps} replicates; {args.n_boot} bootstrap resamples; nominal 90% intervals")
    print(
        f"design: {len(sizes)} sizes {sizes[0]:.3g} to {sizes[-1]:.3g} parameters, {len(RATES)} rates, "
        f"{design.seeds} seed(s); --lr {design.lr}"
    )
    print("scenario  estimator  coverage  width  est/true")
    for name in args.scenario or list(SCENARIOS):
        t0 = time.perf_counter()
        found = coverage(SCENARIOS[name], args.reps, args.n_boot, design=design)
        for estimator, r in found.items():
            print(
                f"{name}  {estimator}  {r['coverage']:.3f}  {r['width']:.3f}  {r['bias']:.3f}  "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
