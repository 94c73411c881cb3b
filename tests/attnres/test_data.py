"""The built-in corpus, the fixed split, the token cache, the batch order and the learning-rate schedule."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from attnres.config import DataConfig, RunConfig, TrainConfig
from attnres.data.corpus import TrainBatches, load_corpus, val_starts, val_windows
from attnres.data.sources import source_files
from attnres.model import AttnResLM
from attnres.training.module import build_scheduler
from attnres.training.optimizer import parameter_groups
from tests.conftest import schedule_rates


def test_builtin_corpus_is_vendored_with_its_provenance():
    files = source_files("builtin")
    assert [f.name for f in files] == ["kjv.txt.gz", "shakespeare.txt.gz"]
    assert (files[0].parent / "PROVENANCE.md").is_file()
    head = gzip.decompress(files[0].read_bytes())[:9]
    assert head == b"Genesis 1"


def test_split_holds_every_byte_once_and_mirrors_the_training_mix():
    corpus = load_corpus(DataConfig())
    texts = [gzip.decompress(f.read_bytes()) for f in source_files("builtin")]
    eot = 1  # one end-of-text token per document (file)
    assert len(corpus.train) + len(corpus.val) == sum(len(t) + eot for t in texts)
    assert 0.015 < len(corpus.val) / (len(corpus.train) + len(corpus.val)) < 0.025
    assert corpus.vocab_size == 256 and corpus.val_bytes_per_token == 1.0
    # the validation split holds KJV and Shakespeare within 5 points of the training split's shares, and the
    # evaluation windows (spread over the whole split, not its first bytes) cover both
    starts = val_starts(len(corpus.val), 256, 65536)
    mix = corpus.composition(starts)
    for name in ("kjv.txt.gz", "shakespeare.txt.gz"):
        assert abs(mix[name]["val_share"] - mix[name]["train_share"]) < 0.05
        assert abs(mix[name]["eval_window_share"] - mix[name]["train_share"]) < 0.05
    # no validation piece is in the training text (no leakage of neighbouring windows)
    train = bytes(np.asarray(corpus.train))
    for _, start, n in corpus.val_pieces[:5]:
        piece = bytes(corpus.val[int(start) : int(start + n)])
        assert len(piece) > 1000 and piece[500:700] not in train


def test_cache_is_built_once(token_cache):
    load_corpus(DataConfig())
    files = sorted((Path(token_cache) / "tokens").rglob("*.bin"))
    stamps = [f.stat().st_mtime_ns for f in files]
    load_corpus(DataConfig())
    assert files and [f.stat().st_mtime_ns for f in sorted((Path(token_cache) / "tokens").rglob("*.bin"))] == stamps


def test_user_text_folder(tmp_path):
    (tmp_path / "a.txt").write_text("hello world " * 5000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("goodbye moon " * 5000)
    corpus = load_corpus(DataConfig(corpus=str(tmp_path), chunk_bytes=4096, val_fraction=0.1))
    assert len(corpus.train) + len(corpus.val) == 12 * 5000 + 13 * 5000 + 2
    assert corpus.files == (str(tmp_path / "a.txt"), str(tmp_path / "sub" / "b.txt"))


def test_batches_are_a_function_of_seed_and_step_and_split_across_ranks():
    tokens = np.arange(10_000, dtype=np.uint8)
    one = TrainBatches(tokens, batch_size=8, seq_len=16, seed=3, steps=5)
    full = [b.clone() for b in one]
    assert len(full) == 5 and full[0].shape == (8, 17)
    again = TrainBatches(tokens, batch_size=8, seq_len=16, seed=3, steps=5)
    again.step = 3  # a resumed run starts at its global step
    assert torch.equal(next(iter(again)), full[3])
    ranks = [list(TrainBatches(tokens, 8, 16, 3, 5, rank=r, world=2)) for r in range(2)]
    for step in range(5):
        merged = torch.empty_like(full[step])
        merged[0::2], merged[1::2] = ranks[0][step], ranks[1][step]
        assert torch.equal(merged, full[step])
    assert not torch.equal(full[0], list(TrainBatches(tokens, 8, 16, 4, 1))[0])  # another seed


def test_validation_windows_are_fixed_and_spread_over_the_whole_split():
    tokens = np.arange(1000, dtype=np.int64)
    w = val_windows(tokens, seq_len=10, max_tokens=50)
    assert w.shape == (5, 11)
    assert np.array_equal(w[0], np.arange(11)) and w[-1, -1] == 999  # first and last tokens of the split
    assert np.all(np.diff(w[:, 0]) >= 10)  # no window overlaps the next by more than its last target
    full = val_windows(tokens, seq_len=10, max_tokens=10_000)  # as many as fit, still not overlapping
    assert full.shape == (99, 11) and full[-1, -1] == 999 and np.all(np.diff(full[:, 0]) >= 10)


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_schedule_warms_up_then_decays_to_the_floor(schedule):
    cfg = RunConfig(train=TrainConfig(lr=1.0, warmup_frac=0.1, schedule=schedule, min_lr_ratio=0.1))
    lrs = schedule_rates(cfg, 100)
    assert lrs[:10] == pytest.approx([(k + 1) / 10 for k in range(10)])
    assert lrs[-1] == pytest.approx(0.1) and max(lrs) == pytest.approx(1.0)
    assert all(a >= b - 1e-12 for a, b in zip(lrs[10:], lrs[11:]))  # non-increasing after warm-up
    if schedule == "wsd":
        assert lrs[10:80] == pytest.approx([1.0] * 70)


def test_weight_decay_only_on_linear_weights():
    from attnres.config import ModelConfig

    model = AttnResLM(ModelConfig(n_layer=2, d_model=32, n_head=2, residual="block", n_blocks=2))
    decay, no_decay = parameter_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert all(
        n.endswith(("qkv.weight", "proj.weight", "gate_up.weight", "down.weight", "lm_head.weight")) for n in decayed
    )
    kept = {names[id(p)] for p in no_decay["params"]}
    assert {"depth.pseudo_query", "depth.key_gain", "embed.weight", "final_norm.weight"} <= kept
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0


def test_the_depth_mixer_trains_at_its_own_learning_rate_scale_through_the_schedule():
    from attnres.config import ModelConfig
    from attnres.training.module import LitLM

    model = AttnResLM(ModelConfig(n_layer=2, d_model=32, n_head=2, residual="block", n_blocks=2))
    assert len(parameter_groups(model, 0.1)) == 2  # scale 1: the two groups of old checkpoints
    groups = parameter_groups(model, 0.1, depth_lr_scale=2.5)
    depth = {id(p) for p in model.depth.parameters()}
    scaled = [g for g in groups if "lr_scale" in g]
    assert scaled and {id(p) for g in scaled for p in g["params"]} == depth
    assert sum(len(g["params"]) for g in groups) == len(list(dict.fromkeys(model.parameters())))
    cfg = RunConfig(train=TrainConfig(lr=1.0, warmup_frac=0.1, depth_lr_scale=2.5))
    opt = torch.optim.AdamW(groups, lr=1.0)
    sched = build_scheduler(opt, cfg, 50)
    for _ in range(50):
        LitLM.scale_lrs(opt)
        main = opt.param_groups[0]["lr"]
        assert all(g["lr"] == pytest.approx(2.5 * main) for g in opt.param_groups if "lr_scale" in g)
        opt.step()
        sched.step()
