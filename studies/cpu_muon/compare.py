"""Muon against AdamW, from this study's fit.json (`attnres fit studies/cpu_muon/results --lr envelope`).

    python studies/cpu_muon/compare.py

Per tokens-per-parameter ratio: (1) the change in AttnRes's multiplier, the ratio of Block's paired per-size M under
Muon to its M under AdamW at the same size, with a t-interval over the sizes (the two arms share sizes, budgets and
rates, not seeds or runs, so the sizes are the replicates); (2) what Muon does to the loss itself: each (curve,
size)'s envelope minimum under Muon against AdamW's.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from scipy import stats

FIT = Path(__file__).resolve().parent / "results" / "fit.json"
LEVEL = 0.9


def by_sweep(fit: dict) -> dict[str, dict]:
    return {sweep["sweep"]: sweep for sweep in fit["sweeps"]}


def paired_sizes(sweep: dict, variant: str = "block") -> dict[str, float]:
    entry = next(m for m in sweep["multipliers"] if m["variant"] == variant)
    return {s["budget"]: s["multiplier"] for s in entry["paired"]["sizes"]}


def envelope_losses(sweep: dict) -> dict[tuple[str, str], float]:
    return {(e["curve"], e["size"]): e["loss"] for e in sweep["envelope"]}


def main() -> None:
    sweeps = by_sweep(json.loads(FIT.read_text()))
    ratios = sorted({name.split("@")[1] for name in sweeps if "@" in name}, key=lambda r: float(r.removesuffix("tpp")))
    for ratio in ratios:
        muon, adamw = sweeps[f"cpu_muon@{ratio}"], sweeps[f"cpu_muon_adamw@{ratio}"]
        m, a = paired_sizes(muon), paired_sizes(adamw)
        sizes = [s for s in m if s in a]
        diffs = [math.log(m[s] / a[s]) for s in sizes]
        mean = sum(diffs) / len(diffs)
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
        half = stats.t.ppf(0.5 + LEVEL / 2, len(diffs) - 1) * sd / math.sqrt(len(diffs))
        print(f"{ratio}: Block's paired M under Muon / under AdamW, per size:")
        for s, d in zip(sizes, diffs):
            print(f"  {s}  M muon {m[s]:.3f}  M adamw {a[s]:.3f}  ratio {math.exp(d):.3f}")
        low, high = math.exp(mean - half), math.exp(mean + half)
        interval = f"{math.exp(mean):.3f} [{low:.3f}, {high:.3f}]"
        print(f"  mean over {len(sizes)} sizes: {interval} ({LEVEL:.0%}, t over sizes)")
        lm, la = envelope_losses(muon), envelope_losses(adamw)
        print(f"{ratio}: envelope loss under Muon against AdamW (%, negative: Muon lower):")
        for key in sorted(lm):
            if key in la:
                change = 100 * (lm[key] / la[key] - 1)
                print(f"  {key[0]:<9} {key[1]}  muon {lm[key]:.4f}  adamw {la[key]:.4f}  {change:+.2f} %")


if __name__ == "__main__":
    sys.exit(main())
