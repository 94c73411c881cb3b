"""The loss a fit reads (``--metric``): the run's own validation loss, or an extra evaluation set's.

A run trained with ``data.eval_sets`` records each set's last loss and bits per byte in run.parquet's
``eval_sets`` column (JSON). :func:`with_metric` puts the chosen set's loss where every fit reads a run's loss
(``val_loss``, and ``val_bpb``), so the points, envelopes, stall checks and reports follow it unchanged. A run
without that set cannot be compared on it: one error names them before any fit.

Pure Python; never imports torch.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd

from analysis.base.errors import FitInputError
from analysis.data.load import Results
from analysis.fitting.checks import did_you_mean

VAL = "val"  # the run's own validation split


def eval_set_losses(runs: pd.DataFrame) -> pd.Series:
    """Each run's extra evaluation sets as a dict {name: {"loss", "bpb"}} (empty where it named none)."""
    column = runs["eval_sets"] if "eval_sets" in runs else pd.Series([None] * len(runs), index=runs.index)
    return column.map(lambda text: json.loads(text) if isinstance(text, str) and text else {})


def with_metric(results: Results, metric: str) -> Results:
    """``results`` with each run's ``val_loss`` and ``val_bpb`` read from the evaluation set ``metric`` (``val``:
    unchanged). Raises :class:`FitInputError` when a finished run lacks the set, naming the runs and the sets
    they have."""
    if metric == results.metric:
        return results
    if results.metric != VAL:
        raise FitInputError(f"these results already fit the evaluation set {results.metric!r}; load them again")
    runs = results.runs
    sets = eval_set_losses(runs)
    done = runs["status"] == "done"
    lacking = done & ~sets.map(lambda s: metric in s)
    if lacking.any():
        names = sorted({name for s in sets for name in s})
        ids = runs.loc[lacking, "run_id"].tolist()
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        raise FitInputError(
            f"--metric {metric}: {len(ids)} finished run(s) have no loss on an evaluation set of that name ({shown}); "
            + (f"the sets they were evaluated on: {', '.join(names)}" if names else "no run names data.eval_sets")
            + did_you_mean(metric, names)
            + f"; train them with data.eval_sets naming {metric!r}, or fit --metric {VAL}"
        )
    loss = sets.map(lambda s: s.get(metric, {}).get("loss"))
    bpb = sets.map(lambda s: s.get(metric, {}).get("bpb"))
    runs = runs.assign(val_loss=pd.to_numeric(loss, errors="coerce"), val_bpb=pd.to_numeric(bpb, errors="coerce"))
    return replace(results, runs=runs, metric=metric)
