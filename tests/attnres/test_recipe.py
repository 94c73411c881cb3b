"""The paper's recipe: Muon on the hidden matrices (AdamW on the rest), the epoch data order, extra evaluation sets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch

from attnres import AttnResLM
from attnres.config import ConfigError, ModelConfig, TrainConfig, resolve_run_config
from attnres.data.corpus import TrainBatches
from attnres.data.errors import DataError
from attnres.data.order import batch_starts, permute, repeat_fraction, window_slots
from attnres.storage import schema
from attnres.training.optimizer import MuonAdamW, build_optimizer, muon_parameters
from attnres.training.run import train
from tests.conftest import TINY

# ------------------------------------------------------------------------------------------------------ Muon


def test_muon_takes_the_sublayer_matrices_and_adamw_everything_else():
    model = AttnResLM(ModelConfig(n_layer=2, d_model=32, n_head=2, residual="block", n_blocks=2))
    opt = build_optimizer(model, TrainConfig(optimizer="muon", depth_lr_scale=2.0))
    assert isinstance(opt, MuonAdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)] for g in opt.muon.param_groups for p in g["params"]}
    adamw = {names[id(p)] for g in opt.adamw.param_groups for p in g["params"]}
    suffixes = ("qkv.weight", "proj.weight", "gate_up.weight", "down.weight")
    assert len(muon) == 4 * 2 and all(n.endswith(suffixes) for n in muon)
    assert {"embed.weight", "lm_head.weight", "final_norm.weight", "depth.pseudo_query"} <= adamw
    assert muon.isdisjoint(adamw) and muon | adamw == set(dict(model.named_parameters()))
    # one list of groups, the inner optimizers' own: what a scheduler sets is what each inner optimizer steps with
    assert opt.param_groups == [*opt.muon.param_groups, *opt.adamw.param_groups]
    for group in opt.param_groups:
        group["lr"] = 0.123
    assert all(g["lr"] == 0.123 for g in opt.muon.param_groups + opt.adamw.param_groups)
    assert [g.get("lr_scale") for g in opt.adamw.param_groups].count(2.0) >= 1  # the depth mixer's own scale


def test_muon_makes_orthogonalised_steps_of_adamws_rms():
    """One step from zero momentum on a matrix: the update is the Newton-Schulz orthogonalised gradient, whose
    singular values are all near 1, scaled by 0.2 sqrt(max(A, B)) (update RMS near 0.2 lr, as AdamW's)."""
    torch.manual_seed(0)
    model = AttnResLM(ModelConfig(n_layer=2, d_model=32, n_head=2))
    opt = build_optimizer(model, TrainConfig(optimizer="muon", lr=0.01, weight_decay=0.0))
    w = muon_parameters(model)[0]
    before = w.detach().clone()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    update = (before - w.detach()) / 0.01
    singular = torch.linalg.svdvals(update / (0.2 * max(w.shape) ** 0.5))
    assert 0.5 < float(singular.min()) and float(singular.max()) < 1.3  # Newton-Schulz: near-orthogonal, not exact
    assert len(opt.state) == len(list(model.parameters()))  # both inner optimizers' states, seen as one
    assert all(state for state in opt.state.values())  # reading every state (as Lightning's device move does) ...
    assert len(opt.muon.state) == len(muon_parameters(model))  # ... adds no empty state to either optimizer


def test_muon_refuses_fsdp_and_an_unknown_optimizer_is_named():
    with pytest.raises(ConfigError, match="train.optimizer=muon .* runtime.strategy=fsdp"):
        resolve_run_config(None, ["train.optimizer=muon", "runtime.strategy=fsdp", "runtime.devices=2"])
    with pytest.raises(ConfigError, match="train.optimizer='sgd' is not allowed; choose one of 'adamw', 'muon'"):
        resolve_run_config(None, ["train.optimizer=sgd"])


def test_the_memory_estimate_counts_muons_state():
    from attnres.training.memory import estimate

    args = ["model.n_layer=2", "model.d_model=64", "model.n_head=2", "model.vocab_size=256"]
    adamw = estimate(resolve_run_config(None, args), gpu=False)
    muon = estimate(resolve_run_config(None, [*args, "train.optimizer=muon"]), gpu=False)
    model = AttnResLM(resolve_run_config(None, args).model)
    matrices = sum(p.numel() for p in muon_parameters(model)) * 4
    assert adamw.weights == muon.weights
    assert adamw.optimizer - muon.optimizer == matrices  # Muon keeps one momentum where AdamW keeps two moments


@pytest.mark.parametrize("residual", ["baseline", "full", "block"])
def test_muon_trains_every_variant_to_a_falling_loss(tmp_path, residual):
    args = [*TINY, f"model.residual={residual}", "train.optimizer=muon", "train.tokens=20480", "train.eval_interval=5"]
    result = train(resolve_run_config(None, args), tmp_path / "run", progress=False)
    assert result.status == "done"
    val = pd.read_parquet(tmp_path / "run" / schema.METRICS_FILE).query("split == 'val'").loss.to_numpy()
    assert len(val) == 4 and np.all(np.diff(val) < 0) and val[-1] < np.log(256) - 1.0


class _StopAt(L.Callback):
    """Fails the run after ``step`` (a crash mid-run: the run stays resumable from its last checkpoint)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError("stopped by the test")


class _FirstStep(L.Callback):
    step: int | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.step = trainer.global_step


def test_muon_with_the_epoch_order_resumes_bit_for_bit(tmp_path):
    """Stopped at step 13 with a checkpoint at step 10, then resumed: every logged loss equals the uninterrupted
    run's exactly (the optimizer states of both inner optimizers and the data order are restored, not re-made)."""
    args = [*TINY, "train.optimizer=muon", "train.sampler=epoch", "train.tokens=20480", "train.log_interval=1"]
    args += ["runtime.checkpoint_interval_steps=5", "train.eval_interval=10"]
    cfg = resolve_run_config(None, args)
    assert train(cfg, tmp_path / "straight", progress=False).status == "done"
    with pytest.raises(RuntimeError, match="stopped by the test"):
        train(cfg, tmp_path / "resumed", progress=False, callbacks=[_StopAt(13)])
    assert schema.read_run_row(tmp_path / "resumed")["step"] < 20
    first = _FirstStep()
    assert train(cfg, tmp_path / "resumed", progress=False, callbacks=[first]).status == "done"
    assert first.step == 10  # resumed from the checkpoint, not trained again from step 0
    a = pd.read_parquet(tmp_path / "straight" / schema.METRICS_FILE)
    b = pd.read_parquet(tmp_path / "resumed" / schema.METRICS_FILE)
    assert list(zip(a.step, a.split)) == list(zip(b.step, b.split))
    assert a.loss.tolist() == b.loss.tolist()


# ------------------------------------------------------------------------------------------------ data order


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 100, 1000, 4097])
def test_the_feistel_permutation_is_a_permutation_of_every_size(n):
    out = permute(np.arange(n), n, seed=7, epoch=3)
    assert sorted(out.tolist()) == list(range(n))
    if n >= 64:  # seeded: another epoch or seed is another order, and the order is far from the identity
        assert not np.array_equal(out, permute(np.arange(n), n, seed=7, epoch=4))
        assert not np.array_equal(out, permute(np.arange(n), n, seed=8, epoch=3))
        assert np.mean(out == np.arange(n)) < 0.1


