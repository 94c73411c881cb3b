"""The paper's recipe: Muon on the hidden matrices (AdamW on the rest), and the epoch data order."""

from __future__ import annotations

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch

from attnres import AttnResLM
from attnres.config import ConfigError, ModelConfig, TrainConfig, resolve_run_config
from attnres.data.corpus import TrainBatches
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
