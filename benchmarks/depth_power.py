"""The power of a fixed-width depth ladder (studies/cpu_depth/README.md): how wide the 90 % interval of the depth
trend (the change of the paired gap from the shallowest to the deepest size, analysis/estimates/depth.py) will be, and
whether it covers the truth, for a design of depths and seeds, with the noise measured in a committed study.

The noise: each (size, budget, seed) of the committed study at d_model 48 gives a paired gap between the two arms'
learning-rate envelope minima (a parabola in ln rate through the best rate and its neighbours, as `--lr envelope`
reads a cell); the spread of the two seeds' gaps is the per-seed noise of one depth's gap. The simulation draws
each depth's gap as a line in depth plus that noise (Gaussian; then with one depth in five off by 3 to 10 times the
noise, as a stalled run or a cliff in the loss-rate curve would put it) and fits the trend as `attnres fit` does.

    python benchmarks/depth_power.py                         # the measured noise, then the designs side by side
    python benchmarks/depth_power.py --depths 4 6 8 10 12 --seeds 2 --reps 4000
    python benchmarks/depth_power.py --depths 2 3 4 5 --rows 4 --seeds 2   # an architecture sweep's 4 x 4 cells
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "cpu_envelope" / "results"


def envelope_minimum(lrs: np.ndarray, losses: np.ndarray) -> float:
    """ln loss at the minimum of a parabola in ln rate through the best rate and its two neighbours (the best
    loss itself where the three make no upward parabola)."""
    x, y = np.log(lrs), np.log(losses)
    i = int(np.argmin(y))
    lo = max(0, min(i - 1, x.size - 3))
    c = np.polyfit(x[lo : lo + 3], y[lo : lo + 3], 2)
    if c[0] <= 0:
        return float(y[i])
    vertex = float(np.clip(-c[1] / (2 * c[0]), x[lo], x[lo + 2]))
    return float(np.polyval(c, vertex))


def measured_noise(
    results: Path = STUDY, d_model: int = 48, base: str = "baseline", variant: str = "block", rate: float | None = None
) -> float:
    """The per-seed standard deviation (% of loss) of one cell's paired envelope-minimum gap (``rate``: of the
    paired gap at that one rate instead), from the two seeds of every (size, budget) of ``results`` at
    ``d_model``."""
    from analysis import load_results

    runs = load_results(results, tables=()).runs
    runs = runs[(runs["status"] == "done") & (runs["d_model"] == d_model) & ~runs["sweep"].str.endswith("-trunk")]
    diffs = []
    for _, cell in runs.groupby(["n_layer", "tokens"]):
        gaps = []
        for seed in (0, 1):
            minima = []
            for arm in (base, variant):
                g = cell[(cell["variant"] == arm) & (cell["seed"] == seed)].sort_values("lr")
                if rate is not None:
                    g = g[np.isclose(g["lr"].to_numpy(float), rate, rtol=1e-6)]
                    if len(g) == 1:
                        minima.append(float(np.log(g["val_loss"].iloc[0])))
                    continue
                if len(g) < 3:
                    break
                minima.append(envelope_minimum(g["lr"].to_numpy(float), g["val_loss"].to_numpy(float)))
            if len(minima) == 2:
                gaps.append(100 * (minima[0] - minima[1]))
        if len(gaps) == 2:
            diffs.append(gaps[0] - gaps[1])
    if len(diffs) < 3:
        raise SystemExit(f"{results}: fewer than 3 cells with two seeds of both arms at d_model {d_model}")
    return float(np.std(diffs, ddof=1) / math.sqrt(2))


def trend_intervals(x: np.ndarray, y: np.ndarray, level: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """The change of the least-squares line over x's span and its t half-width, for each row of y (as
    analysis.estimates.depth does for one)."""
    from scipy.stats import t as student_t

    dx = x - x.mean()
    sxx = float(dx @ dx)
    slope = (y - y.mean(axis=1, keepdims=True)) @ dx / sxx
    fitted = y.mean(axis=1, keepdims=True) + slope[:, None] * dx[None, :]
    sd = np.sqrt(((y - fitted) ** 2).sum(axis=1) / (x.size - 2))
    span = float(x[-1] - x[0])
    half = float(student_t.ppf(0.5 + level / 2, x.size - 2)) * sd / math.sqrt(sxx) * span
    return slope * span, half


def simulate(
    depths: list[int],
    seeds: int,
    sigma: float,
    change: float,
    reps: int,
    outliers: bool,
    rng: np.random.Generator,
    rows: int = 1,
) -> tuple[float, float, float]:
    """Coverage of the true change, median half-width, and the share of intervals that exclude 0, for a true
    change ``change`` (points of %) over the ladder. ``rows``: cells per depth (an architecture sweep's head
    counts, each its own runs)."""
    x = 2 * np.repeat(np.asarray(depths, dtype=float), rows)
    truth = change * (x - x[0]) / (x[-1] - x[0])
    noise = rng.normal(0, sigma / math.sqrt(seeds), (reps, x.size))
    if outliers:  # one depth in five off by 3-10 sigma (of one seed), either way
        hit = rng.random((reps, x.size)) < 0.2
        noise += hit * rng.choice([-1, 1], (reps, x.size)) * rng.uniform(3, 10, (reps, x.size)) * sigma / seeds
    est, half = trend_intervals(x, truth[None, :] + noise)
    covered = np.abs(est - change) <= half
    resolved = np.abs(est) > half
    return float(covered.mean()), float(np.median(half)), float(resolved.mean())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", help="n_layer of the sizes (default: compare designs)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--rows", type=int, default=1, help="cells per depth (an architecture sweep's head counts)")
    parser.add_argument("--sigma", type=float, help="per-seed noise of one depth's gap, %% (default: measured)")
    parser.add_argument(
        "--at-rate", type=float, help="measure the noise of the gap at this one rate (default: at the envelope minima)"
    )
    parser.add_argument("--change", type=float, default=1.0, help="the true change over the ladder, points of %%")
    parser.add_argument("--reps", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sigma = args.sigma
    if sigma is None:
        sigma = measured_noise(rate=args.at_rate)
        where = "envelope minima" if args.at_rate is None else f"at rate {args.at_rate:g}"
        print(f"noise: {sigma:.3f} % per seed of one depth's paired gap (cpu_envelope, d_model 48, {where})")
    designs = (
        [(args.depths, args.seeds)]
        if args.depths
        else [([4, 6, 8, 10, 12], 1), ([4, 6, 8, 10, 12], 2), (list(range(4, 13)), 1), ([4, 8, 12], 2)]
    )
    print(f"true change over the ladder: {args.change:+.2f} points of %; {args.reps} replicates; 90 % intervals")
    print(
        f"{'depths (n_layer)':<28}{'seeds':>6}{'cells':>7}{'half-width':>12}{'coverage':>10}"
        f"{'resolved':>10}{'with outliers: cov.':>21}{'half-width':>12}"
    )
    for depths, seeds in designs:
        rng = np.random.default_rng(args.seed)
        cov, half, res = simulate(depths, seeds, sigma, args.change, args.reps, False, rng, args.rows)
        cov_o, half_o, _ = simulate(depths, seeds, sigma, args.change, args.reps, True, rng, args.rows)
        cost = (
            sum(n * n for n in depths) * seeds * args.rows
        )  # compute per (arm, rate): tokens ~ n_layer, time a token ~ n_layer
        print(
            f"{' '.join(map(str, depths)):<28}{seeds:>6}{cost:>7}{half:>11.2f} {cov:>10.3f}{res:>10.3f}"
            f"{cov_o:>21.3f}{half_o:>11.2f}"
        )
    print("cells: the design's compute in units of one n_layer 1 cell (tokens and time a token both grow with depth)")


if __name__ == "__main__":
    main()
