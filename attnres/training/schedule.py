"""The learning-rate schedule's step arithmetic, without torch (a plan and a grid's WSD branches need it).

:func:`attnres.training.module.build_scheduler` builds the schedule itself from these.
"""

from __future__ import annotations

from attnres.config import RunConfig


def warmup_steps(cfg: RunConfig, steps: int) -> int:
    """Linear warm-up steps: ``train.warmup_tokens`` in whole steps, else ``warmup_frac`` of the steps (at most
    steps - 1)."""
    t = cfg.train
    if t.warmup_tokens is not None:
        warmup = round(t.warmup_tokens / (t.batch_size * cfg.model.seq_len))
    else:
        warmup = round(t.warmup_frac * steps)
    return min(steps - 1, warmup)


def decay_start(cfg: RunConfig, steps: int) -> int:
    """WSD: the first step of the final linear decay (steps before it run at the peak rate after warm-up); a
    branch starts from its trunk's checkpoint there."""
    rest = steps - warmup_steps(cfg, steps)
    return steps - min(rest, max(1, round(cfg.train.wsd_decay_frac * steps)))
