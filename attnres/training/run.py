"""One training run into one run folder: validate, lock, resume or skip, train, record the status.

``train(cfg, run_dir)`` is what ``attnres train`` and every sweep launcher call. It is safe to call again on
the same folder at any time: a finished run is not trained again, an interrupted one resumes from its last
checkpoint (same data order, same result), and a run being trained by another process is left alone.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnres.config import ConfigError, RunConfig, dump_yaml, from_dict, load_yaml
from attnres.costs import Budget, run_budget
from attnres.data.corpus import (
    Corpus,
    bytes_per_token,
    check_run_data,
    load_corpus,
    val_starts,
    with_data_vocab,
)
from attnres.data.eval_sets import open_eval_sets
from attnres.data.order import epochs, repeat_fraction
from attnres.data.prepare import SPLITS
from attnres.storage import locks, schema
from attnres.storage.writable import folder_problem
from attnres.training.branches import branch_start, check_branch, keep_steps
from attnres.training.checkpoints import remove_temporaries, resume_checkpoint, verified_checkpoint_io
from attnres.training.trackers import build_tracker, check_tracker


class RunBusy(RuntimeError):
    """Another process holds this run folder's lock (it is training the run right now)."""


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    status: str  # done | diverged | failed | running (interrupted) | busy
    step: int
    val_loss: float | None
    trained: bool  # False when the run was already finished or busy


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """An exclusive, non-blocking lock on the run folder (:mod:`attnres.storage.locks`); raises :class:`RunBusy`."""
    path = run_dir / locks.TRAIN_LOCK_FILE
    with locks.exclusive(path) as ours:
        if not ours:
            raise RunBusy(f"{run_dir} is being trained by another process ({locks.holder(path)})")
        yield


def check_same_run(cfg: RunConfig, run_dir: Path) -> None:
    """A run folder belongs to one run: refuse to resume it with a different model, data or recipe."""
    path = run_dir / schema.CONFIG_FILE
    if not path.exists():
        return
    try:
        previous = from_dict(RunConfig, load_yaml(path))
    except ConfigError as err:
        raise ConfigError(
            f"{path} cannot be read as a run config ({err}); move the folder away or pick another"
        ) from None
    if previous.identity != cfg.identity:
        changed = sorted(
            f"{section}.{k}"
            for section in cfg.identity
            for k in cfg.identity[section]
            if cfg.identity[section][k] != previous.identity[section].get(k)
        )
        raise ConfigError(
            f"{run_dir} holds a different run ({', '.join(changed)} differ); "
            "train into a new folder (or delete that one to start over)"
        )


def data_record(cfg: RunConfig, corpus: Corpus, budget: Budget) -> dict[str, Any]:
    """What ``RUN_DIR/data.json`` records: the prepared folder, its tokenizer, the composition of the training
    split, the validation split and the evaluation windows, per source file, and the training order (its sampler,
    the passes it makes over the training split, and the share of the tokens it reads that it has read before)."""
    m = corpus.manifest
    starts = val_starts(len(corpus.val), cfg.model.seq_len, cfg.train.eval_tokens)
    windows = budget.steps * cfg.train.batch_size
    order = cfg.train.sampler
    return {
        "folder": str(corpus.folder),
        "source": m["source"],
        "tokenizer": m["tokenizer"],
        "vocab_size": m["vocab_size"],
        "tokens": {s: m["splits"][s]["tokens"] for s in SPLITS},
        "bytes_per_token": {s: bytes_per_token(m, s) for s in SPLITS},
        "eval_windows": {"count": len(starts), "tokens_each": cfg.model.seq_len},
        "composition": corpus.composition(starts),
        "order": {
            "sampler": order,
            "windows": windows,
            "epochs": epochs(windows, len(corpus.train), cfg.model.seq_len),
            "repeat_fraction": repeat_fraction(order, windows, len(corpus.train), cfg.model.seq_len),
        },
    }


def batch_split(cfg: RunConfig) -> tuple[int, int]:
    """(sequences per device per step, micro-batches accumulated per step); a clear error if they do not divide."""
    world = cfg.runtime.devices * cfg.runtime.num_nodes
    if cfg.train.batch_size % world:
        raise ConfigError(f"train.batch_size={cfg.train.batch_size} is not divisible by devices x num_nodes = {world}")
    per_device = cfg.train.batch_size // world
    micro = cfg.train.micro_batch_size or per_device
    if per_device % micro:
        raise ConfigError(
            f"train.micro_batch_size={micro} does not divide the per-device batch ({cfg.train.batch_size} sequences "
            f"over {world} devices = {per_device}); pick a divisor of {per_device}"
        )
    return per_device, per_device // micro


