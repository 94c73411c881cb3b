"""The step benchmark: its statistics, and one tiny side-by-side run end to end (no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attnres import AttnResLM
from attnres.kernels import attention
from attnres.kernels import cpu as cpu_kernels
from benchmarks import bench_step
from tests.conftest import needs_cxx, needs_native


def test_median_ci_covers_the_true_median_at_its_level():
    """Samples of 40 from a skewed distribution with a known median (exponential: ln 2)."""
    rng = np.random.default_rng(0)
    trials = 2000
    covered = 0
    for _ in range(trials):
        sample = rng.exponential(size=40).tolist()
        low, high = bench_step.median_ci(sample)
        assert low <= float(np.median(sample)) <= high
        covered += low <= np.log(2) <= high
    assert 0.93 <= covered / trials <= 0.99  # order statistics give at least the level (about 96 % at n = 40)


def test_median_ci_falls_back_to_the_range_for_tiny_samples():
    assert bench_step.median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)


def test_side_by_side_run_reports_ratios_to_the_baseline(tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = [
        "--sizes",
        "32x1",
        "--seq-len",
        "16",
        "--batch",
        "2",
        "--head-dim",
        "16",
        "--repeats",
        "3",
        "--warmup",
        "1",
        "--variants",
        "baseline,block2,full",
        "--threads",
        str(torch.get_num_threads()),
        "--json",
        str(out),
    ]
    assert bench_step.main(argv) == 0
    rows = {row["variant"]: row for row in json.loads(out.read_text())["results"]}
    assert set(rows) == {"baseline", "block2", "full"}
    assert rows["baseline"]["step_ratio"] == 1.0 and rows["baseline"]["peak_ratio"] == 1.0
    for row in rows.values():
        low, high = row["step_ratio_ci95"]
        assert low <= row["step_ratio"] <= high
        assert row["step_ms"] > 0 and row["peak_mib"] > 0 and row["depth_ms"] > 0
    assert rows["full"]["peak_ratio"] > 1.0  # the depth buffers cost memory, and the measurement sees them
    assert "95% CI" in capsys.readouterr().out


def test_an_eager_variant_runs_without_the_native_kernels(monkeypatch):
    """``block2-eager`` is Block N = 2 with the depth attention in torch ops; ``block2`` uses the CPU kernels."""
    seen: list[bool] = []
    usable = cpu_kernels.usable
    monkeypatch.setattr(cpu_kernels, "usable", lambda *xs: seen.append(cpu_kernels.enabled) or usable(*xs))
    tokens = torch.randint(0, 256, (2, 17))
    default = cpu_kernels.enabled
    for name in ("block2-eager", "block2"):
        cfg = bench_step.variant_config(name, 32, 2, 16, 2)
        assert (cfg.residual, cfg.n_blocks) == ("block", 2)
        model = AttnResLM(cfg)
        seen.clear()
        bench_step.Runner(name, model, torch.optim.AdamW(model.parameters()), tokens, False).step()
        assert seen and set(seen) == {default and not name.endswith("-eager")}, name
        assert cpu_kernels.enabled == default  # switched back after the step


def test_an_ungrouped_variant_gathers_each_slot_alone():
    """``full-ungrouped`` is Full AttnRes with each slot gathering all of its readers itself (AttnRes.group = False)."""
    for name, group in (("full-ungrouped", False), ("full", True), ("block2-scatter", True)):
        cfg = bench_step.variant_config(name, 32, 2, 16, 2)
        model = bench_step.build_model(name, cfg, torch.device("cpu"), compile=False, fused=False)
        assert model.depth.group is group and model.depth.gather is ("scatter" not in name), name


@needs_cxx
def test_an_sdpa_variant_runs_the_token_attention_through_torch(monkeypatch):
    """``baseline-sdpa`` takes torch's SDPA for the token attention; ``baseline`` the native kernels (head_dim 16)."""
    seen: list[bool] = []
    native = attention.native
    monkeypatch.setattr(attention, "native", lambda *xs: seen.append(native(*xs)) or seen[-1])
    monkeypatch.setattr(cpu_kernels, "enabled", True)
    tokens = torch.randint(0, 256, (2, 17))
    for name in ("baseline-sdpa", "baseline"):
        model = AttnResLM(bench_step.variant_config(name, 32, 2, 16, 2))
        seen.clear()
        bench_step.Runner(name, model, torch.optim.AdamW(model.parameters()), tokens, False).step()
        assert seen and set(seen) == {not name.endswith("-sdpa")}, name
        assert attention.enabled  # switched back after the step


