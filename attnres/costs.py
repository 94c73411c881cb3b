"""What a run costs, from its config alone (no torch import): parameters, FLOPs per token, and the run's budget
(steps, tokens, FLOPs), used by training and by sweep plans.

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

import math
from dataclasses import dataclass

from attnres.config import DEFAULT_TOKENS, ConfigError, ModelConfig, RunConfig

# A budget above this is a typo (1e30 for 1e3), not a plan; refused before anything is written, since the counts it
# gives overflow run.parquet's int64 columns long before the run could end.
MAX_TOKENS = 10**15
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


def _depth_params(cfg: ModelConfig) -> int:
    d, L, queries = cfg.d_model, cfg.n_sublayers, cfg.n_sublayers + 1
    if cfg.residual == "baseline":
        return 0
    if cfg.residual == "denseformer":
        return sum(i + 2 for i in range(cfg.n_layer))  # block i averages the embedding and i + 1 block outputs
    if cfg.residual in ("hc", "mhc"):
        n = cfg.hc_streams
        return L * (n * d * (n * n + 2 * n) + 3 + 2 * n + n * n)  # phi, alpha, b_pre, b_post, b_res
    if cfg.depth_mixing == "scalar":
        sources = queries if cfg.residual == "full" else cfg.n_blocks + 1
        return queries * sources
    query = queries * d * d if cfg.depth_query == "input" else queries * d
    gain = queries * d if (cfg.key_norm and cfg.key_norm_gain) else 0
    return query + gain


def count_params(cfg: ModelConfig) -> ParamCounts:
    d, h = cfg.d_model, cfg.hidden_dim
    attention = d + 3 * d * d + d * d  # PreNorm gain, fused QKV, output projection (no biases)
    mlp = d + 2 * d * h + h * d  # PreNorm gain, fused gate+up, down projection
    return ParamCounts(
        embedding=cfg.vocab_size * d,
        lm_head=0 if cfg.tie_embeddings else cfg.vocab_size * d,
        blocks=cfg.n_layer * (attention + mlp),
        final_norm=d,
        depth_mixing=_depth_params(cfg),
    )


def depth_sources(cfg: ModelConfig) -> list[int]:
    """Number of depth-attention sources read by each sublayer's input and by the final aggregation.

    Entry l (0 <= l < L) is sublayer l's source count, entry L the final aggregation's; empty unless the
    model is Full or Block AttnRes. Block AttnRes: the completed blocks (the embedding is block 0), plus the
    current block's partial sum when the sublayer is not the first of its block. A Full AttnRes window W
    keeps the embedding and the last W outputs.
    """
    starts = cfg.block_starts
    if not starts:
        return []
    counts = []
    for layer in range(cfg.n_sublayers + 1):
        if layer == cfg.n_sublayers:
            count = 1 + len(starts)
        else:
            block = max(k for k, s in enumerate(starts) if s <= layer)
            count = 1 + block + (1 if layer > starts[block] else 0)
        if cfg.depth_window:
            count = min(count, 1 + cfg.depth_window)
        counts.append(count)
    return counts


def _depth_flops(cfg: ModelConfig) -> float:
    d, L = cfg.d_model, cfg.n_sublayers
    if cfg.residual == "denseformer":
        return sum(2 * d * (i + 2) for i in range(cfg.n_layer))
    if cfg.residual in ("hc", "mhc"):
        n = cfg.hc_streams
        per_sublayer = 2 * n * d * (n * n + 2 * n) + 2 * n * d + 2 * n * n * d + 2 * n * d  # maps, pre, res, post
        return L * per_sublayer
    sources = depth_sources(cfg)
    per_pair = 2 * d if cfg.depth_mixing == "scalar" else 4 * d  # weighted sum (+ logit)
    query = 2 * d * d * (L + 1) if cfg.depth_query == "input" else 0
    return sum(per_pair * s for s in sources) + query


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
        depth_attention=_depth_flops(cfg),
    )


def training_flops_per_token(cfg: ModelConfig) -> float:
    return count_flops(cfg).training


@dataclass(frozen=True)
class Budget:
    steps: int
    batch_tokens: int
    tokens: int  # steps x batch_tokens: what the run actually trains on
    flops_per_token: float  # training FLOPs per token (3 x forward)
    flops: float  # training FLOPs of the whole run
    params: int  # non-embedding
    params_total: int


def run_budget(cfg: RunConfig) -> Budget:
    """A token budget (or a FLOP budget converted with the FLOP counter) rounded up to whole steps."""
    per_token = training_flops_per_token(cfg.model)
    target = cfg.train.tokens
    if cfg.train.flops is not None:
        target = cfg.train.flops / per_token
    elif target is None:
        target = DEFAULT_TOKENS
    if target > MAX_TOKENS:
        given = (
            f"train.flops={cfg.train.flops:g} is {target:.3g} tokens" if cfg.train.flops else f"train.tokens={target:g}"
        )
        raise ConfigError(
            f"{given}, more than {MAX_TOKENS:.0e} (the largest published training runs read a few 1e13); give the "
            "budget of a run you mean to train"
        )
    batch_tokens = cfg.train.batch_size * cfg.model.seq_len
    if target < batch_tokens * (1 - 1e-9):
        # rounded up to one step, it trained a whole batch and then evaluated train.eval_tokens (`train.tokens=10`:
        # 4,096 tokens of training, then 138 s of evaluation): a budget this small is a typo, not a run
        given = (
            f"train.flops={cfg.train.flops:g} is {target:,.0f} tokens"
            if cfg.train.flops
            else f"train.tokens={target:g}"
        )
        raise ConfigError(
            f"{given}, less than one batch (train.batch_size {cfg.train.batch_size} x model.seq_len "
            f"{cfg.model.seq_len} = {batch_tokens:,} tokens): the run would train {batch_tokens:,} tokens in one step "
            f"and then evaluate {cfg.train.eval_tokens:,}; give a budget of at least {batch_tokens:,} tokens, or a "
            "smaller batch_size or seq_len"
        )
    steps = max(1, math.ceil(target / batch_tokens - 1e-9))
    counts = count_params(cfg.model)
    return Budget(
        steps=steps,
        batch_tokens=batch_tokens,
        tokens=steps * batch_tokens,
        flops_per_token=per_token,
        flops=steps * batch_tokens * per_token,
        params=counts.non_embedding,
        params_total=counts.total,
    )


STATE_BYTES_PER_PARAM = 16  # fp32 weights, gradients, AdamW's two moments: no setting shrinks them


def states_problem(cfg: RunConfig, available_gib: float) -> str | None:
    """Why ``cfg`` cannot train on a CPU with ``available_gib`` of memory whatever its settings (its weights,
    gradients and optimizer state alone exceed the share of it a run may take), or None. No torch: `attnres sweep
    plan` says it for every run, and `attnres train` and `sweep run` refuse such a run
    (:func:`attnres.training.memory.fit_problem`)."""
    from attnres.runtime import MEMORY_HEADROOM

    total = count_params(cfg.model).total
    states = STATE_BYTES_PER_PARAM * total
    if states <= MEMORY_HEADROOM * available_gib * 2**30:
        return None
    return (
        f"{cfg.run_id} needs at least {states / 2**30:,.1f} GiB for its weights, gradients and AdamW state alone "
        f"({total:,} parameters), more than {MEMORY_HEADROOM:.0%} of the {available_gib:.1f} GiB this machine has "
        "available (set runtime.device_memory_gb to check another); use a smaller model (model.n_layer, "
        "model.d_model) or vocabulary"
    )
