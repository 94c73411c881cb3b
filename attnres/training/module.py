"""The thin LightningModule around :class:`AttnResLM`: loss, optimizer, schedule, data, diagnostics.

Parquet logging lives in :mod:`attnres.training.run_log` (a Callback); run orchestration (folders, resume, status) in
:mod:`attnres.training.run`.
"""

from __future__ import annotations

import math
import time

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.lr_scheduler import ConstantLR, CosineAnnealingLR, LinearLR, LRScheduler, SequentialLR
from torch.utils.data import DataLoader, TensorDataset

from attnres.config import RunConfig
from attnres.data.corpus import Corpus, TrainBatches, val_windows
from attnres.mixers import Recorder
from attnres.mixers.base import norm
from attnres.model import AttnResLM
from attnres.training.optimizer import build_optimizer
from attnres.training.parallel import full_value, is_sharded, local_part
from attnres.training.schedule import decay_start, warmup_steps
from attnres.training.state_names import eager_names

DIAGNOSTIC_WINDOWS = 8  # validation windows the per-layer diagnostics are measured on


def rank_windows(windows: np.ndarray, rank: int, world: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s evaluation windows (every ``world``-th, from its own) and which of them count.

    Every rank gets the same number of windows, because under FSDP every rank must run the same forwards; the
    last ranks' spare places hold copies of window 0 that do not count, so the validation loss is that of exactly
    the run's windows whatever the world size (a padding sampler would count the copies). One device: the
    windows as they are, all counted.
    """
    per_rank = -(-len(windows) // world)
    index = np.arange(rank, per_rank * world, world)
    counted = index < len(windows)
    return windows[np.where(counted, index, 0)], counted


def build_scheduler(opt: torch.optim.Optimizer, cfg: RunConfig, steps: int) -> LRScheduler:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr`` (the paper's), warm-up, stable, linear decay
    (WSD), or warm-up and the peak rate to the end (constant: a WSD trunk).

    The learning rate of step k (0-based) is ``lr * (k + 1) / W`` during the W warm-up steps and, but for
    constant, reaches the floor at the last step. A WSD branch and its trunk share W (``warmup_tokens``), so the
    two schedules are the same up to the branch's :func:`decay_start`.
    """
    t = cfg.train
    warmup = warmup_steps(cfg, steps)
    rest = steps - warmup
    phases: list[tuple[LRScheduler, int]] = []
    if warmup > 0:
        phases.append(
            (LinearLR(opt, start_factor=1.0 / warmup, end_factor=1.0, total_iters=max(1, warmup - 1)), warmup)
        )
    if t.schedule == "cosine":
        phases.append((CosineAnnealingLR(opt, T_max=max(1, rest - 1), eta_min=t.min_lr_ratio * t.lr), rest))
    elif t.schedule == "constant":
        phases.append((ConstantLR(opt, factor=1.0, total_iters=rest), rest))
    else:
        decay = steps - decay_start(cfg, steps)
        if rest > decay:
            phases.append((ConstantLR(opt, factor=1.0, total_iters=rest - decay), rest - decay))
        phases.append(
            (LinearLR(opt, start_factor=1.0, end_factor=t.min_lr_ratio, total_iters=max(1, decay - 1)), decay)
        )
    if len(phases) == 1:
        return phases[0][0]
    milestones = np.cumsum([length for _, length in phases[:-1]]).tolist()
    return SequentialLR(opt, [s for s, _ in phases], milestones=milestones)


def lm_loss(model: nn.Module, batch: Tensor, reduction: str = "mean", rows: Tensor | None = None) -> Tensor:
    """Next-token cross-entropy of (B, T + 1) tokens, in fp32 whatever the logits' dtype. ``rows`` (B,) bool: the
    rows that count (the model still runs on every row: under FSDP every rank must run the same forwards)."""
    logits = model(batch[:, :-1])
    targets = batch[:, 1:]
    if rows is not None and not bool(rows.all()):
        logits, targets = logits[rows], targets[rows]
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction=reduction)