def prepare(cfg: RunConfig) -> tuple[Corpus, Budget]:
    """Everything that can fail before compute: the budget, the batch split, the tracker, the corpus, the split."""
    budget = run_budget(cfg)  # first: a typo in the budget is said before a raw corpus is prepared
    batch_split(cfg)
    check_tracker(cfg)
    check_precision(cfg)
    check_branch(cfg)
    corpus = load_corpus(cfg.data)
    # the data's limits before the memory estimate: a seq_len longer than the data is the mistake to name, not the
    # memory it would take (a raw corpus is prepared before either; its shards are kept for the next run)
    check_run_data(cfg, corpus)
    sets = open_eval_sets(cfg.data.eval_sets, corpus.folder, corpus.manifest, cfg.model.seq_len)
    check_memory(cfg)
    return dataclasses.replace(corpus, eval_sets=sets), budget


def check_precision(cfg: RunConfig) -> None:
    """runtime.precision=bf16-mixed on a GPU without bf16 is refused here, before compute."""
    from attnres.runtime import resolve_precision, uses_gpu

    resolve_precision(cfg.runtime.precision, uses_gpu(cfg.runtime))


def check_memory(cfg: RunConfig) -> None:
    """A run whose estimated peak does not fit runtime.device_memory_gb, or on CPU without it the machine's available
    memory, is refused (naming what would fit)."""
    from attnres.runtime import uses_gpu
    from attnres.training.memory import fit_problem

    problem = fit_problem(cfg, uses_gpu(cfg.runtime), cfg.runtime.devices * cfg.runtime.num_nodes)
    if problem:
        raise ConfigError(problem)


def latest_checkpoint(run_dir: Path) -> str | None:
    """The checkpoint to resume from: the newest of Lightning's last.ckpt and a SLURM pre-emption (hpc) checkpoint,
    else a kept step's, else a WSD branch's start (attnres.training.branches); a damaged one is set aside with one
    line and the next one used (:func:`attnres.training.checkpoints.resume_checkpoint`). None: from step 0."""
    return resume_checkpoint(Path(run_dir))


SRUN_HINT = ".*The `srun` command is available on your system but is not used.*"


def _quiet_lightning(cfg: RunConfig | None = None) -> None:
    # Lightning's srun hint helps one user: a multi-device run started inside a SLURM allocation without srun
    # (it would hang at the rendezvous). Anywhere else (a login node, a laptop with SLURM installed) it is noise,
    # and Lightning says it twice; so it is said once, and only there.
    multi = cfg is not None and cfg.runtime.devices * cfg.runtime.num_nodes > 1
    warnings.filterwarnings("once" if multi and "SLURM_JOB_ID" in os.environ else "ignore", message=SRUN_HINT)
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*resuming from a checkpoint that ended before the epoch ended.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*`isinstance\\(treespec, LeafSpec\\)` is deprecated.*")
    warnings.filterwarnings("ignore", message=".*GPU available but not used.*")
    warnings.filterwarnings("ignore", message=".*`training_step` returned `None`.*")  # a diverged step
    warnings.filterwarnings("ignore", message=".*Checkpoint directory .* exists and is not empty.*")  # resuming
    # DDP: val_loss is already summed over the ranks (LitLM.on_validation_epoch_end), so sync_dist would add nothing
    warnings.filterwarnings("ignore", message=".*self.log\\('val_loss', \\.\\.\\., sync_dist=True\\).*")


def progress_bar(wanted: bool) -> bool:
    """Lightning's bar where it is wanted and stderr is a terminal with a size; in a log (redirected output, a batch
    job) or on a terminal that reports 0 columns (:func:`attnres.runtime.terminal_ok`) the run writes a plain line per
    train.log_interval instead (:class:`attnres.training.run_log.RunLogger`)."""
    from attnres.runtime import terminal_ok

    return bool(wanted) and terminal_ok(sys.stderr)


def run_dir_for(cfg: RunConfig, results: str | Path) -> Path:
    """Where a run lives in a results tree: ``RESULTS/<sweep>/<run_id>``."""
    return Path(results) / cfg.sweep / cfg.run_id


