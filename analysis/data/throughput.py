"""Training throughput for the wall-clock multiplier: measured side by side when the sweep has it, else the runs'.

``attnres sweep throughput`` writes ``RESULTS/<sweep>/throughput.json``: every variant's tokens/s at every size,
interleaved in one process. This module reads it and maps it onto the analysis's curves. Without it the
wall-clock multiplier falls back to the tokens/s each run logged while it trained, which on a shared machine
measures the load at the time as much as the model; the fit then says so in the sweep's notes. A FLOP/s ratio
outside [:data:`RATIO_LOW`, :data:`RATIO_HIGH`] is flagged wherever wall-clock M is shown: variants of one size
differ by a few tens of percent in FLOP/s, so a ratio that far from 1 is more likely the machine than the model.
:func:`throughput_ratios` gives each point of a variant its FLOP/s ratio to the baseline at the same model size,
the factor that turns M into wall-clock M (:func:`analysis.estimates.multiplier.wall_clock_multiplier`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.base.errors import AnalysisError

THROUGHPUT_FILE = "throughput.json"  # written by sweeps.throughput (attnres sweep throughput)
RATIO_LOW, RATIO_HIGH = 0.5, 2.0
# Runs of one variant and shape do the same work per token: the FLOP/s they logged differ only by the machine's load
# while each trained. Up to this relative spread (largest over smallest, minus 1) the logged throughputs read as one
# machine state and wall-clock M keeps M's interval; past it, wall-clock M is a point (docs/analysis.md).
LOAD_SPREAD = 0.10


def implausible(ratio: float) -> bool:
    """Whether a variant's FLOP/s over the baseline's is outside the plausible range (and so flagged)."""
    return math.isfinite(ratio) and not RATIO_LOW <= ratio <= RATIO_HIGH


def read_side_by_side(folders: list[Path]) -> tuple[list[dict], Path | None]:
    """The measured entries of the first ``throughput.json`` among ``folders`` (a sweep's folders), or none."""
    for folder in folders:
        path = folder / THROUGHPUT_FILE
        if path.is_file():
            try:
                entries = json.loads(path.read_text())["measured"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise AnalysisError(
                    f"{path} cannot be read ({err}); measure it again with `attnres sweep throughput`, or delete it"
                ) from None
            return entries, path
    return [], None


def side_by_side_by_shape(points: pd.DataFrame, entries: list[dict]) -> dict[tuple[str, int, int], float]:
    """FLOP/s per (curve, n_layer, d_model) of the points, from the measured entries of the same residual,
    n_blocks (Block only) and shape; nan where none was measured."""
    out: dict[tuple[str, int, int], float] = {}
    for row in points[["curve", "variant", "n_blocks", "n_layer", "d_model"]].drop_duplicates().itertuples():
        found = [
            e
            for e in entries
            if e.get("residual") == row.variant
            and int(e.get("n_layer", -1)) == int(row.n_layer)
            and int(e.get("d_model", -1)) == int(row.d_model)
            and (row.variant != "block" or e.get("n_blocks") == int(row.n_blocks))
        ]
        out[(str(row.curve), int(row.n_layer), int(row.d_model))] = (
            float(found[0]["flops_per_s"]) if found else math.nan
        )
    return out


def sweep_folders(root: Path, runs: pd.DataFrame) -> tuple[Path, ...]:
    """The folders holding a sweep's run folders (where ``attnres sweep throughput`` writes its file)."""
    if "path" not in runs:
        return ()
    return tuple(sorted({(Path(root) / str(p)).parent for p in runs["path"]}))


def logged_by_shape(points: pd.DataFrame) -> dict[tuple[str, int, int], float]:
    """Median measured FLOP/s per (curve, n_layer, d_model) over the points of that shape."""
    out = {}
    for (curve, n_layer, d_model), g in points.groupby(["curve", "n_layer", "d_model"]):
        values = g["flops_per_s"].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        out[(str(curve), int(n_layer), int(d_model))] = float(np.median(values)) if values.size else math.nan
    return out


def sweep_throughput(
    points: pd.DataFrame, folders: Sequence[Path], notes: list[str], runs: pd.DataFrame | None = None
) -> tuple[dict[tuple[str, int, int], float], str]:
    """(FLOP/s per (curve, n_layer, d_model) of a sweep's points, why wall-clock M can have no interval or "").

    Measured side by side where the sweep's folders hold a ``throughput.json`` (comparable by construction), else as
    the runs logged it, comparable when the runs of one variant and shape logged FLOP/s within :data:`LOAD_SPREAD`
    of each other (:func:`load_spread` of ``runs``); a note says which."""
    entries, source = read_side_by_side(list(folders))
    if source is not None:
        notes.append(f"wall-clock M from throughput measured side by side ({source.name})")
        return side_by_side_by_shape(points, entries), ""
    why = ""
    if runs is not None:
        spread, shapes = load_spread(runs)
        if shapes == 0:
            why = "no variant and shape was trained twice, so the load behind the logged tokens/s cannot be judged"
        elif spread > LOAD_SPREAD:
            why = (
                f"runs of one variant and shape logged FLOP/s up to {spread:.0%} apart (more than {LOAD_SPREAD:.0%}): "
                "the machine's load while each trained, not the model"
            )
    notes.append(
        "wall-clock M from the tokens/s each run logged while it trained (at different times, on a machine that "
        "may have been shared)"
        + (
            f"; a point without an interval: {why}"
            if why
            else f"; their spread within a shape is at most {LOAD_SPREAD:.0%}"
        )
        + "; `attnres sweep throughput GRID` measures the variants side by side"
    )
    return logged_by_shape(points), why


def load_spread(runs: pd.DataFrame) -> tuple[float, int]:
    """(the largest relative spread of logged FLOP/s among finished runs of one variant and shape, the number of
    such groups with two runs or more); a run's FLOP/s is its tokens/s times its FLOPs per token."""
    done = runs[runs["status"].astype(str) == "done"] if "status" in runs else runs
    flops = pd.to_numeric(done["tokens_per_s"], errors="coerce") * pd.to_numeric(
        done["flops_per_token"], errors="coerce"
    )
    keys = [k for k in ("variant", "n_blocks", "n_layer", "d_model", "seq_len", "batch_size") if k in done]
    frame = done[keys].astype(str).assign(flops_per_s=flops.to_numpy())
    frame = frame[np.isfinite(frame["flops_per_s"]) & (frame["flops_per_s"] > 0)]
    groups = [g["flops_per_s"] for _, g in frame.groupby(keys) if len(g) >= 2]
    if not groups:
        return math.nan, 0
    return max(float(g.max() / g.min() - 1) for g in groups), len(groups)


def throughput_ratios(
    label: str,
    base: str,
    g_var: pd.DataFrame,
    throughput: dict[tuple[str, int, int], float],
    notes: list[str],
) -> list[float]:
    """Per point of the variant (``g_var``), its measured FLOP/s over the baseline's at the same model size
    (nan where either is missing, with a note)."""
    ratios = []
    for r in g_var.itertuples():
        r_var = throughput.get((label, int(r.n_layer), int(r.d_model)), math.nan)
        r_base = throughput.get((base, int(r.n_layer), int(r.d_model)), math.nan)
        ratios.append(r_var / r_base if r_base and math.isfinite(r_base) and math.isfinite(r_var) else math.nan)
    if any(math.isnan(x) for x in ratios):
        notes.append(
            f"{label}: no throughput of the baseline at the same model size for some budgets; "
            "wall-clock multiplier is nan there"
        )
    return ratios


def flag_implausible(multipliers: Sequence[Any], notes: list[str]) -> None:
    """A note for every variant (``multipliers``: :class:`analysis.fitting.results.VariantMultiplier` objects, not
    imported here) whose headline FLOP/s ratio to the baseline is implausible (:func:`implausible`)."""
    for m in multipliers:
        if implausible(m.throughput_ratio):
            notes.append(
                f"{m.variant}: FLOP/s ratio {m.throughput_ratio:.3g} to the baseline is outside "
                f"[{RATIO_LOW:g}, {RATIO_HIGH:g}] (flagged !): its wall-clock M says more about the machine's load "
                "than about the model"
            )
