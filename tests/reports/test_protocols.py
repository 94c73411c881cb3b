"""A study run under two tuning protocols is compared side by side (reports.sections.protocols): M per part and variant
with a column per sweep, the learning rates, and the protocol each sweep's runs show."""

from __future__ import annotations

import pandas as pd

from analysis import fit_results
from reports.document.document import Table
from reports.sections.protocols import comparison_blocks, protocol_of
from tests.synthetic_results import write_synthetic_results


def runs(lrs: dict[tuple[int, str], list[float]]) -> pd.DataFrame:
    rows = [
        dict(sweep="s", n_layer=n, d_model=8 * n, tokens=1e5, variant=v, n_blocks=None, lr=r, status="done")
        for (n, v), rs in lrs.items()
        for r in rs
    ]
    return pd.DataFrame(rows)


def test_the_protocol_is_read_from_the_learning_rates():
    shared = runs({(4, "baseline"): [3e-3], (4, "full"): [3e-3], (6, "baseline"): [2e-3], (6, "full"): [2e-3]})
    assert protocol_of(shared).startswith("one learning rate per size for every variant (the paper's protocol")
    own = runs({(4, "baseline"): [3e-3], (4, "full"): [5e-3]})
    assert protocol_of(own) == "each variant at a learning rate of its own (per-variant tuning)"
    swept = runs({(4, "baseline"): [3e-3, 6e-3]})
    assert protocol_of(swept).startswith("several learning rates per (size, variant)")
    blocks = runs({(4, "baseline"): [3e-3], (4, "block"): [2e-3, 5e-3]})  # Block N=2 and N=4, each tuned
    blocks.loc[blocks["variant"] == "block", "n_blocks"] = [2, 4]
    assert protocol_of(blocks) == "each variant at a learning rate of its own (per-variant tuning)"


def test_two_sweeps_of_one_study_get_a_column_each(tmp_path):
    truth = {"baseline": 1.0, "block": 1.25}
    write_synthetic_results(tmp_path, sweep="paper", multipliers=truth, noise=0.003, tables=False)
    write_synthetic_results(tmp_path, sweep="pv", multipliers=truth, noise=0.003, tables=False, rng_seed=1)
    report = fit_results(tmp_path, n_boot=50)
    blocks = comparison_blocks(report, report_runs(tmp_path), "90% CI")
    m_table, lr_table = (b.frame for b in blocks if isinstance(b, Table))
    assert list(m_table.columns) == ["part", "variant", "M in paper [90% CI]", "M in pv [90% CI]"]
    assert m_table["variant"].tolist() == ["Block AttnRes (N=4)"]
    for sweep in ("paper", "pv"):
        value = report.sweep(sweep).multiplier("block").multiplier.text(3)
        assert m_table[f"M in {sweep} [90% CI]"].iloc[0].startswith(value)
    assert {"baseline in paper", "baseline in pv"} <= set(lr_table.columns)
    assert "the paper's protocol" in blocks[0].text


def test_one_sweep_has_nothing_to_compare(tmp_path):
    write_synthetic_results(tmp_path, sweep="paper", multipliers={"baseline": 1.0, "block": 1.25}, tables=False)
    report = fit_results(tmp_path, n_boot=0)
    assert comparison_blocks(report, report_runs(tmp_path), "90% CI") == []


def report_runs(root) -> pd.DataFrame:
    from analysis.data.load import load_results

    return load_results(root, tables=()).runs


def test_the_frontier_multiplier_of_each_sweep_is_compared_too(tmp_path):
    import numpy as np

    from analysis import ChinchillaLaw

    law = ChinchillaLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
    for sweep in ("paper", "pv"):  # IsoFLOP grids: N and D vary independently, so each curve gets a surface
        write_synthetic_results(
            tmp_path,
            sweep=sweep,
            law=law,
            multipliers={"baseline": 1.0, "block": 1.25},
            budgets=np.geomspace(1e17, 1e20, 6),
            sizes_per_budget=5,
            tables=False,
        )
    report = fit_results(tmp_path, n_boot=0)
    m_table = next(b.frame for b in comparison_blocks(report, report_runs(tmp_path), "90% CI") if isinstance(b, Table))
    assert m_table["part"].tolist() == ["whole sweep", "all sizes and budgets, M at the frontier"]
    frontier = m_table.iloc[1]
    for sweep in ("paper", "pv"):
        top = max((f for f in report.sweep(sweep).frontier_multipliers), key=lambda f: f.compute)
        assert frontier[f"M in {sweep} [90% CI]"] == f"{top.M.text(3)} (not calibrated)"


def test_two_sweeps_of_different_studies_are_not_compared(tmp_path):
    truth = {"baseline": 1.0, "block": 1.25}
    write_synthetic_results(tmp_path, sweep="one", multipliers=truth, budgets=[1e15, 1e16, 1e17], tables=False)
    write_synthetic_results(tmp_path, sweep="two", multipliers=truth, budgets=[1e18, 1e19, 1e20], tables=False)
    report = fit_results(tmp_path, n_boot=0)
    assert comparison_blocks(report, report_runs(tmp_path), "90% CI") == []  # no size trained at the same tokens
