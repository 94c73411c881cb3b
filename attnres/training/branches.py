"""WSD cooldown branches: a stable trunk keeps checkpoints at its branches' decay starts; a branch begins there.

A trunk is a run with ``train.schedule=constant`` (warm-up, then the peak rate) in the sweep ``<sweep>-trunk``; it
keeps a checkpoint at each step of ``train.save_at_steps``. A branch is a WSD run (``schedule=wsd``) with the same
settings, the same absolute warm-up (``train.warmup_tokens``) and ``train.trunk_tokens`` naming the trunk's length:
its schedule equals the trunk's up to its :func:`~attnres.training.module.decay_start`, and the batches are a
function of the step, so training it from the trunk's checkpoint at that step is training it from step 0, minus
the shared steps. Without that checkpoint (the trunk not run, or not that far yet) the branch trains from step 0,
and says so. What the branch takes from the checkpoint: weights, AdamW state and the step; the learning-rate
scheduler's state is rebuilt for the branch's own schedule at that step (the trunk's is constant).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any

from attnres.config import RunConfig, TrainConfig
from attnres.costs import run_budget
from attnres.runtime import say
from attnres.storage import schema
from attnres.training.checkpoints import BRANCH_START, write_verified

TRUNK_SUFFIX = "-trunk"  # the sweep of a grid's trunks (not a scaling study: analysis.fitting.sweep_fits skips it)


def step_checkpoint(run_dir: Path, step: int) -> Path:
    """Where a run keeps its checkpoint of ``step`` (``train.save_at_steps``)."""
    return run_dir / schema.CHECKPOINT_DIR / f"step-{step:08d}.ckpt"


def trunk_of(cfg: RunConfig) -> RunConfig:
    """The trunk a branch starts from: the same run with the constant schedule, ``trunk_tokens`` long, in the sweep
    ``<sweep>-trunk``."""
    t = cfg.train
    defaults = TrainConfig()
    train = dataclasses.replace(
        t,
        schedule="constant",
        tokens=t.trunk_tokens,
        flops=None,
        wsd_decay_frac=defaults.wsd_decay_frac,
        min_lr_ratio=defaults.min_lr_ratio,
        trunk_tokens=None,
        save_at_steps=(),
    )
    return dataclasses.replace(cfg, sweep=cfg.sweep + TRUNK_SUFFIX, train=train)


def branch_step(cfg: RunConfig) -> int:
    """The step a branch starts from: its decay's first step."""
    from attnres.training.schedule import decay_start

    return decay_start(cfg, run_budget(cfg).steps)


def check_branch(cfg: RunConfig) -> None:
    """A branch whose decay would start beyond its trunk's end, or inside the warm-up: one clear error."""
    from attnres.config import ConfigError
    from attnres.training.schedule import requested_warmup

    if cfg.train.trunk_tokens is None:
        return
    budget, trunk = run_budget(cfg), run_budget(trunk_of(cfg))
    start = branch_step(cfg)
    if start > trunk.steps:
        raise ConfigError(
            f"{cfg.run_id}: this WSD branch ({budget.tokens:,} tokens) starts its decay at step {start}, beyond its "
            f"stable trunk's {trunk.steps} steps (train.trunk_tokens={cfg.train.trunk_tokens:,}); lengthen the trunk "
            "or lower the branch's budget"
        )
    # the shared warm-up, not clipped to this branch's steps: the branch's schedule equals its trunk's only if its
    # decay begins after the warm-up both share
    warmup = requested_warmup(cfg, budget.steps) if cfg.train.warmup_tokens is not None else 0
    if start < warmup:
        raise ConfigError(
            f"{cfg.run_id}: this WSD branch ({budget.tokens:,} tokens) would start its decay at step {start}, inside "
            f"the {warmup}-step warm-up it shares with its trunk (train.warmup_tokens={cfg.train.warmup_tokens:,}); "
            "raise its budget or shorten the warm-up"
        )


def branch_start(cfg: RunConfig, run_dir: Path) -> str | None:
    """The checkpoint a branch starts from, written into its folder from its trunk's (None: train from step 0).

    Called by rank 0 only, before training, when the branch has no checkpoint of its own.
    """
    import torch

    from attnres.training.module import build_scheduler
    from attnres.training.optimizer import saved_param_groups

    start = branch_step(cfg)
    ready = run_dir / schema.CHECKPOINT_DIR / BRANCH_START
    if ready.is_file():
        return str(ready)
    trunk = trunk_of(cfg)
    source = step_checkpoint(run_dir.parent.parent / trunk.sweep / trunk.run_id, start)
    if not source.is_file():
        say(
            f"{cfg.run_id}: no trunk checkpoint at step {start} ({source}); training the branch from step 0 (the "
            "same run, more compute)"
        )
        return None
    checkpoint = torch.load(source, map_location="cpu", weights_only=False)
    if checkpoint.get("global_step") != start:
        raise RuntimeError(f"{source} holds step {checkpoint.get('global_step')}, not {start}")
    # the branch's own schedule at its start step (the scheduler reads only its optimizer's groups' lr: stand-ins)
    groups = saved_param_groups(checkpoint["optimizer_states"][0])
    stand_in = torch.optim.SGD([{"params": [torch.zeros(1)]} for _ in groups], lr=cfg.train.lr)
    scheduler = build_scheduler(stand_in, cfg, run_budget(cfg).steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": no optimizer steps here
        for _ in range(start):
            scheduler.step()
    checkpoint["lr_schedulers"] = [scheduler.state_dict()]
    # the trunk's last step is not the branch's: its loop must not read the epoch as ended (the trunk's final
    # checkpoint says it was its last batch); and the trunk's checkpoint folder is not the branch's
    checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["is_last_batch"] = False
    checkpoint["callbacks"] = {k: v for k, v in checkpoint["callbacks"].items() if not k.startswith("ModelCheckpoint")}
    for group, lr in zip(groups, scheduler.get_last_lr()):
        group["lr"] = lr
    # verified and moved into place, as the run's own checkpoints are: a kill or a full disk part way leaves no
    # checkpoint-sized file behind, and the disk's error names this file
    write_verified(ready, lambda f: torch.save(checkpoint, f))
    say(f"{cfg.run_id}: starting from its trunk's checkpoint at step {start} ({source})")
    return str(ready)


def keep_steps(run_dir: Path, steps: tuple[int, ...]) -> Any:
    """A Lightning callback for ``train.save_at_steps``: a checkpoint of each listed step, written once (atomically)
    and kept (a trunk's branch points)."""
    from lightning.pytorch.callbacks import Callback

    class _KeepSteps(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:  # noqa: ANN001
            if (batch_idx + 1) % trainer.accumulate_grad_batches:  # inside a step's gradient accumulation
                return
            step = trainer.global_step
            path = step_checkpoint(run_dir, step)
            if step not in steps or path.exists():
                return
            tmp = path.with_suffix(".tmp")
            trainer.save_checkpoint(tmp)  # every rank (FSDP gathers); rank 0 writes
            if trainer.is_global_zero:
                os.replace(tmp, path)

    return _KeepSteps()
