"""How long ``attnres report`` takes on a 50-run results tree, and whether two builds give the same numbers.

The tree (synthetic, following the run-folder contract exactly, with metrics / layers / depth_attn tables):

* sweep ``scaling``: baseline, Full and Block (N = 4) at 7 budgets from 1e15 to 1e18 FLOPs, 2 seeds each
  (42 runs, 0.3 % noise);
* sweep ``ablation``: one size, baseline, Full, Block with N = 1, 2, 4, 8 and two ablation variants
  (8 runs), so the block-size figure and the Table 4 like table are drawn too.

Run: ``python benchmarks/bench_report.py [--pdf] [--n-boot 1000]``. Prints the time of each build (load + fit
+ every figure as PNG and SVG + report.md / report.html / report.json) and checks that the second build
wrote byte-identical report.md, report.json and figures. Target: well under a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from tests.synthetic_results import write_synthetic_results  # noqa: E402


def write_tree(root: Path) -> int:
    write_synthetic_results(root, sweep="scaling", budgets=np.geomspace(1e15, 1e18, 7), seeds=2, noise=0.003)
    kw = dict(sweep="ablation", budgets=[1e16], seeds=1, noise=0.002)
    write_synthetic_results(
        root, multipliers={"baseline": 1.0, "full": 1.27, "full+sigmoid": 1.2, "block+no_key_norm": 1.15}, **kw
    )
    for n, m in ((1, 1.02), (2, 1.22), (4, 1.25), (8, 1.24)):
        write_synthetic_results(root, multipliers={"block": m}, n_blocks=n, rng_seed=n, **kw)
    return sum(1 for _ in root.rglob("run.parquet"))


def digest(out: Path, files: list[Path]) -> dict[str, str]:
    return {
        p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in files
        if p.name != ".report-files.json"
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pdf", action="store_true", help="also write PDFs")
    parser.add_argument(
        "--n-boot", type=int, default=1000, help="bootstrap resamples (default 1000, as attnres report)"
    )
    args = parser.parse_args()
    import reports

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "results"
        t0 = time.perf_counter()
        n_runs = write_tree(root)
        print(f"wrote a synthetic tree of {n_runs} runs in {time.perf_counter() - t0:.1f} s")
        timings, digests = [], []
        for k in range(2):
            out = Path(tmp) / f"report{k}"
            t0 = time.perf_counter()
            summary = reports.build_report(root, out, pdf=args.pdf, n_boot=args.n_boot)
            timings.append(time.perf_counter() - t0)
            digests.append(digest(out, list(summary.files)))
            print(
                f"build {k + 1}: {timings[-1]:.1f} s, {len(summary.figures)} figures, {len(summary.skipped)} skipped, "
                f"{len(summary.files)} files"
            )
        print("headline:")
        for h in summary.headline:
            print(f"  {h.text()}")
        for s in summary.skipped:
            print(f"  skipped {s}")
        same = digests[0] == digests[1]
        differ = sorted(k for k in digests[0] if digests[0].get(k) != digests[1].get(k))
        print(f"report for {n_runs} runs: {min(timings):.1f} s (best of 2; target < 60 s on 2 CPU cores)")
        print(
            "two builds identical (report.md, report.json, fit.json, every figure and table): "
            + ("yes" if same else f"NO: {differ}")
        )
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
