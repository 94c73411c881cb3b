"""Time of the scaling-law analysis: three variants x seven budgets, 1,000 bootstrap resamples.

    python benchmarks/bench_analysis.py                 # prints seconds; the target is well under 10 s on 2 cores
    python benchmarks/bench_analysis.py --n-boot 5000 --form E+A*C^-alpha --seeds 3

Writes a synthetic results tree (baseline, full, block; 7 budgets; 0.3% noise) to a temporary folder, then
times, separately: loading it, ``fit_results`` (curve fits, joint fit, the shared bootstrap, every multiplier
with its interval, the exponent tests), and the array API (three ``fit_power_law`` calls with their own
bootstraps plus two ``compute_multiplier`` calls). Each is the best of ``--repeat`` runs. No assertion:
timings go to stdout.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the synthetic results writer lives in tests/


def best_of(repeat: int, fn):  # noqa: ANN001, ANN201
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--form", default="A*C^-alpha")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import analysis
    from tests.synthetic_results import write_synthetic_results

    with tempfile.TemporaryDirectory() as tmp:
        tree = write_synthetic_results(tmp, seeds=args.seeds, noise=0.003, tables=False)
        t_load, results = best_of(args.repeat, lambda: analysis.load_results(tree.root, tables=()))
        t_fit, report = best_of(
            args.repeat, lambda: analysis.fit_results(results, form=args.form, n_boot=args.n_boot, chinchilla=False)
        )

        runs = tree.runs
        data = {v: (g["flops"].to_numpy(), g["val_loss"].to_numpy()) for v, g in runs.groupby("variant")}

        def api() -> list:
            fits = {v: analysis.fit_power_law(c, l, args.form, n_boot=args.n_boot) for v, (c, l) in data.items()}
            return [
                analysis.compute_multiplier(fits["baseline"], fits[v], at=float(np.max(data[v][0])))
                for v in ("full", "block")
            ]

        t_api, mults = best_of(args.repeat, api)

    sweep = report.sweeps[0]
    print(
        f"analysis benchmark: 3 variants x 7 budgets x {args.seeds} seed(s), {args.n_boot} bootstrap resamples, "
        f"form {args.form}"
    )
    print(f"  load_results (runs table)                       {t_load:7.3f} s")
    print(f"  fit_results (everything `attnres fit` computes) {t_fit:7.3f} s")
    print(f"  fit_power_law x3 + compute_multiplier x2        {t_api:7.3f} s")
    for m in sweep.multipliers:
        truth = tree.multipliers[m.variant]
        print(f"  {m.variant:6s} M at largest budget = {m.multiplier.text()} ({m.exponent} exponent; truth {truth})")
    for v, m in zip(("full", "block"), mults):
        print(f"  {v:6s} M from the array API (separate exponents) = {m.multiplier[0].text()}")


if __name__ == "__main__":
    main()