def param_group(name: str) -> str:
    """The group a parameter's gradient norm is logged under, from its name in :class:`AttnResLM`: ``attn{i}`` /
    ``mlp{i}`` for the sublayers of block i, else :func:`outer_group`'s."""
    parts = name.split(".")
    if parts[0] == "blocks" and len(parts) > 2:
        return f"{parts[2]}{parts[1]}"
    return outer_group(name)


# the parameters outside the transformer blocks, by their module in AttnResLM: the layers.parquet kind of each
OUTER_GROUPS = {"embed": "embedding", "depth": "depth", "final_norm": "final_norm", "lm_head": "head"}


def outer_group(name: str) -> str:
    """``embedding`` (a tied head's weight too), ``depth`` (the depth mixer's pseudo-queries, gains, mixing
    weights), ``final_norm``, ``head`` (an untied output projection); a module this list does not know keeps its
    own name, so no parameter is left out of the norms."""
    top = name.split(".")[0]
    return OUTER_GROUPS.get(top, top)


class LitLM(L.LightningModule):
    def __init__(self, cfg: RunConfig, corpus: Corpus, steps: int) -> None:
        super().__init__()
        self.cfg, self.corpus, self.steps = cfg, corpus, steps
        with torch.random.fork_rng():  # the initialisation is a function of the seed alone
            torch.manual_seed(cfg.train.seed)
            self.model = AttnResLM(cfg.model)
        self.model.checkpointing = cfg.runtime.checkpointing == "sublayer"
        self.diverged: str | None = None
        self.grad_norm = math.nan
        # per sublayer, block and group outside the blocks, before clipping, at evaluation steps
        self.param_grad_norms: dict[str, float] = {}
        self._val_sum = self._val_count = None
        self.eval_losses: dict[str, float] = {}  # data.eval_sets: each set's loss at the last evaluation
        self._last_time: float | None = None
        self.step_loss = math.nan  # mean training loss of the last complete step (over its micro-batches and ranks)
        # the schedule's rate that step's update used (group 0's); the optimizer's own group reads the next step's
        # once the scheduler has stepped, which is when the step's row is logged
        self.step_lr = math.nan
        self._step_loss_sum: Tensor | None = None  # this rank's micro-batch losses of the step so far (fp64, on device)
        self._micro_count = self._step_tokens = 0
        self._sharded = False

    # ------------------------------------------------------------------------------------------ data
    def train_dataloader(self) -> TrainBatches:
        # Batches are a function of the global step, so a resumed run continues at exactly its step.
        batches = TrainBatches(
            self.corpus.train,
            self.cfg.train.batch_size,
            self.cfg.model.seq_len,
            self.cfg.train.seed,
            self.steps,
            rank=self.global_rank,
            world=self.trainer.world_size,
            micro=self.cfg.train.micro_batch_size,
            sampler=self.cfg.train.sampler,
        )
        batches.step = self.trainer.global_step
        return batches

    def val_windows(self) -> np.ndarray:
        return val_windows(self.corpus.val, self.cfg.model.seq_len, self.cfg.train.eval_tokens)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        """The run's validation windows, then (as more loaders) those of each ``data.eval_sets`` set, chosen alike."""
        per_device = max(1, self.cfg.train.batch_size // self.trainer.world_size)
        per_device = min(per_device, self.cfg.train.micro_batch_size or per_device)  # what fits in training fits here
        seq_len, eval_tokens = self.cfg.model.seq_len, self.cfg.train.eval_tokens
        sets = [self.val_windows()]
        sets += [val_windows(s.tokens, seq_len, eval_tokens) for s in self.corpus.eval_sets.values()]
        loaders = []
        for all_windows in sets:
            windows, counted = rank_windows(all_windows, self.global_rank, self.trainer.world_size)
            dataset = TensorDataset(torch.from_numpy(windows), torch.from_numpy(counted))
            loaders.append(DataLoader(dataset, batch_size=per_device))
        return loaders if len(loaders) > 1 else loaders[0]

    # -------------------------------------------------------------------------------------- training
    def configure_model(self) -> None:
        """runtime.strategy=fsdp: shard the model (Lightning calls this on every rank before the optimizer exists)."""
        from lightning.pytorch.strategies import ModelParallelStrategy

        if isinstance(self.trainer.strategy, ModelParallelStrategy) and not self._sharded:
            from attnres.training.parallel import shard_model

            bf16 = self.trainer.precision == "bf16-mixed" and self.cfg.runtime.fsdp_mixed_precision
            shard_model(self.model, self.device_mesh["data_parallel"], bf16_params=bf16)
            self._sharded = True

    def loss(self, batch: Tensor, reduction: str = "mean", rows: Tensor | None = None) -> Tensor:
        return lm_loss(self.model, batch, reduction, rows)

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        """One micro-batch's loss. No host sync and no collective here: the loss is added up on the device, and
        :meth:`on_before_optimizer_step` reads the step's once (finite or not, and the logged mean)."""
        loss = self.loss(batch)
        # the step's loss is the mean of its micro-batches' (equal sizes): what a one-shot step would have computed;
        # summed in fp64, as float() summed them before, so the logged mean has the same bits
        micro = loss.detach().double()
        self._step_loss_sum = micro if self._micro_count == 0 else self._step_loss_sum + micro
        self._micro_count += 1
        self._step_tokens += batch.shape[0] * (batch.shape[1] - 1)
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Once per optimizer step, after its last backward: the step's loss (one all-reduce over the ranks), the
        gradient norm and clipping, and one host sync for both. A non-finite loss on any rank (NaN and inf survive
        the all-reduce's sum, so every rank sees it) stops the run with this step's update dropped: the weights
        and optimizer state stay the last finite step's."""
        step_loss = self._step_loss_sum / self._micro_count
        tokens = self._step_tokens * self.trainer.world_size
        self._step_loss_sum, self._micro_count, self._step_tokens = None, 0, 0
        if self.trainer.world_size > 1:  # every rank trained on its share of the batch: the global batch's mean
            # torch's all-reduce itself: Lightning's strategy.reduce puts a barrier before it (a second collective)
            torch.distributed.all_reduce(step_loss)
            step_loss = step_loss / self.trainer.world_size
        self.scale_lrs(optimizer)
        self.step_lr = optimizer.param_groups[0]["lr"]
        if self._next_step_is_eval():  # before clipping, like grad_norm: clipping scales every group by one factor
            self.param_grad_norms = self._param_grad_norms()
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.cfg.train.grad_clip if self.cfg.train.grad_clip > 0 else math.inf
        # the norm before clipping; under FSDP the gradients are DTensor shards and torch takes the global norm
        grad_norm = full_value(torch.nn.utils.clip_grad_norm_(params, clip))
        self.step_loss, self.grad_norm = torch.stack([step_loss, grad_norm.double()]).tolist()  # the host sync
        if not math.isfinite(self.step_loss):
            self.diverged = f"non-finite training loss at step {self.global_step + 1}"
            self.trainer.should_stop = True
            optimizer.zero_grad(set_to_none=True)  # the optimizer skips parameters without a gradient: no update
            return
        self.log("loss", self.step_loss, prog_bar=True)  # trackers: the step's loss, as metrics.parquet has it
        now = time.perf_counter()
        if self._last_time is not None:
            self.log("tok_s", tokens / (now - self._last_time), prog_bar=True)
        self._last_time = now

    @staticmethod
    def scale_lrs(optimizer: torch.optim.Optimizer) -> None:
        """The depth mixer's groups at ``lr_scale`` times the schedule's learning rate (group 0's) for this step;
        the scheduler's own value for them is overwritten, so the scale holds through warm-up, decay and resume."""
        lr = optimizer.param_groups[0]["lr"]
        for group in optimizer.param_groups:
            if "lr_scale" in group:
                group["lr"] = lr * group["lr_scale"]

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        # Lightning validates every eval_interval steps; make sure the last step is evaluated too.
        if self.global_step >= self.steps:
            self.trainer.should_stop = True

    def _next_step_is_eval(self) -> bool:
        step = self.global_step + 1
        return step % self.cfg.train.eval_interval == 0 or step >= self.steps

    @torch.no_grad()
    def _param_grad_norms(self) -> dict[str, float]:
        """L2 norm of the parameter gradients of every sublayer (``attn{i}``, ``mlp{i}``) and transformer block
        (``block{i}``), and of each group of parameters outside the blocks (:func:`outer_group`): together, every
        parameter once, so the sublayers' and the outer groups' norms combine to the global norm."""
        squares: dict[str, Tensor] = {}
        for name, p in self.model.named_parameters():  # a tied head is the embedding's parameter, listed once
            if p.grad is not None:
                group = param_group(name)
                # float64: the squares of small gradients, summed over many parameters, combine to 1e-6 and better
                square = norm(local_part(p.grad)) ** 2  # fp64, the same bits whatever the threads
                squares[group] = squares[group] + square if group in squares else square
        names = list(squares)
        total = torch.stack([squares[n] for n in names]) if names else torch.zeros(0, dtype=torch.float64)
        if any(is_sharded(p.grad) for p in self.model.parameters() if p.grad is not None):
            # FSDP: each rank holds a shard of every gradient; the squares of the shards sum to the whole's
            total = self.trainer.strategy.reduce(total.to(self.device), reduce_op="sum")
        by_group = dict(zip(names, total.tolist()))
        norms = {name: math.sqrt(value) for name, value in by_group.items()}
        for i in range(len(self.model.blocks)):
            norms[f"block{i}"] = math.sqrt(by_group.get(f"attn{i}", 0.0) + by_group.get(f"mlp{i}", 0.0))
        return norms

    # ------------------------------------------------------------------------------------ validation
    def on_validation_epoch_start(self) -> None:
        n = 1 + len(self.corpus.eval_sets)  # the run's own split, then each extra set
        self._val_sum = torch.zeros(n, dtype=torch.float64, device=self.device)
        self._val_count = torch.zeros(n, dtype=torch.float64, device=self.device)

    def validation_step(self, batch: list[Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        windows, counted = batch
        self._val_sum[dataloader_idx] += self.loss(windows, reduction="sum", rows=counted).double()
        self._val_count[dataloader_idx] += windows[counted, 1:].numel()

    def on_validation_epoch_end(self) -> None:
        total = self.trainer.strategy.reduce(self._val_sum, reduce_op="sum")
        count = self.trainer.strategy.reduce(self._val_count, reduce_op="sum")
        losses = (total / count).tolist()
        self.val_loss = losses[0]
        self.eval_losses = dict(zip(self.corpus.eval_sets, losses[1:]))
        self.log("val_loss", self.val_loss, prog_bar=True, sync_dist=False)

    @torch.no_grad()
    def diagnose(self) -> Recorder:
        """Per-sublayer magnitudes and depth-attention weights on a fixed slice of the validation set. Every rank
        runs it (under FSDP the forward gathers parameters from all ranks); rank 0 writes what it records."""
        windows = torch.from_numpy(self.val_windows()[:DIAGNOSTIC_WINDOWS]).to(self.device)
        recorder = Recorder()
        model = self.model
        was_training = model.training
        model.eval()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.trainer.precision == "bf16-mixed"):
            # the eager call, hooks (FSDP's) included: runtime.compile compiles the model whole, in place, and the
            # recorder's .item() calls would break its graph (on GPU, Full / Block's compiled sublayers stay compiled:
            # they record nothing)
            model._call_impl(windows[:, :-1], recorder=recorder)
        model.train(was_training)
        return recorder

    # ----------------------------------------------------------------------------------- checkpoints
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # before the weights are loaded: a checkpoint of an earlier version's compiled baseline has _orig_mod. names
        if "state_dict" in checkpoint:
            checkpoint["state_dict"] = eager_names(checkpoint["state_dict"])

    # ------------------------------------------------------------------------------------- optimizer
    def configure_optimizers(self) -> dict:
        opt = build_optimizer(self.model, self.cfg.train)
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": build_scheduler(opt, self.cfg, self.steps), "interval": "step"},
        }
