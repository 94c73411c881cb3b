"""Training a run end to end: the run folder contract, determinism, resume after SIGKILL, divergence, errors."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from attnres import AttnResLM
from attnres.config import ConfigError, resolve_run_config
from attnres.storage import locks, schema
from attnres.training.run import train
from tests.attnres.grad_norms import assert_layer_norms_combine
from tests.cli_helpers import attnres
from tests.conftest import TINY, needs_cxx, schedule_rates

ATTNRES = [sys.executable, "-m", "attnres.cli"]


def run_cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``attnres ARGS`` in a fresh process: for a kill and resume, and what a process reads from its environment (the
    other tests run the command in-process, tests.cli_helpers.attnres)."""
    return subprocess.run(
        [*ATTNRES, *args], capture_output=True, text=True, timeout=timeout, env=env or os.environ.copy()
    )


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """One tiny Block AttnRes run on the built-in corpus (2 layers, d_model 32, ~50k tokens)."""
    run_dir = tmp_path_factory.mktemp("tiny") / "run"
    result = train(resolve_run_config(None, TINY), run_dir, progress=False)
    assert result.status == "done" and result.trained
    return run_dir


def test_tiny_run_writes_the_whole_contract(tiny_run):
    for name in (schema.CONFIG_FILE, schema.RUN_FILE, schema.METRICS_FILE, schema.LAYERS_FILE, schema.DEPTH_ATTN_FILE):
        assert (tiny_run / name).is_file(), name
    assert (tiny_run / schema.CHECKPOINT_DIR / "last.ckpt").is_file()
    for name, declared in schema.SCHEMAS.items():
        table = schema.read_table(tiny_run / name)
        assert table.schema.equals(declared, check_metadata=False), name
        assert table.num_rows > 0
    run = schema.read_table(tiny_run / schema.RUN_FILE).to_pylist()[0]
    assert run["status"] == "done" and run["step"] == run["max_steps"] == math.ceil(50000 / (16 * 64))
    assert run["tokens"] == run["step"] * run["batch_tokens"] and run["flops"] == run["tokens"] * run["flops_per_token"]
    assert run["val_loss"] < math.log(256) - 1.0  # clearly below the uniform 5.545 nats
    assert run["val_bpb"] == pytest.approx(run["val_loss"] / math.log(2))
    assert run["tokens_per_s"] > 0 and run["wall_s"] > 0 and run["variant"] == "block" and run["n_blocks"] == 4


def test_per_layer_gradient_norms_are_taken_before_clipping(tmp_path):
    """With clipping active at every step (grad_clip 0.05, norms near 1), layers.parquet's sublayer and outer-group
    norms combine to metrics' pre-clip grad_norm (they were once taken after clipping: 0.05 against 1)."""
    run_dir = tmp_path / "run"
    args = [*TINY, "train.tokens=20480", "train.eval_interval=10", "train.log_interval=5", "train.grad_clip=0.05"]
    assert train(resolve_run_config(None, args), run_dir, progress=False).status == "done"
    assert_layer_norms_combine(run_dir, grad_clip=0.05)
    kinds = set(pd.read_parquet(run_dir / schema.LAYERS_FILE).kind)
    assert {"depth", "head"} <= kinds  # Block AttnRes: the depth mixer's parameters; an untied head


def test_layers_files_of_schema_version_1_stay_readable_and_a_resume_drops_their_post_clip_norms(tmp_path):
    """Version 1 (per-layer norms after clipping) has version 2's columns: analysis reads it as it is, and a run
    resumed under version 2 keeps its rows but not those norms, which its rewritten file would call pre-clip."""
    import pyarrow.parquet as pq

    from attnres.training.run_log import read_rows

    row = {"step": 10, "tokens": 100, "layer": 0, "sublayer": 0, "kind": "attn", "input_rms": 1.0, "grad_norm": 0.05}
    table = schema.to_table([row], schema.LAYERS_SCHEMA)
    for version, readable in ((1, True), (2, True), (99, False)):
        path = tmp_path / str(version) / schema.LAYERS_FILE
        path.parent.mkdir()
        pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"schema_version": str(version)}), path)
        if not readable:
            with pytest.raises(schema.SchemaError, match="schema_version 99, this version of attnres reads 1, 2"):
                schema.read_table(path)
            assert read_rows(path) == []
            continue
        read = schema.read_table(path)
        assert schema.file_version(read) == version and read.to_pylist()[0]["grad_norm"] == 0.05
        assert read_rows(path) == [{**row, "output_rms": None, "grad_norm": 0.05 if version == 2 else None}]
    assert schema.LAYERS_SCHEMA.field("layer").nullable  # the rows of the parameters outside the blocks have none


