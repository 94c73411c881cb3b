"""The report of a grid that swept learning rates: the envelope figures and tables, both protocols, the paired M."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import reports
from reports.figures.learning_rates import best_lr_table
from tests.synthetic_results import write_synthetic_results


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    return write_synthetic_results(
        tmp_path_factory.mktemp("swept"),
        multipliers={"baseline": 1.0, "block": 1.2},
        budgets=np.geomspace(1e15, 1e17, 5),
        lrs=(1e-3, 2e-3, 4e-3, 8e-3),
        best_lr={"baseline": 4e-3, "block": 4e-3 / 1.5},
        lr_curvature=0.05,
        seeds=2,
        noise=0.001,
        stalled=[("block", 1)],
    )


def test_the_report_draws_the_learning_rate_figures_and_tables(swept, tmp_path):
    summary = reports.build_report(
        swept.root, tmp_path / "out", formats=("png",), n_boot=50, lr="envelope", strict=True
    )
    names = {f.name for f in summary.figures}
    assert {"lr_curves", "best_lr"} <= names
    md = summary.report_md.read_text()
    for heading in (
        "Paired per-size M",
        "Tuning protocols from the same runs",
        "Learning-rate envelopes",
        "Stalled runs",
    ):
        assert f"#### {heading}" in md, heading
    assert "the paper (Table 2)" in md and "cost of the paper's protocol %" in md
    (block,) = [h for h in summary.headline if h.variant == "block"]
    assert block.paired is not None and block.other_protocol[0] == "paper" and block.without_stalls is not None
    assert "| paired per-size M |" in md and "| M, other protocol |" in md and "| M without stalled runs |" in md


def test_the_best_rate_table_extrapolates_each_variants_law_to_the_papers_sizes(swept):
    import analysis

    fit = analysis.fit_results(swept.root, lr="envelope", n_boot=0, chinchilla=False)
    table = best_lr_table(fit)
    assert len(table) == 3 and table["variant"].iloc[-1] == "the paper (Table 2)"
    assert table.iloc[-1]["lr* at 194M"] == "0.00299"
    # the synthetic best rates do not move with size: the fitted exponent is about 0
    assert all(abs(float(e)) < 0.05 for e in table["exponent"].iloc[:-1])


def test_a_sweep_with_seeds_and_no_stalled_run_says_none_was_flagged(tmp_path):
    root = write_synthetic_results(
        tmp_path / "res", multipliers={"baseline": 1.0, "block": 1.2}, budgets=np.geomspace(1e15, 1e17, 5), seeds=2
    )
    summary = reports.build_report(root.root, tmp_path / "out", formats=("png",), n_boot=20, strict=True)
    md = summary.report_md.read_text()
    said = "#### Stalled runs\n\nNone flagged: no run's training loss lagged the other seeds of its cell by more than 5"
    assert said in md


def test_the_rate_figure_has_one_panel_per_size_and_budget_though_the_variants_differ_in_parameters(swept):
    import analysis
    from reports.figures.learning_rates import plot_lr_curves

    fit = analysis.fit_results(swept.root, lr="envelope", n_boot=0, chinchilla=False)
    sw = fit.sweeps[0]
    # as in a real study, Block has a few more parameters than the baseline of its size (its depth mixer's)
    cells = tuple(replace(c, params=c.params * (1.01 if c.curve == "block" else 1.0)) for c in sw.envelope.cells)
    fit = replace(fit, sweeps=(replace(sw, envelope=replace(sw.envelope, cells=cells)),))
    fig = plot_lr_curves(fit, sw.sweep)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert len(titles) == len(set(titles)) == len({(c.size, c.tokens) for c in cells})


def test_one_seed_at_several_rates_gives_the_detector_nothing_to_judge_and_the_report_says_nothing(tmp_path):
    root = write_synthetic_results(
        tmp_path / "res",
        multipliers={"baseline": 1.0, "block": 1.2},
        budgets=np.geomspace(1e15, 1e17, 5),
        lrs=(1e-3, 2e-3, 4e-3),
        seeds=1,
    )
    summary = reports.build_report(root.root, tmp_path / "out", formats=("png",), n_boot=20, lr="envelope", strict=True)
    assert "#### Stalled runs" not in summary.report_md.read_text()
