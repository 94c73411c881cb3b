"""Several devices on CPU: two processes over gloo, through the same `attnres train` a GPU cluster runs.

DDP and FSDP (FSDP2 through Lightning's ModelParallelStrategy, which runs on CPU) must train the run that one process
trains: the same weights, the same validation loss (over exactly the run's windows, not a padded copy), the same
logged training loss (the global batch's, not rank 0's half), and a kill at any point must resume to the
uninterrupted result, also across strategies (one checkpoint format). Each two-process run starts two Python
processes (10-20 s on 2 busy cores), so most of these are marked ``slow``: ``pytest -m slow
tests/attnres/test_parallel.py``.

On a machine with 2 GPUs the same tests run over NCCL: ``ATTNRES_TEST_ACCELERATOR=gpu pytest -m "slow or gpu"
tests/attnres/test_parallel.py`` (every run, the one-process reference too, on GPUs in fp32; docs/first-gpu-run.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from attnres.config import resolve_run_config
from attnres.storage import schema
from attnres.training.module import rank_windows
from attnres.training.run import train
from tests.attnres.grad_norms import assert_layer_norms_combine

ATTNRES = [sys.executable, "-m", "attnres.cli"]
# 255 evaluation windows: they do not split evenly over 2 ranks (a padding sampler counted one twice)
SMALL = [
    "model.n_layer=2",
    "model.d_model=32",
    "model.n_head=2",
    "model.seq_len=64",
    "train.batch_size=16",
    "train.tokens=20480",  # 20 steps
    "train.eval_interval=10",
    "train.eval_tokens=16320",
    "train.log_interval=1",
    "runtime.threads=1",
    f"runtime.accelerator={os.environ.get('ATTNRES_TEST_ACCELERATOR', 'cpu')}",
    "runtime.precision=32-true",
]
VARIANTS = {"baseline": ["model.residual=baseline"], "full": ["model.residual=full"], "block": ["model.n_blocks=2"]}
TWO = ["runtime.devices=2"]


def two_processes(args: list[str], out: Path, timeout: float = 300) -> None:
    proc = subprocess.run(
        [*ATTNRES, "train", *args, "--out", str(out), "--no-progress"], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def metrics(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / schema.METRICS_FILE)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]


def assert_same_run(a: Path, b: Path, atol: float) -> None:
    """The same logged steps, losses, gradient norms and validation loss, to ``atol``, and the same final weights to
    5 x ``atol`` (AdamW divides by the root of tiny second moments, which magnifies rounding; one wrong step would
    move a weight by about the learning rate, 3e-3)."""
    ma, mb = metrics(a), metrics(b)
    assert list(zip(ma.step, ma.split)) == list(zip(mb.step, mb.split))
    np.testing.assert_allclose(mb.loss.values, ma.loss.values, rtol=0, atol=atol)
    np.testing.assert_allclose(mb.grad_norm.dropna().values, ma.grad_norm.dropna().values, rtol=10 * atol)
    ra, rb = schema.read_run_row(a), schema.read_run_row(b)
    assert ra["status"] == rb["status"] == "done" and abs(ra["val_loss"] - rb["val_loss"]) < atol
    wa, wb = weights(a), weights(b)
    assert set(wa) == set(wb)
    for name in wa:
        np.testing.assert_allclose(wb[name].numpy(), wa[name].numpy(), rtol=0, atol=5 * atol, err_msg=name)


def assert_equal_to(a: Path, b: Path, tol: float) -> None:
    """Every logged loss (training and validation) and every final weight to ``tol`` absolute, every gradient norm
    to ``tol`` relative."""
    ma, mb = metrics(a), metrics(b)
    assert list(zip(ma.step, ma.split)) == list(zip(mb.step, mb.split))
    np.testing.assert_allclose(mb.loss.values, ma.loss.values, rtol=0, atol=tol)
    np.testing.assert_allclose(mb.grad_norm.dropna().values, ma.grad_norm.dropna().values, rtol=tol)
    wa, wb = weights(a), weights(b)
    assert set(wa) == set(wb)
    for name in wa:
        np.testing.assert_allclose(wb[name].numpy(), wa[name].numpy(), rtol=0, atol=tol, err_msg=name)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The run of a variant trained by one process, once per module."""
    done: dict[str, Path] = {}

    def run(variant: str) -> Path:
        if variant not in done:
            out = tmp_path_factory.mktemp("one") / variant
            assert train(resolve_run_config(None, SMALL + VARIANTS[variant]), out, progress=False).status == "done"
            done[variant] = out
        return done[variant]

    return run


