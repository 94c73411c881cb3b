"""Architecture sweeps (the paper's Fig. 7): a depth x heads grid of model shapes at one parameter count, trained at
one compute budget, instead of a ladder of sizes.

    ladder:
      architecture:
        params: 114e3                 # non-embedding parameters of every cell's baseline model
        depths: [2, 3, 4, 5]          # n_layer of each column; d_model follows from the parameter count
        heads_per_layer: [0.5, 1]     # n_head = h x n_layer rounded half up (at least 1) per row; or heads: [2, 4]
        tolerance: 0.1                # every cell's parameters, and its training compute, within 10 % (at most 0.2)

At a fixed parameter count N ~ 12 n_layer d_model^2, the paper's axes d_model / L_b and H / L_b are depth and heads
per layer: a column of cells is one depth (deeper is narrower), a row one number of heads per layer. Each cell's
d_model is the multiple of 2 n_head (whole heads of an even dimension, for RoPE) whose baseline model comes closest
to ``params``; a cell that cannot come within ``tolerance`` of it, or whose training compute under the grid's
budget strays more than ``tolerance`` from the budget's, is one error naming the cell before anything runs
(:func:`check_compute`), as are two rows that round to one head count. No torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from attnres.config import ConfigError, ModelConfig, from_dict
from attnres.costs import count_params, run_budget
from sweeps.ladder import Size
from sweeps.sections import AT_LEAST_1, POSITIVE, read_section
from sweeps.specs import PlannedRun

WHERE = "ladder.architecture."
SECTION = "ladder.architecture"
# (1 + 0.2) / (1 - 0.2) = 1.5, the factor analysis.estimates.architecture reads a sweep as one within
MAX_TOLERANCE = 0.2


@dataclass(frozen=True)
class ArchitectureSection:
    """``ladder.architecture:``: the cells of an architecture sweep."""

    params: float = field(metadata=POSITIVE)
    """Non-embedding parameters of every cell's baseline model."""
    depths: tuple[int, ...] = field(default=(), metadata=AT_LEAST_1)
    """n_layer of each column (a value or a list)."""
    heads: tuple[int, ...] = field(default=(), metadata=AT_LEAST_1)
    """n_head of each row, the same at every depth."""
    heads_per_layer: tuple[float, ...] = field(default=(), metadata=POSITIVE)
    """n_head / n_layer of each row (the paper's H / L_b): n_head = h x n_layer rounded half up, at least 1."""
    tolerance: float = field(default=0.1, metadata=POSITIVE)
    """How far (a fraction) a cell's parameters and training compute may be from the sweep's."""


@dataclass(frozen=True)
class Architecture:
    """A read ``ladder.architecture:``: its target, its tolerance and its cells (one :class:`Size` each)."""

    params: float
    tolerance: float
    cells: tuple[Size, ...]


def read_architecture(value: Any, model_defaults: Mapping[str, Any]) -> Architecture:
    """``ladder.architecture:`` (:class:`ArchitectureSection`) as its cells, each checked against the target."""
    if isinstance(value, Mapping):
        value = {
            k: ([v] if k in ("depths", "heads", "heads_per_layer") and not isinstance(v, list) else v)
            for k, v in value.items()
        }
    spec = read_section(ArchitectureSection, value, WHERE)
    if not spec.depths:
        raise ConfigError(f"{WHERE}depths is empty: list the n_layer of each column, e.g. depths: [2, 3, 4, 6]")
    if bool(spec.heads) == bool(spec.heads_per_layer):
        raise ConfigError(
            f"{SECTION}: give the rows as heads (n_head) or as heads_per_layer (n_head / n_layer), one of the two"
        )
    if spec.tolerance > MAX_TOLERANCE:
        raise ConfigError(
            f"{WHERE}tolerance {spec.tolerance:g} is more than {MAX_TOLERANCE:g}: cells that far apart in parameters "
            "or compute are not one architecture sweep (attnres fit reads a sweep as one where both stay within a "
            "factor 1.5); choose depths and heads that fit, or train them as a ladder"
        )
    if len(set(spec.depths)) != len(spec.depths):
        raise ConfigError(f"{WHERE}depths: {list(spec.depths)} lists a depth twice; list each once")
    cells = []
    for n_layer in spec.depths:
        seen: dict[int, str] = {}
        for row in spec.heads or spec.heads_per_layer:
            if spec.heads:
                n_head, row_name = int(row), f"heads {row}"
            else:
                n_head, row_name = max(1, math.floor(row * n_layer + 0.5)), f"heads_per_layer {row:g}"
            if n_head in seen:
                raise ConfigError(
                    f"{SECTION}: at n_layer {n_layer}, {seen[n_head]} and {row_name} both give {n_head} head(s); "
                    "space the rows further apart, or drop one"
                )
            seen[n_head] = row_name
            cells.append(_cell(n_layer, n_head, row_name, spec, model_defaults))
    return Architecture(spec.params, spec.tolerance, tuple(cells))


def _cell(n_layer: int, n_head: int, row: str, spec: ArchitectureSection, model_defaults: Mapping[str, Any]) -> Size:
    """The cell (n_layer, n_head) at the d_model whose baseline model comes closest to ``spec.params``."""
    step = 2 * n_head
    best: tuple[float, int, int] | None = None
    k = 1
    while True:
        d_model = k * step
        params = _params(n_layer, d_model, n_head, model_defaults)
        miss = abs(params / spec.params - 1)
        if best is None or miss < best[0]:
            best = (miss, d_model, params)
        if params > spec.params:
            break
        k += 1
    miss, d_model, params = best
    if miss > spec.tolerance:
        raise ConfigError(
            f"{SECTION}: the cell n_layer {n_layer}, {row} ({n_head} head(s)) comes closest at d_model {d_model} "
            f"with {params:,} non-embedding parameters, {100 * miss:.0f} % from params {spec.params:,.0f} (tolerance "
            f"{100 * spec.tolerance:g} %): d_model moves in steps of 2 n_head = {step}; drop that depth or head "
            f"count, or raise {WHERE}tolerance"
        )
    return Size(n_layer, d_model, n_head, heads_in_name=True)


def _params(n_layer: int, d_model: int, n_head: int, model_defaults: Mapping[str, Any]) -> int:
    model = {**model_defaults, "n_layer": n_layer, "d_model": d_model, "n_head": n_head, "residual": "baseline"}
    return count_params(from_dict(ModelConfig, model, "model.")).non_embedding


def check_compute(architecture: Architecture, runs: Iterable[PlannedRun]) -> None:
    """Every cell's training compute (its baseline's, or its first variant's) within the tolerance of its budget's
    median over the cells; one error naming the first cell that is not."""
    compute: dict[str, dict[str, float]] = {}
    for r in runs:
        if r.role == "trunk":
            continue
        per_cell = compute.setdefault(r.budget.label, {})
        if r.size.name not in per_cell or r.variant == "baseline":
            per_cell[r.size.name] = run_budget(r.cfg).flops
    for budget, values in compute.items():
        centre = sorted(values.values())[len(values) // 2]
        for cell, c in values.items():
            miss = abs(c / centre - 1)
            if miss > architecture.tolerance:
                raise ConfigError(
                    f"{SECTION}: the cell {cell} trains with {c:.3g} FLOPs at budget {budget}, {100 * miss:.0f} % "
                    f"from the cells' {centre:.3g} (tolerance {100 * architecture.tolerance:g} %): an architecture "
                    "sweep compares its cells at one compute; give a FLOP budget (budgets: [{flops: C}]), which "
                    "every cell converts to its own tokens, or raise the tolerance"
                )