def train(
    cfg: RunConfig, run_dir: str | Path, progress: bool | None = None, callbacks: Sequence[Any] = ()
) -> RunResult:
    """Train ``cfg`` into ``run_dir`` (resuming or skipping as needed) and return its final status.

    ``callbacks``: extra Lightning callbacks (e.g. Optuna pruning), added after the run's own logging.
    """
    from attnres.runtime import check_environment, check_slurm

    check_environment()  # before Lightning reads the ranks
    check_slurm(cfg.runtime)  # SLURM tasks Lightning would fail on (or train the wrong world with), before any work
    run_dir = Path(run_dir)
    if why := folder_problem(run_dir):
        raise ConfigError(f"cannot write the run folder {run_dir}: {why}; pick another --out or --results")
    cfg = with_data_vocab(cfg)
    check_same_run(cfg, run_dir)
    previous = schema.read_run_row(run_dir)
    if previous and previous["status"] == "done":
        locks.announce(run_dir, "done")  # for a rank > 0 that read the row a moment before the run finished
        return RunResult(run_dir, "done", previous["step"], previous["val_loss"], trained=False)
    corpus, budget = prepare(cfg)

    from lightning.fabric.utilities.rank_zero import rank_zero_only

    if rank_zero_only.rank != 0:  # DDP ranks > 0: no folder bookkeeping; train if (and only if) rank 0 does
        world = cfg.runtime.devices * cfg.runtime.num_nodes
        decided = locks.await_rank_zero(run_dir) if world > 1 else "train"
        if decided != "train":
            row = schema.read_run_row(run_dir) or {}
            return RunResult(run_dir, decided, row.get("step", 0), row.get("val_loss"), trained=False)
        return _fit(cfg, run_dir, corpus, budget, False, callbacks)
    try:
        with run_lock(run_dir):
            finished = schema.read_run_row(run_dir)  # it may have finished while we waited for nothing but the lock
            if finished and finished["status"] == "done":
                locks.announce(run_dir, "done")
                return RunResult(run_dir, "done", finished["step"], finished["val_loss"], trained=False)
            remove_temporaries(run_dir)  # a killed write's; we hold the lock, so nobody is writing them now
            schema.atomic_write_bytes(run_dir / schema.CONFIG_FILE, dump_yaml(cfg).encode())
            schema.atomic_write_bytes(
                run_dir / schema.DATA_FILE, json.dumps(data_record(cfg, corpus, budget), indent=1).encode()
            )
            if cfg.train.trunk_tokens is not None and latest_checkpoint(run_dir) is None:
                branch_start(cfg, run_dir)
            locks.announce(run_dir, "train")
            return _fit(cfg, run_dir, corpus, budget, progress, callbacks)
    except RunBusy:
        locks.announce(run_dir, "busy")
        return RunResult(run_dir, "busy", previous["step"] if previous else 0, None, trained=False)


