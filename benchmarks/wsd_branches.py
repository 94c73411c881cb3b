"""WSD cooldown branches against full cosine runs: final losses at each budget, and what the branches cost.

    python benchmarks/wsd_branches.py                      # L4-d128, bytes, branches at 2, 4 and 8 tokens/param
    python benchmarks/wsd_branches.py --budgets 2,4,8 --seeds 0,1 --depth 4 --out /tmp/wsd

Trains, through the local sweep launcher (what `attnres sweep run` runs), two grids on the same size, data and
seeds: one full cosine run per budget, and one stable trunk with a WSD branch per budget (``branches:``, decay 20 %
of each branch). Prints each budget's final validation loss both ways and their difference in %, and the wall
time of the trunk and its branches over that of the longest cosine run (the issue's bar: within 1 %, at most
1.5x). Wall times are the runs' own training and evaluation seconds (``run.parquet``'s ``wall_s``: a branch
holds the trunk's seconds up to its start, so its own are its ``wall_s`` minus the trunk's at that step), measured
one run after another on this machine: on a shared machine, read them as rough.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnres.training.branches import branch_step, trunk_of  # noqa: E402
from sweeps import expand_runs, load_grid, run_grid  # noqa: E402


def grid(args: argparse.Namespace, branches: bool) -> dict:
    data = {
        "name": "wsd-branches" if branches else "wsd-cosine",
        "defaults": {
            "model": {"seq_len": args.seq_len},
            "train": {"batch_size": args.batch, "lr": args.lr, "eval_interval": 10**9, "eval_tokens": 65536},
            "runtime": {"threads": args.threads},
        },
        "ladder": {"depths": [args.depth], "width_per_layer": args.width, "head_dim": 32},
        "budgets": [{"tokens_per_param": b} for b in args.budgets],
        "variants": [args.variant],
        "seeds": args.seeds,
    }
    if branches:
        data["branches"] = {"decay_frac": args.decay_frac}
    return data


def finished(results: Path, sweep: str) -> pd.DataFrame:
    rows = [pd.read_parquet(p) for p in sorted((results / sweep).glob("*/run.parquet"))]
    return pd.concat(rows, ignore_index=True)


def trunk_seconds_at(results: Path, sweep: str, run_id: str, step: int) -> float:
    """The trunk's seconds up to ``step``, from its logged rows (wall_s is cumulative)."""
    metrics = pd.read_parquet(results / sweep / run_id / "metrics.parquet")
    rows = metrics[(metrics["split"] == "train") & (metrics["step"] <= step)]
    return float(rows["wall_s"].iloc[-1]) if len(rows) else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=lambda s: [float(x) for x in s.split(",")], default=[2.0, 4.0, 8.0])
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0])
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--width", type=int, default=32, help="d_model per layer (d_model = depth x width)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--variant", default="block2")
    parser.add_argument("--decay-frac", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: a temporary one)")
    args = parser.parse_args(argv)
    results = args.out or Path(tempfile.mkdtemp(prefix="wsd-branches-"))
    cosine, branched = load_grid(grid(args, False)), load_grid(grid(args, True))
    for g in (cosine, branched):
        run_grid(g, results, progress=False, log=lambda line: print(line, flush=True))
    full = finished(results, cosine.name)
    parts = finished(results, branched.name)
    trunks = finished(results, branched.name + "-trunk")
    planned = {r.cfg.run_id: r for r in expand_runs(branched)}
    print(f"\n{args.variant} L{args.depth}-d{args.depth * args.width}, seeds {args.seeds}, results in {results}")
    print(f"{'tok/param':>9} {'cosine loss':>12} {'branch loss':>12} {'branch/cosine':>14}")
    for budget in args.budgets:
        c = full[(full["tokens"] / full["params"]).round(1) == round(budget, 1)]["val_loss"].mean()
        b = parts[(parts["tokens"] / parts["params"]).round(1) == round(budget, 1)]["val_loss"].mean()
        print(f"{budget:9g} {c:12.4f} {b:12.4f} {100 * (b / c - 1):+13.2f}%")
    own = 0.0
    for row in parts.itertuples():
        branch = planned[row.run_id].cfg
        trunk = trunk_of(branch)
        own += row.wall_s - trunk_seconds_at(results, trunk.sweep, trunk.run_id, branch_step(branch))
    longest = full.loc[full["tokens"].idxmax()]
    branched_s = float(trunks["wall_s"].sum()) + own
    print(
        f"cost: trunk + {len(parts)} branches {branched_s:.0f} s of training; the longest cosine run "
        f"{longest.wall_s:.0f} s "
        f"(x{branched_s / (longest.wall_s * len(args.seeds)):.2f} per seed); all {len(full)} cosine runs "
        f"{full['wall_s'].sum():.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
