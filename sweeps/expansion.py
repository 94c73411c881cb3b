"""A grid's expansion into runs: the cross product  sizes x budgets x variants x learning rates x seeds  on top of the
grid's ``defaults:``, each run built with :func:`attnres.config.from_dict` (so its settings get the same checks and
messages as ``attnres train``), then the checks only a whole grid can fail: a Block N out of range for a size, a FLOP
budget a size cannot meet, duplicate runs.

:func:`sweeps.grid.load_grid` expands a grid once, to validate it, and keeps the runs on the :class:`Grid`;
:func:`expand_runs` gives a command the runs it plans or trains (with ``lr: tuned*``, with the tuned values), once
per command. No torch.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnres.config import ONLY_FOR, ConfigError, ModelConfig, RunConfig, apply_overrides, from_dict
from attnres.costs import run_budget
from attnres.data.corpus import with_data_vocab
from attnres.variants import Variant
from sweeps.branches import as_branches
from sweeps.ladder import BudgetSpec, Size, size_params, tokens_for
from sweeps.slurm import merge_resources
from sweeps.specs import Grid, PlannedRun
from sweeps.tuned_values import TunedValuesMissing, read_tuned, tuned_values


def expand_grid(grid: Grid, tuned: Mapping[str, Any] | None) -> list[PlannedRun]:
    """Every run of the grid. ``tuned``: the tuned-values file's content (None: placeholders, for validation)."""
    runs: list[PlannedRun] = []
    for size in grid.sizes:
        try:
            params = size_params(grid.defaults, size)
        except ConfigError as err:
            raise ConfigError(f"size {size.name}: {err}") from None
        for spec in grid.variants:
            if spec.residual == "block" and spec.n_blocks != "divisors":
                _check_n_blocks(size, grid.default_n_blocks if spec.n_blocks is None else spec.n_blocks)
        for budget in size.budgets if size.budgets is not None else grid.budgets:
            for spec in grid.variants:
                for label, residual, n_blocks in spec.for_size(size.n_layer, grid.default_n_blocks):
                    extra: dict[str, Any] = {}
                    if spec.lr is not None:
                        lrs = spec.lr
                    elif isinstance(grid.lr, str):
                        lrs: tuple[float | None, ...] = (None,)
                        if tuned is not None:
                            extra = tuned_values(
                                tuned,
                                size.name,
                                label,
                                baseline_only=grid.lr == "tuned-baseline",
                                own_only=grid.lr == "tuned-per-variant",
                            )
                    else:
                        lrs = grid.lr or (None,)
                    for lr in lrs:
                        for seed in spec.seeds or grid.seeds:
                            data = _run_data(grid, size, budget, residual, n_blocks, lr, seed, params)
                            data["model"].update(dict(spec.model))
                            data["train"].update(extra)
                            where = f"size {size.name}, variant {label}, budget {budget.label}, seed {seed}"
                            try:
                                cfg = with_data_vocab(from_dict(RunConfig, data))
                            except ConfigError as err:
                                raise ConfigError(f"{where}: {err}") from None
                            _check_flop_budget(cfg, budget, size, where)
                            runs.append(PlannedRun(cfg, size, label, budget, merge_resources(grid.slurm, size.slurm)))
    if grid.branches is not None:
        runs = as_branches(grid, runs)
    _check_duplicates(runs)
    return runs


def expand_runs(grid: Grid, results: str | Path | None = None, untuned_ok: bool = False) -> list[PlannedRun]:
    """Every run of the grid with its origin (size, variant, budget, SLURM resources): the runs it was loaded with
    (:attr:`Grid.runs`), expanded again only for ``lr: tuned*`` with tuned values it was not loaded with.

    With ``lr: tuned`` the tuned values are read from :meth:`Grid.tuned_file` under ``results`` (default
    ``./results``); a missing file or value is a :class:`ConfigError` naming the ``attnres tune`` command. With
    ``untuned_ok`` (a plan, which trains nothing) a missing file gives the runs with a stand-in lr, marked
    ``to_be_tuned``.
    """
    if not isinstance(grid.lr, str):
        return list(grid.runs)
    results = results if results is not None else "results"
    if grid.tuned_from is not None and grid.tuned_from == grid.tuned_file(results):
        return list(grid.runs)  # loaded with these tuned values
    try:
        tuned = read_tuned_values(grid, results)
    except TunedValuesMissing:
        if not untuned_ok:
            raise
        if grid.tuned_from is None:
            return list(grid.runs)  # the stand-ins it was loaded with
        return [dataclasses.replace(r, to_be_tuned=True) for r in expand_grid(grid, None)]
    try:
        return expand_grid(grid, tuned)
    except ConfigError as err:
        raise ConfigError(f"{grid.label}: {err}") from None


def read_tuned_values(grid: Grid, results: str | Path) -> dict[str, Any] | None:
    """The tuned file of a grid with ``lr: tuned*`` under ``results`` (None for a grid with rates of its own); a
    missing file is :class:`~sweeps.tuned_values.TunedValuesMissing`, which names the ``attnres tune`` to run."""
    if not isinstance(grid.lr, str):
        return None
    return read_tuned(grid.tuned_file(results), grid.lr, grid.tune_command(results), grid.name, results)


