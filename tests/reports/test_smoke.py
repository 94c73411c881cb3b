"""The smoke grid's results produce a report: ``sweeps/smoke.yaml`` trained with the public sweeps API (the
session's ``smoke_results``), then the report built and its figures and numbers checked."""

from __future__ import annotations

import json


def test_smoke_grid_results_produce_a_report(tmp_path, smoke_results):
    import analysis
    import reports

    results_dir = smoke_results  # trained once for the session (tests/conftest.py), read only here

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