@pytest.mark.parametrize(
    "name,fused,whole",
    [
        ("block4", False, True),  # CPU: runtime.compile compiles Full / Block whole
        ("block4-sublayers", False, False),
        ("full-sublayers", False, False),
        ("block4", True, False),  # GPU (the fused depth kernels): each sublayer
        ("block4-whole", True, True),
        ("baseline-sublayers", False, True),  # the baseline compiles whole whatever the suffix
        ("baseline", True, True),
    ],
)
def test_the_compiled_variants_compile_what_they_name(name, fused, whole):
    """With --compile, a Full / Block variant compiles as runtime.compile does on its device (``fused``: GPU), each
    sublayer around the two-phase AttnRes (``-sublayers``, or on GPU) or the whole model with its depth attention
    traced (on CPU, or ``-whole``). Nothing compiles until a call, so this only builds the models."""
    from attnres.mixers import AttnRes, TracedAttnRes

    cfg = bench_step.variant_config(name, 32, 2, 16, 2)
    model = bench_step.build_model(name, cfg, torch.device("cpu"), compile=True, fused=fused)
    if cfg.residual != "baseline":
        assert type(model.depth) is (TracedAttnRes if whole else AttnRes)
        assert whole or model.depth.fused == fused
    assert (model._compiled_call_impl is not None) == whole
    assert all((s._compiled_call_impl is not None) == (not whole) for s in model.sublayers)


@needs_native  # bench_attention refuses to run with the kernels off
def test_the_attention_benchmark_compares_both_kernels_side_by_side(capsys):
    from benchmarks import bench_attention

    assert bench_attention.main(["--shapes", "1x2x9x16", "--repeats", "3", "--warmup", "1"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["1x2x9x16"]]
    assert [line[1] for line in lines] == ["fwd", "f+b"]
    for line in lines:
        sdpa_ms, native_ms, speedup = map(float, line[2:5])
        low, high = float(line[5].strip("[,")), float(line[6].strip("]"))
        assert sdpa_ms > 0 and native_ms > 0 and low <= speedup <= high


def test_fused_compiled_variants_may_scatter():
    """With --fused-depth Full / Block compile each sublayer around the two-phase autograd (as on GPU), where -scatter
    and -eager mean something: they are accepted, as they are refused where the model compiles whole (below)."""
    args = bench_step.parse_args(["--compile", "--fused-depth", "--variants", "baseline,block4-scatter,full-eager"])
    assert args.fused and not any(bench_step.compiles_whole(name, True, True) for name in args.variant_names)


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--sizes", "64y2"], "'64y2' is not d_model x n_layer"),
        (["--variants", "baseline,block5x"], "block<N>"),
        (["--sizes", "64x2", "--variants", "baseline,block8"], "n_blocks=8 is out of range"),
        (["--variants", "full,baseline"], "must start with baseline"),
        (["--compile", "--variants", "baseline,block4-scatter"], "compiled whole there is none"),
        (["--compile", "--variants", "baseline,full-ungrouped"], "add -sublayers"),
        (["--compile", "--variants", "baseline,full-eager"], "add -sublayers"),
        pytest.param(
            ["--device", "cuda"],
            "sees no CUDA GPU",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible"),
        ),
    ],
)
def test_bad_arguments_are_rejected_before_anything_is_timed(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_step.main(argv)
    assert exit_info.value.code == 2
    assert fragment in capsys.readouterr().err


@pytest.mark.integration  # a script end to end: pytest -m integration
def test_training_side_by_side_trains_each_variant_and_compares_their_throughput(tmp_path, capsys):
    from benchmarks import train_side_by_side

    argv = [
        "--variants",
        "baseline,block2",
        "--accelerator",
        "cpu",
        "--out",
        str(tmp_path),
        "model.n_layer=2",
        "model.d_model=32",
        "model.n_head=2",
        "model.seq_len=32",
        "train.batch_size=4",
        "train.tokens=8000",
    ]
    assert train_side_by_side.main(argv) == 0
    printed = capsys.readouterr().out
    for name in ("baseline", "block2"):
        run, rate = train_side_by_side.train_rate(tmp_path / name)
        assert run.status == "done" and run.device == "cpu" and rate > 0
        assert f"{name}: done, step {run.step}" in printed
    assert run.variant == "block" and run.n_blocks == 2  # the last run read: the overrides reached it
    assert "block2 step time / baseline's: " in printed


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--variants", "baseline,blockx"], "--variants: 'blockx' is not baseline, full or blockN"),
        # Block N=8 needs 4+ layers: refused before the baseline trains
        (["--variants", "baseline,block8", "model.n_layer=2"], "block8: ModelConfig.n_blocks=8 is out of range"),
        (["model.d_modle=32"], "d_modle"),
    ],
)
def test_training_side_by_side_rejects_bad_input_before_training(argv, fragment, capsys, tmp_path):
    from benchmarks import train_side_by_side

    with pytest.raises(SystemExit):
        train_side_by_side.main([*argv, "--out", str(tmp_path)])
    assert fragment in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing trained


