"""``attnres tune``: an Optuna search of the learning rate (optionally warm-up and AdamW beta2) per model size.

For every size of the ladder (and every variant asked for, the baseline by default) one Optuna study trains
short runs (the grid's ``tune.budget``), reports each evaluation's validation loss to Optuna through a
Lightning callback, and prunes trials that fall behind (median or hyperband pruner). The best values are
merged into the tuned file (:mod:`sweeps.tuned_values`) that a grid with ``lr: tuned`` reads.

* Trials are ordinary runs in their own sweep folder, ``RESULTS/<sweep>-tune/<run_id>``, never mixed with the
  study's runs; a pruned trial stays ``running`` there (resumable), a diverged one scores ln(vocab_size), the loss
  of a model that learned nothing, so the sampler learns to avoid its region.
* Storage: a journal file ``RESULTS/<sweep>-tune/optuna.journal`` by default (several processes on one file
  system can share it), or any Optuna RDB URL (``--storage postgresql://...``) for many workers. A study is
  named ``<sweep>/<size>/<variant>``; running ``attnres tune`` again tops each study up to ``tune.trials``
  finished trials (complete or pruned), so interrupted or parallel tuning adds up instead of starting over.
* A trial whose tuner stopped (Ctrl-C, SIGKILL, pre-emption, a lost node) stays ``RUNNING`` in the journal, which
  has no heartbeat. The next ``attnres tune`` marks it failed and enqueues its values again, so its run resumes from
  its checkpoint instead of being left half-trained while a new point is sampled (:func:`retry_abandoned`).

optuna, torch and lightning are imported when tuning starts.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnres.config import ConfigError
from attnres.storage import locks
from sweeps.expansion import make_run, variant_labels
from sweeps.ladder import Size
from sweeps.specs import Grid
from sweeps.tuned_values import check_writer, write_tuned


def storage_for(grid: Grid, results: str | Path, storage: str | None) -> Any:
    """An Optuna storage: an RDB URL as given, else a journal file (default next to the tuning runs)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    if storage and "://" in storage:
        return storage
    path = Path(storage) if storage else Path(results) / grid.tune_sweep / "optuna.journal"
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


TUNERS_DIR = ".tuners"  # RESULTS/<sweep>-tune/.tuners/<tuner>: a lock each live tuner holds (attnres.storage.locks)


def retry_abandoned(study: Any, trials_dir: Path) -> list[int]:
    """Fail the study's ``RUNNING`` trials whose tuner is gone and enqueue their values again; returns their numbers.

    A trial names its tuner (user attribute ``tuner``), and every tuner holds a lock in ``trials_dir/.tuners``
    while it lives, which the kernel releases when it dies, however it dies.
    """
    import optuna

    retried = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        tuner = trial.user_attrs.get("tuner")
        if tuner is None or locks.is_held(trials_dir / TUNERS_DIR / tuner):
            continue  # live (or asked a moment ago, before it was named)
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        retried.append(trial.number)
    return retried


def _pruner(grid: Grid):
    import optuna

    spec = grid.tune
    if spec.pruner == "none":
        return optuna.pruners.NopPruner()
    if spec.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=spec.startup_trials, n_warmup_steps=spec.warmup_steps)


def _no_pruning_before(cfg: Any, min_frac: float) -> int:
    """The first step a trial may be pruned at: after its warm-up and ``min_frac`` of its steps (a rate is ranked
    by how it trains, not by how fast a warm-up at a larger rate moves first, nor by an early lead that the decay
    takes back)."""
    from attnres.costs import run_budget
    from attnres.training.schedule import warmup_steps

    steps = run_budget(cfg).steps
    return max(warmup_steps(cfg, steps), math.ceil(min_frac * steps))


