"""Incremental decoding: a prompt prefilled into the KV cache and then tokens fed one at a time (or in chunks) give
the logits of one full forward over the same sequence, for every variant and ablation (docs/method.md, "Decoding")."""

from __future__ import annotations

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.model import KVCache
from tests.attnres.test_ablations import ABLATIONS

VARIANTS = [
    dict(residual="baseline"),
    dict(residual="full"),
    dict(residual="block", n_blocks=1),
    dict(residual="block", n_blocks=3),  # 8 sublayers in 3 blocks: uneven (3, 3, 2)
    dict(residual="block", n_blocks=5),  # uneven (2, 2, 2, 1, 1)
    dict(residual="block", n_blocks=8),  # N = L: Full's sources as blocks
    *ABLATIONS,
]
IDS = [ModelConfig(n_layer=4, d_model=32, n_head=2, **kw).variant for kw in VARIANTS]


def model_of(**kw) -> AttnResLM:
    """A tiny model with every depth parameter moved off its initial value (zero queries mix uniformly, which would
    hide a source fed in the wrong order)."""
    torch.manual_seed(0)
    model = AttnResLM(ModelConfig(vocab_size=64, n_layer=4, d_model=32, n_head=2, seq_len=24, **kw)).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("depth."):
                p.add_(0.5 * torch.randn(p.shape, generator=gen))
    return model


def decoded(model: AttnResLM, x: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    """The logits of ``x`` fed through one KV cache in pieces of the given lengths."""
    cache = KVCache(model.cfg, x.shape[0], x.shape[1], x.device, torch.float32)
    out, at = [], 0
    for n in chunks:
        out.append(model(x[:, at : at + n], cache=cache))
        at += n
    assert at == x.shape[1] and cache.length == at
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("kw", VARIANTS, ids=IDS)
@torch.no_grad()
def test_decoding_token_by_token_after_a_prompt_equals_the_full_forward(kw):
    model = model_of(**kw)
    x = torch.randint(0, 64, (3, 24), generator=torch.Generator().manual_seed(2))
    full = model(x)
    # a 9-token prompt (longer than any one decode step), then 15 single tokens; and uneven chunks after a prompt
    for chunks in ([9] + [1] * 15, [5, 7, 1, 3, 8]):
        torch.testing.assert_close(decoded(model, x, chunks), full, rtol=0, atol=1e-5, msg=f"chunks {chunks}")


@torch.no_grad()
def test_a_prefill_is_the_training_forward_bit_for_bit():
    """The first call on an empty cache runs exactly the training path's attention (causal SDPA), so a prompt's logits
    are the forward's, not merely close."""
    model = model_of(residual="block", n_blocks=3)
    x = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(3))
    cache = KVCache(model.cfg, 2, 24, x.device, torch.float32)
    assert torch.equal(model(x, cache=cache), model(x))


def test_the_cache_refuses_what_it_cannot_hold():
    model = model_of(residual="baseline")
    with pytest.raises(ValueError, match="seq_len=24"):
        KVCache(model.cfg, 1, 25, torch.device("cpu"), torch.float32)
    cache = KVCache(model.cfg, 1, 10, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="longer than the KV cache's 10"):
            model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    assert cache.length == 8  # a refused step leaves the cache as it was
