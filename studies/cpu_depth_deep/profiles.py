"""The paper's Fig. 5 claim at this study's depth: per transformer block, the output magnitude and the gradient norm
of both arms at 48 sublayers, from the runs' diagnostics (``layers.parquet``, kind ``block``, last step).

    python studies/cpu_depth_deep/profiles.py > studies/cpu_depth_deep/profiles.txt

The paper (its section on training dynamics): in a PreNorm baseline the hidden state's magnitude grows with depth
and the gradients concentrate in the first blocks; AttnRes keeps the magnitudes bounded and spreads the gradients
more evenly. Per arm and training length this reads the cell at its best swept rate (the lowest mean final loss over
the seeds; the report's profile figures read the rate nearest the envelope's minimum instead, which is the same rate
wherever the minimum lies inside the swept ones) and averages the seeds block by block. Definitions:
docs/method.md, "Diagnostics" (output: RMS of the hidden state a block hands on; gradient: L2 norm of the block's
parameter gradients before clipping). tests/test_committed_study.py holds profiles.txt to this script.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_depth"
SHOWN = (1, 2, 4, 8, 12, 16, 20, 24)  # blocks printed (1-based)


def runs() -> pd.DataFrame:
    """One row per finished branch run: its id, arm, seed, rate, training length (tokens per parameter)."""
    rows = []
    for path in sorted(RESULTS.glob("*/run.parquet")):
        r = pd.read_parquet(path).iloc[-1]
        if r["status"] != "done" or int(r["n_layer"]) != 24:
            continue
        rows.append(
            {
                "run_id": r["run_id"],
                "arm": str(r["variant"]),
                "seed": int(r["seed"]),
                "lr": float(r["lr"]),
                "tpp": int(round(float(r["tokens"]) / float(r["params"]))),
                "loss": float(r["val_loss"]),
            }
        )
    return pd.DataFrame(rows)


def profile(run_ids: list[str]) -> pd.DataFrame:
    """Per block (1-based): output RMS and gradient norm at the last step, the mean over ``run_ids``."""
    frames = []
    for run_id in run_ids:
        lay = pd.read_parquet(RESULTS / run_id / "layers.parquet")
        lay = lay[(lay["kind"].astype(str) == "block") & (lay["step"] == lay["step"].max())]
        frames.append(lay.assign(block=lay["layer"].astype(int) + 1)[["block", "output_rms", "grad_norm"]])
    return pd.concat(frames).groupby("block").mean()


def main() -> None:
    table = runs()
    print(
        "Per transformer block at 48 sublayers (n_layer 24, d_model 48): the mean over seeds at each cell's best rate"
    )
    print(
        "output: RMS of the hidden state the block hands on; grad: L2 norm of its parameter gradients before clipping"
    )
    for tpp in sorted(table["tpp"].unique()):
        print(f"\n{tpp} tokens per parameter")
        summary = []
        for arm in ("baseline", "block"):
            cell = table[(table["tpp"] == tpp) & (table["arm"] == arm)]
            by_rate = cell.groupby("lr")["loss"].agg(["mean", "count"])
            lr = float(by_rate[by_rate["count"] == by_rate["count"].max()]["mean"].idxmin())
            ids = cell[cell["lr"] == lr]["run_id"].tolist()
            prof = profile(ids)
            out, grad = prof["output_rms"], prof["grad_norm"]
            print(f"  {arm:8s} rate {lr:.3g}, {len(ids)} seeds")
            print("    block   " + " ".join(f"{b:>7d}" for b in SHOWN))
            print("    output  " + " ".join(f"{out[b]:7.3f}" for b in SHOWN))
            print("    grad    " + " ".join(f"{grad[b]:7.4f}" for b in SHOWN))
            summary.append(
                f"  {arm:8s} output: last block {out.iloc[-1]:.3f}, last/first {out.iloc[-1] / out.iloc[0]:5.2f}; "
                f"grad: first block / median {grad.iloc[0] / grad.median():4.2f}, "
                f"max/min {grad.max() / grad.min():4.2f}"
            )
        print("\n".join(summary))


if __name__ == "__main__":
    main()
