"""The smoke grid's results produce a report: train ``sweeps/smoke.yaml`` with the public sweeps API, then
build the report and check its figures and numbers. Skipped, with the reason, where the sweeps package or the
smoke grid is not there."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE_GRID = ROOT / "sweeps" / "smoke.yaml"


def smoke_runner():
    """``sweeps.run_grid`` and the smoke grid file, or a skip that says which is missing."""
    try:
        import sweeps
    except ImportError as err:
        pytest.skip(f"the sweeps package is not importable here ({err})")
    run_grid = getattr(sweeps, "run_grid", None)
    if run_grid is None:
        pytest.skip("sweeps.run_grid does not exist (yet)")
    if not SMOKE_GRID.exists():
        pytest.skip("sweeps/smoke.yaml does not exist (yet)")
    return run_grid


def test_smoke_grid_results_produce_a_report(tmp_path):
    run_grid = smoke_runner()
    import analysis
    import reports

    results_dir = tmp_path / "results"
    options = {"workers": 2, "progress": False, "log": lambda message: None}
    accepted = inspect.signature(run_grid).parameters
    summary = run_grid(str(SMOKE_GRID), str(results_dir), **{k: v for k, v in options.items() if k in accepted})
    failed = getattr(summary, "failed", 0)
    assert not failed, f"{failed} smoke run(s) failed"

    report = reports.build_report(results_dir, tmp_path / "report", n_boot=200, strict=True)
    names = {f.name for f in report.figures}
    # the smoke grid: baseline, Full and Block (N = 2) at two budgets, one size
    assert {
        "scaling_curves",
        "multiplier",
        "loss_curves",
        "block_output_rms",
        "block_grad_norm",
        "depth_attention_full",
    } <= names
    assert any(n.startswith("depth_attention_block") for n in names)
    assert {h.variant for h in report.headline} == {"full", "block"}
    fit = analysis.fit_results(analysis.load_results(results_dir, tables=()), n_boot=200)
    assert json.loads(report.report_json.read_text())["fit"] == fit.to_dict()
    md = report.report_md.read_text()
    for h in report.headline:
        assert h.multiplier.text(3) in md
    assert report.report_html.stat().st_size > 10_000
