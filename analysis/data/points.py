"""Which loss each (curve, size, budget) contributes, under the fit's options: how its learning rate is chosen
(``lr``: the best rate the grid trained, or the learning-rate envelope) and for whom (``protocol``: every variant at
its own best rate, or at the baseline's, as the paper tunes).

Both protocols come from the same runs when a grid trained several rates per cell: the per-variant protocol reads
each curve's own minimum, the paper's reads each curve at the baseline's best rate of the same cell (its grid run
there with ``lr="best"``; its fitted curve there with ``lr="envelope"`` or ``"split"``). Pure pandas; never imports
torch.
"""

from __future__ import annotations

import warnings

import pandas as pd

from analysis.data.envelope import Envelopes, best_rates, envelope_points, fit_envelopes, unfinished_cells
from analysis.data.select import curve_labels, finished_runs, select_points

LR_RULES = ("best", "envelope", "split")  # split: the envelope as a split parabola (analysis.data.envelope.SHAPES)
PROTOCOLS = ("per-variant", "paper")


def labelled(runs: pd.DataFrame) -> pd.DataFrame:
    """The finished runs with their ``curve`` (what the envelope and the stall detector read)."""
    runs = finished_runs(runs)
    if runs.empty:
        return runs.assign(curve=pd.Series([], dtype="str"))
    return runs.assign(curve=curve_labels(runs), val_loss=pd.to_numeric(runs["val_loss"]))


def choose_points(
    runs: pd.DataFrame, *, select: str, lr: str, protocol: str, baseline: str
) -> tuple[pd.DataFrame, Envelopes | None]:
    """The points of :func:`analysis.data.select.select_points` under ``lr`` and ``protocol``, and the envelopes behind
    them (None with ``lr="best"``)."""
    if lr in ("envelope", "split"):
        shape = "split" if lr == "split" else "local"
        finished, notes = unfinished_cells(labelled(runs), shape)
        for note in notes:  # the sweep's notes (analysis.fitting.sweep_points.collect_warnings)
            warnings.warn(note, stacklevel=2)
        envelopes = fit_envelopes(finished, shape=shape)
        rates = best_rates(envelopes, baseline) if protocol == "paper" else None
        return envelope_points(finished, envelopes, method=select, rates=rates), envelopes
    if protocol == "paper":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the second call below gives the same warnings once
            own = select_points(runs, method=select)
        base = own[own["curve"] == baseline]
        rates = {(r.sweep, int(r.n_layer), int(r.d_model), float(r.tokens)): float(r.lr) for r in base.itertuples()}
        return select_points(runs, method=select, rates=rates), None
    return select_points(runs, method=select), None
