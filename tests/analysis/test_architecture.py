"""The cells of an architecture sweep (analysis/estimates/architecture.py) on synthetic results whose best cells are
known: the baseline is best at 3 layers, Block AttnRes at 4, both at 2 heads."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from analysis import fit_results, load_results
from analysis.estimates.architecture import architecture_grid, is_architecture_sweep
from analysis.tables.tables import format_report
from tests.synthetic_results import write_synthetic_results

WIDTHS = {2: 64, 3: 56, 4: 48, 5: 40}  # 96k-113k parameters; whole heads of an even dimension (valid configs)
SHAPES = [(n, d, h) for n, d in WIDTHS.items() for h in (1, 2, 4)]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return write_synthetic_results(
        tmp_path_factory.mktemp("arch"),
        multipliers={"baseline": 1.0, "block": 1.1},
        budgets=[6.5e11],
        shapes=SHAPES,
        best_depth={"baseline": 3, "block": 4},
        seeds=2,
        tables=False,
    )


def test_the_cells_and_each_curves_best_cell_are_read_back(tree):
    runs = load_results(tree.root, tables=()).runs
    assert is_architecture_sweep(runs)
    grid = architecture_grid(runs, "baseline")
    assert grid.curves == ["baseline", "block"] and len(grid.cells) == 24
    assert grid.row_names == ("1 head", "2 heads", "4 heads")
    assert grid.best("baseline").name == "L3-d56-h2" and grid.best("block").name == "L4-d48-h2"
    truth = tree.runs.groupby(["variant", "n_layer", "n_head"])["true_loss"].mean()
    for c in grid.cells:
        assert c.n_runs == 2 and c.row == (1, 2, 4).index(c.n_head)
        assert c.loss == pytest.approx(truth[(c.curve, c.n_layer, c.n_head)], rel=1e-9)  # no noise
    block = {(c.n_layer, c.n_head): c for c in grid.of("block")}
    base = {(c.n_layer, c.n_head): c for c in grid.of("baseline")}
    for key, c in block.items():
        assert c.gap_pct == pytest.approx(100 * math.log(c.loss / base[key].loss))
    # Block's loss is 0.4 % x ((n - 4)^2 - (n - 3)^2) lower than the baseline's at depth n, beside its constant M:
    # its gap falls by 0.8 points a layer, 2.4 from 2 to 5 layers
    assert grid.gap_change["block"].change.value == pytest.approx(-2.4, abs=1e-6)
    assert grid.gap_change["block"].depths == (2, 5)


def test_the_fit_prints_and_saves_the_cells(tree):
    report = fit_results(tree.root, n_boot=0)
    sw = report.sweeps[0]
    assert sw.architecture is not None
    text = format_report(report)
    assert "the architecture sweep (one parameter count, one compute)" in text
    assert len(re.findall(r"\d\.\d{4} \*", text)) == 2  # one best cell per curve
    assert "no scaling law" in text and "IsoFLOP" not in text  # no frontier is looked for
    saved = json.loads(json.dumps(report.to_dict()))["sweeps"][0]["architecture"]
    assert saved["best"] == {"baseline": "L3-d56-h2", "block": "L4-d48-h2"}
    assert saved["gap_change_pct"]["block"]["value"] == pytest.approx(-2.4, abs=1e-6)
    assert "change 2 -> 5 layers" in text
    assert len(saved["cells"]) == 24


def test_attnres_fit_on_an_architecture_sweep_exits_0(tree, tmp_path):
    """Its result is the cells, not a curve: no "no curve could be fitted" error (it exited 1 before)."""
    from analysis.cli import main

    assert main(["fit", str(tree.root), "--n-boot", "0", "--out", str(tmp_path / "fit.json")]) == 0


def test_a_scaling_ladder_is_not_an_architecture_sweep(tmp_path):
    ladder = write_synthetic_results(tmp_path, multipliers={"baseline": 1.0, "block": 1.25}, tables=False)
    runs = load_results(ladder.root, tables=()).runs
    assert not is_architecture_sweep(runs) and architecture_grid(runs, "baseline") is None
    assert "architecture" not in json.dumps(fit_results(ladder.root, n_boot=0).to_dict())


def test_the_report_draws_the_heatmaps(tree, tmp_path):
    import reports

    summary = reports.build_report(tree.root, tmp_path / "out", formats=("png",), n_boot=0, strict=True)
    assert "architecture" in {f.name for f in summary.figures}
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Architecture cells" in text and "Loss over depth and heads at one size and one compute" in text
    assert np.isfinite([c.loss for c in summary.fit.sweeps[0].architecture.cells]).all()


def test_a_missing_cell_leaves_a_hole_and_the_trend_names_its_own_depths(tmp_path):
    """Without the baseline at 5 layers and without Block's 2-head cell at 3 layers: the rows stay the head counts
    (the 4-head cell at 3 layers is not moved down), and Block's trend runs over the depths it has a gap at."""
    import shutil

    import reports

    tree = write_synthetic_results(
        tmp_path / "holes",
        multipliers={"baseline": 1.0, "block": 1.1},
        budgets=[6.5e11],
        shapes=SHAPES,
        best_depth={"baseline": 3, "block": 4},
        seeds=1,
        tables=False,
    )
    gone = tree.runs.query(
        "(variant == 'baseline' and n_layer == 5) or (variant == 'block' and n_layer == 3 and n_head == 2)"
    )
    for path in gone["path"]:
        shutil.rmtree(tree.root / path)
    grid = architecture_grid(load_results(tree.root, tables=()).runs, "baseline")
    assert grid.row_names == ("1 head", "2 heads", "4 heads")
    assert {(c.n_layer, c.n_head): c.row for c in grid.of("block")}[(3, 4)] == 2
    assert grid.gap_change["block"].depths == (2, 4)  # no baseline at 5: no gap there
    assert grid.gap_change["block"].change.value == pytest.approx(-1.6, abs=1e-6)
    summary = reports.build_report(tree.root, tmp_path / "out", formats=("png",), n_boot=0, strict=True)
    assert "architecture" in {f.name for f in summary.figures}
    assert "change 2 -> 4 layers" in (tmp_path / "out" / "report.md").read_text()
