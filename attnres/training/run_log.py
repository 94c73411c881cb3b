"""Writing a run folder's parquet files (the contract of :mod:`attnres.storage.schema`) from a Lightning Callback.

Rows are kept in memory and every file is rewritten atomically at each evaluation and at the end (they are
small). On resume, rows from steps after the restored checkpoint are dropped, because those steps are
trained again; a failure before training starts leaves the rows of earlier attempts as they are. Rows are
unique per (step, split) / (step, layer, kind) / (step, query, source), the latest kept. Only global rank 0
writes; every rank computes what rank 0 writes (under FSDP the diagnostics' forward is a collective).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import pyarrow as pa

from attnres.config import RunConfig
from attnres.costs import FLOPS_CONVENTION, Budget
from attnres.data.corpus import bits_per_byte
from attnres.runtime import git_sha, now_iso, say, versions
from attnres.storage import schema


@dataclass
class RunRow:
    """The one row of run.parquet: static identity and budget, plus what changes as the run goes."""

    cfg: RunConfig
    budget: Budget
    device: str = "cpu"
    precision: str = "32-true"
    bytes_per_token: dict[str, float] = field(default_factory=lambda: {"train": 1.0, "val": 1.0})  # the manifest's
    threads: int | None = None  # torch's threads in this attempt
    blas: str | None = None  # MKL's mode (attnres.blas.in_effect)

    def row(self, **state: Any) -> dict[str, Any]:
        m = self.cfg.model
        row = {
            "schema_version": schema.SCHEMA_VERSION,
            "run_id": self.cfg.run_id,
            "sweep": self.cfg.sweep,
            "variant": m.variant,
            "n_blocks": m.effective_n_blocks,
            "block_size": m.block_size,
            "n_layer": m.n_layer,
            "d_model": m.d_model,
            "n_head": m.n_head,
            "seq_len": m.seq_len,
            "vocab_size": m.vocab_size,
            "params": self.budget.params,
            "params_total": self.budget.params_total,
            "tokens": self.budget.tokens,
            "flops": self.budget.flops,
            "flops_per_token": self.budget.flops_per_token,
            "flops_convention": FLOPS_CONVENTION,
            "lr": self.cfg.train.lr,
            "batch_tokens": self.budget.batch_tokens,
            "seed": self.cfg.train.seed,
            "max_steps": self.budget.steps,
            "device": self.device,
            "precision": self.precision,
            "threads": self.threads,
            "blas": self.blas,
            "git_sha": git_sha(),
            "versions": versions(),
            "updated_at": now_iso(),
            "status": "running",
            "step": 0,
            "tokens_seen": 0,
        }
        row.update(state)
        row["tokens_seen"] = row["step"] * self.budget.batch_tokens
        return row

    def write(self, run_dir: Path, **state: Any) -> dict[str, Any]:
        row = self.row(**state)
        schema.write_table(run_dir / schema.RUN_FILE, schema.to_table([row], schema.RUN_SCHEMA))
        return row


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    try:
        table = schema.read_table(path)
    except (schema.SchemaError, pa.ArrowException, OSError):
        return []  # written by another version or unreadable: start the log afresh
    rows = table.to_pylist()
    if path.name == schema.LAYERS_FILE and schema.file_version(table) < schema.PRE_CLIP_LAYER_GRADS:
        # a run resumed from an older version: its gradient norms were after clipping, and the file is rewritten
        # as this version's, whose norms are before; a value cannot be converted, so it is dropped
        rows = [{**row, "grad_norm": None} for row in rows]
    return rows


class RunLogger(L.Callback):
    """Collects metrics, per-layer diagnostics and depth-attention weights; writes the parquet files."""

    def __init__(self, run_dir: Path, run_row: RunRow) -> None:
        self.run_dir = Path(run_dir)
        self.run_row = run_row
        self.cfg = run_row.cfg
        self.metrics: list[dict] = []
        self.layers: list[dict] = []
        self.depth: list[dict] = []
        self.train_s = 0.0  # seconds in training steps, summed over attempts (checkpointed)
        self.eval_s = 0.0
        self._batch_t0 = self._eval_t0 = 0.0
        self._last_train_row = (0, 0.0)  # (step, train_s) of the previous train row
        self.last: dict[str, Any] = {"train_loss": None, "val_loss": None, "val_bpb": None, "eval_sets": {}}
        self._restored_step: int | None = None  # the step of the checkpoint Lightning restored, once it has
        self._reloaded = False  # whether the rows of earlier attempts are in memory

    # ---- checkpointed state: time spent so far
    def state_dict(self) -> dict[str, Any]:
        return {"train_s": self.train_s, "eval_s": self.eval_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.train_s, self.eval_s = state["train_s"], state["eval_s"]

    def bpb(self, loss: float, split: str) -> float:
        """Bits per byte of text: nats per token over the split's bytes per token (1 for byte tokens)."""
        return bits_per_byte(loss, self.run_row.bytes_per_token[split])

    @property
    def wall_s(self) -> float:
        return self.train_s + self.eval_s

    def _at(self, step: int) -> dict[str, Any]:
        tokens = step * self.run_row.budget.batch_tokens
        return {"step": step, "tokens": tokens}

    def _reload(self, step: int | None) -> None:
        """Take back the rows written by earlier attempts up to ``step`` (the restored checkpoint's; None: all)."""
        self._reloaded = True
        keep = lambda rows: [r for r in rows if step is None or r["step"] <= step]  # noqa: E731
        self.metrics = keep(read_rows(self.run_dir / schema.METRICS_FILE))
        self.layers = keep(read_rows(self.run_dir / schema.LAYERS_FILE))
        self.depth = keep(read_rows(self.run_dir / schema.DEPTH_ATTN_FILE))
        self._last_train_row = (step or 0, self.train_s)
        latest = lambda split: next((r for r in reversed(self.metrics) if r["split"] == split), {})  # noqa: E731
        train_row, val_row = latest("train"), latest("val")
        sets = {r["split"] for r in self.metrics} - {"train", "val"}
        self.last = {
            "train_loss": train_row.get("loss"),
            "val_loss": val_row.get("loss"),
            "val_bpb": val_row.get("bpb"),
            "eval_sets": {name: {k: latest(name)[k] for k in ("loss", "bpb")} for name in sorted(sets)},
        }

    # ---- hooks
    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        self._restored_step = checkpoint["global_step"]  # trainer.global_step still reads 0 until training starts

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reload(trainer.global_step)  # after any checkpoint restore

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._batch_t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.train_s += time.perf_counter() - self._batch_t0
        step = trainer.global_step
        if (batch_idx + 1) % trainer.accumulate_grad_batches:  # inside a step's gradient accumulation
            return
        if outputs is None or pl_module.diverged:  # a diverged step updated nothing: no row of it
            return
        if not (step % self.cfg.train.log_interval == 0 or step >= pl_module.steps):
            return
        loss = pl_module.step_loss
        prev_step, prev_s = self._last_train_row
        elapsed = self.train_s - prev_s
        rate = (step - prev_step) * self.run_row.budget.batch_tokens / elapsed if elapsed > 0 else None
        self._last_train_row = (step, self.train_s)
        self.last["train_loss"] = loss
        lr = pl_module.step_lr  # this step's rate: the optimizer's group holds the next step's by now
        if trainer.progress_bar_callback is None and trainer.is_global_zero:  # a batch job: a plain line instead
            say(self.log_line(step, pl_module.steps, loss, lr, rate), sys.stdout)
        self.metrics.append(
            {
                **self._at(step),
                "split": "train",
                "flops": step * self.run_row.budget.batch_tokens * self.run_row.budget.flops_per_token,
                "loss": loss,
                "bpb": self.bpb(loss, "train"),
                "lr": lr,
                "grad_norm": pl_module.grad_norm,
                "tokens_per_s": rate,
                "wall_s": self.wall_s,
            }
        )

    def log_line(self, step: int, steps: int, loss: float, lr: float, rate: float | None) -> str:
        """``step 120/777  tokens 245,760  loss 2.3412  lr 8.00e-03  tok/s 45,100  eta 30s`` (train.log)."""
        tokens = step * self.run_row.budget.batch_tokens
        speed = f"{rate:,.0f}" if rate else "-"
        eta = "-"
        if rate:
            seconds = (steps - step) * self.run_row.budget.batch_tokens / rate
            eta = (
                f"{seconds:.0f}s"
                if seconds < 90
                else f"{seconds / 60:.0f}m"
                if seconds < 5400
                else f"{seconds / 3600:.1f}h"
            )
        return f"step {step}/{steps}  tokens {tokens:,}  loss {loss:.4f}  lr {lr:.2e}  tok/s {speed}  eta {eta}"

    def on_validation_start(self, trainer, pl_module) -> None:
        self._eval_t0 = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module) -> None:
        self.eval_s += time.perf_counter() - self._eval_t0
        if trainer.sanity_checking:
            return
        step = trainer.global_step
        loss = pl_module.val_loss
        self.last.update(val_loss=loss, val_bpb=self.bpb(loss, "val"))
        self.metrics.append(self._eval_row(step, "val", loss))
        for name, set_loss in pl_module.eval_losses.items():  # data.eval_sets: a row per set, its name as the split
            self.last["eval_sets"][name] = {"loss": set_loss, "bpb": self.bpb(set_loss, name)}
            self.metrics.append(self._eval_row(step, name, set_loss))
        rec = pl_module.diagnose()  # on every rank: under FSDP its forward is a collective
        if trainer.is_global_zero:
            self._diagnostics(step, pl_module, rec)
            self.flush(trainer, status="running")

    def _eval_row(self, step: int, split: str, loss: float) -> dict[str, Any]:
        """The metrics.parquet row of an evaluation: the run's own split or an extra evaluation set."""
        return {
            **self._at(step),
            "split": split,
            "flops": step * self.run_row.budget.batch_tokens * self.run_row.budget.flops_per_token,
            "loss": loss,
            "bpb": self.bpb(loss, split),
            "lr": None,
            "grad_norm": None,
            "tokens_per_s": None,
            "wall_s": self.wall_s,
        }

    def _diagnostics(self, step: int, pl_module, rec) -> None:
        grads = pl_module.param_grad_norms
        at = self._at(step)
        n_layer = self.cfg.model.n_layer
        for i in range(n_layer):
            for j, kind in enumerate(("attn", "mlp")):
                sub = 2 * i + j
                self.layers.append(
                    {
                        **at,
                        "layer": i,
                        "sublayer": sub,
                        "kind": kind,
                        "input_rms": rec.input_rms[sub],
                        "output_rms": rec.output_rms[sub],
                        "grad_norm": grads.get(f"{kind}{i}"),
                    }
                )
            handed_on = rec.input_rms[2 * i + 2] if i + 1 < n_layer else rec.final_rms
            self.layers.append(
                {
                    **at,
                    "layer": i,
                    "sublayer": None,
                    "kind": "block",
                    "input_rms": rec.input_rms[2 * i],
                    "output_rms": handed_on,
                    "grad_norm": grads.get(f"block{i}"),
                }
            )
        in_blocks = {f"{kind}{i}" for i in range(n_layer) for kind in ("attn", "mlp", "block")}
        for name, norm in grads.items():  # the parameters outside the blocks: embedding, depth mixer, norm, head
            if name not in in_blocks:
                self.layers.append(
                    {
                        **at,
                        "layer": None,
                        "sublayer": None,
                        "kind": name,
                        "input_rms": None,
                        "output_rms": None,
                        "grad_norm": norm,
                    }
                )
        L_ = self.cfg.model.n_sublayers
        for query, weights in rec.depth_weights.items():
            kind = "final" if query == L_ else ("attn", "mlp")[query % 2]
            kinds = rec.source_kinds[query]
            for source, (w, source_kind) in enumerate(zip(weights.tolist(), kinds)):
                self.depth.append(
                    {**at, "query": query, "kind": kind, "source": source, "source_kind": source_kind, "weight": w}
                )

    def flush(self, trainer: L.Trainer, status: str, error: str | None = None) -> None:
        """Rewrite every file of the run folder from the rows in memory (atomically, file by file)."""
        if not trainer.is_global_zero:
            return
        if not self._reloaded:
            # Training never started: it failed while being set up (the files keep every row up to the checkpoint,
            # or all of them when the checkpoint was not read yet), or Lightning skipped it because the checkpoint
            # is at max_steps (a kill after the last checkpoint, before the final write).
            self._reload(self._restored_step)
        uniq = lambda rows, key: list({tuple(r[k] for k in key): r for r in rows}.values())  # noqa: E731
        self.metrics = sorted(uniq(self.metrics, ("step", "split")), key=lambda r: (r["step"], r["split"]))
        self.layers = uniq(self.layers, ("step", "layer", "kind"))
        self.depth = uniq(self.depth, ("step", "query", "source"))
        schema.write_table(self.run_dir / schema.METRICS_FILE, schema.to_table(self.metrics, schema.METRICS_SCHEMA))
        schema.write_table(self.run_dir / schema.LAYERS_FILE, schema.to_table(self.layers, schema.LAYERS_SCHEMA))
        if self.cfg.model.residual != "baseline":
            schema.write_table(
                self.run_dir / schema.DEPTH_ATTN_FILE, schema.to_table(self.depth, schema.DEPTH_ATTN_SCHEMA)
            )
        # a failure in set-up: the step the earlier attempts' logs (and so the checkpoint) reached
        step = max([trainer.global_step, *(r["step"] for r in self.metrics[-1:])])
        self.run_row.write(
            self.run_dir,
            status=status,
            step=step,
            val_loss=self.last["val_loss"],
            val_bpb=self.last["val_bpb"],
            eval_sets=json.dumps(self.last["eval_sets"], sort_keys=True) if self.last["eval_sets"] else None,
            train_loss=self.last["train_loss"],
            tokens_per_s=step * self.run_row.budget.batch_tokens / self.train_s if self.train_s > 0 else None,
            wall_s=self.wall_s,
            error=error,
        )
