"""The learning-rate schedule's step arithmetic, without torch (a plan and a grid's WSD branches need it).

:func:`attnres.training.module.build_scheduler` builds the schedule itself from these.
"""

from __future__ import annotations

from attnres.config import RunConfig


def requested_warmup(cfg: RunConfig, steps: int) -> int:
    """The warm-up asked for, in steps: ``train.warmup_tokens`` in whole steps, else ``warmup_frac`` of the steps."""
    t = cfg.train
    if t.warmup_tokens is not None:
        return round(t.warmup_tokens / (t.batch_size * cfg.model.seq_len))
    return round(t.warmup_frac * steps)


def warmup_steps(cfg: RunConfig, steps: int) -> int:
    """Linear warm-up steps: :func:`requested_warmup`, at most steps - 1."""
    return min(steps - 1, requested_warmup(cfg, steps))


def decay_start(cfg: RunConfig, steps: int) -> int:
    """WSD: the first step of the final linear decay (steps before it run at the peak rate after warm-up); a
    branch starts from its trunk's checkpoint there."""
    rest = steps - warmup_steps(cfg, steps)
    return steps - min(rest, max(1, round(cfg.train.wsd_decay_frac * steps)))
