"""Grid files: validation with clear messages, expansion into valid runs, stable run ids, the plan (no training)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from attnres.config import ConfigError, RunConfig
from sweeps import expand, load_grid, model_of_size, tokens_for
from sweeps.expansion import expand_runs, make_run
from sweeps.ladder import BudgetSpec, size_params
from sweeps.lookup import GRID_DIR, grid_files
from tests.cli_helpers import attnres

TINY = {
    "name": "tiny",
    "defaults": {"model": {"seq_len": 64}, "train": {"batch_size": 16, "eval_interval": 10, "eval_tokens": 4096}},
    "ladder": {"depths": [2], "width_per_layer": 16, "head_dim": 16},
    "budgets": [{"tokens": 20000}],
    "variants": ["baseline", "full", {"block": [2]}],
    "seeds": [0],
    "lr": 3e-3,
}


def grid_with(**changes):
    data = yaml.safe_load(yaml.safe_dump(TINY))
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def write(tmp_path: Path, data: dict, name: str = "g.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def expand_shipped(name, tmp_path):
    """A shipped grid's runs; a grid with `lr: tuned*` reads a tuned file written here with lr 3e-3 per size."""
    grid = load_grid(name)
    if isinstance(grid.lr, str):
        path = grid.tuned_file(tmp_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        sizes = {s.name: {"baseline": {"lr": 3e-3}} for s in grid.sizes}
        path.write_text(yaml.safe_dump({"sweep": grid.name, "sizes": sizes}))
    return expand(grid, tmp_path)


@pytest.mark.parametrize(
    "name", ["smoke", "demo", "cpu_small", "cpu_lr", "cpu_wsd", "paper", "block_size", "ablations"]
)
def test_shipped_grids_load_and_expand_to_valid_runs(name, tmp_path):
    runs = expand_shipped(name, tmp_path)
    assert runs and all(isinstance(r, RunConfig) for r in runs)
    assert {r.sweep for r in runs} == {name} | ({name + "-trunk"} if load_grid(name).branches else set())
    assert len({r.run_id for r in runs}) == len(runs)


def test_shipped_grids_have_what_the_issue_asks(tmp_path):
    smoke = expand("smoke")
    assert len({r.train.tokens for r in smoke}) == 2
    assert {r.model.residual for r in smoke} == {"baseline", "full", "block"}
    small = expand_shipped("cpu_small", tmp_path)
    assert len({(r.model.n_layer, r.train.tokens) for r in small}) >= 5
    assert sorted({r.model.n_blocks for r in small if r.model.residual == "block"}) == [2, 4]
    assert isinstance(load_grid("cpu_small").seeds, tuple)
    paper = expand("paper")
    assert sorted({(r.model.n_layer, r.model.d_model) for r in paper}) == [
        (12, 896),
        (13, 960),
        (14, 1024),
        (16, 1168),
        (17, 1264),
    ]
    assert {r.train.lr for r in paper if r.model.n_layer == 12} == {2.99e-3}
    blocks = expand("block_size")
    sizes = {r.model.block_size for r in blocks if r.model.residual == "block"}
    assert sizes == {12, 6, 4, 3, 2, 1} and any(r.model.residual == "baseline" for r in blocks)


def test_ladder_functions():
    assert model_of_size(4, 16, 16) == {"n_layer": 4, "d_model": 64, "n_head": 4}
    assert model_of_size(12, 73, 64) == {"n_layer": 12, "d_model": 896, "n_head": 14}
    assert tokens_for(1000, BudgetSpec("tokens_per_param", 20)) == {"tokens": 20000, "flops": None}
    assert tokens_for(1000, BudgetSpec("flops", 1e12)) == {"tokens": None, "flops": 1e12}


def test_tokens_per_param_use_the_baseline_params_for_every_variant():
    grid = load_grid(grid_with(budgets=[{"tokens_per_param": 2}]))
    runs = expand(grid)
    params = size_params(grid.defaults, grid.sizes[0])
    assert {r.train.tokens for r in runs} == {2 * params}


def test_flops_budget_is_passed_to_each_variant():
    runs = expand(load_grid(grid_with(budgets=[{"flops": 1e11}])))
    assert {r.train.flops for r in runs} == {1e11} and {r.train.tokens for r in runs} == {None}


@pytest.mark.parametrize(
    "changes, fragments",
    [
        ({"variants": ["baseline", "ful"]}, ["unknown variant 'ful'", "did you mean 'full'"]),
        ({"variants": [{"blok": [2]}]}, ["unknown variant 'blok'"]),
        ({"variants": [{"block": [5]}]}, ["block N=5 is out of range for size L2-d32", "1 <= N <= 2 * n_layer = 4"]),
        ({"variants": [{"block": [0]}]}, ["block N=0 is out of range"]),
        ({"ladder": {"depths": [], "width_per_layer": 16, "head_dim": 16}}, ["the ladder is empty"]),
        ({"ladder": None}, ["the ladder is empty"]),
        ({"variants": ["full", "full"]}, ["duplicate runs", "full-L2-d32"]),
        ({"seeds": [0, 0]}, ["duplicate runs"]),
        ({"variants": [{"block": [2]}, "block2"]}, ["duplicate runs", "block2-L2-d32"]),
        ({"budgets": []}, ["budgets is empty"]),
        ({"defaults": {"model": {"n_layr": 2}}}, ["defaults", "n_layr", "n_layer"]),
        ({"defaults": {"train": {"batch_size": "many"}}}, ["defaults", "batch_size must be an integer"]),
        ({"budgets": [{"tokens_per_parm": 2}]}, ["tokens_per_parm", "tokens_per_param"]),
        ({"lr": "tunned"}, ["lr must be a number"]),
        ({"slurm": {"gpus_per_nod": 2}}, ["slurm.", "gpus_per_nod", "gpus_per_node"]),
        ({"slurm": {"time_min": "soon"}}, ["time_min must be an integer"]),
        ({"seedz": [1]}, ["unknown config key 'seedz'", "seeds"]),
    ],
)
def test_bad_grids_are_rejected_with_a_clear_message(tmp_path, changes, fragments):
    path = write(tmp_path, grid_with(**changes))
    with pytest.raises(ConfigError) as err:
        load_grid(path)
    message = str(err.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message


def test_an_empty_defaults_section_is_an_empty_mapping():
    """`train:` with nothing under it (YAML null), and no seeds: the seed and the settings are the defaults' (this
    raised AttributeError before)."""
    data = grid_with(seeds=None, defaults={"model": {"seq_len": 64}, "train": None})
    runs = expand(load_grid(data))
    assert {r.train.seed for r in runs} == {0} and {r.model.seq_len for r in runs} == {64}


def test_a_bad_per_run_setting_names_the_run(tmp_path):
    data = grid_with(ladder={"sizes": [{"n_layer": 2, "d_model": 30, "n_head": 4}]})
    with pytest.raises(ConfigError, match="size L2-d30.*d_model=30 is not divisible by n_head=4"):
        load_grid(write(tmp_path, data))


def test_run_ids_are_stable_and_follow_the_config(tmp_path):
    path = write(tmp_path, TINY)
    first = [r.run_id for r in expand(load_grid(path))]
    again = [r.run_id for r in expand(load_grid(path))]
    assert first == again
    # the same runs from a different file name and sweep name keep their ids (ids hash model+data+train)
    assert [r.run_id for r in expand(load_grid(write(tmp_path, {**TINY, "name": "other"}, "other.yaml")))] == first
    changed = [r.run_id for r in expand(load_grid(write(tmp_path, {**TINY, "lr": 1e-3}, "lr.yaml")))]
    assert not set(changed) & set(first)
    override = [r.run_id for r in expand(load_grid(path, ["train.weight_decay=0.0"]))]
    assert not set(override) & set(first)
    runtime = [r.run_id for r in expand(load_grid(path, ["runtime.threads=1"]))]
    assert runtime == first


def test_lists_expand_as_a_cross_product(tmp_path):
    grid = load_grid(grid_with(lr=[1e-3, 3e-3], seeds=[0, 1], budgets=[{"tokens": [10000, 20000]}]))
    runs = expand_runs(grid)
    assert len(runs) == 2 * 2 * 2 * 3
    assert {r.variant for r in runs} == {"baseline", "full", "block2"}


def test_block_divisors_and_explicit_sizes(tmp_path):
    data = grid_with(
        variants=["baseline", {"block": "divisors"}],
        ladder={
            "sizes": [{"n_layer": 3, "d_model": 48, "n_head": 3, "train": {"lr": 1e-3}, "budgets": [{"tokens": 5000}]}]
        },
        lr=None,
    )
    runs = expand(load_grid(data))
    assert sorted(r.model.n_blocks for r in runs if r.model.residual == "block") == [1, 2, 3, 6]
    assert {r.train.lr for r in runs} == {1e-3} and {r.train.tokens for r in runs} == {5000}


def test_lr_tuned_without_a_tuned_file_names_the_command(tmp_path):
    path = write(tmp_path, grid_with(lr="tuned"))
    grid = load_grid(path)  # loading validates everything else
    with pytest.raises(ConfigError, match=r"attnres tune .*g\.yaml --results .*res"):
        expand(grid, tmp_path / "res")


def test_a_tuned_file_with_a_key_written_twice_is_refused_naming_the_lines(tmp_path):
    """A hand-edited tuned file that gives one size's baseline twice: YAML would keep the second rate without a
    word; the grid that reads it stops with the file, the key and both lines instead."""
    grid = load_grid(write(tmp_path, grid_with(lr="tuned")))
    path = grid.tuned_file(tmp_path / "res")
    path.parent.mkdir(parents=True)
    size = grid.sizes[0].name
    path.write_text(f"sweep: {grid.name}\nsizes:\n  {size}:\n    baseline: {{lr: 0.003}}\n    baseline: {{lr: 0.03}}\n")
    with pytest.raises(ConfigError, match=r"tuned\.yaml: key 'baseline' is given twice .*lines 4 and 5"):
        expand(grid, tmp_path / "res")
    path.write_text("- a list\n")  # not a mapping at all
    with pytest.raises(ConfigError, match=r"has no sizes: section"):
        expand(grid, tmp_path / "res")


def test_plan_prints_the_table_and_trains_nothing(tmp_path):
    path = write(tmp_path, TINY)
    results = tmp_path / "results"
    out = attnres("sweep", "plan", path, "--results", results)
    assert out.returncode == 0, out.stderr
    for fragment in (
        "run_id",
        "params",
        "tokens",
        "FLOPs",
        "est. time",
        "baseline-L2-d32-s0-",
        "full-L2-d32",
        "block2-L2-d32",
        "3 runs",
    ):
        assert fragment in out.stdout
    assert not results.exists()


def test_plan_shows_the_datas_tokens_and_warns_above_one_epoch(tmp_path):
    from attnres.config import DataConfig
    from attnres.data.corpus import load_corpus
    from sweeps.plan import data_summary, format_plan, grid_data, plan

    train_tokens = len(load_corpus(DataConfig()).train)
    grid = load_grid(write(tmp_path, TINY), ["train.tokens=2e7"])  # about 2.2 passes over the built-in corpus
    rows = plan(grid, None)
    text = format_plan(grid, rows, data=[data_summary(c) for c in grid_data(grid)])
    assert all(r.epochs == pytest.approx(2e7 / train_tokens, rel=0.01) for r in rows)
    assert f"data: builtin (bytes, vocabulary 256): {train_tokens / 1e6:.3g}M training tokens" in text
    assert "warning: 3 run(s) need more than one epoch of the data (up to 2.2)" in text
    # the share of what each run reads twice: by chance with the default order, past the first epoch with epoch's
    e = rows[0].epochs
    assert rows[0].repeat == pytest.approx(1 - (1 - math.exp(-e)) / e, rel=1e-4)
    assert "  epochs  repeat  " in next(line for line in text.splitlines() if line.startswith("run_id"))
    epoch = plan(load_grid(write(tmp_path, TINY), ["train.tokens=2e7", "train.sampler=epoch"]), None)
    assert epoch[0].repeat == pytest.approx(1 - 1 / e, rel=1e-4)


def test_plan_rejects_a_bad_grid_with_exit_code_2(tmp_path):
    path = write(tmp_path, grid_with(variants=["baseline", "fancy"]))
    out = attnres("sweep", "plan", path)
    assert out.returncode == 2
    assert "unknown variant 'fancy'" in out.stderr


def test_grids_ship_in_the_package_folder():
    assert {p.stem for p in GRID_DIR.glob("*.yaml")} >= {"smoke", "demo", "paper", "block_size", "ablations"}


def test_slurm_resources_become_the_runs_runtime():
    from sweeps.slurm import resources, slurm_groups

    res = resources(
        {
            "gpus_per_node": 8,
            "nodes": 2,
            "cpus_per_task": 12,
            "additional": {"qos": "high"},
            "setup": ["module load cuda"],
        }
    )
    assert res.runtime() == {"accelerator": "gpu", "devices": 8, "num_nodes": 2, "threads": 12, "progress_bar": False}
    assert resources({}).runtime()["accelerator"] == "cpu"
    with pytest.raises(ConfigError, match="tasks_per_node=2 must equal gpus_per_node=8"):
        resources({"gpus_per_node": 8, "tasks_per_node": 2})
    groups = slurm_groups(expand_runs(load_grid("paper")))
    assert sorted(res.nodes for res, _, _ in groups) == [4, 6]  # one array per set of resources
    for res, _runs, cfgs in groups:
        assert all(
            c.runtime.devices == 8 and c.runtime.num_nodes == res.nodes and c.runtime.accelerator == "gpu" for c in cfgs
        )


def test_slurm_env_is_exported_in_the_job_before_its_setup_lines():
    from sweeps.slurm import resources, slurm_groups

    res = resources({"env": {"NCCL_SOCKET_IFNAME": "ib0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": 1, "X": "a b;c"}})
    assert res.exports() == [
        "export NCCL_SOCKET_IFNAME=ib0", "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "export X='a b;c'"
    ]  # fmt: skip
    for bad in ({"NCCL-DEBUG": "WARN"}, ["NCCL_DEBUG=WARN"], {"NCCL_DEBUG": None}):
        with pytest.raises(ConfigError, match="slurm.env"):
            resources({"env": bad})
    (res, _, cfgs), *_ = slurm_groups(expand_runs(load_grid("paper")))
    assert "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in res.exports()  # the paper grid's NCCL template
    assert cfgs[0].runtime.checkpoint_interval_min == 30 and cfgs[0].runtime.process_group_timeout_s == 1800


def test_a_batch_that_does_not_split_over_the_gpus_is_rejected_by_the_slurm_plan(tmp_path):
    path = write(
        tmp_path, grid_with(slurm={"gpus_per_node": 8}, defaults={**TINY["defaults"], "train": {"batch_size": 12}})
    )
    out = attnres("sweep", "plan", path, "--launcher", "slurm")
    assert out.returncode == 2 and "batch_size=12 does not split over its 8 devices" in out.stderr


def test_a_missing_corpus_fails_the_sweep_before_it_starts(tmp_path):
    from sweeps import run_grid

    data = grid_with(defaults={**TINY["defaults"], "data": {"corpus": str(tmp_path / "nowhere.txt")}})
    with pytest.raises(ConfigError, match="nowhere.txt' does not exist"):
        run_grid(load_grid(data), tmp_path / "results", progress=False)
    assert not (tmp_path / "results").exists()


def test_ablation_variants_carry_their_model_settings():
    grid = load_grid(
        grid_with(
            variants=[
                "baseline",
                {"name": "full+sigmoid", "model": {"residual": "full", "depth_score": "sigmoid"}},
                {"model": {"residual": "block", "n_blocks": 2, "key_norm": False}},
            ]
        )
    )
    runs = expand(grid)
    by_variant = {r.model.variant: r for r in runs}
    assert set(by_variant) == {"baseline", "full+sigmoid", "block+no_key_norm"}
    assert by_variant["full+sigmoid"].model.depth_score == "sigmoid"
    assert by_variant["block+no_key_norm"].model.n_blocks == 2 and not by_variant["block+no_key_norm"].model.key_norm
    labels = [spec.for_size(2, 4)[0][0] for spec in grid.variants]
    assert labels == ["baseline", "full+sigmoid", "block2+no_key_norm"]
    trial = make_run(grid, grid.sizes[0], "full+sigmoid", grid.budgets[0], 0)
    assert trial.model.depth_score == "sigmoid"


@pytest.mark.parametrize(
    "variant,fragment",
    [
        ({"name": "x", "model": {"residual": "full", "depth_scor": "sigmoid"}}, "depth_score"),
        ({"name": "x", "model": {"depth_score": "sigmoid"}}, "residual"),
        ({"name": "a b", "model": {"residual": "full"}}, "without spaces"),
        ({"name": "x", "model": {"residual": "baseline", "depth_score": "sigmoid"}}, "only apply to AttnRes"),
    ],
)
def test_bad_ablation_variants_are_rejected(variant, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_grid(grid_with(variants=["baseline", variant]))


def test_the_ablations_grid_has_the_papers_table_4_rows():
    variants = {r.model.variant for r in expand("ablations")}
    assert {
        "baseline",
        "denseformer",
        "mhc4",
        "full",
        "full+input_query",
        "full+scalar",
        "full+sigmoid",
        "full+no_key_norm",
        "full+window4",
        "block",
        "block+heads16",
        "block+no_key_norm",
    } <= variants


def test_a_plan_before_tuning_shows_the_runs_to_be_tuned_and_the_tuning(tmp_path):
    """`sweep plan` of an lr: tuned grid on a fresh clone trains nothing, so it does not need the tuned values."""
    data = grid_with(lr="tuned", tune={"budget": {"tokens": 4000}, "trials": 3})
    out = attnres("sweep", "plan", str(write(tmp_path, data)), "--results", str(tmp_path / "res"))
    assert out.returncode == 0, out.stderr
    assert "baseline-L2-d32-s0-?" in out.stdout and " tuned " in out.stdout
    assert "tuning first: 5 trial runs (3 + 2 finalists" in out.stdout and "attnres tune" in out.stdout
    assert not (tmp_path / "res").exists()


def test_the_shipped_study_plans_on_a_fresh_clone(tmp_path):
    out = attnres("sweep", "plan", "cpu_small", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "40 runs" in out.stdout and "tuning first: 50 trial runs" in out.stdout
    assert "attnres tune cpu_small --results RESULTS" in out.stdout  # a shipped grid by its name, not its path


def test_status_before_tuning_and_without_a_grid_shows_what_exists(tmp_path):
    out = attnres("sweep", "status", "cpu_small", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "sweep cpu_small: 0 runs" in out.stdout and "attnres tune cpu_small" in out.stdout
    bare = attnres("sweep", "status", cwd=tmp_path)
    assert bare.returncode == 0, bare.stderr
    assert "no runs under results/ yet" in bare.stdout
    committed = GRID_DIR.parent / "studies" / "cpu_small" / "results"
    listing = attnres("sweep", "status", "--results", str(committed)).stdout
    assert "sweep cpu_small: 40 runs: 40 done" in listing and "sweep cpu_lr: 24 runs: 24 done" in listing


def test_help_lists_every_shipped_grid():
    out = attnres("sweep", "plan", "--help").stdout
    shipped = sorted(grid_files())  # sweeps/*.yaml and the committed studies' grids
    assert len(shipped) >= 7 and all(name in " ".join(out.split()) for name in shipped)


def test_the_default_cpu_time_model_matches_the_committed_studys_wall_times():
    """The plan's default estimate (no measured runs) of the committed cpu_lr sweep (24 runs, 3 learning rates)
    against the wall time its runs recorded on 2 CPU cores: within 30 %."""
    import pandas as pd

    from sweeps.plan import plan

    folder = GRID_DIR.parent / "studies" / "cpu_small" / "results" / "cpu_lr"
    rows = plan(load_grid("cpu_lr"), results=None)
    measured = {p.parent.name: float(pd.read_parquet(p)["wall_s"].iloc[0]) for p in folder.glob("*/run.parquet")}
    assert {r.run_id for r in rows} == set(measured) and all(r.rate_source == "default" for r in rows)
    assert sum(r.est_s for r in rows) == pytest.approx(sum(measured.values()), rel=0.3)


def test_status_names_an_unreadable_run_parquet(tmp_path):
    from sweeps.status import format_status, sweep_status

    planned = expand_runs(load_grid(grid_with()), tmp_path)
    broken = tmp_path / planned[0].cfg.sweep / planned[0].run_id
    broken.mkdir(parents=True)
    (broken / "run.parquet").write_bytes(b"PAR1 truncated")
    states = sweep_status(planned, tmp_path)
    assert [s.state for s in states] == ["unreadable", "queued", "queued"]
    assert "cannot be read" in states[0].detail and "1 unreadable" in format_status(states, "tiny")


def test_sweep_throughput_times_every_variant_of_every_size_side_by_side(tmp_path):
    import json

    from sweeps.throughput import measure, write

    grid = load_grid("smoke")
    data = measure(grid, steps=1, rounds=2, warmup=1, log=lambda _: None)
    assert "interleaved" in data["method"] and data["device"] == "cpu"
    entries = {(e["residual"], e["n_blocks"]): e for e in data["measured"]}
    assert set(entries) == {("baseline", None), ("full", None), ("block", 2)}
    assert all(e["tokens_per_s"] > 0 and e["flops_per_s"] > e["tokens_per_s"] for e in entries.values())
    assert all(len(e["rounds"]) == 2 for e in entries.values())
    bad = attnres("sweep", "throughput", "smoke", "--results", tmp_path, "--steps", "0")
    assert bad.returncode == 2 and "--steps and --rounds must be at least 1" in bad.stderr
    assert not (tmp_path / "smoke" / "throughput.json").exists()  # a bad argument measured and wrote nothing
    path = write(tmp_path, grid, data)
    assert path == tmp_path / "smoke" / "throughput.json" and json.loads(path.read_text()) == data


def test_an_isoflop_budget_a_size_cannot_meet_is_one_clear_error(tmp_path):
    grid = yaml.safe_load((GRID_DIR / "smoke.yaml").read_text())
    grid.update(name="iso", budgets=[{"flops": [1e9, 3e12]}], variants=["baseline"])
    grid["ladder"] = {"depths": [2, 3], "width_per_layer": 16, "head_dim": 16}
    path = tmp_path / "iso.yaml"
    path.write_text(yaml.safe_dump(grid))
    with pytest.raises(ConfigError, match=r"size L3-d48.*budget 1e\+09 FLOPs is less than a few steps of size L3-d48"):
        expand(load_grid(path))
    grid["budgets"] = [{"flops": [1e11, 3e12]}]  # every size meets both: an IsoFLOP grid, two sizes per budget
    path.write_text(yaml.safe_dump(grid))
    runs = expand(load_grid(path))
    assert len(runs) == 4 and len({r.train.flops for r in runs}) == 2


def test_the_plan_shows_memory_per_device_and_the_micro_batch_that_fits(tmp_path):
    """With runtime.device_memory_gb, each run gets its estimated peak; one that will not fit is marked and the plan
    names the largest micro-batch that would; a sweep with such a run is refused before it starts."""
    from attnres.training.memory import GIB, HEADROOM, estimate
    from sweeps import run_grid
    from sweeps.plan import format_plan, plan

    grid = load_grid(grid_with(variants=["full"]))
    (run,) = expand(grid)
    whole = estimate(run, gpu=False).peak
    halves = estimate(RunConfig(model=run.model, train=grid_with_micro(run, 8), runtime=run.runtime), gpu=False).peak
    assert halves < whole
    memory = (halves + whole) / 2 / HEADROOM / GIB  # fits at micro-batch 8, not at 16
    sized = load_grid(write(tmp_path, grid_with(variants=["full"])), [f"runtime.device_memory_gb={memory}"])
    (row,) = plan(sized)
    assert row.memory_gib == pytest.approx(whole / GIB) and "train.micro_batch_size=8 " in row.memory_problem
    text = format_plan(sized, [row])
    assert "mem GiB" in text and f"{whole / GIB:.3g}!" in text and "1 of 1 runs do not (!)" in text
    with pytest.raises(ConfigError, match="(?s)will not fit in memory.*set train.micro_batch_size=8"):
        run_grid(sized, tmp_path / "results", progress=False)
    assert not (tmp_path / "results").exists()
    tiny = load_grid(write(tmp_path, grid_with(variants=["full"])), ["runtime.device_memory_gb=1e-6"])
    (row,) = plan(tiny)
    assert "even micro-batch 1 with runtime.checkpointing=sublayer needs" in row.memory_problem
    assert plan(grid)[0].memory_gib is None and "mem GiB" not in format_plan(grid, plan(grid))


def grid_with_micro(run: RunConfig, micro: int):
    from dataclasses import replace

    return replace(run.train, micro_batch_size=micro)


def test_a_variant_entry_carries_its_own_rates_and_seeds():
    data = grid_with(
        lr=[1e-3, 2e-3, 4e-3],
        seeds=[0, 1],
        variants=[
            "baseline",
            {"name": "full", "model": {"residual": "full"}, "lr": [2e-3], "seeds": [0]},
            {"block": [2], "seeds": [5]},
        ],
    )
    runs = expand(load_grid(data))
    by = {}
    for r in runs:
        by.setdefault(r.model.residual, set()).add((r.train.lr, r.train.seed))
    assert by["baseline"] == {(lr, s) for lr in (1e-3, 2e-3, 4e-3) for s in (0, 1)}
    assert by["full"] == {(2e-3, 0)}
    assert by["block"] == {(lr, 5) for lr in (1e-3, 2e-3, 4e-3)}
    with pytest.raises(ConfigError, match="lr must be rates"):
        load_grid(grid_with(variants=["baseline", {"block": [2], "lr": "tuned"}]))
    with pytest.raises(ConfigError, match="name the variant too"):
        load_grid(grid_with(variants=["baseline", {"seeds": [1]}]))


def test_rates_a_factor_apart_around_a_centre():
    runs = expand(load_grid(grid_with(lr={"centre": 4e-3, "factor": 2, "count": 4}, variants=["baseline"])))
    rates = sorted(r.train.lr for r in runs)
    assert rates == pytest.approx([4e-3 * 2**k for k in (-1.5, -0.5, 0.5, 1.5)])
    for bad, match in (
        ({"centre": 4e-3, "factor": 2}, "needs count"),
        ({"centre": 4e-3, "factor": 1, "count": 3}, "factor must be > 1"),
        ({"centre": 4e-3, "factor": 2, "count": 3, "spread": 1}, "unknown config key lr"),
    ):
        with pytest.raises(ConfigError, match=match):
            load_grid(grid_with(lr=bad))


def test_branches_share_a_warm_up_capped_at_a_tenth_of_the_shortest_branch():
    def warmups(branches):
        data = grid_with(budgets=[{"tokens": [20000, 160000]}], branches=branches, variants=["baseline"])
        data["defaults"]["train"]["warmup_frac"] = 0.05
        return {r.train.warmup_tokens for r in expand(load_grid(data)) if r.train.trunk_tokens is not None}

    (capped,) = warmups({"decay_frac": 0.2})
    assert capped == pytest.approx(0.1 * 20480, abs=1)  # 10 % of the shortest branch, not 5 % of the longest (8,000)
    (uncapped,) = warmups({"decay_frac": 0.2, "max_warmup_frac": None})
    assert uncapped == pytest.approx(0.05 * 160768, abs=1)  # the committed cpu_wsd grids' rule
    with pytest.raises(ConfigError, match="max_warmup_frac"):
        warmups({"decay_frac": 0.2, "max_warmup_frac": 1.5})


def test_a_studys_grid_is_found_by_name_in_its_folder():
    from sweeps.lookup import STUDIES_DIR, resolve_grid_path, shipped_grids

    assert resolve_grid_path("cpu_envelope") == STUDIES_DIR / "cpu_envelope" / "cpu_envelope.yaml"
    assert "cpu_envelope" in shipped_grids() and "smoke" in shipped_grids()
    for study, grids in {"cpu_small": ["cpu_small", "cpu_lr"], "cpu_wsd": ["cpu_wsd", "cpu_wsd_pv"]}.items():
        for name in grids:  # each committed study's grids beside its results
            assert resolve_grid_path(name) == STUDIES_DIR / study / f"{name}.yaml"