def variant_labels(grid: Grid, size: Size) -> list[str]:
    """The variant labels of the grid at one size (baseline, full, block<N>), in grid order."""
    labels: list[str] = []
    for spec in grid.variants:
        labels += [label for label, _, _ in spec.for_size(size.n_layer, grid.default_n_blocks) if label not in labels]
    return labels


def make_run(
    grid: Grid,
    size: Size,
    variant: str,
    budget: BudgetSpec,
    seed: int,
    sweep: str | None = None,
    train: Mapping[str, Any] | None = None,
) -> RunConfig:
    """One run of the grid outside its cross product (``attnres tune`` builds its trials with it).

    ``variant``: baseline, full or block<N>; ``train``: extra train.* settings, applied last.
    """
    model: dict[str, Any] = {}
    if main := Variant.parse_main(variant):
        residual, n_blocks = main.name, main.n_blocks
    else:
        specs = [s for s in grid.variants if s.name == variant]
        if not specs:
            raise ConfigError(
                f"unknown variant {variant!r}; use baseline, full, block<N> (e.g. block4) or a grid variant's name"
            )
        residual, n_blocks, model = specs[0].residual, specs[0].n_blocks, dict(specs[0].model)
    data = _run_data(grid, size, budget, residual, n_blocks, None, seed, size_params(grid.defaults, size))
    data["model"].update(model)
    data["train"].update(dict(train or {}))
    if sweep:
        data["sweep"] = sweep
    try:
        return with_data_vocab(from_dict(RunConfig, data))
    except ConfigError as err:
        raise ConfigError(f"{grid.label}: size {size.name}, variant {variant}: {err}") from None


def _run_data(
    grid: Grid,
    size: Size,
    budget: BudgetSpec,
    residual: str,
    n_blocks: int | None,
    lr: float | None,
    seed: int,
    params: int,
) -> dict[str, Any]:
    data = copy.deepcopy(dict(grid.defaults))
    model = data.setdefault("model", {})
    model.update(size.model)
    model["residual"] = residual
    for name, readers in ONLY_FOR.items():  # a grid-wide default (defaults.model.n_blocks) only where it is read
        if residual not in readers:
            model.pop(name, None)
    if n_blocks is not None:
        model["n_blocks"] = n_blocks
    train = data.setdefault("train", {})
    train.update(copy.deepcopy(dict(size.train)))
    train.update(tokens_for(params, budget))
    if lr is not None:
        train["lr"] = lr
    train["seed"] = seed
    data["sweep"] = grid.name
    return apply_overrides(data, list(grid.overrides))


def _check_n_blocks(size: Size, n: int) -> None:
    """Block N at a size, by the config's own rule (:class:`ModelConfig` checks N against the sublayers), said as
    the grid's variant and size."""
    try:
        ModelConfig(n_layer=size.n_layer, residual="block", n_blocks=n)
    except ConfigError:
        sublayers = ModelConfig(n_layer=size.n_layer).n_sublayers
        raise ConfigError(
            f"variants: block N={n} is out of range for size {size.name} (n_layer={size.n_layer}): Block AttnRes needs "
            f"1 <= N <= 2 * n_layer = {sublayers}; drop N={n} or the size"
        ) from None


FLOP_BUDGET_SLACK = 0.1  # whole steps may overshoot a FLOP budget by at most this fraction


def _check_flop_budget(cfg: RunConfig, budget: BudgetSpec, size: Size, where: str) -> None:
    """A FLOP budget (an IsoFLOP grid's) that a size cannot meet: its whole steps would overshoot it by more than
    :data:`FLOP_BUDGET_SLACK` (a budget below a few steps of that size), so the run would sit at another compute."""
    if budget.kind != "flops":
        return
    got = run_budget(cfg)
    if got.flops > (1 + FLOP_BUDGET_SLACK) * budget.value:
        raise ConfigError(
            f"{where}: the budget {budget.value:.3g} FLOPs is less than a few steps of size {size.name} (one step of "
            f"{cfg.train.batch_size} sequences is {got.flops / got.steps:.3g} FLOPs; {got.steps} step(s) would train "
            f"{got.flops:.3g}); raise the budget, or give that size its own budgets (budgets: under the size)"
        )


def _check_duplicates(runs: list[PlannedRun]) -> None:
    counts = Counter(r.run_id for r in runs)
    repeated = [r for r in runs if counts[r.run_id] > 1]
    if repeated:
        first = repeated[0]
        raise ConfigError(
            f"duplicate runs: {first.run_id} appears {counts[first.run_id]} times (size {first.size.name}, variant "
            f"{first.variant}, budget {first.budget.label}, seed {first.cfg.train.seed}); every combination of the "
            "grid must "
            "be a different run: remove the repeated variant / budget / seed / lr"
        )