def test_a_run_records_its_data_and_byte_runs_keep_bits_per_byte_equal_to_bits(tiny_run):
    import json

    record = json.loads((tiny_run / schema.DATA_FILE).read_text())
    assert record["tokenizer"]["spec"] == "bytes" and record["bytes_per_token"] == {"train": 1.0, "val": 1.0}
    mix = record["composition"]
    assert set(mix) == {"kjv.txt.gz", "shakespeare.txt.gz"}
    assert all(0.3 < m["eval_window_share"] < 0.7 for m in mix.values())  # the windows cover both sources
    order = record["order"]  # 49 steps of 16 windows of 64 tokens: a small share of the split, read once
    assert order["sampler"] == "replacement" and order["windows"] == 49 * 16
    assert order["epochs"] == pytest.approx(49 * 16 * 64 / (record["tokens"]["train"] - 1))
    assert 0 < order["repeat_fraction"] < order["epochs"]


def test_a_run_on_a_prepared_bpe_corpus_logs_bits_per_byte_from_the_manifest(tmp_path):
    import json

    prepared = tmp_path / "bpe"
    prep = attnres("data", "prepare", "builtin", "--tokenizer", "bpe:1024", "--out", str(prepared), "--no-progress")
    assert prep.returncode == 0, prep.stderr
    manifest = json.loads((prepared / "manifest.json").read_text())
    result = train(resolve_run_config(None, [*TINY, f"data.corpus={prepared}"]), tmp_path / "run", progress=False)
    assert result.status == "done"
    run = schema.read_table(tmp_path / "run" / schema.RUN_FILE).to_pylist()[0]
    assert run["vocab_size"] == 1024  # from the data; the parameter count includes its embedding
    val = manifest["splits"]["val"]
    bytes_per_token = val["bytes"] / val["tokens"]
    assert 2.0 < bytes_per_token < 5.0
    assert run["val_bpb"] == pytest.approx(run["val_loss"] / math.log(2) / bytes_per_token)
    assert run["val_loss"] < math.log(1024) - 1.0


def test_metrics_layers_and_depth_attention_contents(tiny_run):
    metrics = pd.read_parquet(tiny_run / schema.METRICS_FILE)
    val = metrics[metrics.split == "val"]
    assert list(val.step) == [20, 40, 49]  # every eval_interval, and the last step
    assert val.loss.is_monotonic_decreasing
    train_rows = metrics[metrics.split == "train"]
    assert (train_rows.lr > 0).all() and (train_rows.grad_norm > 0).all()
    layers = pd.read_parquet(tiny_run / schema.LAYERS_FILE)
    last = layers[layers.step == 49]
    assert sorted(last.kind.unique()) == ["attn", "block", "depth", "embedding", "final_norm", "head", "mlp"]
    assert len(last[last.kind == "block"]) == 2 and last.grad_norm.notna().all()
    outer = last[~last.kind.isin(["attn", "mlp", "block"])]
    assert outer.layer.isna().all() and outer.input_rms.isna().all()  # parameters outside the blocks: norms only
    depth = pd.read_parquet(tiny_run / schema.DEPTH_ATTN_FILE)
    sums = depth.groupby(["step", "query"]).weight.sum()
    np.testing.assert_allclose(sums.values, 1.0, atol=1e-5)
    assert set(depth.source_kind) == {"embedding", "block", "partial"} or set(depth.source_kind) >= {
        "embedding",
        "block",
    }


def test_a_train_row_logs_the_rate_its_step_used(tiny_run):
    """Row ``step`` s holds step s's loss and the rate of the update that step made: the schedule's rate of 0-based
    step s - 1, not the one the scheduler has moved on to by the time the row is written."""
    cfg = resolve_run_config(None, TINY)
    rates = schedule_rates(cfg, int(pd.read_parquet(tiny_run / schema.RUN_FILE).max_steps.iloc[0]))
    rows = pd.read_parquet(tiny_run / schema.METRICS_FILE).query("split == 'train'")
    assert len(rows) > 2
    np.testing.assert_allclose(rows.lr, [rates[s - 1] for s in rows.step], rtol=1e-12)
    assert rows.lr.iloc[-1] == pytest.approx(cfg.train.min_lr_ratio * cfg.train.lr)  # the last step's: the floor


def test_a_finished_run_is_not_trained_again(tiny_run):
    result = train(resolve_run_config(None, TINY), tiny_run, progress=False)
    assert result.status == "done" and not result.trained


def test_a_run_folder_refuses_a_different_config(tiny_run):
    with pytest.raises(ConfigError, match="model.d_model"):
        train(resolve_run_config(None, TINY + ["model.d_model=48"]), tiny_run, progress=False)


def test_same_config_gives_identical_losses(tmp_path, tiny_run):
    cfg = resolve_run_config(None, TINY)
    train(cfg, tmp_path / "again", progress=False)
    a = pd.read_parquet(tiny_run / schema.METRICS_FILE)
    b = pd.read_parquet(tmp_path / "again" / schema.METRICS_FILE)
    assert list(a.step) == list(b.step) and list(a.split) == list(b.split)
    np.testing.assert_array_equal(a.loss.values, b.loss.values)


