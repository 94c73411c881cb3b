"""``runtime.checkpoint_interval_steps`` / ``checkpoint_interval_min``: last.ckpt between evaluations.

The run's ModelCheckpoint rewrites ``last.ckpt`` after every evaluation; at cluster scale an evaluation interval can
be an hour of several nodes' work, which a node failure or a pre-emption without warning would lose. This callback
also writes it every N steps and/or once T minutes have passed since the last checkpoint, at the end of a whole
step (never inside a step's gradient accumulation), skipping evaluation steps (their checkpoint follows anyway).

Every rank takes part (an FSDP checkpoint gathers the shards; rank 0 writes), and rank 0's clock decides for all
(one broadcast per step), so the ranks never disagree about saving. The parquet logs are flushed first: a resumed
run keeps the rows up to its checkpoint's step and trains the rest again, so a checkpoint newer than the files on
disk would leave a gap in them, while files newer than the checkpoint only have rows to drop.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L


class IntervalCheckpoint(L.Callback):
    def __init__(self, path: Path, run_logger: Any, steps: int | None, minutes: float | None) -> None:
        self.path, self.run_logger = Path(path), run_logger
        self.steps, self.seconds = steps, None if minutes is None else 60.0 * minutes
        self._since = time.monotonic()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._since = time.monotonic()

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._since = time.monotonic()  # any checkpoint (an evaluation's, a pre-emption's) restarts the clock

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        step = trainer.global_step
        if step % pl_module.cfg.train.eval_interval == 0 or step >= pl_module.steps:
            return
        due = bool(self.steps) and step % self.steps == 0
        if self.seconds is not None:
            late = time.monotonic() - self._since >= self.seconds
            due = due or (trainer.strategy.broadcast(late) if trainer.world_size > 1 else late)
        if not due:
            return
        self.run_logger.flush(trainer, status="running")  # rank 0 only, inside
        trainer.save_checkpoint(self.path)
