"""The paper's ablations and the other depth-mixing baselines: defining equations, limiting cases, counters."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from attnres import AttnResLM, ModelConfig
from attnres.config import ConfigError, resolve_run_config
from attnres.costs import count_flops, count_params
from attnres.mixers.ablations import AttnResAblation, sinkhorn
from attnres.training.run import train
from tests.attnres.test_model import capture, randomize_depth, tokens
from tests.conftest import TINY

ABLATIONS = [
    dict(residual="full", depth_score="sigmoid"),
    dict(residual="full", key_norm=False),
    dict(residual="block", n_blocks=3, key_norm=False),
    dict(residual="full", depth_query="input"),
    dict(residual="full", depth_mixing="scalar"),
    dict(residual="block", n_blocks=2, depth_mixing="scalar"),
    dict(residual="full", depth_heads=4),
    dict(residual="block", n_blocks=4, depth_heads=4),
    dict(residual="full", depth_window=3),
    dict(residual="denseformer"),
    dict(residual="hc", hc_streams=4),
    dict(residual="mhc", hc_streams=4),
]
IDS = [ModelConfig(n_layer=4, d_model=32, n_head=2, **kw).variant for kw in ABLATIONS]


def cfg_of(**kw) -> ModelConfig:
    base = dict(vocab_size=64, n_layer=4, d_model=32, n_head=2, seq_len=16)
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize("kw", ABLATIONS, ids=IDS)
def test_counters_cover_every_variant(kw):
    cfg = ModelConfig(n_layer=3, d_model=64, n_head=4, seq_len=32, **kw)
    model = AttnResLM(cfg)
    assert count_params(cfg).total == sum(p.numel() for p in model.parameters())
    x = torch.randint(0, 256, (2, 32))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(x).float().mean().backward()
    assert count_flops(cfg).training == pytest.approx(counter.get_total_flops() / x.numel(), rel=0.02)


@pytest.mark.parametrize("kw", ABLATIONS, ids=IDS)
def test_every_variant_trains_in_the_smoke_setting(tmp_path, kw):
    overrides = TINY + [f"model.{k}={v}" for k, v in kw.items()] + ["train.tokens=12000", "train.eval_interval=6"]
    result = train(resolve_run_config(None, overrides), tmp_path / "run", progress=False)
    assert result.status == "done" and result.val_loss is not None and result.val_loss < 5.545


# ------------------------------------------------------------------------------------------ limiting cases


def test_the_ablation_code_with_one_head_and_the_papers_switches_is_attnres():
    """One head, softmax, static query, key norm, no window: the general code computes AttnRes."""
    torch.manual_seed(0)
    fast = randomize_depth(AttnResLM(cfg_of(residual="block", n_blocks=3)))
    general = AttnResLM(cfg_of(residual="block", n_blocks=3))
    general.depth = AttnResAblation(general.cfg)
    general.load_state_dict(fast.state_dict())
    x = tokens(fast.cfg)
    torch.testing.assert_close(general(x), fast(x), rtol=1e-5, atol=1e-5)


def test_a_window_covering_every_source_is_full_attnres():
    torch.manual_seed(0)
    full = randomize_depth(AttnResLM(cfg_of(residual="full")))
    window = AttnResLM(cfg_of(residual="full", depth_window=8))
    window.load_state_dict(full.state_dict())
    x = tokens(full.cfg)
    torch.testing.assert_close(window(x), full(x), rtol=1e-5, atol=1e-5)


def test_each_depth_head_has_its_own_softmax_over_its_channels():
    torch.manual_seed(0)
    cfg = cfg_of(residual="full", depth_heads=2)
    model = randomize_depth(AttnResLM(cfg))
    x = tokens(cfg)
    inputs, outputs = capture(model, x)
    sources = torch.stack([model.embed(x)] + outputs[:4])  # (n, B, T, D)
    keys = F.rms_norm(sources, (cfg.d_model,), eps=cfg.norm_eps) * model.depth.key_gain[4]
    w = model.depth.pseudo_query[4]
    expected = []
    for g in (slice(0, 16), slice(16, 32)):
        alpha = torch.softmax(keys[..., g] @ w[g], dim=0)
        expected.append((alpha.unsqueeze(-1) * sources[..., g]).sum(0))
    torch.testing.assert_close(inputs[4], torch.cat(expected, -1), rtol=1e-5, atol=1e-5)


def test_uniform_scalar_mixing_at_init_is_the_mean_of_the_sources():
    torch.manual_seed(0)
    cfg = cfg_of(residual="full", depth_mixing="scalar")
    model = AttnResLM(cfg)
    x = tokens(cfg)
    inputs, outputs = capture(model, x)
    e = model.embed(x)
    for layer, h in enumerate(inputs):
        torch.testing.assert_close(h, torch.stack([e] + outputs[:layer]).mean(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("residual", ["denseformer", "hc", "mhc"])
def test_the_other_baselines_start_as_the_prenorm_baseline(residual):
    torch.manual_seed(0)
    base = AttnResLM(cfg_of(residual="baseline"))
    other = AttnResLM(cfg_of(residual=residual))
    other.load_state_dict(base.state_dict(), strict=False)  # same transformer weights
    x = tokens(base.cfg)
    for h_other, h_base in zip(capture(other, x)[0], capture(base, x)[0]):  # every sublayer's input
        torch.testing.assert_close(h_other, h_base, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------- defining equations


def test_sigmoid_scores_each_source_independently():
    torch.manual_seed(0)
    cfg = cfg_of(residual="full", depth_score="sigmoid")
    model = randomize_depth(AttnResLM(cfg))
    x = tokens(cfg)
    inputs, outputs = capture(model, x)
    sources = torch.stack([model.embed(x)] + outputs[:3])
    keys = F.rms_norm(sources, (cfg.d_model,), eps=cfg.norm_eps) * model.depth.key_gain[3]
    alpha = torch.sigmoid(keys @ model.depth.pseudo_query[3])
    torch.testing.assert_close(inputs[3], (alpha.unsqueeze(-1) * sources).sum(0), rtol=1e-5, atol=1e-5)


def test_input_dependent_query_projects_the_previous_input():
    torch.manual_seed(0)
    cfg = cfg_of(residual="full", depth_query="input", key_norm=False)
    model = AttnResLM(cfg)
    with torch.no_grad():
        model.depth.pseudo_query_proj.normal_(0, 0.3)
    x = tokens(cfg)
    inputs, outputs = capture(model, x)
    sources = torch.stack([model.embed(x)] + outputs[:3])
    q = F.rms_norm(inputs[2], (cfg.d_model,), eps=cfg.norm_eps) @ model.depth.pseudo_query_proj[3].T
    alpha = torch.softmax((sources * q).sum(-1), dim=0)
    torch.testing.assert_close(inputs[3], (alpha.unsqueeze(-1) * sources).sum(0), rtol=1e-5, atol=1e-5)


def test_denseformer_averages_block_outputs():
    torch.manual_seed(0)
    cfg = cfg_of(residual="denseformer")
    model = AttnResLM(cfg)
    with torch.no_grad():
        for w in model.depth.dwa:
            w.normal_()
    x = tokens(cfg)
    inputs, outputs = capture(model, x)
    x0 = model.embed(x)
    x1 = x0 + outputs[0] + outputs[1]  # block 0's output (its residual stream)
    w = model.depth.dwa[0]
    torch.testing.assert_close(inputs[2], w[0] * x0 + w[1] * x1, rtol=1e-5, atol=1e-5)


def test_sinkhorn_is_doubly_stochastic():
    """20 iterations, as in the mHC paper: columns exact (normalised last), rows converged for moderate logits."""
    m = sinkhorn(torch.randn(50, 4, 4, generator=torch.Generator().manual_seed(0)))
    torch.testing.assert_close(m.sum(-2), torch.ones(50, 4), atol=1e-6, rtol=0)
    torch.testing.assert_close(m.sum(-1), torch.ones(50, 4), atol=1e-3, rtol=0)
    assert (m >= 0).all()


def test_mhc_streams_mix_doubly_stochastically_and_hc_does_not_have_to():
    torch.manual_seed(0)
    for residual, constrained in (("mhc", True), ("hc", False)):
        model = AttnResLM(cfg_of(residual=residual))
        with torch.no_grad():
            model.depth.phi.normal_(0, 0.05)
            model.depth.alpha.fill_(1.0)
        streams = torch.randn(4, 2, 3, 32)
        pre, post, res = model.depth.maps(streams, 0)
        sums = torch.stack([res.sum(-1), res.sum(-2)])  # 20 Sinkhorn iterations: rows converge to ~1e-3
        assert torch.allclose(sums, torch.ones_like(sums), atol=5e-3) == constrained
        assert ((pre >= 0).all() and (post >= 0).all() and (post <= 2).all()) or not constrained


# ----------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kw,fragment",
    [
        (dict(residual="baseline", depth_score="sigmoid"), "only apply to AttnRes"),
        (dict(residual="block", depth_window=2), "Full AttnRes only"),
        (dict(residual="full", depth_heads=3), "depth_heads=3"),
        (dict(residual="full", depth_mixing="scalar", depth_heads=2), "depth_mixing=scalar"),
        (dict(residual="full", depth_score="tanh"), None),
    ],
)
def test_invalid_ablation_configs(kw, fragment):
    from attnres.config import from_dict

    with pytest.raises(ConfigError) as err:
        from_dict(ModelConfig, dict(n_layer=4, d_model=32, n_head=2, **kw))
    if fragment:
        assert fragment in str(err.value)


def test_variant_names():
    assert cfg_of(residual="block", key_norm=False).variant == "block+no_key_norm"
    assert cfg_of(residual="full", depth_window=8).variant == "full+window8"
    assert cfg_of(residual="mhc", hc_streams=2).variant == "mhc2"
    assert cfg_of(residual="full").variant == "full"


CHECKPOINTED = [dict(residual="baseline"), dict(residual="full"), dict(residual="block", n_blocks=3), *ABLATIONS]


@pytest.mark.parametrize("kw", CHECKPOINTED, ids=[cfg_of(**kw).variant for kw in CHECKPOINTED])
def test_sublayer_checkpointing_gives_the_same_loss_and_gradients(kw):
    """runtime.checkpointing=sublayer recomputes each sublayer in backward: the gradients must not change, for
    every variant and ablation mixer (random depth parameters, so the mixers do not sit at their initial state)."""
    torch.manual_seed(0)
    model = randomize_depth(AttnResLM(cfg_of(**kw)))
    x = tokens(model.cfg)
    calls = []
    model.sublayers[1].register_forward_pre_hook(lambda *_: calls.append(1))
    results = []
    for checkpointing in (False, True):
        model.zero_grad()
        model.checkpointing = checkpointing
        calls.clear()
        loss = model(x).float().logsumexp(-1).mean()
        loss.backward()
        assert len(calls) == (2 if checkpointing else 1)  # recomputed in backward, or kept
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (loss0, grads0), (loss1, grads1) = results
    torch.testing.assert_close(loss1, loss0, rtol=0, atol=0)
    assert grads1.keys() == grads0.keys() and grads0
    for name in grads0:
        torch.testing.assert_close(grads1[name], grads0[name], rtol=1e-6, atol=1e-7, msg=name)
