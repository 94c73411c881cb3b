"""A grid's ``branches:`` (:class:`~sweeps.specs.BranchSpec`): the expanded runs of each (size, variant, lr, seed),
one per budget, become WSD cooldown branches of one stable trunk (docs/sweeps.md, "WSD branches"). What a trunk and
a branch are, and how a branch starts from its trunk's checkpoint, is :mod:`attnres.training.branches`. No torch.
"""

from __future__ import annotations

import dataclasses

from attnres.config import ConfigError
from attnres.costs import run_budget
from sweeps.ladder import BudgetSpec, size_params, tokens_for
from sweeps.specs import Grid, PlannedRun


def as_branches(grid: Grid, runs: list[PlannedRun]) -> list[PlannedRun]:
    """``branches:``: the runs of each (size, variant, lr, seed), one per budget, become WSD branches of one trunk.

    Every branch and its trunk share the warm-up: ``warmup_frac`` of the longest branch, in tokens, capped at
    ``max_warmup_frac`` of the shortest (:class:`~sweeps.specs.BranchSpec`). The trunk
    (``schedule: constant``, in ``<sweep>-trunk``) keeps a checkpoint at each branch's decay start and runs first:
    a size's trunks, then its branches."""
    from attnres.training.branches import branch_step, check_branch, trunk_of

    spec = grid.branches
    groups: dict[tuple, list[PlannedRun]] = {}
    for run in runs:
        groups.setdefault((run.size.name, run.variant, run.cfg.train.lr, run.cfg.train.seed), []).append(run)
    trunks: dict[str, list[PlannedRun]] = {}
    branch_of: dict[int, PlannedRun] = {}  # id of the plain run -> its branch (branches keep the grid's order)
    for group in groups.values():
        first = group[0].cfg
        lengths = [run_budget(r.cfg).tokens for r in group]
        warmup = round(first.train.warmup_frac * max(lengths))
        if spec.max_warmup_frac is not None:
            warmup = min(warmup, round(spec.max_warmup_frac * min(lengths)))
        made = []
        for run in group:
            train = dataclasses.replace(
                run.cfg.train, schedule="wsd", wsd_decay_frac=spec.decay_frac, warmup_tokens=warmup
            )
            made.append(dataclasses.replace(run, cfg=dataclasses.replace(run.cfg, train=train), role="branch"))
        starts = sorted({branch_step(r.cfg) for r in made})
        if spec.stable is not None:
            params = size_params(grid.defaults, group[0].size)
            stable = dataclasses.replace(
                first, train=dataclasses.replace(first.train, **tokens_for(params, spec.stable))
            )
            trunk_tokens = run_budget(stable).tokens
        else:
            trunk_tokens = starts[-1] * run_budget(first).batch_tokens
        for i, run in enumerate(made):
            train = dataclasses.replace(run.cfg.train, trunk_tokens=trunk_tokens)
            made[i] = dataclasses.replace(run, cfg=dataclasses.replace(run.cfg, train=train))
            try:
                check_branch(made[i].cfg)
            except ConfigError as err:
                raise ConfigError(
                    f"size {run.size.name}, variant {run.variant}, budget {run.budget.label}: {err}"
                ) from None
        trunk = trunk_of(made[0].cfg)
        trunk = dataclasses.replace(trunk, train=dataclasses.replace(trunk.train, save_at_steps=tuple(starts)))
        budget = BudgetSpec("tokens", float(trunk_tokens))
        trunks.setdefault(group[0].size.name, []).append(
            dataclasses.replace(group[0], cfg=trunk, budget=budget, role="trunk")
        )
        branch_of.update((id(r), b) for r, b in zip(group, made))
    ordered = []
    for size in trunks:
        ordered += trunks[size] + [branch_of[id(r)] for r in runs if r.size.name == size]
    return ordered
