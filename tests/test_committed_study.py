"""The committed CPU study (studies/cpu_small/): `attnres fit` reproduces the numbers the README states."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "studies" / "cpu_small" / "results"
pytestmark = pytest.mark.skipif(
    not (RESULTS / "cpu_small").is_dir(), reason="the committed study is not in this checkout"
)


def readme_rows() -> dict[str, list[str]]:
    """The README's table of the study: variant -> its cells (M in the paper's form, M with an offset E,
    wall-clock M, runs)."""
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        if re.match(r"\| (full|block-N\d+) \|", line):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.parametrize("form,column", [("A*C^-alpha", 0), ("E+A*C^-alpha", 1)])
def test_fit_reproduces_the_readme_multipliers(form, column):
    from analysis import fit_results

    sweep = fit_results(RESULTS, sweeps=["cpu_small"], form=form).sweep("cpu_small")
    rows = readme_rows()
    assert {m.variant for m in sweep.multipliers} == set(rows)
    for m in sweep.multipliers:
        assert rows[m.variant][column] == m.multiplier.text(3), (form, m.variant)
        assert rows[m.variant][3] == f"{m.n_runs_variant} + {m.n_runs_baseline}" == "10 + 10"
        if column == 0:
            assert rows[m.variant][2] == m.wall_clock.text(3), m.variant


def test_fit_with_the_seeds_bootstrap_reproduces_the_readme_column_and_marks_it_unreliable():
    """The last column: the paper's form with --interval seeds. The fit misses its points by more than the seed
    noise explains, and the seeds-only interval says so; the default interval (budgets) does not need to."""
    from analysis import fit_results

    sweep = fit_results(RESULTS, sweeps=["cpu_small"], interval="seeds").sweep("cpu_small")
    rows = readme_rows()
    for m in sweep.multipliers:
        assert rows[m.variant][4] == m.multiplier.text(3), m.variant
        assert m.interval == "seeds" and not m.reliable and "lack-of-fit" in m.why, m.variant
    default = fit_results(RESULTS, sweeps=["cpu_small"]).sweep("cpu_small")
    assert all(m.interval == "budgets" and m.reliable for m in default.multipliers)


def test_the_committed_report_is_the_report_of_the_committed_results():
    import json

    from analysis import load_results

    saved = json.loads((ROOT / "studies" / "cpu_small" / "report" / "report.json").read_text())
    assert saved["fit"]["inputs_hash"] == load_results(RESULTS, tables=()).inputs_hash
