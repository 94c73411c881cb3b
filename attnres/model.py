"""The decoder-only language model, top to bottom: embedding, transformer blocks, final norm, LM head.

The residual path is not hard-wired: every sublayer reads its input from a depth mixer and writes its raw
output back to it (:mod:`attnres.mixers`), so the same model is the PreNorm baseline, Full AttnRes or Block
AttnRes depending on ``ModelConfig.residual``.

Initialisation (the same for every variant, so comparisons start from the same weights): embeddings and
linear weights ~ N(0, init_std); the two projections that write into the depth path (attention output, MLP
down) ~ N(0, init_std / sqrt(2 * n_layer)) as in GPT-2; norm gains 1; AttnRes pseudo-queries 0 (every input
starts as the uniform mean of its sources) and key-norm gains 1. No biases. The LM head is untied from the
embedding unless ``tie_embeddings`` is set.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnres.config import ModelConfig
from attnres.kernels.attention import causal_attention
from attnres.kernels.rms_norm import rms_norm
from attnres.mixers import AttnRes, DepthMixer, Recorder, TracedAttnRes, build_mixer


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * gain`` (:mod:`attnres.kernels.rms_norm`: a one-pass backward on CPU)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class Rotary(nn.Module):
    """Rotary position embedding (rotate-half form) applied to queries and keys, (.., T, hd).

    ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``, computed as ``cat(x2, x1) * sin'``
    where ``sin'`` holds the sign (``-sin`` on the first half): the same products to the bit, since negating a
    factor negates the product exactly, with one pass fewer over the heads (eager CPU spent 4 % of a deep, narrow
    step on the negation; docs/performance.md).
    """

    def __init__(self, head_dim: int, seq_len: int, base: float) -> None:
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (hd/2,)
        angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)  # (T, hd/2)
        sin = angles.sin().float()
        self.register_buffer("cos", torch.cat([angles, angles], dim=-1).cos().float(), persistent=False)
        self.register_buffer("signed_sin", torch.cat([-sin, sin], dim=-1), persistent=False)  # (T, hd)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """Rotate ``x`` (.., T, hd) as the tokens at positions start .. start + T - 1 (start > 0: decoding)."""
        t = x.shape[-2]
        x1, x2 = x.chunk(2, dim=-1)
        swapped = torch.cat([x2, x1], dim=-1)
        cos, sin = self.cos[start : start + t], self.signed_sin[start : start + t]
        return x * cos.to(x.dtype) + swapped * sin.to(x.dtype)


class KVCache:
    """The keys and values of the tokens a sequence holds so far, for incremental decoding.

    One (B, H, capacity, hd) buffer each for keys and values per transformer block, filled from position 0;
    ``length`` tokens are in it. Only the token attention needs it: every depth mixer works per token (a token's
    sublayer inputs mix that token's own embedding and sublayer outputs), so a decode step runs the new token's
    whole depth and keeps nothing of it once its logits are out (docs/method.md, "Decoding").
    """

    def __init__(self, cfg: ModelConfig, batch: int, capacity: int, device: torch.device, dtype: torch.dtype):
        if not 1 <= capacity <= cfg.seq_len:
            raise ValueError(f"a KV cache of {capacity} tokens: it holds 1 to seq_len={cfg.seq_len} tokens")
        shape = (batch, cfg.n_head, capacity, cfg.head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]
        self.capacity = capacity
        self.length = 0

    def extend(self, block: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new tokens' keys and values of transformer block ``block`` after the ``length`` held; return
        every key and value up to them."""
        end = self.length + k.shape[-2]
        self.keys[block][:, :, self.length : end] = k
        self.values[block][:, :, self.length : end] = v
        return self.keys[block][:, :, :end], self.values[block][:, :, :end]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


class Attention(nn.Module):
    """Sublayer f = RMSNorm -> causal multi-head self-attention (RoPE; SDPA, or the native CPU kernels of
    :mod:`attnres.kernels.attention`) -> output projection."""

    def __init__(self, cfg: ModelConfig, rotary: Rotary) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.rotary = [rotary]  # shared, and kept out of this module's children (one buffer for all layers)

    def forward(self, h: Tensor, cache: KVCache | None = None, block: int = 0) -> Tensor:
        """``cache``: decoding; the T new tokens follow the ``cache.length`` tokens it holds (transformer block
        ``block``'s keys and values), and attend to those and, causally, to each other."""
        b, t, d = h.shape
        qkv = self.qkv(self.norm(h)).view(b, t, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)
        start = 0 if cache is None else cache.length
        q, k = self.rotary[0](qkv[:2], start)  # queries and keys in one call: half the element-wise launches
        v = qkv[2]
        if start == 0:
            if cache is not None:
                cache.extend(block, k, v)
            y = causal_attention(q, k, v)  # (B, H, T, hd); natively on CPU (attnres.kernels.attention)
        else:
            keys, values = cache.extend(block, k, v)
            # new token i (position start + i) sees positions 0 .. start + i; one new token sees them all
            mask = None if t == 1 else torch.ones(t, start + t, dtype=torch.bool, device=h.device).tril(start)
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    """Sublayer f = RMSNorm -> SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.hidden_dim, bias=False)
        self.down = nn.Linear(cfg.hidden_dim, cfg.d_model, bias=False)

    def forward(self, h: Tensor) -> Tensor:
        gate, up = self.gate_up(self.norm(h)).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    """One transformer block = two sublayers, each reading from and writing to the depth mixer.

    Baseline (PreNorm residual)            AttnRes (Full or Block)

        h ----+---------+                  sources v_0 .. v_l (or block sums b_0..b_n, partial p)
              |         |                        |  softmax_i( w_l . RMSNorm(v_i) )
           norm->attn   |                        v
              |         |                  h_l = sum_i alpha_i v_i ---> norm -> attn --> v_{l+1}
              +--(+)----+                  h_{l+1} (new query w_{l+1}, sources now include v_{l+1})
              |         |                        |
           norm->mlp    |                        +--> norm -> mlp --> v_{l+2}
              +--(+)----+
    """

    def __init__(self, cfg: ModelConfig, rotary: Rotary) -> None:
        super().__init__()
        self.attn = Attention(cfg, rotary)
        self.mlp = MLP(cfg)


class AttnResLM(nn.Module):
    """Decoder-only LM whose residual connections are a :class:`DepthMixer` chosen by ``cfg.residual``.

    ``forward(tokens)`` maps (B, T) int64 tokens to (B, T, vocab_size) logits. Pass a
    :class:`~attnres.mixers.Recorder` to collect diagnostics; without one the forward does no extra work. Pass a
    :class:`KVCache` to decode: the tokens continue the ones the cache holds, and their keys and values join it.
    """

    def __init__(self, cfg: ModelConfig, reference_depth: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.rotary = Rotary(cfg.head_dim, cfg.seq_len, cfg.rope_base)
        self.blocks = nn.ModuleList(Block(cfg, self.rotary) for _ in range(cfg.n_layer))
        self.depth: DepthMixer = build_mixer(cfg, reference=reference_depth)
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.checkpointing = False  # runtime.checkpointing=sublayer: recompute each sublayer in backward

    @property
    def sublayers(self) -> list[nn.Module]:
        """The L = 2 * n_layer sublayers in order: attn_0, mlp_0, attn_1, mlp_1, ..."""
        return [s for block in self.blocks for s in (block.attn, block.mlp)]

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Embeddings, linear weights and norm gains; the depth mixer initialises its own parameters."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if name.startswith("depth."):
                continue
            if name.endswith(("proj.weight", "down.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg.n_layer))
            elif p.ndim == 2:
                nn.init.normal_(p, 0.0, std)
            else:
                nn.init.ones_(p)

    def forward(self, tokens: Tensor, recorder: Recorder | None = None, cache: KVCache | None = None) -> Tensor:
        held = 0 if cache is None else cache.length
        if held + tokens.shape[-1] > (self.cfg.seq_len if cache is None else cache.capacity):
            raise ValueError(
                f"sequence of {held + tokens.shape[-1]} tokens is longer than "
                + (f"seq_len={self.cfg.seq_len}" if cache is None else f"the KV cache's {cache.capacity}")
            )
        state = self.depth.start(self.embed(tokens), recorder)
        recompute = self.checkpointing and torch.is_grad_enabled()
        for layer, sublayer in enumerate(self.sublayers):
            h = self.depth.read(state, layer)
            if cache is not None and layer % 2 == 0:  # an attention sublayer: it reads and extends the KV cache
                v = sublayer(h, cache, layer // 2)
            # the mixer's read and write stay outside: only the sublayer's own activations are recomputed
            elif recompute:
                v = checkpoint(sublayer, h, use_reentrant=False)
            else:
                v = sublayer(h)
            if recorder is not None:
                recorder.input_rms[layer] = recorder.rms(h)
                recorder.output_rms[layer] = recorder.rms(v)
            self.depth.write(state, layer, v)
        h = self.depth.finish(state)
        if recorder is not None:
            recorder.final_rms = recorder.rms(h)
        if cache is not None:
            cache.length += tokens.shape[-1]
        return self.lm_head(self.final_norm(h))


def compile_model(model: AttnResLM, fuse_depth: bool) -> AttnResLM:
    """``runtime.compile``: torch.compile the model, in place (``nn.Module.compile``), so parameter names and
    checkpoints are those of the eager model (``torch.compile(model)`` would prefix them with ``_orig_mod.``).

    The baseline and the ablation mixers: the whole model. Full / Block AttnRes: the whole model too, their depth
    attention as :class:`~attnres.mixers.TracedAttnRes` (the two-phase equations in torch ops, with the same
    parameter tensors), so that Inductor fuses and differentiates it inside the one graph; on CPU that steps faster
    than the sublayers compiled around the native depth kernels (docs/performance.md). With ``fuse_depth`` (training
    on GPU, where the whole graph has not been measured) as before: every sublayer compiled, and the hand-written
    depth autograd of :class:`~attnres.mixers.AttnRes` eager around them with its element-wise work through the fused
    kernels of :mod:`attnres.kernels.fused` (tracing through that autograd would lose gradients: its backward
    accumulates into buffers that a compiled graph does not see).
    """
    if isinstance(model.depth, AttnRes):
        if fuse_depth:
            model.depth.fused = True
            for sublayer in model.sublayers:
                sublayer.compile()
            return model
        model.depth = TracedAttnRes(model.cfg, like=model.depth)
    model.compile()
    return model
