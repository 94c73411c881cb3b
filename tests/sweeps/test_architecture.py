"""Architecture sweeps (sweeps/architecture.py): a depth x heads grid of cells at one parameter count and one compute,
each cell's shape solved for the count, and one clear error before any compute for a cell that cannot meet either."""

from __future__ import annotations

import pytest
import yaml

from attnres.config import ConfigError, ModelConfig
from attnres.costs import count_params, run_budget
from sweeps import load_grid
from tests.cli_helpers import attnres

ARCH = {
    "name": "arch",
    "defaults": {"model": {"seq_len": 128}, "train": {"batch_size": 16}},
    "ladder": {"architecture": {"params": 114e3, "depths": [2, 3, 4, 5], "heads": [1, 2, 3, 4], "tolerance": 0.1}},
    "budgets": [{"flops": 6.5e11}],
    "variants": ["baseline", {"block": [2]}],
    "seeds": [0, 1],
    "lr": 5e-3,
}


def arch(**changes):
    data = yaml.safe_load(yaml.safe_dump(ARCH))
    data["ladder"]["architecture"].update(changes.pop("architecture", {}))
    data.update(changes)
    return data


def test_the_cells_meet_the_parameter_count_and_the_compute():
    grid = load_grid(arch())
    cells = grid.sizes
    assert [(c.n_layer, c.n_head) for c in cells] == [(n, h) for n in (2, 3, 4, 5) for h in (1, 2, 3, 4)]
    assert len({c.name for c in cells}) == 16 and all(c.name.endswith(f"-h{c.n_head}") for c in cells)
    for c in cells:
        model = ModelConfig(n_layer=c.n_layer, d_model=c.d_model, n_head=c.n_head, seq_len=128)
        assert abs(count_params(model).non_embedding / 114e3 - 1) <= 0.1, c.name
        assert c.d_model % (2 * c.n_head) == 0  # whole heads of an even dimension
    # deeper is narrower: d_model falls with depth in every row
    for h in (1, 2, 3, 4):
        widths = [c.d_model for c in cells if c.n_head == h]
        assert widths == sorted(widths, reverse=True)
    runs = grid.runs
    assert len(runs) == 16 * 2 * 2 and len({r.run_id for r in runs}) == len(runs)
    flops = [run_budget(r.cfg).flops for r in runs]
    assert max(flops) / min(flops) < 1.02  # one compute: each cell reads its own tokens


def test_the_shipped_study_grid_loads():
    grid = load_grid("cpu_architecture")
    assert grid.architecture is not None and len(grid.sizes) == 16


@pytest.mark.parametrize(
    "changes, fragments",
    [
        (  # two layers move d_model in steps of 2 n_head: 4 heads cannot come within 2 % of 114k
            {"architecture": {"tolerance": 0.02}},
            ["ladder.architecture: the cell n_layer", "non-embedding parameters", "tolerance 2 %", "2 n_head"],
        ),
        (
            {"architecture": {"heads": [], "heads_per_layer": [0.5, 0.75]}},
            ["at n_layer 3, heads_per_layer 0.5 and heads_per_layer 0.75 both give 2 head(s)"],
        ),
        ({"architecture": {"heads_per_layer": [0.5]}}, ["give the rows as heads (n_head) or as heads_per_layer"]),
        ({"architecture": {"depths": [2, 2]}}, ["lists a depth twice"]),
        ({"architecture": {"tolerance": 0.3}}, ["tolerance 0.3 is more than 0.2", "not one architecture sweep"]),
        ({"architecture": {"params": -1}}, ["ladder.architecture.params"]),
        (  # a token budget gives every cell the same tokens: the deep cells' attention makes their compute differ
            {
                "architecture": {"tolerance": 0.03, "params": 166e3, "depths": [2, 6], "heads": [1, 2]},
                "budgets": [{"tokens": 1e6}],
            },
            ["trains with", "FLOPs at budget", "give a FLOP budget"],
        ),
    ],
)
def test_a_cell_that_cannot_meet_the_sweep_is_one_error_naming_it(changes, fragments):
    with pytest.raises(ConfigError) as err:
        load_grid(arch(**changes))
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


def test_a_ladder_beside_the_architecture_is_refused():
    data = arch()
    data["ladder"]["depths"] = [2]
    with pytest.raises(ConfigError, match="give ladder.architecture alone"):
        load_grid(data)


def test_the_plan_refuses_a_bad_cell_in_one_line_before_any_run(tmp_path):
    path = tmp_path / "arch.yaml"
    path.write_text(yaml.safe_dump(arch(architecture={"tolerance": 0.02})))
    done = attnres("sweep", "plan", path, "--results", tmp_path / "r")
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and "ladder.architecture: the cell n_layer" in done.stderr
    assert not (tmp_path / "r").exists()


def test_the_plan_shows_each_runs_cell(tmp_path):
    from sweeps.plan import format_plan, plan

    grid = load_grid(arch())
    text = format_plan(grid, plan(grid, tmp_path))
    header = next(line for line in text.splitlines() if line.startswith("run_id")).split()
    assert header[:3] == ["run_id", "cell", "variant"]
    assert sum("L4-d48-h3" in line for line in text.splitlines()) == 4  # 2 variants x 2 seeds