def test_divergence_stops_the_run_and_keeps_the_log(tmp_path):
    cfg = resolve_run_config(None, TINY + ["train.lr=1e30", "train.eval_interval=1"])
    result = train(cfg, tmp_path / "run", progress=False)
    assert result.status == "diverged"
    run = schema.read_table(tmp_path / "run" / schema.RUN_FILE).to_pylist()[0]
    assert run["status"] == "diverged" and "non-finite" in run["error"] and run["step"] < run["max_steps"]
    assert schema.read_table(tmp_path / "run" / schema.METRICS_FILE).num_rows >= 1


@pytest.mark.parametrize("residual", ["baseline", "full"])
def test_other_variants_train(tmp_path, residual):
    cfg = resolve_run_config(None, TINY + [f"model.residual={residual}", "train.tokens=20000"])
    assert train(cfg, tmp_path / "run", progress=False).status == "done"
    has_depth = (tmp_path / "run" / schema.DEPTH_ATTN_FILE).exists()
    assert has_depth == (residual != "baseline")


def readable_or_absent(run_dir: Path) -> None:
    for name in schema.SCHEMAS:
        if (run_dir / name).exists():
            schema.read_table(run_dir / name)  # raises on a half-written file


@pytest.fixture(scope="module")
def straight_runs(tmp_path_factory):
    """The uninterrupted run of some arguments, trained once for every test that compares with it."""
    done: dict[tuple[str, ...], Path] = {}

    def run(args: list[str]) -> Path:
        if tuple(args) not in done:
            out = tmp_path_factory.mktemp("straight") / "run"
            proc = run_cli("train", *args, "--out", str(out))
            assert proc.returncode == 0, proc.stderr
            done[tuple(args)] = out
        return done[tuple(args)]

    return run