def run_schedule(grid: Grid, size: Size, label: str) -> dict[str, Any]:
    """The train.* schedule settings of the grid's runs of (size, variant) that a trial copies: the warm-up in
    tokens, the schedule and its decay (``tune.match_schedule``). For WSD branches, the branches' (a trunk is
    not what the rate is chosen for); among several budgets, the shortest run's warm-up. Read from the runs the
    grid was loaded with: the schedule does not depend on the tuned values (a searched warm-up is the trial's own)."""
    from attnres.costs import run_budget
    from attnres.training.schedule import requested_warmup

    runs = [r for r in grid.runs if r.size.name == size.name and r.variant == label and r.role != "trunk"]
    if not runs:
        return {}
    cfg = min(runs, key=lambda r: run_budget(r.cfg).tokens).cfg
    t = cfg.train
    warmup = t.warmup_tokens
    if warmup is None:
        warmup = requested_warmup(cfg, run_budget(cfg).steps) * t.batch_size * cfg.model.seq_len
    return {
        "warmup_tokens": int(warmup),
        "schedule": t.schedule,
        "wsd_decay_frac": t.wsd_decay_frac,
        "min_lr_ratio": t.min_lr_ratio,
    }


def pruning_callback(trial: Any, no_pruning_before: int = 0) -> Any:
    """A Lightning callback: report every validation loss to the trial; stop the run when Optuna prunes it, but
    never before step ``no_pruning_before`` (the run's learning-rate warm-up: learning rates are ranked by how
    they train, not by how fast a warm-up at a larger rate moves first)."""
    import lightning as L

    class OptunaPruning(L.Callback):
        def __init__(self) -> None:
            self.pruned_at: int | None = None

        def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            if trainer.sanity_checking or not math.isfinite(pl_module.val_loss):
                return
            step = trainer.global_step
            trial.report(pl_module.val_loss, step)
            if step >= no_pruning_before and trial.should_prune():
                self.pruned_at = step
                trainer.should_stop = True

    return OptunaPruning()


def tune(
    grid: Grid,
    results: str | Path,
    variants: list[str] | None = None,
    sizes: list[str] | None = None,
    trials: int | None = None,
    storage: str | None = None,
    threads: int | None = None,
    log: Callable[[str], None] = print,
    runtime: dict[str, Any] | None = None,
) -> dict[tuple[str, str], dict[str, Any]]:
    """Tune every (size, variant) and write the tuned file; returns the best values per (size, variant).

    ``runtime``: runtime.* settings every trial trains with (a SLURM tuner's device: :mod:`sweeps.tune_slurm`).

    ``variants``: labels (baseline, full, block<N>) or ``["all"]`` for every variant of the grid (the same
    tuning budget for each); default the grid's ``tune.variants`` (the baseline).
    """
    import optuna

    from attnres.runtime import CpuShare

    spec = grid.tune
    if spec.budget is None:
        raise ConfigError(
            f"{grid.label}: tune.budget is missing; add e.g. tune: {{budget: {{tokens_per_param: 2}}}} (a short budget)"
        )
    chosen = _chosen_sizes(grid, sizes)
    check_writer(grid.tuned_file(results), grid.name, grid.tune_owner)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for handler in optuna.logging.get_logger("optuna").handlers:  # on the handler: the record comes from a child
        handler.addFilter(_not_interrupted)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    store = storage_for(grid, results, storage)
    if threads is None:  # the free cores: on a busy machine more threads only wait, and spin (attnres.runtime)
        share = CpuShare.now()
        threads = share.threads(1)
        if note := share.note(1, threads):
            log(f"attnres tune: {note}")
    runtime = {**(runtime or {}), "threads": threads, "progress_bar": False}
    best: dict[tuple[str, str], dict[str, Any]] = {}
    trials_dir = Path(results) / grid.tune_sweep
    tuner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # unique even if a dead pid is reused
    alive = trials_dir / TUNERS_DIR / tuner
    with locks.exclusive(alive):  # held until this tuner returns or dies: how others tell its trials are live
        for size in chosen:
            for label in _labels(grid, size, variants):
                name = f"{grid.name}/{size.name}/{label}"
                entry = _tune_one(grid, size, label, name, store, results, runtime, tuner, trials, trials_dir, log)
                entry = _confirm_finalists(
                    grid, size, label, name, store, results, runtime, tuner, trials_dir, log, entry
                )
                if entry is None:
                    continue
                write_tuned(grid.tuned_file(results), grid.name, size.name, label, entry)
                best[(size.name, label)] = entry
                values = {k: v for k, v in entry.items() if k in spec.searched}
                log(
                    f"{name}: best "
                    + ", ".join(f"{k} {v:.4g}" for k, v in values.items())
                    + f" (val_loss {entry['val_loss']:.4f}) -> {grid.tuned_file(results)}"
                )
    alive.unlink(missing_ok=True)
    return best


