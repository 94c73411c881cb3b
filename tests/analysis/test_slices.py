"""A sweep with several tokens-per-parameter ratios per size is fitted once per ratio (analysis.data.slices)."""

from __future__ import annotations

import pandas as pd

from analysis.data.slices import slices


def runs_of(grid: dict[tuple[int, int], list[float]]) -> pd.DataFrame:
    rows = []
    for (n_layer, d_model), ratios in grid.items():
        params = 12 * n_layer * d_model**2
        for variant, extra in (("baseline", 0), ("full", 2 * n_layer * d_model)):  # AttnRes: a few more params
            for r in ratios:
                rows.append(dict(n_layer=n_layer, d_model=d_model, params=params + extra, tokens=r * params,
                                 variant=variant))  # fmt: skip
    return pd.DataFrame(rows)


def test_every_size_at_several_ratios_is_fitted_once_per_ratio():
    runs = runs_of({(4, 32): [2, 4, 8, 16], (5, 40): [2, 4, 8, 16], (6, 48): [2, 4, 8, 16]})
    parts = slices("study", runs)
    assert [name for name, _ in parts] == ["study@2tpp", "study@4tpp", "study@8tpp", "study@16tpp"]
    assert sum(len(p) for _, p in parts) == len(runs)
    for _, part in parts:  # both variants of every size, one budget each
        assert len(part) == 6 and part.groupby("variant").size().tolist() == [3, 3]


def test_one_budget_per_size_or_too_few_sizes_per_ratio_stays_whole():
    ladder = runs_of({(4, 32): [4], (5, 40): [4], (6, 48): [4]})
    assert [name for name, _ in slices("study", ladder)] == ["study"]
    two_sizes = runs_of({(4, 32): [2, 8], (5, 40): [2, 8]})  # a slice would have 2 budgets: no fit
    assert [name for name, _ in slices("study", two_sizes)] == ["study"]
    isoflop = runs_of({(4, 32): [16], (5, 40): [8], (6, 48): [4]})  # one ratio per size
    assert [name for name, _ in slices("study", isoflop)] == ["study"]


def test_the_report_finds_a_slices_runs_by_its_name():
    from reports.base.data import sweep_runs

    runs = runs_of({(4, 32): [2, 4], (5, 40): [2, 4], (6, 48): [2, 4]}).assign(sweep="study")
    part, name = sweep_runs(runs, "study@4tpp")
    assert name == "study@4tpp" and len(part) == 6
    assert (part["tokens"] / part["params"]).round().unique().tolist() == [4]