@pytest.mark.parametrize(
    "sig, micro",
    [
        pytest.param(signal.SIGKILL, [], marks=pytest.mark.integration),
        pytest.param(signal.SIGINT, [], marks=pytest.mark.integration),  # kill and resume: the integration tier
        # about 20 s; the default suite's budget is 10 minutes (pytest -m slow runs it)
        pytest.param(signal.SIGKILL, ["train.micro_batch_size=4"], marks=pytest.mark.slow),
    ],
    ids=["sigkill", "ctrl-c", "sigkill-accumulating"],
)
def test_a_killed_or_interrupted_run_resumes_and_matches_an_uninterrupted_run(tmp_path, sig, micro, straight_runs):
    args = TINY + [*micro, "train.tokens=100000", "train.eval_interval=20", "--no-progress"]  # 98 steps
    straight = straight_runs(args)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [*ATTNRES, "train", *args, "--out", str(killed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as at a terminal: a test run started in the background (`pytest &`) inherits SIGINT ignored,
        # and the run then finished instead of stopping
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        readable_or_absent(killed)
        rows = schema.read_table(killed / schema.RUN_FILE).to_pylist() if (killed / schema.RUN_FILE).exists() else []
        if rows and rows[0]["step"] >= 40 and (killed / "checkpoints" / "last.ckpt").exists():
            break
        time.sleep(0.05)
    time.sleep(0.3)  # a few more steps past the checkpoint, which the resumed run must redo
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    readable_or_absent(killed)
    status = schema.read_table(killed / schema.RUN_FILE).to_pylist()[0]
    assert status["status"] == "running" and status["step"] < status["max_steps"]
    if sig == signal.SIGINT:  # Lightning's graceful stop exits 1 without a word; the command says what happened
        assert proc.returncode == 130 and "interrupted (Ctrl-C)" in err and "the same command resumes it" in err, err

    resumed = run_cli("train", *args, "--out", str(killed))
    assert resumed.returncode == 0, resumed.stderr
    a = pd.read_parquet(straight / schema.METRICS_FILE)
    b = pd.read_parquet(killed / schema.METRICS_FILE)
    assert list(zip(a.step, a.split)) == list(zip(b.step, b.split))
    np.testing.assert_allclose(b.loss.values, a.loss.values, rtol=0, atol=1e-4)
    ra = schema.read_table(straight / schema.RUN_FILE).to_pylist()[0]
    rb = schema.read_table(killed / schema.RUN_FILE).to_pylist()[0]
    assert rb["status"] == "done" and abs(ra["val_loss"] - rb["val_loss"]) < 1e-4


@pytest.mark.parametrize(
    "setting, saved",
    [
        ("runtime.checkpoint_interval_steps=3", [3, 6, 9, 10, 12, 15, 18, 20]),  # and at the evaluations, 10 and 20
        ("runtime.checkpoint_interval_min=1e-9", list(range(1, 21))),  # the clock is always past due: every step
    ],
    ids=["steps", "minutes"],
)
def test_checkpoints_between_evaluations_fall_on_whole_steps(tmp_path, setting, saved):
    import lightning as L

    class Saves(L.Callback):
        steps: list[int] = []

        def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
            self.steps.append(trainer.global_step)

    args = [*TINY, "train.tokens=20480", "train.eval_interval=10", "train.micro_batch_size=8", setting]  # 20 steps
    assert train(resolve_run_config(None, args), tmp_path / "run", progress=False, callbacks=[Saves()]).status == "done"
    assert Saves.steps == saved
    rows = pd.read_parquet(tmp_path / "run" / schema.METRICS_FILE)
    assert rows[rows.split == "train"].step.tolist() == list(range(10, 21, 10))  # the logs, flushed first, intact


@pytest.mark.slow  # about 40 s
def test_a_run_killed_after_a_step_checkpoint_resumes_from_it(tmp_path, straight_runs):
    """A checkpoint between evaluations (step 7, 14, ...) is resumed from like any: the same losses as unkilled."""
    args = TINY + ["train.tokens=100000", "train.eval_interval=50", "--no-progress"]  # 98 steps
    straight = straight_runs(args)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [*ATTNRES, "train", *args, "runtime.checkpoint_interval_steps=7", "--out", str(killed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ckpt = killed / "checkpoints" / "last.ckpt"
    deadline = time.time() + 120
    while time.time() < deadline and not (ckpt.exists() and torch.load(ckpt, weights_only=False)["global_step"] >= 14):
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    step = torch.load(ckpt, weights_only=False)["global_step"]
    assert 14 <= step < 50 and step % 7 == 0  # not an evaluation's checkpoint
    assert run_cli("train", *args, "--out", str(killed)).returncode == 0
    a = pd.read_parquet(straight / schema.METRICS_FILE)
    b = pd.read_parquet(killed / schema.METRICS_FILE)
    assert list(zip(a.step, a.split)) == list(zip(b.step, b.split))  # no gap in the logs
    np.testing.assert_allclose(b.loss.values, a.loss.values, rtol=0, atol=1e-4)


def test_gradient_accumulation_matches_the_one_shot_step(tmp_path):
    """batch 16 as 4 micro-batches of 4: the same losses, step by step, as 16 at once (float tolerance)."""
    args = [*TINY, "train.tokens=20480", "train.log_interval=1", "train.eval_interval=10"]  # 20 steps
    one = train(resolve_run_config(None, args), tmp_path / "one", progress=False)
    cfg = resolve_run_config(None, [*args, "train.micro_batch_size=4"])
    four = train(cfg, tmp_path / "four", progress=False)
    assert one.status == four.status == "done" and one.step == four.step == 20
    assert cfg.run_id == resolve_run_config(None, args).run_id  # the split is not part of the run
    a = pd.read_parquet(tmp_path / "one" / schema.METRICS_FILE)
    b = pd.read_parquet(tmp_path / "four" / schema.METRICS_FILE)
    assert list(zip(a.step, a.split)) == list(zip(b.step, b.split)) and len(a[a.split == "train"]) == 20
    np.testing.assert_allclose(b.loss.values, a.loss.values, rtol=1e-5)
    np.testing.assert_allclose(b.grad_norm.dropna().values, a.grad_norm.dropna().values, rtol=1e-4)


# Tensor methods that read a value to the host: on a GPU each waits for the device (a host sync)
HOST_READS = {"__bool__", "__float__", "__int__", "__index__", "__format__", "item", "tolist", "numpy", "cpu"}


class HostReads(torch.overrides.TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's signature)
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def test_a_step_reads_its_loss_to_the_host_once_and_no_micro_batch_does(tmp_path, monkeypatch):
    """Under gradient accumulation (4 micro-batches a step) training_step reads nothing to the host (before, each
    micro-batch read its loss and its finite check), and a step's hooks read once: the loss and the gradient norm
    together (evaluation steps also read the per-layer gradient norms)."""
    from attnres.training.module import LitLM

    training_reads: list[list[str]] = []
    step_reads: list[tuple[int, list[str]]] = []
    training_step, before_step = LitLM.training_step, LitLM.on_before_optimizer_step

    def counted_training_step(self, batch, batch_idx):  # noqa: ANN001, ANN202
        with HostReads() as mode:
            out = training_step(self, batch, batch_idx)
        training_reads.append(mode.reads)
        return out

    def counted_before_step(self, optimizer):  # noqa: ANN001, ANN202
        with HostReads() as mode:
            before_step(self, optimizer)
        step_reads.append((self.global_step + 1, mode.reads))

    monkeypatch.setattr(LitLM, "training_step", counted_training_step)
    monkeypatch.setattr(LitLM, "on_before_optimizer_step", counted_before_step)
    args = [*TINY, "train.tokens=6144", "train.eval_interval=3", "train.micro_batch_size=4", "runtime.threads=1"]
    assert train(resolve_run_config(None, args), tmp_path / "run", progress=False).status == "done"
    assert len(training_reads) == 6 * 4 and all(reads == [] for reads in training_reads), training_reads
    assert [step for step, _ in step_reads] == [1, 2, 3, 4, 5, 6]  # once per optimizer step, not per micro-batch
    for step, reads in step_reads:
        assert reads == ["tolist"] if step % 3 else reads.count("tolist") == 2, (step, reads)


def test_a_non_finite_loss_drops_its_step_and_stops_the_run(tmp_path, monkeypatch):
    """Checked once per step, after its last micro-batch: a non-finite loss in any micro-batch (here the second of
    step 4's four) leaves the weights and the optimizer state as step 3 left them, writes no training row for step
    4, and ends the run diverged at step 4."""
    from attnres.training.branches import step_checkpoint
    from attnres.training.module import LitLM

    loss, calls = LitLM.loss, []

    def poisoned(self, batch, reduction="mean", rows=None):  # noqa: ANN001, ANN202
        value = loss(self, batch, reduction, rows)
        if self.training:
            calls.append(self.global_step)
            if self.global_step == 3 and calls.count(3) == 2:
                return value * float("inf")
        return value

    monkeypatch.setattr(LitLM, "loss", poisoned)
    args = [*TINY, "train.eval_interval=10", "train.log_interval=1", "train.micro_batch_size=4", "runtime.threads=1"]
    run = tmp_path / "run"
    result = train(resolve_run_config(None, [*args, "train.save_at_steps=[3,4]"]), run, progress=False)
    assert result.status == "diverged" and result.step == 4
    row = schema.read_run_row(run)
    assert row["status"] == "diverged" and row["error"] == "non-finite training loss at step 4"
    assert calls.count(3) == 4  # the step's four micro-batches ran; the check came once, after them
    metrics = pd.read_parquet(run / schema.METRICS_FILE)
    assert metrics[metrics.split == "train"].step.tolist() == [1, 2, 3]
    before, after = (torch.load(step_checkpoint(run, s), weights_only=False) for s in (3, 4))
    assert after["global_step"] == 4
    for name, value in before["state_dict"].items():
        assert torch.equal(after["state_dict"][name], value), name
    for i, state in before["optimizer_states"][0]["state"].items():
        for key, value in state.items():
            assert torch.equal(after["optimizer_states"][0]["state"][i][key], value), (i, key)


@pytest.mark.parametrize("tracker", ["csv", "tensorboard"])
def test_a_tracker_writes_its_files_in_the_run_folder_beside_the_parquet_record(tmp_path, tracker):
    args = [*TINY, "train.tokens=20480", "train.log_interval=5", "train.eval_interval=10", f"runtime.logger={tracker}"]
    assert train(resolve_run_config(None, args), tmp_path / "run", progress=False).status == "done"
    assert (tmp_path / "run" / schema.METRICS_FILE).is_file()
    if tracker == "csv":
        logged = pd.read_csv(tmp_path / "run" / "csv" / "metrics.csv")
        assert logged["loss"].notna().sum() == 4 and logged["val_loss"].notna().sum() == 2  # steps 5..20; 10, 20
        hparams = (tmp_path / "run" / "csv" / "hparams.yaml").read_text()
        assert "model.n_layer: 2" in hparams
    else:
        import struct

        from tensorboardX.proto import event_pb2

        tags = []
        for path in (tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"):
            data = path.read_bytes()
            at = 0
            while at < len(data):  # TFRecord: length, its crc, the record, its crc
                (n,) = struct.unpack("<Q", data[at : at + 8])
                event = event_pb2.Event.FromString(data[at + 12 : at + 12 + n])
                tags += [v.tag for v in event.summary.value]
                at += 16 + n
        assert tags.count("loss") == 4 and tags.count("val_loss") == 2


def test_a_missing_tracker_package_is_one_clear_error_before_compute(tmp_path):
    import importlib.util

    if importlib.util.find_spec("wandb"):
        pytest.skip("wandb is installed here")
    result = attnres("train", *TINY, "runtime.logger=wandb", "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert "runtime.logger=wandb needs the wandb package" in message and "attnres-scaling[wandb]" in message
    assert not (tmp_path / "run" / schema.RUN_FILE).exists()


def test_depth_lr_scale_zero_freezes_the_depth_mixer_and_nothing_else(tmp_path):
    args = [*TINY, "train.tokens=8192", "train.depth_lr_scale=0"]
    assert train(resolve_run_config(None, args), tmp_path / "run", progress=False).status == "done"
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert torch.count_nonzero(state["model.depth.pseudo_query"]) == 0  # zero-initialised, never moved
    assert torch.equal(state["model.depth.key_gain"], torch.ones_like(state["model.depth.key_gain"]))
    torch.manual_seed(0)  # the run's initialisation (train.seed 0, LitLM)
    init = AttnResLM(resolve_run_config(None, args).model)
    assert not torch.equal(state["model.blocks.0.mlp.down.weight"], init.blocks[0].mlp.down.weight)  # it trained


LOGS = (schema.METRICS_FILE, schema.LAYERS_FILE, schema.DEPTH_ATTN_FILE)


def finished_but_marked_running(tiny_run: Path, run_dir: Path) -> tuple[dict, dict[str, pd.DataFrame]]:
    """A copy of tiny_run as a kill after its last checkpoint (at max_steps) but before its final write leaves
    it: the row still `running`. Returns the finished row and the log files, as they were."""
    shutil.copytree(tiny_run, run_dir)
    row = schema.read_table(run_dir / schema.RUN_FILE).to_pylist()[0]
    schema.write_table(run_dir / schema.RUN_FILE, schema.to_table([{**row, "status": "running"}], schema.RUN_SCHEMA))
    return row, {name: pd.read_parquet(run_dir / name) for name in LOGS}


def assert_logs_unchanged(run_dir: Path, before: dict[str, pd.DataFrame]) -> None:
    for name, table in before.items():
        pd.testing.assert_frame_equal(pd.read_parquet(run_dir / name), table, obj=name)


@pytest.mark.filterwarnings("ignore:The dirpath has changed")  # the run folder is a copy of tiny_run
def test_a_kill_after_the_last_checkpoint_but_before_the_final_write_keeps_every_row(tmp_path, tiny_run):
    """Lightning skips training (and on_train_start) when the checkpoint is at max_steps; the run must still
    come out `done` with its losses and logs (it once came out with val_loss None and empty files)."""
    run_dir = tmp_path / "run"
    row, before = finished_but_marked_running(tiny_run, run_dir)

    result = train(resolve_run_config(None, TINY), run_dir, progress=False)
    assert result.status == "done" and result.val_loss == row["val_loss"]
    after = schema.read_table(run_dir / schema.RUN_FILE).to_pylist()[0]
    for field in ("status", "step", "val_loss", "val_bpb", "train_loss", "tokens_per_s", "wall_s"):
        assert after[field] == row[field], field
    assert_logs_unchanged(run_dir, before)


@pytest.mark.filterwarnings("ignore:The dirpath has changed")  # the run folder is a copy of tiny_run
@pytest.mark.parametrize("hook", ["setup", "configure_optimizers"], ids=["before-restore", "after-model-restore"])
def test_a_failure_before_training_resumes_keeps_the_logs_of_earlier_attempts(tmp_path, tiny_run, monkeypatch, hook):
    """An error while the resumed run is set up (before Lightning restores the checkpoint, or after it restored
    the weights but not yet the step, e.g. out of GPU memory) marks the run failed and leaves its logs as
    they were, so the next attempt resumes with its history (it once emptied the metric files)."""
    from attnres.training.module import LitLM

    run_dir = tmp_path / "run"
    row, before = finished_but_marked_running(tiny_run, run_dir)

    def fail(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    with monkeypatch.context() as patch:
        patch.setattr(LitLM, hook, fail)
        with pytest.raises(RuntimeError, match="simulated"):
            train(resolve_run_config(None, TINY), run_dir, progress=False)
    failed = schema.read_table(run_dir / schema.RUN_FILE).to_pylist()[0]
    assert failed["status"] == "failed" and "simulated" in failed["error"] and failed["step"] == row["step"]
    assert_logs_unchanged(run_dir, before)

    result = train(resolve_run_config(None, TINY), run_dir, progress=False)
    assert result.status == "done" and result.val_loss == row["val_loss"]
    assert_logs_unchanged(run_dir, before)


# ------------------------------------------------------------------------------------------ the CLI


def test_help_lists_every_field():
    from attnres.config import SECTIONS

    out = attnres("train", "--help").stdout
    for section, cls in SECTIONS.items():
        for name in cls.__dataclass_fields__:
            assert f"{section}.{name}:" in out, f"{section}.{name}"
    assert "Transformer blocks" in out  # the field docs, not just names


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["model.n_layers=4"], ["unknown config key", "model.'n_layers'", "n_layer"]),
        (["train.lr=fast"], ["train.lr", "number", "fast"]),
        (["model.n_layer=2.5"], ["model.n_layer", "integer"]),
        (["model.residual=resnet"], ["model.residual", "'baseline', 'full', 'block'"]),
        (["data.corpus=/nonexistent/text"], ["data.corpus", "does not exist"]),
        # with a budget of more than one such batch, so that the validation split is what refuses it
        (["model.seq_len=1000000", "train.tokens=2e7"], ["model.seq_len=1000000", "validation split"]),
        (["model.seq_len=1000000"], ["train.tokens=50000, less than one batch", "model.seq_len 1000000"]),
        (["model.n_blocks=99"], ["n_blocks", "2 * n_layer"]),
        (["train.lr=inf"], ["train.lr must be a finite number, got 'inf'"]),
        (["train.lr=nan"], ["train.lr must be a finite number"]),
        (["train.flops=inf", "train.tokens=null"], ["train.flops must be a finite number"]),
        (["model.residual=baseline", "model.n_blocks=9"], ["n_blocks=9 applies to residual block only"]),
        (["train.micro_batch_size=5"], ["micro_batch_size=5 must divide train.batch_size=16"]),
        (["train.micro_batch_size=8", "runtime.devices=4"], ["micro_batch_size=8 does not divide", "divisor of 4"]),
        (["data.tokenizer=bpe:7"], ["tokenizer 'bpe:7'", "bpe:8192"]),
        (["model.vocab_size=300"], ["model.vocab_size=300", "vocabulary is 256"]),
        (["runtime.strategy=fsdp"], ["runtime.strategy=fsdp shards over several devices"]),
        (["runtime.process_group_timeout_s=0"], ["process_group_timeout_s must be positive"]),
    ],
)
def test_bad_input_fails_before_training_with_one_clear_error(tmp_path, args, fragments):
    out = tmp_path / "run"
    result = attnres("train", *TINY, *args, "--out", str(out))
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("attnres train: error:")
    for fragment in fragments:
        assert fragment in message
    assert not out.exists()  # no run folder either


def test_empty_corpus_is_rejected(tmp_path):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "empty.txt").write_text("")
    result = attnres("train", *TINY, f"data.corpus={tmp_path / 'texts'}", "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "holds no text" in result.stderr


def test_config_file_and_override_precedence(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("model:\n  n_layer: 3\n  d_model: 48\ntrain:\n  lr: 1e-3\n")
    cfg = resolve_run_config(path, ["train.lr=2e-3"])
    assert (cfg.model.n_layer, cfg.model.d_model, cfg.train.lr) == (3, 48, 2e-3)
    assert cfg.model.n_head == 4  # the default


@needs_cxx
@pytest.mark.integration  # compiles for the CPU (tests/conftest.py: compiles_for_cpu)
def test_compiled_block_attnres_trains_like_the_eager_one(tmp_path, monkeypatch):
    """runtime.compile=true for Block AttnRes (on CPU the whole model, its depth attention traced): the same losses
    to rounding, and a checkpoint that the eager model loads (the parameter names do not change). A failed compile
    fails the test here instead of running eagerly with a warning (which would give the same losses)."""
    from contextlib import nullcontext

    from attnres import runtime

    monkeypatch.setattr(runtime, "eager_fallback", nullcontext)
    args = TINY + ["model.residual=block", "model.n_blocks=2", "train.tokens=20000"]
    losses = {}
    for compiled in (False, True):
        cfg = resolve_run_config(None, args + [f"runtime.compile={str(compiled).lower()}"])
        assert train(cfg, tmp_path / str(compiled), progress=False).status == "done"
        losses[compiled] = pd.read_parquet(tmp_path / str(compiled) / schema.METRICS_FILE).loss.to_numpy()
    assert len(losses[True]) == len(losses[False]) > 2
    np.testing.assert_allclose(losses[True], losses[False], rtol=0, atol=1e-4)
    state = torch.load(tmp_path / "True" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert {k.removeprefix("model.") for k in state} == set(AttnResLM(cfg.model).state_dict())


@pytest.mark.parametrize("residual", ["baseline", "block"])
def test_compiling_keeps_the_eager_parameter_names(residual):
    """runtime.compile compiles in place, so a checkpoint resumes whether or not the next attempt compiles."""
    from attnres.model import compile_model

    cfg = resolve_run_config(None, TINY + [f"model.residual={residual}"])
    names = list(AttnResLM(cfg.model).state_dict())
    assert list(compile_model(AttnResLM(cfg.model), fuse_depth=False).state_dict()) == names


def test_a_checkpoint_of_a_baseline_compiled_whole_loads_into_the_eager_model():
    """Before in-place compiling, a compiled baseline's checkpoint had ``_orig_mod.`` in every name."""
    from attnres.training.module import LitLM

    cfg = resolve_run_config(None, TINY + ["model.residual=baseline"])
    wrapped = torch.compile(AttnResLM(cfg.model))  # the old runtime.compile=true (nothing compiles until a call)
    checkpoint = {"state_dict": {f"model.{k}": v for k, v in wrapped.state_dict().items()}}
    assert all("_orig_mod." in k for k in checkpoint["state_dict"])
    LitLM.on_load_checkpoint(None, checkpoint)  # the hook Lightning calls before it loads the weights
    eager = AttnResLM(cfg.model)
    eager.load_state_dict({k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()}, strict=True)
    assert torch.equal(eager.lm_head.weight, wrapped.lm_head.weight)


def test_the_ranks_of_a_slurm_launch_hear_what_rank_zero_decided(tmp_path, monkeypatch):
    launch = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}
    for name, value in launch.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)  # (set if the tests themselves run in a requeued job)
    monkeypatch.setenv("SLURM_PROCID", "1")
    locks.announce(tmp_path, "train")  # only global rank 0 speaks
    assert not (tmp_path / locks.RANK_ZERO_FILE).exists()
    monkeypatch.setenv("SLURM_PROCID", "0")
    locks.announce(tmp_path, "busy")
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert locks.await_rank_zero(tmp_path, timeout_s=5) == "busy"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # a requeued launch must not act on the last one's word
    with pytest.raises(TimeoutError, match="did not say"):
        locks.await_rank_zero(tmp_path, timeout_s=0.5, poll_s=0.1)
    monkeypatch.setenv("SLURM_NTASKS", "1")  # one task: nobody to wait for
    assert locks.await_rank_zero(tmp_path, timeout_s=0) == "train"


SLURM_LAUNCH = {  # what srun sets for a one-node, two-task step (the parts Lightning and attnres.storage.locks read)
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_NNODES": "1",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "localhost",
    "SLURM_JOB_NAME": "attnres",
}


def two_slurm_ranks(run_dir: Path, timeout: float = 120) -> list[str]:
    """Train a tiny 2-device DDP run as the two tasks of a SLURM step would (on CPU); each rank's output."""
    ddp = ["runtime.devices=2", "runtime.accelerator=cpu", "runtime.threads=1"]
    args = ["train", *TINY, *ddp, "--out", str(run_dir), "--no-progress"]
    ranks = [
        subprocess.Popen(
            [*ATTNRES, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **SLURM_LAUNCH, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in ranks]
    finally:
        for p in ranks:
            p.kill()
    for rank, (p, out) in enumerate(zip(ranks, outputs)):
        assert p.returncode == 0, (rank, out)
    return outputs


def test_two_slurm_ranks_train_one_run_with_ddp(tmp_path):
    outputs = two_slurm_ranks(tmp_path / "run")
    assert all(out.splitlines()[-1].startswith("done: step 49") for out in outputs), outputs
    assert schema.read_run_row(tmp_path / "run")["status"] == "done"


@pytest.mark.integration  # two ranks of a whole command: pytest -m integration
def test_when_rank_zero_finds_the_run_busy_the_other_slurm_ranks_stop_too(tmp_path):
    """Rank 0 finds another process training the run and returns "busy"; rank 1 must too, instead of waiting at
    DDP's rendezvous for a rank 0 that never comes (until the rendezvous times out, GPUs held)."""
    run_dir = tmp_path / "run"
    with locks.exclusive(run_dir / locks.TRAIN_LOCK_FILE) as ours:
        assert ours
        outputs = two_slurm_ranks(run_dir, timeout=60)
    assert all(out.splitlines()[-1].startswith("busy") for out in outputs), outputs
    assert not (run_dir / schema.RUN_FILE).exists()  # nobody trained


@pytest.mark.integration  # a whole command's output: pytest -m integration
def test_lightnings_srun_hint_is_not_printed_outside_a_slurm_allocation(tmp_path):
    """With srun on PATH (a login node, a laptop with SLURM) but no allocation, the hint is noise: not printed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    args = [*TINY, "train.tokens=2000", "runtime.progress_bar=false", "--out", str(tmp_path / "run")]
    proc = run_cli("train", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "The `srun` command" not in proc.stdout + proc.stderr, proc.stderr


@pytest.mark.parametrize("flag", ["--out", "--results"])
def test_an_unwritable_output_is_one_line_naming_the_path(tmp_path, flag):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("not a folder")
    result = attnres("train", *TINY, flag, str(in_the_way / "run"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert (
        message.startswith("attnres train: error: cannot write the run folder") and "is a file, not a folder" in message
    )
    assert str(in_the_way) in message


def test_checkpointing_is_a_runtime_setting_with_the_same_run(tmp_path):
    """runtime.checkpointing=sublayer trains the same run (same run id) to the same losses, recomputing sublayers."""
    plain = resolve_run_config(None, [*TINY, "train.tokens=8000"])
    ckpt = resolve_run_config(None, [*TINY, "train.tokens=8000", "runtime.checkpointing=sublayer"])
    assert ckpt.run_id == plain.run_id
    a = train(plain, tmp_path / "a", progress=False)
    b = train(ckpt, tmp_path / "b", progress=False)
    assert a.status == b.status == "done" and b.val_loss == pytest.approx(a.val_loss, abs=1e-5)


@pytest.mark.gpu  # deselected by default; `pytest -m gpu` on a machine with 2 or more CUDA GPUs
def test_fsdp_trains_to_the_ddp_result(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("FSDP needs 2 or more GPUs")
    common = [*TINY, "runtime.devices=2", "runtime.accelerator=gpu", "runtime.precision=32-true", "--no-progress"]
    ddp = run_cli("train", *common, "--out", str(tmp_path / "ddp"))
    assert ddp.returncode == 0, ddp.stderr
    half = run_cli("train", *common, "runtime.strategy=fsdp", "train.eval_interval=20", "--out", str(tmp_path / "f"))
    assert half.returncode == 0, half.stderr
    a = schema.read_table(tmp_path / "ddp" / schema.RUN_FILE).to_pylist()[0]
    b = schema.read_table(tmp_path / "f" / schema.RUN_FILE).to_pylist()[0]
    assert b["status"] == "done" and abs(a["val_loss"] - b["val_loss"]) < 1e-3