@pytest.mark.integration  # a script end to end: pytest -m integration
def test_the_preparation_benchmark_checks_its_tokens_against_one_go_tokenization(tmp_path):
    """benchmarks/bench_prepare.py on 3 MB instead of 2 GB: it prepares, measures and verifies (exit 0)."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_prepare.py"
    args = ["--size-gb", "0.003", "--tokenizer", "bpe:300", "--workers", "2", "--verify", "0", "--dir", str(tmp_path)]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "peak RSS" in done.stdout and "equal to one-go tokenization: True" in done.stdout


@pytest.mark.integration  # a script end to end: pytest -m integration
def test_the_load_benchmark_runs_end_to_end(tmp_path):
    """benchmarks/bench_load.py on one smoke run (no timing assertions: the lead runs it on a quiet machine)."""
    from benchmarks import bench_load

    out = tmp_path / "load.json"
    assert (
        bench_load.main(["--grid", "smoke", "--runs", "1", "--hogs", "1", "--settle-s", "0", "--json", str(out)]) == 0
    )
    rows = json.loads(out.read_text())["rows"]
    labels = ["quiet", "quiet, unbound", "busy", "busy, unbound"]  # "busy, as before" where its threads differ
    assert [r["label"] for r in rows][:4] == labels and [r["bound"] for r in rows][:4] == [True, False, True, False]
    assert all(r["seconds"] > 0 for r in rows) and all("ratio_to_quiet" in r for r in rows[1:])


def test_the_depth_power_analysis_measures_its_noise_and_covers_at_its_level(capsys):
    """benchmarks/depth_power.py: the per-depth noise from the committed cpu_envelope runs (two seeds of both arms at
    d_model 48), and intervals of the depth trend that cover the true change about 90 % of the time."""
    import numpy as np

    from benchmarks import depth_power

    sigma = depth_power.measured_noise()
    assert 0.3 < sigma < 1.0  # % of loss per seed of one depth's paired gap (0.61 as committed)
    rng = np.random.default_rng(0)
    coverage, half, resolved = depth_power.simulate([4, 6, 8, 10, 12], 1, sigma, 1.0, 4000, False, rng)
    assert 0.88 < coverage < 0.92 and 0 < resolved < 1
    assert half == pytest.approx(2.353 * sigma * 16 / np.sqrt(160), rel=0.15)  # t(3) x the slope's SE x the span
    wider, _, _ = depth_power.simulate([4, 6, 8, 10, 12], 1, sigma, 1.0, 2000, True, rng)
    assert wider > 0.85  # one depth in five far off: the residual scatter widens the interval with it
    depth_power.main(["--depths", "4", "8", "12", "--seeds", "2", "--reps", "200", "--sigma", "0.6"])
    assert "4 8 12" in capsys.readouterr().out


@pytest.mark.integration  # a script end to end: pytest -m integration
def test_the_one_shape_power_analysis_covers_near_its_level(capsys):
    """benchmarks/one_shape_power.py: simulated one-shape studies read by analysis/estimates/one_shape.py as
    `attnres fit --lr envelope` does; with per-run noise its 90 % intervals cover near 0.9 (docs/analysis.md has the
    measured numbers)."""
    from benchmarks import one_shape_power

    coverage = one_shape_power.main(["--curves", "6", "--reps", "25"])
    assert set(coverage) == {"per-run", "per-seed", "half", "stalled"}
    assert 0.78 < coverage["per-run"] < 0.98 and all(0.6 < c <= 1 for c in coverage.values())
    assert "half-width median" in capsys.readouterr().out
    # the constant the interval adds for the envelope's misreading of asymmetric curves is the one computed here
    assert one_shape_power.resolution() == pytest.approx(one_shape_power.RESOLUTION, abs=0.005)
    assert one_shape_power.resolution(0.02, 0.02) == pytest.approx(0, abs=1e-9)  # a symmetric curve: read exactly


def test_the_decode_benchmark_times_prefill_and_decode_side_by_side(tmp_path, capsys):
    from benchmarks import bench_decode

    out = tmp_path / "decode.json"
    argv = ["--sizes", "32x2", "--head-dim", "16", "--prompt", "8", "--new", "3", "--repeats", "3", "--warmup", "1"]
    argv += ["--batches", "1,2", "--variants", "baseline,full,block3", "--json", str(out)]
    assert bench_decode.main(argv) == 0
    rows = json.loads(out.read_text())["results"]
    expected = [(b, v) for b in (1, 2) for v in ("baseline", "full", "block3")]
    assert [(r["batch"], r["variant"]) for r in rows] == expected
    for row in rows:
        for what in ("prefill", "decode"):
            low, high = row[f"{what}_ratio_ci95"]
            assert row[f"{what}_ms"] > 0 and low <= row[f"{what}_ratio"] <= high
            assert row[f"{what}_ratio_spread"][0] <= low and high <= row[f"{what}_ratio_spread"][1]
            assert row["variant"] != "baseline" or row[f"{what}_ratio"] == 1.0
    assert "decode ms/token" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [(["--variants", "full,baseline"], "must start with baseline"), (["--batches", "1,x"], "--batches")],
)
def test_the_decode_benchmark_rejects_bad_arguments_before_timing(argv, fragment, capsys):
    from benchmarks import bench_decode

    with pytest.raises(SystemExit):
        bench_decode.main(argv)
    assert fragment in capsys.readouterr().err


@pytest.mark.slow  # a short training run, under a minute on 2 busy cores
def test_the_host_sync_check_passes_on_cpu(tmp_path):
    """benchmarks/check_host_syncs.py (gpu_check.sh's host-syncs stage) on CPU: no host read in any micro-batch."""
    from benchmarks import check_host_syncs

    argv = ["--device", "cpu", "--json", str(tmp_path / "syncs.json"), "model.d_model=32", "model.n_head=2"]
    argv += ["model.seq_len=64", "train.tokens=3072", "train.eval_interval=3", "runtime.threads=1"]
    assert check_host_syncs.main(argv) == 0
    summary = json.loads((tmp_path / "syncs.json").read_text())
    assert summary["micro_batches_per_step"] == 4 and summary["training_step"]["calls"] == 12
    assert summary["on_before_optimizer_step"][0] == "step 1: reads ['tolist'], syncs 0"


@pytest.mark.parametrize(
    "op,group",
    [
        ("aten::mm", "matmul"),
        ("attnres::causal_attention_backward", "token attention"),
        ("DepositBackward", "depth mixing"),
        ("## Call CompiledFxGraph fvk4zlnoyee5gtp3auqdwvxmdhxbxtxcsfjmmqbd7k3ywblpirje ##", "compiled graphs"),
        ("aten::something_new", "other"),
    ],
)
def test_the_step_profile_groups_ops_by_what_they_do(op, group):
    from benchmarks import profile_step

    assert profile_step.group_of(op) == group


def test_the_step_profile_takes_the_variants_in_turn():
    """Each variant's steps alternate with the others', the order rotated each round, so they share the drift."""
    from benchmarks import profile_step

    order = list(profile_step.turns(["a", "b", "c"], 4))
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
