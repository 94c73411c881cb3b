"""Parameter and FLOP counts from a :class:`ModelConfig`, without building the model (no torch import).

Conventions (the FLOP convention is written into every run.parquet as ``flops_convention``):

* A multiply-add is 2 FLOPs. Matrix products are counted; element-wise work (norms, softmax, SwiGLU gating,
  RoPE, residual adds) is not, as in Kaplan et al. and Chinchilla, and as ``FlopCounterMode`` does.
* Attention's T^2 terms are counted over the full T x T score matrix (QK^T and AV, 2 * T * d_model FLOPs per
  token each), as the dense kernels compute it and as ``FlopCounterMode`` counts it; causal masking is not
  discounted.
* The LM head is counted; the embedding lookup is not.
* The depth attention of AttnRes is counted: per (query, source) pair, 2 * d FLOPs for the logit
  (pseudo-query . normalised key) and 2 * d for the weighted sum of the values. The variant pays for its
  own overhead in every multiplier.
* Training FLOPs = 3 x forward FLOPs (backward = 2 x forward).

Parameters: ``params`` is the non-embedding count (everything but the token embedding and the LM head
matrix); ``params_total`` counts every parameter once (a tied head is not counted twice).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnres.config import ModelConfig

FLOPS_CONVENTION = (
    "attnres-v1: 2 FLOPs per multiply-add; matmuls only (attention QK^T and AV over the full TxT, MLP, "
    "LM head, AttnRes depth attention 4d per query-source pair); training = 3 x forward"
)


@dataclass(frozen=True)
class ParamCounts:
    embedding: int
    lm_head: int
    blocks: int
    final_norm: int
    depth_mixing: int

    @property
    def non_embedding(self) -> int:
        return self.blocks + self.final_norm + self.depth_mixing

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.non_embedding


def count_params(cfg: ModelConfig) -> ParamCounts:
    d, h = cfg.d_model, cfg.hidden_dim
    attention = d + 3 * d * d + d * d  # PreNorm gain, fused QKV, output projection (no biases)
    mlp = d + 2 * d * h + h * d  # PreNorm gain, fused gate+up, down projection
    depth = 0
    if cfg.residual != "baseline":
        queries = cfg.n_sublayers + 1  # one per sublayer, one for the final aggregation
        depth = queries * d * (2 if cfg.key_norm_gain else 1)  # pseudo-query (+ key-norm gain) per query
    return ParamCounts(
        embedding=cfg.vocab_size * d,
        lm_head=0 if cfg.tie_embeddings else cfg.vocab_size * d,
        blocks=cfg.n_layer * (attention + mlp),
        final_norm=d,
        depth_mixing=depth,
    )


def depth_sources(cfg: ModelConfig) -> list[int]:
    """Number of depth-attention sources read by each sublayer's input and by the final aggregation.

    Entry l (0 <= l < L) is sublayer l's source count, entry L the final aggregation's; empty for the
    baseline. Block AttnRes: the completed blocks (the embedding is block 0), plus the current block's
    partial sum when the sublayer is not the first of its block.
    """
    starts = cfg.block_starts
    if not starts:
        return []
    counts = []
    for layer in range(cfg.n_sublayers):
        block = max(k for k, s in enumerate(starts) if s <= layer)
        counts.append(1 + block + (1 if layer > starts[block] else 0))
    counts.append(1 + len(starts))
    return counts


@dataclass(frozen=True)
class FlopCounts:
    """Forward FLOPs per token, by part."""

    attention_linear: float
    attention_scores: float
    mlp: float
    lm_head: float
    depth_attention: float

    @property
    def forward(self) -> float:
        return self.attention_linear + self.attention_scores + self.mlp + self.lm_head + self.depth_attention

    @property
    def training(self) -> float:
        return 3.0 * self.forward


def count_flops(cfg: ModelConfig) -> FlopCounts:
    """Forward FLOPs per token (see the module docstring for what is counted)."""
    d, h, t, n = cfg.d_model, cfg.hidden_dim, cfg.seq_len, cfg.n_layer
    return FlopCounts(
        attention_linear=n * 2 * (3 * d * d + d * d),
        attention_scores=n * 2 * (2 * t * d),
        mlp=n * 2 * (3 * d * h),
        lm_head=2 * d * cfg.vocab_size,
        depth_attention=sum(4 * d * s for s in depth_sources(cfg)),
    )


def training_flops_per_token(cfg: ModelConfig) -> float:
    return count_flops(cfg).training