def _fit(
    cfg: RunConfig, run_dir: Path, corpus: Corpus, budget: Budget, progress: bool | None, callbacks: Sequence[Any]
) -> RunResult:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from attnres import blas
    from attnres.model import compile_model
    from attnres.runtime import (
        Terminated,
        eager_fallback,
        pin_malloc,
        resolve_precision,
        torch_threads,
        uses_gpu,
    )
    from attnres.training.interval_checkpoint import IntervalCheckpoint
    from attnres.training.module import LitLM
    from attnres.training.parallel import build_strategy
    from attnres.training.run_log import RunLogger, RunRow

    _quiet_lightning(cfg)
    rt = cfg.runtime
    gpu = uses_gpu(rt)
    precision, fallback = resolve_precision(rt.precision, gpu)
    if fallback:
        warnings.warn(fallback, RuntimeWarning, stacklevel=2)
    if not gpu:
        pin_malloc()
    if rt.threads:
        threads, capped = torch_threads(rt.threads)  # capped at the cores, with one line
        if capped:
            warnings.warn(capped, RuntimeWarning, stacklevel=2)
        torch.set_num_threads(threads)
    blas_mode, threads = blas.in_effect(), torch.get_num_threads()
    if not gpu and (problem := blas.problem(blas_mode, threads)):
        warnings.warn(problem, RuntimeWarning, stacklevel=2)
    world = rt.devices * rt.num_nodes
    _, accumulate = batch_split(cfg)

    lit = LitLM(cfg, corpus, budget.steps)
    if rt.compile:
        lit.model = compile_model(lit.model, fuse_depth=gpu)
    device = torch.cuda.get_device_name() if gpu else "cpu"
    per_token = {s: bytes_per_token(corpus.manifest, s) for s in SPLITS}
    per_token |= {name: eval_set.bytes_per_token for name, eval_set in corpus.eval_sets.items()}
    run_row = RunRow(
        cfg, budget, device=device, precision=precision, bytes_per_token=per_token, threads=threads, blas=blas_mode
    )
    logger = RunLogger(run_dir, run_row)
    # One checkpoint, last.ckpt, rewritten after every evaluation: written beside it, verified, then renamed over it
    # (VerifiedCheckpointIO), so a full disk leaves the previous one whole.
    checkpoints = ModelCheckpoint(
        dirpath=run_dir / schema.CHECKPOINT_DIR,
        filename="last",
        monitor=None,
        save_top_k=1,
        save_on_train_epoch_end=False,
        enable_version_counter=False,
    )
    kept = [keep_steps(run_dir, cfg.train.save_at_steps)] if cfg.train.save_at_steps else []
    if rt.checkpoint_interval_steps or rt.checkpoint_interval_min:
        last = run_dir / schema.CHECKPOINT_DIR / "last.ckpt"
        kept.append(IntervalCheckpoint(last, logger, rt.checkpoint_interval_steps, rt.checkpoint_interval_min))
    trainer = L.Trainer(
        accelerator="gpu" if gpu else "cpu",
        devices=rt.devices,
        num_nodes=rt.num_nodes,
        strategy=build_strategy(cfg) if world > 1 else "auto",
        use_distributed_sampler=False,  # LitLM.val_dataloader splits the windows itself, without counting copies
        precision=precision,
        max_steps=budget.steps,
        max_epochs=1,  # the training stream is one pass of exactly max_steps batches
        accumulate_grad_batches=accumulate,
        # counted in micro-batches: evaluations (and their checkpoints) fall on whole steps
        val_check_interval=min(cfg.train.eval_interval, budget.steps) * accumulate,
        check_val_every_n_epoch=1,
        num_sanity_val_steps=0,
        logger=build_tracker(cfg, run_dir),
        log_every_n_steps=cfg.train.log_interval * accumulate,  # counted in micro-batches, like val_check_interval
        callbacks=[logger, *callbacks, checkpoints, *kept],
        enable_progress_bar=progress_bar(rt.progress_bar if progress is None else progress),
        enable_model_summary=False,
        default_root_dir=run_dir / schema.CHECKPOINT_DIR,
        plugins=[verified_checkpoint_io()],
    )
    if trainer.is_global_zero and not (run_dir / schema.RUN_FILE).exists():
        run_row.write(run_dir, status="running")
    try:
        try:
            with eager_fallback() if rt.compile else nullcontext():  # torch compiles on the first step
                trainer.fit(lit, ckpt_path=latest_checkpoint(run_dir))
        except BaseException as err:
            if not isinstance(err, (KeyboardInterrupt, SystemExit)):  # interrupted runs stay resumable
                logger.flush(trainer, status="failed", error=f"{type(err).__name__}: {err}")
            elif isinstance(err, SIGTERMException) and not isinstance(err, Terminated):
                # Lightning's own SIGTERM handler stops at the next step with a bare exit, status 0: said as what it is
                raise Terminated(signal.SIGTERM) from None
            elif trainer.interrupted and not isinstance(err, Terminated):
                raise KeyboardInterrupt from None  # Lightning turns Ctrl-C into a silent exit(1); the caller says it
            raise
        if lit.diverged:
            status = "diverged"
        elif trainer.global_step >= budget.steps:
            status = "done"
        else:
            status = "running"  # stopped early by a signal (e.g. SLURM pre-emption): resumable
        logger.flush(trainer, status=status, error=lit.diverged)
    finally:
        _end_process_group()
    return RunResult(run_dir, status, trainer.global_step, logger.last["val_loss"], trained=True)


def _end_process_group() -> None:
    """DDP: end the process group now. Lightning leaves it to interpreter exit, and gloo's threads then still run
    while the interpreter tears down, which can abort a process whose run finished (-6, "terminate called without
    an active exception"; seen once in a rank > 0 of the DDP test)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
