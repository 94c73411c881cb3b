"""Requeue a SLURM task before its time limit (or on any SIGUSR1) from a checkpoint taken at a step boundary.

SLURM sends SIGUSR1 ``signal_delay_s`` seconds before the time limit (``--signal=USR1@N``, set by the SLURM
launcher). Lightning's own SLURM auto-requeue would save an ``hpc_ckpt`` *inside* the signal handler, in the
middle of whatever step is running, and with DDP the ranks would save at different steps. So the sweep
installs its own SIGUSR1 handler before training (Lightning then leaves the signal alone): the handler only sets
a flag, and this callback, at the end of the current training step,

1. writes ``RUN_DIR/checkpoints/hpc_ckpt_<n>.ckpt`` with Lightning's ``trainer.save_checkpoint`` (same name
   and place as Lightning's own, so ``attnres.training.run`` resumes from it), on every rank;
2. runs ``scontrol requeue <job>`` (global rank 0; the array task's id for arrays);
3. stops training; the run stays ``running`` (interrupted) until the requeued task resumes it.

With DDP the ranks agree on the flag at each step end (one boolean all-reduce), so they save together.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

from attnres.runtime import say


def slurm_job_id() -> str | None:
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return os.environ.get("SLURM_JOB_ID")


def requeue_callback() -> Any | None:
    """Install the SIGUSR1 handler and return the Lightning callback (None outside the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    import lightning as L

    class RequeueOnSignal(L.Callback):
        def __init__(self) -> None:
            self.requested = False
            self.saved: str | None = None

        def on_signal(self, signum: int, frame: Any) -> None:
            self.requested = True
            name = signal.Signals(signum).name
            try:
                say(f"received signal {name}: checkpoint and requeue at the end of this step", sys.stdout)
            except RuntimeError:  # it came in the middle of a write to stdout ("reentrant call"): the request holds
                pass

        def on_train_batch_end(
            self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            if (batch_idx + 1) % trainer.accumulate_grad_batches:  # a checkpoint holds whole steps only
                return
            if not trainer.strategy.reduce_boolean_decision(self.requested, all=False) or self.saved:
                return
            path = trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir)
            trainer.save_checkpoint(path)
            self.saved = path
            if trainer.is_global_zero:
                job = slurm_job_id()
                if job:
                    done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
                    state = "requeued" if done.returncode == 0 else f"requeue failed ({done.stderr.strip()})"
                    say(f"saved {path} at step {trainer.global_step}; job {job} {state}", sys.stdout)
            trainer.should_stop = True

    callback = RequeueOnSignal()
    signal.signal(signal.SIGUSR1, callback.on_signal)
    return callback
