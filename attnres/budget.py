"""What a run costs, from its config alone (no torch): steps, tokens, FLOPs. Used by training and by sweep plans."""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnres.config import DEFAULT_TOKENS, RunConfig
from attnres.counting import count_params, training_flops_per_token


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
    batch_tokens = cfg.train.batch_size * cfg.model.seq_len
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