def test_the_epoch_order_reads_every_slot_once_per_epoch():
    n_tokens, seq_len, batch = 10_000, 16, 8
    n = window_slots(n_tokens, seq_len)  # 624 slots: the epochs end mid-batch
    steps = 3 * n // batch + 2
    starts = np.concatenate([batch_starts("epoch", n_tokens, seq_len, batch, 5, s) for s in range(steps)])
    assert np.all(starts % seq_len == 0) and starts.max() + seq_len + 1 <= n_tokens
    for e in range(3):
        epoch = starts[e * n : (e + 1) * n] // seq_len
        assert sorted(epoch.tolist()) == list(range(n))  # each slot once, none repeated within the epoch
    assert not np.array_equal(starts[:n], starts[n : 2 * n])  # each epoch in another order


@pytest.mark.parametrize("sampler", ["replacement", "epoch"])
def test_batches_do_not_depend_on_the_world_size_or_on_resuming(sampler):
    tokens = np.arange(5_000, dtype=np.uint16)
    one = [b.clone() for b in TrainBatches(tokens, 8, 16, seed=3, steps=60, sampler=sampler)]
    ranks = [list(TrainBatches(tokens, 8, 16, 3, 60, rank=r, world=2, sampler=sampler)) for r in range(2)]
    for step in range(60):
        merged = torch.empty_like(one[step])
        merged[0::2], merged[1::2] = ranks[0][step], ranks[1][step]
        assert torch.equal(merged, one[step])
    resumed = TrainBatches(tokens, 8, 16, 3, 60, sampler=sampler)
    resumed.step = 41
    assert all(torch.equal(a, b) for a, b in zip(resumed, one[41:]))


