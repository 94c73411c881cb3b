"""The sensitivity table: M at the headline's budget under each alternative analysis choice
(analysis.fitting.sensitivity)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from analysis import fit_results, format_report
from analysis.laws.optimizer import LEAST_SQUARES_DELTA
from attnres.storage.schema import RUN_SCHEMA, read_table, to_table, write_table
from tests.synthetic_results import write_synthetic_results

TRUTH = {"baseline": 1.0, "full": 1.27, "block": 1.25}


def _scale_loss(tree, factor: float, **where) -> str:
    """Multiply the val_loss of the runs matching ``where`` by ``factor`` (an outlying budget); returns the
    budget's n_layer-d_model name."""
    runs = tree.runs
    for key, value in where.items():
        runs = runs[runs[key] == value]
    for path in runs["path"]:
        file = tree.root / path / "run.parquet"
        row = read_table(file, RUN_SCHEMA).to_pylist()[0]
        row["val_loss"] *= factor
        write_table(file, to_table([row], RUN_SCHEMA))
    first = runs.iloc[0]
    return f"L{int(first['n_layer'])}-d{int(first['d_model'])}"


@pytest.fixture(scope="module")
def outlier(tmp_path_factory):
    """A noise-free tree, 2 seeds, whose baseline lies 4 % above its law at the fourth of 7 budgets."""
    root = tmp_path_factory.mktemp("outlier")
    tree = write_synthetic_results(root, multipliers=TRUTH, seeds=2, tables=False)
    budget = sorted(tree.runs["tokens"].unique())[3]
    name = _scale_loss(tree, 1.04, variant="baseline", tokens=budget)
    return root, name


def test_each_row_is_the_headline_of_a_fit_with_that_one_choice_changed(outlier):
    root, name = outlier
    sweep = fit_results(root, n_boot=0).sweeps[0]
    changed = {
        choice: fit_results(root, n_boot=0, exponent="shared", chinchilla=False, **kwargs).sweeps[0]
        for choice, kwargs in [
            ("L = E + A C^-alpha", {"form": "E+A*C^-alpha"}),
            ("robust scale 0.1", {"delta": 0.1}),
            ("least squares", {"delta": LEAST_SQUARES_DELTA}),
            ("median over seeds", {"select": "median"}),
            ("best run per point", {"select": "best"}),
        ]
    }
    for m in sweep.multipliers:
        s = m.sensitivity
        assert s.multiplier == m.multiplier.value and s.exponent == m.exponent == "shared"
        # the scale set from the residuals: noise-free but for one budget, the residuals' robust sd is ~0, so the floor
        assert s.headline == "L = A C^-alpha, robust scale 0.001 from the residuals, mean over seeds, all 7 budgets"
        rows = {r.choice: r for r in s.rows}
        aspects = ["form", "loss scale", "loss scale", "points", "points"] + ["budgets"] * 7
        assert [r.aspect for r in s.rows] == aspects
        for choice, other_sweep in changed.items():
            other = other_sweep.multiplier(m.variant)
            assert math.isclose(rows[choice].multiplier, other.multiplier.value, rel_tol=1e-9), (m.variant, choice)
        # a scale of 1e-3 nearly ignores the outlying budget (close to least absolute deviations); least squares
        # does not
        assert math.isclose(m.multiplier.value, TRUTH[m.variant], rel_tol=5e-3)
        assert abs(rows["least squares"].multiplier / TRUTH[m.variant] - 1) > 0.02
        # leaving the outlying budget out gives the truth exactly, as no other point is off the law
        assert math.isclose(rows[f"without {name}"].multiplier, TRUTH[m.variant], rel_tol=1e-6)
        values = [r.multiplier for r in s.rows]
        assert s.low == min(values) and s.high == max(values) and s.low < s.high


def test_the_table_is_printed_and_saved(outlier):
    root, name = outlier
    report = fit_results(root, n_boot=20)
    text = format_report(report)
    assert "M at the largest budget under other analysis choices (point estimates, no bootstrap):" in text
    assert f"without {name}" in text and "range       over the 12 alternatives" in text
    full = report.sweeps[0].multiplier("full")
    headline = "L = A C^-alpha, robust scale 0.001 from the residuals"
    assert f"full: headline M = {full.multiplier.value:.4g} ({headline}" in text
    saved = json.loads(report.to_json())["sweeps"][0]["multipliers"]
    block = next(m for m in saved if m["variant"] == "block")["sensitivity"]
    assert len(block["rows"]) == 12 and block["low"] <= block["multiplier"] <= block["high"]


def test_a_choice_the_data_cannot_support_is_a_row_without_a_number(tmp_path):
    """Three budgets: leaving one out leaves two, too few for a curve with an offset E (the form row): the row
    says why instead of failing the fit."""
    write_synthetic_results(tmp_path, multipliers=TRUTH, budgets=np.geomspace(1e15, 1e17, 3), tables=False)
    sweep = fit_results(tmp_path, form="E+A*C^-alpha", n_boot=0).sweeps[0]
    rows = sweep.multiplier("full").sensitivity.rows
    left_out = [r for r in rows if r.aspect == "budgets"]
    assert len(left_out) == 3 and all(math.isnan(r.multiplier) and r.note for r in left_out)
    form = next(r for r in rows if r.aspect == "form")
    assert math.isclose(form.multiplier, 1.27, rel_tol=1e-6)
