"""The power of a one-shape study (the block-size and ablation sweeps, studies/cpu_ablations/README.md): how wide the
90 % interval of each curve's gap to the baseline will be (analysis/estimates/one_shape.py, as
`attnres fit --lr envelope` computes it), whether it covers the truth, and how often it excludes 0, for a design of
curves, rates and seeds.

Each simulated curve has an asymmetric loss-rate curve as the CPU studies measured (one factor 2 above the best rate
costs 5 % of loss, one below under 1 %: cpu_envelope), its best rate anywhere within a factor 1.4 of the grid's
centre, and its true gap to the baseline. The noise on log loss: a per-run part, and a per-seed part (a seed's init
and batches shift all its rates), shared between the curves with correlation ``--shared``; the two are set so that
one seed's paired gap at the envelope minima scatters by ``--noise`` (cpu_envelope measured 0.61 % at d48). The
scenarios: that noise (per run only, per seed only, half each), then one stalled seed (a curve's seed 2 % worse at
every rate).

    python benchmarks/one_shape_power.py                # the cpu_ablations design: 16 curves, 3 rates, 2 seeds
    python benchmarks/one_shape_power.py --seeds 3 --reps 400
    python benchmarks/one_shape_power.py --calibrate          # the envelope's resolution constant
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd

from analysis.data.envelope import envelope_points, fit_envelopes
from analysis.estimates.one_shape import RESOLUTION, one_shape_comparison

LOW, HIGH = 0.008 / math.log(2) ** 2, 0.05 / math.log(2) ** 2  # log-loss curvature below / above the best rate


def resolution(low: float = 0.008, high: float = 0.05, positions: int = 201) -> float:
    """The sd of a 3-rate parabola's misreading of an asymmetric curve's minimum, as its best rate falls evenly
    between the rates (one factor 2 apart), per unit of the parabola's curvature times the spacing squared: what
    analysis.estimates.one_shape.RESOLUTION holds. ``low`` / ``high``: the log-loss cost one factor 2 below / above the
    best."""
    h = math.log(2)
    t = np.array([-h, 0.0, h])
    misread, curvature = [], []
    for best in np.linspace(-h / 2, h / 2, positions):
        d = t - best
        c, b, a = np.polyfit(t, np.where(d < 0, low, high) / h**2 * d * d, 2)
        vertex = float(np.clip(-b / (2 * c), -h, h))
        misread.append(a + b * vertex + c * vertex**2)  # the true minimum is 0
        curvature.append(c)
    return float(np.std(misread) / (np.mean(curvature) * h * h))


def simulate(
    rng: np.random.Generator,
    gaps: np.ndarray,
    seeds: int,
    rates: int,
    run_sd: float,
    seed_sd: float,
    shared: float,
    stalled: bool,
) -> pd.DataFrame:
    """The runs of one simulated study: curve 0 the baseline, curve i at true gap ``gaps[i]`` points below it."""
    t = (np.arange(rates) - (rates - 1) / 2) * math.log(2)
    common = rng.normal(0, seed_sd, seeds)
    rows = []
    for i, gap in enumerate(gaps):
        best = rng.uniform(-0.5, 0.5) * math.log(2)
        own = rng.normal(0, seed_sd, seeds)
        for s in range(seeds):
            shift = math.sqrt(shared) * common[s] + math.sqrt(1 - shared) * own[s]
            if stalled and i == 1 and s == 0:
                shift += 0.02
            for r, tr in enumerate(t):
                d = tr - best
                log_loss = math.log(1.7) - gap / 100 + (LOW if d < 0 else HIGH) * d * d + shift
                rows.append(
                    {
                        "run_id": f"c{i}-s{s}-r{r}",
                        "sweep": "sim",
                        "curve": "baseline" if i == 0 else f"v{i}",
                        "variant": "baseline" if i == 0 else f"v{i}",
                        "n_blocks": None,
                        "n_layer": 6,
                        "d_model": 48,
                        "params": 1.7e5,
                        "tokens": 1.33e6,
                        "flops": 2e12,
                        "flops_per_token": 1.5e6,
                        "tokens_per_s": 1e4,
                        "lr": 7e-3 * math.exp(tr),
                        "seed": s,
                        "val_loss": math.exp(log_loss + rng.normal(0, run_sd)),
                    }
                )
    return pd.DataFrame(rows)


def one_study(rng, gaps, args, run_sd, seed_sd, stalled) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    runs = simulate(rng, gaps, args.seeds, args.rates, run_sd, seed_sd, args.shared, stalled)
    envelopes = fit_envelopes(runs)
    one = one_shape_comparison(envelope_points(runs, envelopes), runs, envelopes, "baseline", 0.9)
    est = [one.gap(f"v{i}").gap for i in range(1, gaps.size)]
    low, high = np.array([e.low for e in est]), np.array([e.high for e in est])
    return np.array([e.value for e in est]), low, high


def scenario(name: str, args, run_sd: float, seed_sd: float, stalled: bool = False) -> float:
    """Print the scenario's coverage, half-width, error and power; return its coverage."""
    rng = np.random.default_rng(args.rng)
    gaps = np.concatenate([[0.0], np.linspace(0, 2, args.curves - 1)])
    covered, width, excludes, errors = [], [], [], []
    for _ in range(args.reps):
        value, low, high = one_study(rng, gaps, args, run_sd, seed_sd, stalled)
        truth = gaps[1:]
        covered.append((low <= truth) & (truth <= high))
        width.append((high - low) / 2)
        excludes.append(low > 0)
        errors.append(value - truth)
    covered, excludes = np.array(covered), np.array(excludes)
    at = {g: int(np.argmin(np.abs(gaps[1:] - g))) for g in (1.14, 1.66)}
    stalled_note = f"; the stalled curve alone {covered[:, 0].mean():.2f}" if stalled else ""
    print(
        f"{name:<34} coverage {covered.mean():.2f} (90 % asked){stalled_note}; half-width median "
        f"{np.median(width):.2f} points; error sd {np.std(errors):.2f}; interval above 0 at a true gap "
        + ", ".join(f"{gaps[1:][i]:.2f}: {excludes[:, i].mean():.2f}" for i in at.values())
    )
    return float(covered.mean())


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Every scenario's coverage, by name (printed as it goes)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--curves", type=int, default=16, help="curves, the baseline included (cpu_ablations: 16)")
    parser.add_argument("--rates", type=int, default=3, help="rates a factor 2 apart per curve")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--noise", type=float, default=0.61, help="sd of one seed's paired gap, points of %%")
    parser.add_argument("--shared", type=float, default=0.5, help="correlation of a seed's shift between curves")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--rng", type=int, default=0)
    parser.add_argument("--calibrate", action="store_true", help="print the envelope's resolution constant, and stop")
    args = parser.parse_args(argv)
    if args.calibrate:
        print(
            f"resolution: sd of the minimum's misreading per unit c h^2 = {resolution():.3f} (5 % / 0.8 % a factor 2 "
            f"above / below the best rate, as cpu_envelope measured); {resolution(0.01, 0.03):.3f} at 3 % / 1 %; "
            f"analysis.estimates.one_shape.RESOLUTION = {RESOLUTION}"
        )
        return {}
    total = args.noise / 100 / math.sqrt(2)  # one curve's share of a seed's paired-gap noise
    seed_only = total / math.sqrt(1 - args.shared)
    # a run's noise reaches the envelope minimum roughly divided by sqrt(rates) (the seed's level is fitted to
    # its rates); scale it so that, alone, it gives the asked per-seed scatter
    run_only = total * math.sqrt(args.rates)
    print(
        f"design: {args.curves} curves x {args.rates} rates x {args.seeds} seeds; per-seed paired-gap noise "
        f"{args.noise} points; {args.reps} simulated studies per scenario\n"
    )
    half = (run_only / math.sqrt(2), seed_only / math.sqrt(2))
    return {
        "per-run": scenario("per-run noise only", args, run_only, 0.0),
        "per-seed": scenario("per-seed noise only", args, 0.0, seed_only),
        "half": scenario("half each", args, *half),
        "stalled": scenario("half each, a stalled seed", args, *half, stalled=True),
    }


if __name__ == "__main__":
    main()
