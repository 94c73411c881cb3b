"""The size ladder: its rungs (:class:`Size`), the budgets they train on (:class:`BudgetSpec`), and the small
functions a grid is built from, as in the OLMo ladder: :func:`model_of_size` ("what is a model of depth n"),
:func:`tokens_for` ("how many tokens for it") and :func:`size_params` (the parameters tokens are counted on).

No torch (plans and status stay fast).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from attnres.config import ModelConfig, from_dict
from attnres.costs import count_params


@dataclass(frozen=True)
class BudgetSpec:
    """One training budget: tokens per (non-embedding) parameter of the size, a token count, or training FLOPs."""

    kind: Literal["tokens_per_param", "tokens", "flops"]
    value: float

    @property
    def label(self) -> str:
        if self.kind == "tokens_per_param":
            return f"{self.value:g} tok/param"
        if self.kind == "tokens":
            return f"{self.value:.3g} tokens"
        return f"{self.value:.3g} FLOPs"


@dataclass(frozen=True)
class Size:
    """One rung of the ladder: the model shape, plus settings that belong to this size only."""

    n_layer: int
    d_model: int
    n_head: int
    train: Mapping[str, Any] = field(default_factory=dict)
    """Per-size train.* settings (e.g. the paper's lr and batch per size)."""
    budgets: tuple[BudgetSpec, ...] | None = None
    """Per-size budgets, replacing the grid's."""
    slurm: Mapping[str, Any] = field(default_factory=dict)
    """Per-size SLURM resources, over the grid's slurm: section."""
    heads_in_name: bool = False
    """The name carries n_head too (an architecture sweep's cells share a shape with other head counts)."""

    @property
    def name(self) -> str:
        """The size's key (tuned values are stored under it): ``L<n_layer>-d<d_model>`` (``-h<n_head>`` after it
        in an architecture sweep)."""
        return f"L{self.n_layer}-d{self.d_model}" + (f"-h{self.n_head}" if self.heads_in_name else "")

    @property
    def model(self) -> dict[str, int]:
        return {"n_layer": self.n_layer, "d_model": self.d_model, "n_head": self.n_head}


def model_of_size(n_layer: int, width_per_layer: int, head_dim: int) -> dict[str, int]:
    """The model of depth ``n_layer``: width tied to depth, ``d_model ~ width_per_layer * n_layer``.

    d_model is rounded to a multiple of ``head_dim`` (at least one head), n_head = d_model / head_dim.
    """
    heads = max(1, round(width_per_layer * n_layer / head_dim))
    return {"n_layer": n_layer, "d_model": heads * head_dim, "n_head": heads}


def tokens_for(params: int, budget: BudgetSpec) -> dict[str, float | int | None]:
    """The train.* budget fields of a run of ``params`` non-embedding parameters under ``budget``.

    Tokens per parameter are counted on the size's baseline model, so every variant of a size trains on the
    same tokens (AttnRes adds a few thousand parameters; its extra FLOPs are paid in the compute axis). A FLOP
    budget is passed on as train.flops: each variant converts it to tokens with its own FLOP count.
    """
    if budget.kind == "tokens_per_param":
        return {"tokens": max(1, round(budget.value * params)), "flops": None}
    if budget.kind == "tokens":
        return {"tokens": int(budget.value), "flops": None}
    return {"tokens": None, "flops": float(budget.value)}


def size_params(defaults: Mapping[str, Any], size: Size) -> int:
    """Non-embedding parameters of the size's baseline model (what tokens per parameter are counted on), under a
    grid's ``defaults:``."""
    model = {**(defaults.get("model") or {}), **size.model, "residual": "baseline"}
    return count_params(from_dict(ModelConfig, model, "model.")).non_embedding