WIDEN = 4.0  # a range whose best learning rate sits at its edge is extended by this factor on that side
EDGE = 0.25  # "at the edge": the best is the most extreme value tried and within this share (log lr) of the end


def sampler_for(grid: Grid, name: str) -> Any:
    """Scrambled Sobol points seeded by the study's name: an even cover of the range with the handful of trials a
    CPU affords (where TPE's random start can cluster), and different points at every size and variant (an
    unscrambled sequence tried the same 8 values everywhere)."""
    import zlib

    import optuna

    seed = zlib.crc32(f"{grid.tune.seed}/{name}".encode())
    return optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=seed, warn_independent_sampling=False)


def at_edge(lr: float, tried: list[float], low: float, high: float) -> str | None:
    """``"low"`` / ``"high"`` when the best ``lr`` is the lowest / highest value ``tried`` and lies within
    :data:`EDGE` of that end of [low, high] in log space: the loss was still falling towards the edge."""
    span = math.log(high / low)
    if lr <= min(tried) and math.log(lr / low) <= EDGE * span:
        return "low"
    if lr >= max(tried) and math.log(high / lr) <= EDGE * span:
        return "high"
    return None


def _tune_one(grid, size, label, name, store, results, runtime, tuner, trials, trials_dir, log):
    """One (size, variant): its study, then, while the best learning rate sits at an edge of the range searched,
    a study of the range beyond that edge (:data:`WIDEN` times further, at most ``tune.widen`` times, with half
    the trials); the best of all of them, with the whole range searched and how it was reached."""
    import optuna

    spec = grid.tune
    lr_range = search = tuple(spec.lr)  # all searched so far; what the next study searches
    count = trials or spec.trials
    best: dict[str, Any] | None = None
    tried: list[float] = []
    for widened in range(spec.widen + 1):
        study_name = name if widened == 0 else f"{name}/wider{widened}"
        study = optuna.create_study(
            study_name=study_name,
            storage=store,
            direction="minimize",
            load_if_exists=True,
            sampler=sampler_for(grid, study_name),
            pruner=_pruner(grid),
        )
        objective = _objective(grid, size, label, results, runtime, tuner, search)
        entry = _run_study(study, objective, count if widened == 0 else max(3, count // 2), trials_dir, spec, log)
        if entry is not None and (best is None or entry["val_loss"] < best["val_loss"]):
            best = entry
        if best is None:
            return None
        tried += [t.params["lr"] for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]
        side = at_edge(best["lr"], tried, *lr_range)
        best = {**best, "lr_range": [float(lr_range[0]), float(lr_range[1])], "widened": widened, "lr_at_edge": side}
        if side is None:
            return best
        if widened == spec.widen:
            log(
                f"warning: {name}: the best lr {best['lr']:.3g} is still at the {side} edge of the range searched "
                f"[{lr_range[0]:.3g}, {lr_range[1]:.3g}] after {widened} widening(s); the optimum may lie beyond it"
            )
            return best
        low, high = lr_range
        search = (low / WIDEN, low) if side == "low" else (high, high * WIDEN)  # only the part not searched yet
        lr_range = (min(low, search[0]), max(high, search[1]))
        log(
            f"warning: {name}: the best lr {best['lr']:.3g} is at the {side} edge of the range searched; widening it "
            f"to [{lr_range[0]:.3g}, {lr_range[1]:.3g}]"
        )
    return best


def _confirm_finalists(grid, size, label, name, store, results, runtime, tuner, trials_dir, log, best):
    """The ``tune.finalists`` best trials of the search trained again with a second seed (study
    ``<name>/finalists``, enqueued, never pruned), and the winner chosen by the mean over both seeds: one seed's
    luck does not pick the learning rate. The entry records each finalist's losses."""
    import optuna

    spec = grid.tune
    if best is None or spec.finalists < 1:
        return best
    names = [name] + [f"{name}/wider{k}" for k in range(1, int(best.get("widened", 0)) + 1)]
    complete = (optuna.trial.TrialState.COMPLETE,)
    searched = [t for n in names for t in optuna.load_study(study_name=n, storage=store).get_trials(states=complete)]
    finalists = pick_finalists(searched, spec.finalists, spec.finalist_spacing)
    second = next((s for s in grid.seeds if s != grid.seeds[0]), grid.seeds[0] + 1)
    study = optuna.create_study(
        study_name=f"{name}/finalists",
        storage=store,
        direction="minimize",
        load_if_exists=True,
        pruner=optuna.pruners.NopPruner(),
    )
    for t in finalists:
        study.enqueue_trial(t.params, user_attrs={"seed": second}, skip_if_exists=True)
    objective = _objective(grid, size, label, results, runtime, tuner, tuple(best["lr_range"]))
    log(f"{name}: the {len(finalists)} best value(s) again with seed {second}")
    _run_study(study, objective, len(finalists), trials_dir, spec, log)
    again = {t.params["lr"]: t.value for t in study.get_trials(states=complete)}
    scored = [(t, [t.value, again[t.params["lr"]]]) for t in finalists if t.params["lr"] in again]
    if not scored:
        return best
    winner, losses = min(scored, key=lambda pair: sum(pair[1]) / 2)
    return {
        **best,
        **{k: float(v) for k, v in winner.params.items()},
        "val_loss": sum(losses) / 2,
        "run_id": winner.user_attrs.get("run_id"),
        "finalists": [{"lr": float(t.params["lr"]), "val_loss": [float(x) for x in l]} for t, l in scored],
        "seeds": [grid.seeds[0], second],
    }


def pick_finalists(trials: list[Any], count: int, spacing: float) -> list[Any]:
    """The ``count`` best trials (lowest value), each at least a factor ``spacing`` in learning rate from those
    chosen before it: two rates closer than that are one rate tried twice, and a second seed of it tells nothing
    about which rate is better."""
    chosen: list[Any] = []
    for t in sorted(trials, key=lambda t: t.value):
        lr = t.params["lr"]
        if all(max(lr / c.params["lr"], c.params["lr"] / lr) >= spacing for c in chosen):
            chosen.append(t)
        if len(chosen) == count:
            break
    return chosen


def _not_interrupted(record: logging.LogRecord) -> bool:
    """Optuna logs a trial stopped by Ctrl-C or SIGTERM as failed, with a traceback; the command says it in one line
    (the trial is not counted, and the same command samples it again)."""
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, (KeyboardInterrupt, SystemExit))


def _chosen_sizes(grid: Grid, sizes: list[str] | None) -> list[Size]:
    chosen = [s for s in grid.sizes if not sizes or s.name in sizes]
    if sizes and len(chosen) != len(set(sizes)):
        unknown = sorted(set(sizes) - {s.name for s in grid.sizes})
        raise ConfigError(
            f"unknown size(s) {', '.join(unknown)}; the grid's sizes are {', '.join(s.name for s in grid.sizes)}"
        )
    return chosen


def _labels(grid: Grid, size: Size, variants: list[str] | None) -> list[str]:
    """The variant labels to tune at ``size``: those asked for (``all``: every variant of the grid)."""
    known = variant_labels(grid, size)
    if variants is None and grid.lr == "tuned-per-variant":
        variants = ["all"]  # the per-variant protocol: every variant, the same trials each
    labels = known if variants == ["all"] else list(variants or grid.tune.variants)
    for label in labels:
        if label != "baseline" and label not in known:
            raise ConfigError(f"tune: variant {label!r} is not in the grid at size {size.name} ({', '.join(known)})")
    return labels


def _objective(
    grid: Grid,
    size: Size,
    label: str,
    results: str | Path,
    runtime: dict[str, Any],
    tuner: str,
    lr_range: tuple[float, float],
):
    """Optuna's objective for one (size, variant): train the trial's run (or resume it) and return its val_loss."""
    import optuna

    from attnres.training.run import run_dir_for
    from sweeps.claim import train_claimed
    from sweeps.local_pool import with_runtime

    spec = grid.tune
    schedule = run_schedule(grid, size, label) if spec.match_schedule else {}

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("tuner", tuner)
        seed = int(trial.user_attrs.get("seed", grid.seeds[0]))  # a finalist's second seed (_confirm_finalists)
        train: dict[str, Any] = {"lr": trial.suggest_float("lr", *lr_range, log=True)}
        if spec.warmup_frac:
            train["warmup_frac"] = trial.suggest_float("warmup_frac", *spec.warmup_frac)
        if spec.beta2:
            train["beta2"] = trial.suggest_float("beta2", *spec.beta2)
        if spec.eval_interval:
            train["eval_interval"] = spec.eval_interval
        if spec.match_schedule and not spec.warmup_frac:  # a searched warm-up is the trial's own
            train = {**schedule, **train}
        cfg = make_run(grid, size, label, spec.budget, seed, sweep=grid.tune_sweep, train=train)
        cfg = with_runtime(cfg, **runtime)
        run_dir = run_dir_for(cfg, results)
        trial.set_user_attr("run_id", cfg.run_id)
        callback = pruning_callback(trial, no_pruning_before=_no_pruning_before(cfg, spec.min_prune_frac))
        outcome = train_claimed(cfg, run_dir, log_file=run_dir / "train.log", callbacks=[callback])
        if callback.pruned_at is not None:
            raise optuna.TrialPruned(f"pruned at step {callback.pruned_at}")
        if outcome.status == "diverged":
            trial.set_user_attr("diverged", True)
            return math.log(cfg.model.vocab_size)
        if outcome.status != "done" or outcome.val_loss is None:
            trial.set_user_attr("error", outcome.error or outcome.status)
            return float("nan")  # a failed trial (Optuna records it as FAIL)
        return float(outcome.val_loss)

    return objective


def _run_study(study, objective, trials: int, trials_dir: Path, spec, log) -> dict[str, Any] | None:
    """Run the trials ``study`` still needs (interrupted ones first); its best trial as a tuned entry, or None."""
    import optuna

    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    todo = trials - len(study.get_trials(deepcopy=False, states=finished))
    if todo > 0:
        log(f"tuning {study.study_name}: {todo} trial(s) of {spec.budget.label}, searching {', '.join(spec.searched)}")
        retried = retry_abandoned(study, trials_dir)  # a full study leaves them be: nothing would run them
        if retried:
            log(
                f"{study.study_name}: trial(s) {', '.join(map(str, retried))} were interrupted; their values go "
                "first, and their runs resume"
            )
        study.optimize(objective, n_trials=todo, callbacks=[optuna.study.MaxTrialsCallback(trials, states=finished)])
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not done:
        log(f"{study.study_name}: no trial finished; nothing written")
        return None
    winner = min(done, key=lambda t: t.value)
    return {
        **{k: float(v) for k, v in winner.params.items()},
        "val_loss": float(winner.value),
        "trials": len(study.get_trials(deepcopy=False)),
        "complete": len(done),
        "pruned": len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,))),
        "budget": spec.budget.label,
        "study": study.study_name,
        "run_id": winner.user_attrs.get("run_id"),
    }