def test_the_replacement_order_is_the_one_committed_runs_trained_on():
    """The default order, spelled out as the committed studies drew it: their runs reproduce digit for digit."""
    n_tokens, seq_len, batch, seed = 123_457, 64, 16, 2
    for step in (0, 1, 977):
        rng = np.random.Generator(np.random.PCG64([seed, step]))
        drawn = rng.integers(0, n_tokens - seq_len - 1, size=batch, endpoint=True)
        assert np.array_equal(batch_starts("replacement", n_tokens, seq_len, batch, seed, step), drawn)
    assert TrainConfig().sampler == "replacement"


@pytest.mark.parametrize("sampler", ["replacement", "epoch"])
@pytest.mark.parametrize("epochs", [0.5, 1.0, 2.5])
def test_the_repeat_fraction_is_what_the_sampler_reads(sampler, epochs):
    n_tokens, seq_len, batch = 20_001, 20, 10
    windows = int(epochs * (n_tokens - 1) / seq_len)
    steps = windows // batch
    read = np.zeros(n_tokens, dtype=np.int64)
    for step in range(steps):
        for s in batch_starts(sampler, n_tokens, seq_len, batch, 1, step):
            read[s + 1 : s + seq_len + 1] += 1  # the tokens a window predicts
    measured = 1 - np.count_nonzero(read) / read.sum()
    assert measured == pytest.approx(repeat_fraction(sampler, steps * batch, n_tokens, seq_len), abs=0.01)


