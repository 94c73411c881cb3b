"""Bad input to a fit is one clear error before any fitting, and seeds missing at some budget are said
(analysis.fitting.checks)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import analysis.fitting.curve_fits
from analysis import FitInputError, fit_results, format_report
from analysis.cli import main
from tests.synthetic_results import write_synthetic_results


@pytest.fixture
def no_fitting(monkeypatch):
    """Any scaling-law fit fails the test: the check must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("a law was fitted before the input was checked")

    monkeypatch.setattr(analysis.fitting.curve_fits, "run_study", refuse)


def _two_ranges(root, base_budgets, block_budgets) -> None:
    """A baseline run at ``base_budgets`` and a block variant at ``block_budgets`` only."""
    write_synthetic_results(root, multipliers={"baseline": 1.0}, budgets=base_budgets, tables=False)
    tree = write_synthetic_results(root, multipliers={"block": 1.2}, budgets=block_budgets, tables=False)
    _remove(tree, variant="baseline")  # the writer always adds the baseline


def test_a_variant_outside_the_baselines_compute_range_is_refused_before_any_fitting(tmp_path, no_fitting):
    _two_ranges(tmp_path, np.geomspace(1e15, 1e16, 4), np.geomspace(1e17, 1e18, 4))
    with pytest.raises(FitInputError) as err:
        fit_results(tmp_path, n_boot=0)
    message = str(err.value)
    assert "sweep 'synthetic'" in message and "'block' was run at 1.01e+17 to 1.01e+18 FLOPs" in message
    assert "baseline 'baseline' at 1e+15 to 1e+16" in message and "do not overlap" in message
    assert "\n" not in message


def test_ranges_that_overlap_in_part_are_fitted(tmp_path):
    _two_ranges(tmp_path, np.geomspace(1e15, 1e16, 4), np.geomspace(3e15, 3e16, 4))
    (m,) = fit_results(tmp_path, n_boot=0).sweeps[0].multipliers
    assert m.variant == "block" and np.isclose(m.multiplier.value, 1.2, rtol=1e-6)


def test_two_budgets_under_the_form_with_E_are_refused_before_any_fitting(tmp_path, no_fitting, capsys):
    write_synthetic_results(tmp_path, budgets=[1e16, 1e17], tables=False)
    with pytest.raises(FitInputError, match=r"'baseline' has 2 budgets, too few for the form E\+A\*C\^-alpha"):
        fit_results(tmp_path, form="E+A*C^-alpha", n_boot=0)
    assert main(["fit", str(tmp_path), "--form", "E+A*C^-alpha", "--n-boot", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnres fit: error: sweep 'synthetic': 'baseline' has 2 budgets") and "\n" not in err
    assert "use --form 'A*C^-alpha'" in err
    assert not (tmp_path / "fit.json").exists()


def test_one_budget_is_a_note_in_either_form(tmp_path):
    write_synthetic_results(tmp_path, budgets=[1e16], tables=False)
    sweep = fit_results(tmp_path, form="E+A*C^-alpha", n_boot=0).sweeps[0]
    # every curve at one shape and one budget: one note for the sweep (a one-shape sweep), not one per curve
    assert sweep.curves == () and any("one model shape and one budget" in n for n in sweep.notes)
    assert not any("not fitted, 1 budget(s)" in n for n in sweep.notes)


def _remove(tree, **where) -> None:
    runs = tree.runs
    for key, value in where.items():
        runs = runs[np.isclose(runs[key], value)] if isinstance(value, float) else runs[runs[key] == value]
    assert len(runs) >= 1
    for path in runs["path"]:
        shutil.rmtree(tree.root / path)


def test_a_seed_missing_at_one_budget_is_said_and_not_dropped(tmp_path):
    tree = write_synthetic_results(tmp_path, seeds=2, noise=0.003, tables=False)
    top = float(tree.runs["tokens"].max())
    _remove(tree, variant="full", seed=1, tokens=top)
    report = fit_results(tmp_path, n_boot=50)
    sweep = report.sweeps[0]
    (gap,) = sweep.missing_seeds
    assert (gap.curve, gap.missing, gap.have, gap.others) == ("full", (1,), (0,), ("baseline", "block"))
    assert gap.tokens == top
    full = sweep.multiplier("full")
    assert full.budgets[-1].n_runs_variant == 1 and full.n_runs_variant == 13  # the point is kept, on one seed
    assert full.gaps[-1].n_seeds == 1 and not full.gaps[-1].paired
    printed = format_report(report)
    assert "seeds missing at some budgets" in printed and "no finished run of seed(s) 1" in printed
    assert f"full at L{gap.n_layer}-d{gap.d_model}" in printed
    saved = json.loads(report.to_json())["sweeps"][0]["missing_seeds"]
    assert saved == [gap.to_dict()] and saved[0]["missing"] == [1]


def test_fewer_seeds_at_a_budget_for_every_curve_is_a_design_not_a_gap(tmp_path):
    tree = write_synthetic_results(tmp_path, seeds=2, noise=0.003, tables=False)
    _remove(tree, seed=1, tokens=float(tree.runs["tokens"].max()))
    report = fit_results(tmp_path, n_boot=0)
    assert report.sweeps[0].missing_seeds == () and "seeds missing" not in format_report(report)