def test_every_window_is_counted_once_and_every_rank_runs_the_same_batches():
    windows = np.arange(255 * 3).reshape(255, 3)
    for world in (1, 2, 3, 4, 7):
        shares = [rank_windows(windows, rank, world) for rank in range(world)]
        assert len({len(w) for w, _ in shares}) == 1  # under FSDP every forward is a collective
        counted = np.concatenate([w[c] for w, c in shares])
        assert sorted(counted[:, 0].tolist()) == windows[:, 0].tolist()  # each window once, none twice
    alone, counted = rank_windows(windows, 0, 1)
    assert np.array_equal(alone, windows) and counted.all()  # one device: the windows as they were


def test_a_batch_row_that_does_not_count_leaves_the_loss_unchanged():
    from attnres import AttnResLM
    from attnres.training.module import lm_loss

    cfg = resolve_run_config(None, [*SMALL, "model.residual=baseline"]).model  # no native kernels to build
    torch.manual_seed(0)
    model = AttnResLM(cfg)
    batch = torch.randint(0, 256, (3, 65))
    rows = torch.tensor([True, False, True])
    with torch.no_grad():
        masked = lm_loss(model, batch, "sum", rows)
        kept = lm_loss(model, batch[[0, 2]], "sum")
        whole = lm_loss(model, batch, "sum", torch.ones(3, dtype=torch.bool))
    torch.testing.assert_close(masked, kept, rtol=1e-6, atol=0)
    assert torch.equal(whole, lm_loss(model, batch, "sum"))  # all rows count: the very same computation


@pytest.mark.slow  # two processes, about 30 s
def test_ddp_over_two_processes_trains_the_one_process_run(tmp_path, one_process):
    """Weights, validation loss over 255 windows (odd: once off by 4.5e-4) and the logged training loss (once rank
    0's half of the batch) equal one process's to float rounding."""
    two_processes([*SMALL, *VARIANTS["block"], *TWO], tmp_path / "ddp")
    assert_same_run(one_process("block"), tmp_path / "ddp", atol=2e-5)


@pytest.mark.slow  # two processes per variant, about 30 s each
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fsdp_over_two_processes_trains_the_one_process_run(tmp_path, one_process, variant):
    """FSDP2: gathered sublayers, the global gradient norm (clipping), diagnostics on every rank, full checkpoints
    in the one-process format (the same parameter names and optimizer state order)."""
    two_processes([*SMALL, *VARIANTS[variant], *TWO, "runtime.strategy=fsdp"], tmp_path / "fsdp")
    assert_same_run(one_process(variant), tmp_path / "fsdp", atol=2e-5)
    a = pd.read_parquet(one_process(variant) / schema.LAYERS_FILE)
    b = pd.read_parquet(tmp_path / "fsdp" / schema.LAYERS_FILE)
    np.testing.assert_allclose(b.grad_norm.values, a.grad_norm.values, rtol=1e-4)  # all-reduced shard norms
    np.testing.assert_allclose(b.output_rms.values, a.output_rms.values, rtol=1e-4)


@pytest.mark.slow  # two processes per strategy, about 30 s each
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_per_layer_gradient_norms_are_taken_before_clipping_on_two_processes(tmp_path, strategy):
    """With clipping active (grad_clip 0.05): every rank's per-layer norms are the pre-clip ones (DDP: the all-reduced
    gradients; FSDP: the shards' squares summed over ranks) and combine to the logged pre-clip global norm."""
    args = [*SMALL, *VARIANTS["block"], *TWO, f"runtime.strategy={strategy}", "train.grad_clip=0.05"]
    two_processes(args, tmp_path / strategy)
    assert_layer_norms_combine(tmp_path / strategy, grad_clip=0.05)


