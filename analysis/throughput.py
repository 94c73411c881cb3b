"""Training throughput for the wall-clock multiplier: measured side by side when the sweep has it, else the runs'.

``attnres sweep throughput`` writes ``RESULTS/<sweep>/throughput.json``: every variant's tokens/s at every size,
interleaved in one process. This module reads it and maps it onto the analysis's curves. Without it the
wall-clock multiplier falls back to the tokens/s each run logged while it trained, which on a shared machine
measures the load at the time as much as the model; the fit then says so in the sweep's notes. A FLOP/s ratio
outside [:data:`RATIO_LOW`, :data:`RATIO_HIGH`] is flagged wherever wall-clock M is shown: variants of one size
differ by a few tens of percent in FLOP/s, so a ratio that far from 1 is more likely the machine than the model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from analysis.errors import AnalysisError

THROUGHPUT_FILE = "throughput.json"  # written by sweeps.throughput (attnres sweep throughput)
RATIO_LOW, RATIO_HIGH = 0.5, 2.0


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
