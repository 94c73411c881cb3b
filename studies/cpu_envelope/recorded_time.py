"""The training time the study's runs recorded, to set beside the plan's estimate (plan.txt, plan_widen.txt).

    python studies/cpu_envelope/recorded_time.py

A branch's ``wall_s`` includes its trunk's time up to the checkpoint it started from, so a branch counts only what
it added: its ``wall_s`` less its trunk's time per step times the branch's start step. The sum is worker time (the
plan's "one after another" figure), not elapsed time: two workers ran side by side.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from attnres.training.branches import TRUNK_SUFFIX  # noqa: E402
from sweeps import expand_runs, load_grid  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
KEY = ["n_layer", "d_model", "variant", "lr", "seed"]


def main() -> None:
    decay_frac = load_grid(HERE / "cpu_envelope.yaml").branches.decay_frac
    (widened_lr,) = {run.cfg.train.lr for run in expand_runs(load_grid(HERE / "cpu_envelope_widen.yaml"))}
    columns = [*KEY, "sweep", "wall_s", "step"]
    runs = pd.concat(pd.read_parquet(f, columns=columns) for f in sorted(RESULTS.glob("cpu_envelope*/*/run.parquet")))
    is_trunk = runs["sweep"].str.endswith(TRUNK_SUFFIX)
    trunks = runs[is_trunk].set_index(KEY)
    branches = runs[~is_trunk].join(trunks[["wall_s", "step"]].add_suffix("_trunk"), on=KEY)
    start = (branches["step"] * (1 - decay_frac)).round()
    branches = branches.assign(own_s=branches["wall_s"] - branches["wall_s_trunk"] * start / branches["step_trunk"])
    for name, widened in (("cpu_envelope.yaml", False), ("cpu_envelope_widen.yaml", True)):
        t = trunks[(trunks.index.get_level_values("lr") == widened_lr) == widened]["wall_s"].sum() / 3600
        b = branches[(branches["lr"] == widened_lr) == widened]["own_s"].sum() / 3600
        print(f"{name}: {t:.2f} h of trunks + {b:.2f} h of branches = {t + b:.2f} h of worker time")


if __name__ == "__main__":
    main()
