"""The power of carrying cpu_depth's fixed-width ladder deeper (studies/cpu_depth_deep/README.md): where does Block
AttnRes's paired gap to the baseline cross zero, and can a design on these machines tell?

The question, in cpu_depth's numbers: at 16 tokens per parameter its gap rose from -1.50 % at 8 sublayers to -0.17 %
at 24 (a least-squares slope of about 0.07 points of % per sublayer); if the line holds, the gap crosses zero near
26-28 sublayers and is about +1 point at 40. Two worlds to tell apart:

* **line**: the gap follows cpu_depth's line at every depth;
* **flat**: the gap follows it to 24 sublayers and stays at its value there beyond.

A design adds new depths (n_layer, seeds) to cpu_depth's five (one seed each; they are pooled: same width, recipe and
rates). Each depth's gap is drawn as the world's value plus Gaussian noise of ``sigma`` per seed (the per-seed noise
of one depth's envelope-minimum gap, measured in cpu_envelope by benchmarks/depth_power.py: 0.61 %), and estimated
as the analysis does:

* **the deepest depth's gap**: the mean of its seeds, with the 90 % interval +-1.645 sigma / sqrt(seeds) (the noise
  floor, not the seeds' own spread: with 2 seeds that has 1 degree of freedom);
* **the pooled trend**: the least-squares line of the gap on sublayers over every depth, weighted by seeds, with its
  interval from max(the residual sd, sigma) on the line's degrees of freedom (the floor again);
* **the crossing**: where that line reaches 0, with a Fieller interval, reported "not within the ladder" where the
  interval is open.

Printed per design: its cost in worker-hours (tokens and time a token both grow with depth: n_layer^2 per
(seed, rate), 0.21 worker-minutes per unit for both arms with their two budgets, as cpu_depth's runs took), the
median 90 % half-width of the deepest gap and of the trend's change, and the probabilities that decide the design:
P(the deepest gap's interval excludes 0 | line), P(its interval lies below the line's value there | flat), and
P(the crossing's interval closes within 48 sublayers | line).

    python benchmarks/depth_crossing_power.py                 # the designs side by side
    python benchmarks/depth_crossing_power.py --sigma 0.3     # at cpu_depth's own residual scatter
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

CPU_DEPTH = (4, 6, 8, 10, 12)  # cpu_depth's n_layer, one seed each
CPU_DEPTH_RESULTS = Path(__file__).resolve().parent.parent / "studies" / "cpu_depth" / "results"
MINUTES_PER_UNIT = 0.21  # worker-minutes per n_layer^2 per (seed, rate), both arms, both budgets (cpu_depth)
LEVEL = 0.9
DESIGNS = (  # new depths: ((n_layer, seeds), ...), rates per cell
    (((20, 2),), 4),
    (((20, 2),), 3),
    (((16, 1), (20, 2)), 4),
    (((16, 2), (20, 2)), 3),
    (((16, 2), (20, 2)), 4),
    (((24, 2),), 3),
    (((24, 1),), 3),  # the first part alone (seed 0)
    (((20, 1), (24, 1)), 3),
)


def cpu_depth_line(results: Path = CPU_DEPTH_RESULTS) -> tuple[float, float]:
    """cpu_depth's fitted depth trend at 16 tokens/param, as `attnres fit --lr envelope` has it: the line's gap at 24
    sublayers (% of loss) and its slope (points per sublayer). Read from the committed runs, never typed in."""
    from analysis import fit_results

    trend = fit_results(results, lr="envelope", chinchilla=False).sweep("cpu_depth@16tpp").multiplier("block").depth
    (first, last), (at_first, at_last) = trend.span, trend.gap_at
    return at_last, (at_last - at_first) / (last - first)


def world(sublayers: np.ndarray, kind: str, line_at_24: float, slope: float) -> np.ndarray:
    """The true gap (% of loss) at each depth in the world ``kind`` ("line" or "flat")."""
    line = line_at_24 + slope * (sublayers - 24)
    return line if kind == "line" else np.where(sublayers <= 24, line, line_at_24)


def simulate(
    new: tuple[tuple[int, int], ...],
    sigma: float,
    kind: str,
    reps: int,
    rng: np.random.Generator,
    line: tuple[float, float],
) -> dict:
    """Estimates of ``reps`` draws of the design ``new`` (added to cpu_depth's depths) in the world ``kind``."""
    from scipy.stats import norm
    from scipy.stats import t as student_t

    depths = [(n, 1) for n in CPU_DEPTH] + list(new)
    x = np.array([2.0 * n for n, _ in depths])
    w = np.array([float(s) for _, s in depths])
    gaps = world(x, kind, *line)[None, :] + rng.normal(0.0, 1.0, (reps, x.size)) * sigma / np.sqrt(w)
    z = float(norm.ppf(0.5 + LEVEL / 2))
    deepest = gaps[:, -1]
    deep_half = z * sigma / math.sqrt(w[-1])
    # the weighted least-squares line over every depth (weights: seeds), its residual sd per seed with the floor
    xm = float(w @ x / w.sum())
    sxx = float(w @ (x - xm) ** 2)
    ym = gaps @ w / w.sum()
    slope = ((gaps - ym[:, None]) * (w * (x - xm))[None, :]).sum(axis=1) / sxx
    resid = gaps - (ym[:, None] + slope[:, None] * (x - xm)[None, :])
    df = x.size - 2
    sd = np.maximum(np.sqrt((w * resid**2).sum(axis=1) / df), sigma)
    tq = float(student_t.ppf(0.5 + LEVEL / 2, df))
    span = float(x.max() - x.min())
    trend_half = tq * sd / math.sqrt(sxx) * span
    # Fieller: the x where the line is 0 solves (ym + b (x - xm)) = 0; its set {x: |ym + b (x - xm)| <= tq se(x)}
    # is a closed interval when the slope is resolved (b^2 > tq^2 var(b))
    var_b = (sd / math.sqrt(sxx)) ** 2
    var_m = sd**2 / w.sum()
    closed = slope**2 > tq**2 * var_b
    a2 = slope**2 - tq**2 * var_b
    b1 = ym * slope
    c0 = ym**2 - tq**2 * var_m
    disc = np.maximum(b1**2 - a2 * c0, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        hi = xm + (-b1 + np.sign(a2) * np.sqrt(disc)) / a2
        lo = xm + (-b1 - np.sign(a2) * np.sqrt(disc)) / a2
    crossing = xm - ym / slope
    line_at_deepest = float(world(x[-1:], "line", *line)[0])
    return {
        "deep_half": deep_half,
        "trend_half": float(np.median(trend_half)),
        "excludes_zero": float(np.mean(deepest - deep_half > 0)),
        "below_line": float(np.mean(deepest + deep_half < line_at_deepest)),
        "crossing_closed_48": float(np.mean(closed & (np.maximum(lo, hi) <= 48) & (slope > 0))),
        "crossing_median": float(np.median(np.where(slope > 0, crossing, np.inf))),
    }


def cost_hours(new: tuple[tuple[int, int], ...], rates: int) -> float:
    return sum(n * n * seeds for n, seeds in new) * rates * MINUTES_PER_UNIT / 60


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sigma", type=float, default=0.609, help="per-seed noise of one depth's gap, %% (cpu_envelope)"
    )
    parser.add_argument("--reps", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    at_24, slope = line = cpu_depth_line()
    print(
        f"noise {args.sigma:.3f} % per seed of one depth's gap; cpu_depth's line (its committed fit): "
        f"{at_24:+.2f} % at 24 sublayers, {slope:+.4f} points per sublayer "
        f"(crosses 0 at {24 - at_24 / slope:.1f}); {args.reps} draws"
    )
    print(
        f"{'new depths (n_layer x seeds)':<30}{'rates':>6}{'worker-h':>9}{'deep ±':>8}{'trend ±':>9}"
        f"{'P(>0|line)':>11}{'P(<line|flat)':>14}{'P(cross<=48|line)':>18}{'crossing':>9}"
    )
    for new, rates in DESIGNS:
        rng = np.random.default_rng(args.seed)
        on_line = simulate(new, args.sigma, "line", args.reps, rng, line)
        flat = simulate(new, args.sigma, "flat", args.reps, rng, line)
        name = ", ".join(f"{n} x {s}" for n, s in new)
        print(
            f"{name:<30}{rates:>6}{cost_hours(new, rates):>9.1f}"
            f"{on_line['deep_half']:>8.2f}{on_line['trend_half']:>9.2f}"
            f"{on_line['excludes_zero']:>11.2f}{flat['below_line']:>14.2f}{on_line['crossing_closed_48']:>18.2f}"
            f"{on_line['crossing_median']:>9.1f}"
        )
    print(
        "deep ±: half-width of the deepest depth's gap (points of %); trend ±: of the pooled line's change from 8 "
        "sublayers to the deepest; crossing: median estimate (sublayers) under the line"
    )


if __name__ == "__main__":
    main()