# ------------------------------------------------------------------------------------------- evaluation sets


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A small prepared folder (byte tokens) of two plain-text sources."""
    from attnres.data.prepare import PrepareSpec, prepare

    root = tmp_path_factory.mktemp("evalsets")
    (root / "text").mkdir()
    words = "the quick brown fox jumps over the lazy dog and then sleeps in the warm sun ".split()
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        (root / "text" / f"{name}.txt").write_text(" ".join(rng.choice(words, 40_000)))
    return prepare(PrepareSpec(str(root / "text"), "bytes", chunk_bytes=1024, val_fraction=0.1), root / "prep")


def test_an_evaluation_set_loss_equals_the_same_folder_as_the_validation_split(tmp_path, prepared):
    args = [*TINY, f"data.corpus={prepared}", "train.tokens=20480", "train.eval_interval=10"]
    with_set = resolve_run_config(None, [*args, f"data.eval_sets=[again={prepared}]"])
    assert with_set.run_id == resolve_run_config(None, args).run_id  # evaluated beside the run, not trained on
    assert train(with_set, tmp_path / "run", progress=False).status == "done"
    rows = pd.read_parquet(tmp_path / "run" / schema.METRICS_FILE)
    val, again = rows[rows.split == "val"], rows[rows.split == "again"]
    assert again.step.tolist() == val.step.tolist() == [10, 20]
    assert again.loss.tolist() == val.loss.tolist() and again.bpb.tolist() == val.bpb.tolist()
    run = schema.read_run_row(tmp_path / "run")
    assert json.loads(run["eval_sets"]) == {"again": {"loss": run["val_loss"], "bpb": run["val_bpb"]}}


def test_a_run_parquet_written_before_evaluation_sets_reads_with_a_null_column(tmp_path, prepared):
    """Every committed run.parquet predates the column: it must read as it did, with the column null."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {f.name: None for f in schema.RUN_SCHEMA}
    row |= {"schema_version": 1, "run_id": "r", "sweep": "s", "variant": "baseline", "n_layer": 2, "d_model": 32}
    row |= {k: 1 for k in ("n_head", "seq_len", "vocab_size", "params", "params_total", "tokens", "batch_tokens")}
    row |= {"flops": 1.0, "flops_per_token": 1.0, "flops_convention": "x", "lr": 1e-3, "seed": 0, "status": "done"}
    row |= {"step": 1, "max_steps": 1, "tokens_seen": 1}
    added = ("eval_sets", "threads", "blas")  # threads and blas: tests/attnres/test_threads.py
    metadata = {**schema.RUN_SCHEMA.metadata, b"schema_version": b"1"}  # the column's version, as those files say
    old = pa.schema([f for f in schema.RUN_SCHEMA if f.name not in added], metadata=metadata)
    pq.write_table(
        pa.Table.from_pylist([{k: v for k, v in row.items() if k not in added}], schema=old),
        tmp_path / schema.RUN_FILE,
    )
    table = schema.read_table(tmp_path / schema.RUN_FILE)
    assert table.column_names == schema.RUN_SCHEMA.names
    assert all(table.to_pylist()[0][name] is None for name in added)


def _copy_with_manifest(prepared: Path, out: Path, change) -> Path:  # noqa: ANN001
    shutil.copytree(prepared, out)
    manifest = json.loads((out / "manifest.json").read_text())
    change(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.mark.parametrize(
    "make, fragments",
    [
        (lambda p, out: out, ["not a prepared folder (no manifest.json)", "attnres data prepare", "--tokenizer bytes"]),
        (
            lambda p, out: _copy_with_manifest(p, out, lambda m: m["tokenizer"].update(hash="0" * 64)),
            ["prepared with tokenizer 'bytes' (hash 000000000000", "prepare it again with --tokenizer bytes"],
        ),
        (
            lambda p, out: _copy_with_manifest(p, out, lambda m: m.update(vocab_size=512)),
            ["vocabulary 512", "vocabulary 256"],
        ),
        (
            lambda p, out: _copy_with_manifest(p, out, lambda m: m["splits"]["val"].update(shards=[], tokens=0)),
            ["its validation split holds 0 tokens, fewer than one window"],
        ),
    ],
    ids=["not-prepared", "tokenizer", "vocabulary", "empty"],
)
def test_a_bad_evaluation_set_is_one_clear_error_before_compute(tmp_path, prepared, make, fragments):
    folder = make(prepared, tmp_path / "other")
    cfg = resolve_run_config(None, [*TINY, f"data.corpus={prepared}", f"data.eval_sets=[other={folder}]"])
    with pytest.raises(DataError) as err:
        train(cfg, tmp_path / "run", progress=False)
    assert str(err.value).startswith(f"data.eval_sets other={folder}: ")
    for fragment in fragments:
        assert fragment in str(err.value)
    assert not (tmp_path / "run" / schema.RUN_FILE).exists()