def kill_part_way(args: list[str], out: Path, past_step: int) -> None:
    """Start a run and SIGKILL every process of it (a node lost) once it has a checkpoint past ``past_step``."""
    proc = subprocess.Popen(
        [*ATTNRES, "train", *args, "--out", str(out), "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the launcher's second rank is its child: kill the whole group
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            row = schema.read_run_row(out) if (out / schema.RUN_FILE).exists() else None
            if row and row["step"] >= past_step and (out / "checkpoints" / "last.ckpt").exists():
                break
            time.sleep(0.05)
        time.sleep(0.5)  # a few steps past the checkpoint, which the resumed run trains again
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    row = schema.read_run_row(out)
    assert row["status"] == "running" and row["step"] < row["max_steps"], "the run ended before it was killed"
    checkpoint = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert checkpoint["global_step"] >= past_step  # what the next attempt resumes from


@pytest.mark.slow  # about a minute per strategy
@pytest.mark.parametrize(
    "first, then",
    [("ddp", "ddp"), ("fsdp", "fsdp"), ("fsdp", "one"), ("one", "fsdp")],
    ids=["ddp", "fsdp", "fsdp-then-one-process", "one-process-then-fsdp"],
)
def test_a_killed_run_resumes_to_the_uninterrupted_result_under_either_strategy(tmp_path, one_process, first, then):
    devices = {"ddp": TWO, "fsdp": [*TWO, "runtime.strategy=fsdp"], "one": []}
    args = [*SMALL, *VARIANTS["block"], "train.tokens=61440", "train.eval_interval=15"]  # 60 steps
    reference = tmp_path / "straight"
    assert train(resolve_run_config(None, args), reference, progress=False).status == "done"
    killed = tmp_path / "killed"
    kill_part_way([*args, *devices[first]], killed, past_step=15)
    two_processes([*args, *devices[then]], killed)
    assert_same_run(reference, killed, atol=2e-5)


def counted_run(args: list[str], out: Path, timeout: float = 300) -> list[dict]:
    """A two-process run of ``args`` through tests/attnres/collectives.py: each rank's record of its collectives."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.attnres.collectives", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[2],  # the repository root: the relaunched rank imports tests.attnres
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads((out / f"collectives-rank{rank}.json").read_text()) for rank in range(2)]
    assert all(r["status"] == "done" for r in records)
    return records


GRADIENT_REDUCTIONS = ("c10d::allreduce_", "c10d::_reduce_scatter_base_", "c10d::barrier")
# per optimizer step, once training is steady (DDP rebuilds its buckets at step 2) and not at an evaluation step:
STEADY_LAST_MICRO_BATCH = {
    # DDP: the gradients' one bucket (this model is far below its 1 MiB first bucket), then the step's loss
    "ddp": {"c10d::allreduce_": 2},
    # FSDP2 over 5 units (4 sublayers and the root): 5 gathers in the forward, 4 again in the backward (the root
    # stays gathered), 5 reduce-scatters; the step's loss; the global gradient norm of the DTensor shards
    "fsdp": {
        "c10d::_allgather_base_": 9,
        "c10d::_reduce_scatter_base_": 5,
        "c10d::allreduce_": 1,
        "_c10d_functional::all_reduce": 1,
    },
}


@pytest.mark.slow  # three runs per strategy, about 20 s each
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_gradients_are_reduced_once_per_optimizer_step_under_accumulation(tmp_path, strategy):
    """Two micro-batches per device per step: the first does no all-reduce, reduce-scatter or barrier (DDP: no_sync;
    FSDP2: set_requires_gradient_sync(False); the step's loss and finite check wait for its end), the step's last
    does the gradients' one reduction and one all-reduce of the loss. The collectives are counted per micro-batch
    by the profiler on both ranks. The run equals the same run synchronising every micro-batch (the behaviour
    before, which the counts show too) to 1e-6, and the one-process run to the usual 2e-5."""
    args = [*SMALL, *VARIANTS["block"], *TWO, f"runtime.strategy={strategy}"]
    args += ["train.tokens=6144", "train.eval_interval=3", "train.micro_batch_size=4"]  # 6 steps of 2 x 2 x 4 rows
    once = counted_run(args, tmp_path / "once")
    every = counted_run([*args, "--sync-every-micro-batch"], tmp_path / "every")
    for record in once:
        micro_batches = record["micro_batches"]
        assert [(m["step"], m["micro"]) for m in micro_batches] == [(s, i) for s in range(1, 7) for i in (0, 1)]
        for m in micro_batches:
            if not m["last"]:  # DDP's one-time bucket rebuild broadcasts at step 2; FSDP gathers every unit
                allowed = {"c10d::_allgather_base_": 9} if strategy == "fsdp" else {}
                assert m["ops"] in (allowed, {"c10d::broadcast_": 2} if m["step"] == 2 else allowed), m
            elif m["step"] in (4, 5):
                assert m["ops"] == STEADY_LAST_MICRO_BATCH[strategy], m
            assert not any(op in GRADIENT_REDUCTIONS for op in m["ops"]) or m["last"], m
    for record in every:  # the counter sees a gradient reduction where the old behaviour made one
        first = [m for m in record["micro_batches"] if not m["last"] and m["step"] >= 3]
        op = "c10d::_reduce_scatter_base_" if strategy == "fsdp" else "c10d::allreduce_"
        assert all(m["ops"].get(op) == (5 if strategy == "fsdp" else 1) for m in first), first
    assert_equal_to(tmp_path / "every", tmp_path / "once", 1e-6)
    one = tmp_path / "one"
    one_args = [a for a in args if a not in TWO and not a.startswith("runtime.strategy")]
    assert train(resolve_run_config(None, one_args), one, progress=False).status == "done"
    assert_same_run(one, tmp_path / "once", atol=2e-5)


@pytest.mark.slow  # three two-process runs, about 20 s each
def test_bf16_fsdp_gathers_sublayers_in_bf16_and_trains_the_bf16_ddp_run(tmp_path):
    """runtime.precision=bf16-mixed over gloo (which runs bf16 collectives on CPU): FSDP2's MixedPrecisionPolicy
    gathers each sublayer in bf16 (the root in fp32) and the run equals DDP's bf16 run to bf16 tolerance, with two
    micro-batches per step (FSDP2 accumulates their gradients unsharded, in fp32): losses and validation loss to
    1e-3 relative (bf16's rounding is 2^-8 = 3.9e-3; measured 2e-5), gradient norms to 1e-2 (measured 5e-4);
    runtime.fsdp_mixed_precision=false gathers in fp32 and is closer still. Each unit's gathered bytes are what
    the memory estimate counts (attnres.training.memory.fsdp_unit_params)."""
    from attnres.training.memory import fsdp_unit_params

    args = [*SMALL, *VARIANTS["block"], *TWO, "runtime.precision=bf16-mixed", "train.micro_batch_size=4"]
    args += ["train.tokens=8192", "train.eval_interval=4"]  # 8 steps
    runs = {
        "ddp": [],
        "fsdp": ["runtime.strategy=fsdp"],
        "fsdp-fp32-gathers": ["runtime.strategy=fsdp", "runtime.fsdp_mixed_precision=false"],
    }
    records = {name: counted_run([*args, *extra], tmp_path / name) for name, extra in runs.items()}
    root, sublayer = fsdp_unit_params(resolve_run_config(None, args).model)
    for name, bytes_per in (("fsdp", 2), ("fsdp-fp32-gathers", 4)):
        for record in records[name]:
            units = record["units"]
            assert units["root"] == {"dtypes": ["torch.float32"], "bytes": 4 * root, "numel": root}
            sublayers = [u for unit, u in units.items() if unit != "root"]
            assert len(sublayers) == 4 and {d for u in sublayers for d in u["dtypes"]} == {f"torch.{DTYPES[bytes_per]}"}
            assert max(u["bytes"] for u in sublayers) == bytes_per * sublayer
    ddp = metrics(tmp_path / "ddp")
    for name, rtol in (("fsdp", 1e-3), ("fsdp-fp32-gathers", 1e-4)):
        other = metrics(tmp_path / name)
        assert list(zip(other.step, other.split)) == list(zip(ddp.step, ddp.split))
        np.testing.assert_allclose(other.loss.values, ddp.loss.values, rtol=rtol, err_msg=name)
        np.testing.assert_allclose(other.grad_norm.dropna().values, ddp.grad_norm.dropna().values, rtol=10 * rtol)
        state = weights(tmp_path / name)
        assert all(value.dtype == torch.float32 for value in state.values())  # shards and checkpoints stay fp32
        for key, value in weights(tmp_path / "ddp").items():  # AdamW flips the sign of tiny updates: a 2 % bound
            assert torch.linalg.vector_norm(state[key] - value) <= 2e-2 * torch.linalg.vector_norm(value), key


DTYPES = {2: "bfloat16", 4: "float32"}
