"""What a fit found, as frozen result types: ``FitReport.to_dict()`` is exactly what fit.json holds (its schema in
docs/analysis.md), and ``analysis.format_report(report)`` is what ``attnres fit`` prints. No computation here beyond
the properties of a result; the pipeline that makes them is :mod:`analysis.fitting.sweep_fits`, the diagnostics
:mod:`analysis.fitting.diagnostics`.

Pure Python; never imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis.base.bootstrap import Estimate, json_number
from analysis.data.envelope import Envelopes
from analysis.data.environment import fit_environment
from analysis.data.load import Problem
from analysis.data.stalls import Stall
from analysis.estimates.architecture import ArchitectureGrid
from analysis.estimates.depth import DepthTrend
from analysis.estimates.frontier import FrontierMultiplier
from analysis.estimates.local import LocalMultiplier
from analysis.estimates.one_shape import ShapeComparison
from analysis.estimates.paired import PairedMultiplier
from analysis.estimates.study import BUDGETS
from analysis.fitting.checks import MissingSeeds
from analysis.fitting.sensitivity import Sensitivity
from analysis.fitting.settings import UNIT_NAMES, FitSettings
from analysis.laws.fit import ChinchillaFit, JointPowerLawFit, PowerLawFit
from attnres.variants import Variant

FORMAT = "attnres-fit/1"

LACK_OF_FIT_P = 0.01  # a lack-of-fit p-value below this: the law misses its budgets beyond the seed noise


@dataclass(frozen=True)
class CurvePoint:
    """One fitted point: its compute (in the report's unit), loss and the runs behind it."""

    compute: float
    loss: float
    n_runs: int
    run_ids: tuple[str, ...]
    params: float
    tokens: float
    flops_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "compute": json_number(self.compute),
            "loss": json_number(self.loss),
            "n_runs": self.n_runs,
            "run_ids": list(self.run_ids),
            "params": json_number(self.params),
            "tokens": json_number(self.tokens),
            "flops_per_s": json_number(self.flops_per_s),
        }


@dataclass(frozen=True)
class CurveResult:
    """A curve's power-law fit (intervals from the report's shared bootstrap) and its points. ``curve``: its name
    (``block-N4``), ``variant``: the runs' variant column (``block``), ``curve_variant``: the variant the curve
    stands for, with Block AttnRes's N (what the reports show; fit.json keeps the two names)."""

    curve: str
    variant: str
    curve_variant: Variant
    fit: PowerLawFit
    points: tuple[CurvePoint, ...]

    @property
    def n_runs(self) -> int:
        return sum(p.n_runs for p in self.points)

    def to_dict(self) -> dict[str, Any]:
        return {
            "curve": self.curve,
            "variant": self.variant,
            **self.fit.to_dict(),
            "n_runs": self.n_runs,
            "points": [p.to_dict() for p in self.points],
        }


@dataclass(frozen=True)
class ExponentTest:
    """Do the variant's and the baseline's exponents differ? alpha_var - alpha_base from the separate fits,
    its bootstrap interval (at the table's level), the two-sided bootstrap p-value, and ``differ``: the 99% interval
    excludes 0 (``EXPONENT_TEST_LEVEL``)."""

    difference: Estimate
    p_value: float
    differ: bool

    def to_dict(self) -> dict[str, Any]:
        return {"difference": self.difference.to_dict(), "p_value": json_number(self.p_value), "differ": self.differ}


@dataclass(frozen=True)
class LackOfFit:
    """Does a curve's law miss its budgets by more than its seeds' noise explains?

    ``rms``: RMS of the budget-level residuals of the fit (log loss, ~relative); ``seed_se``: RMS standard
    error of a budget's mean from the spread of its seeds (nan with one seed per budget);
    ``F = (sum r^2 / (K - p)) / mean(s^2 / m)`` on (K - p, sum(m - 1)) degrees of freedom, and its p-value.
    """

    rms: float
    seed_se: float
    F: float
    p_value: float

    @property
    def significant(self) -> bool:
        return bool(self.p_value < LACK_OF_FIT_P)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rms": json_number(self.rms),
            "seed_se": json_number(self.seed_se),
            "F": json_number(self.F),
            "p_value": json_number(self.p_value),
        }


@dataclass(frozen=True)
class BudgetGap:
    """The variant's mean loss minus the baseline's at one budget (no fitted law needed).

    Paired over the seeds both have at this budget (``paired``: the same seeds, i.e. the same init of shared
    parameters and the same batches, so the difference of each seed cancels what they share); otherwise the
    difference of the two means. ``gap`` in nats, ``gap_pct`` in % of the baseline's mean loss, each with a
    bootstrap interval over seeds (pairs resampled; with m seeds, deviations scaled by sqrt(m / (m - 1)) and
    the expanded percentile on m - 1 degrees of freedom, so with 2 seeds the interval is the range of what
    2 seeds can give: read it as rough).
    """

    compute: float
    baseline_compute: float
    n_seeds: int
    paired: bool
    gap: Estimate
    gap_pct: Estimate

    def to_dict(self) -> dict[str, Any]:
        return {
            "compute": json_number(self.compute),
            "baseline_compute": json_number(self.baseline_compute),
            "n_seeds": self.n_seeds,
            "paired": self.paired,
            "gap": self.gap.to_dict(),
            "gap_pct": self.gap_pct.to_dict(),
        }


@dataclass(frozen=True)
class BudgetMultiplier:
    """M at one measured budget of the variant: the baseline fit inverted at the variant's measured loss."""

    compute: float
    loss: float
    n_runs_variant: int
    n_runs_baseline: int
    multiplier: Estimate
    wall_clock: Estimate
    throughput_ratio: float
    # against the baseline's law fitted to its nearest budgets (analysis.estimates.local)
    local: LocalMultiplier | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "compute": json_number(self.compute),
            "loss": json_number(self.loss),
            "n_runs_variant": self.n_runs_variant,
            "n_runs_baseline": self.n_runs_baseline,
            "multiplier": self.multiplier.to_dict(),
            "local": None if self.local is None else self.local.to_dict(),
            "wall_clock": self.wall_clock.to_dict(),
            "throughput_ratio": json_number(self.throughput_ratio),
        }


@dataclass(frozen=True)
class OtherProtocol:
    """A variant's headline under the tuning protocol the fit was not asked for, from the same runs (a grid that
    swept rates): the paper's (every variant at the baseline's best rate) or the per-variant one."""

    protocol: str
    multiplier: Estimate
    exponent: str
    reliable: bool
    paired: PairedMultiplier | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "multiplier": self.multiplier.to_dict(),
            "exponent": self.exponent,
            "reliable": self.reliable,
            "paired": None if self.paired is None else self.paired.to_dict(),
        }


@dataclass(frozen=True)
class ProtocolCell:
    """One (variant, size, budget) under both protocols: its own best rate and loss, the baseline's best rate and
    the variant's loss there, and what the paper's protocol costs it (% of its own loss)."""

    curve: str
    curve_variant: Variant  # the variant ``curve`` stands for, with Block AttnRes's N
    n_layer: int
    d_model: int
    tokens: float
    own_lr: float
    own_loss: float
    baseline_lr: float
    loss_at_baseline_lr: float
    edge: str  # the own minimum's envelope edge flag ("" inside the swept rates)

    @property
    def size(self) -> str:
        return f"L{self.n_layer}-d{self.d_model}"

    @property
    def cost_pct(self) -> float:
        return 100 * (self.loss_at_baseline_lr / self.own_loss - 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "curve": self.curve,
            "size": self.size,
            "tokens": json_number(self.tokens),
            "own_lr": json_number(self.own_lr),
            "own_loss": json_number(self.own_loss),
            "baseline_lr": json_number(self.baseline_lr),
            "loss_at_baseline_lr": json_number(self.loss_at_baseline_lr),
            "cost_pct": json_number(self.cost_pct),
            "edge": self.edge,
        }


@dataclass(frozen=True)
class VariantMultiplier:
    """Everything about one variant against the baseline.

    ``multiplier`` is the headline: M at the variant's largest budget ``compute``, from the joint fit with a
    shared exponent (``exponent == "shared"``) or from the separate fits (``"unshared"``); both are kept.
    ``variant`` is the variant's curve name (as in fit.json), ``curve_variant`` the variant it stands for, with
    Block AttnRes's N.
    """

    variant: str
    curve_variant: Variant
    baseline: str
    exponent: str
    exponent_reason: str
    exponent_test: ExponentTest
    compute: float
    multiplier: Estimate
    multiplier_shared: Estimate | None
    multiplier_unshared: Estimate
    wall_clock: Estimate
    throughput_ratio: float
    budgets: tuple[BudgetMultiplier, ...]
    n_runs_variant: int
    n_runs_baseline: int
    n_boot_failed: int
    baseline_status: str
    variant_status: str
    joint_status: str | None
    interval: str = BUDGETS
    reliable: bool = True
    why: str = ""
    lack_of_fit: Mapping[str, LackOfFit] = field(default_factory=dict)
    gaps: tuple[BudgetGap, ...] = ()
    sensitivity: Sensitivity | None = None  # M under other analysis choices (analysis.fitting.sensitivity)
    # M per size from paired losses, t-interval over sizes (analysis.estimates.paired)
    paired: PairedMultiplier | None = None
    without_stalls: Estimate | None = None  # the headline refitted without the flagged runs (analysis.data.stalls)
    other_protocol: OtherProtocol | None = None  # the headline under the other tuning protocol, from the same runs
    # the paired gap's trend with depth on a fixed-width ladder (analysis.estimates.depth)
    depth: DepthTrend | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "variant": self.variant,
            "interval": self.interval,
            "reliable": self.reliable,
            "why": self.why,
            "lack_of_fit": {lab: t.to_dict() for lab, t in self.lack_of_fit.items()},
            "baseline": self.baseline,
            "exponent": self.exponent,
            "exponent_reason": self.exponent_reason,
            "exponent_test": self.exponent_test.to_dict(),
            "largest_budget": {
                "compute": json_number(self.compute),
                "multiplier": self.multiplier.to_dict(),
                "multiplier_shared": None if self.multiplier_shared is None else self.multiplier_shared.to_dict(),
                "multiplier_unshared": self.multiplier_unshared.to_dict(),
                "wall_clock": self.wall_clock.to_dict(),
                "throughput_ratio": json_number(self.throughput_ratio),
            },
            "budgets": [b.to_dict() for b in self.budgets],
            "gaps": [g.to_dict() for g in self.gaps],
            "sensitivity": None if self.sensitivity is None else self.sensitivity.to_dict(),
            "paired": None if self.paired is None else self.paired.to_dict(),
            "without_stalls": None if self.without_stalls is None else self.without_stalls.to_dict(),
            "other_protocol": None if self.other_protocol is None else self.other_protocol.to_dict(),
            "n_runs_variant": self.n_runs_variant,
            "n_runs_baseline": self.n_runs_baseline,
            "n_boot_failed": self.n_boot_failed,
            "status": {"baseline": self.baseline_status, "variant": self.variant_status, "joint": self.joint_status},
        }
        if self.depth is not None:  # only on a fixed-width depth ladder: every other fit.json stays as it was
            out["depth_trend"] = self.depth.to_dict()
        return out


@dataclass(frozen=True)
class SweepFit:
    """The fits and multipliers of one sweep, and the points they were fitted to.

    ``points`` is the table of :func:`analysis.select_points` for the sweep's runs (one row per curve, model
    shape and budget; compute in FLOPs as stored), before any IsoFLOP frontier (the points each curve was
    fitted to are its :attr:`CurveResult.points`). The report's figures and tables read it instead of
    selecting the points again; it is not written to fit.json.

    ``unreadable``: the folders (relative to the results root) of unreadable run.parquet files that may belong
    to this sweep (in its folder, or anywhere when the results root is the sweep folder itself): the sweep's
    fits are incomplete when there are any (:attr:`FitReport.unreadable`).

    ``missing_seeds``: the (curve, budget) points that lack a seed another curve ran at the same budget
    (:func:`analysis.fitting.checks.missing_seeds`), printed by ``attnres fit`` under the sweep's heading.
    """

    sweep: str
    flops_convention: tuple[str, ...]
    frontier: bool
    curves: tuple[CurveResult, ...]
    joint: JointPowerLawFit | None
    multipliers: tuple[VariantMultiplier, ...]
    chinchilla: Mapping[str, ChinchillaFit]
    notes: tuple[str, ...]
    points: pd.DataFrame = field(repr=False, compare=False)
    unreadable: tuple[str, ...] = ()
    missing_seeds: tuple[MissingSeeds, ...] = ()
    frontier_multipliers: tuple[FrontierMultiplier, ...] = ()  # M between the Chinchilla surfaces' frontiers
    envelope: Envelopes | None = None  # the learning-rate envelopes the points were read off (--lr envelope)
    stalls: tuple[Stall, ...] = ()  # runs flagged as stalled (analysis.data.stalls)
    protocol_cells: tuple[ProtocolCell, ...] = ()  # both protocols per (variant, size, budget), a grid that swept rates
    curve_variants: Mapping[str, Variant] = field(default_factory=dict, compare=False)  # of every curve in ``points``
    architecture: ArchitectureGrid | None = None  # the cells of an architecture sweep (analysis.estimates.architecture)
    one_shape: ShapeComparison | None = None  # every curve against the baseline at a one-shape sweep's shape

    def curve(self, label: str) -> CurveResult:
        for c in self.curves:
            if c.curve == label:
                return c
        raise KeyError(f"no fitted curve {label!r} in sweep {self.sweep!r}; fitted: {[c.curve for c in self.curves]}")

    def multiplier(self, variant: str) -> VariantMultiplier:
        for m in self.multipliers:
            if m.variant == variant:
                return m
        raise KeyError(
            f"no multiplier for {variant!r} in sweep {self.sweep!r}; have: {[m.variant for m in self.multipliers]}"
        )

    def to_dict(self) -> dict[str, Any]:
        joint = None
        if self.joint is not None:
            params: dict[str, Any] = {"alpha": self.joint.alpha.to_dict()}
            if self.joint.E is not None:
                params["E"] = self.joint.E.to_dict()
            params.update({name: est.to_dict() for name, est in self.joint.extra.items()})
            params["A"] = {lab: est.to_dict() for lab, est in self.joint.A.items()}
            joint = {
                "form": self.joint.form,
                "status": self.joint.status,
                "message": self.joint.message,
                "params": params,
                "objective": json_number(self.joint.objective),
                "delta": json_number(self.joint.delta),
                "n_points": dict(self.joint.n_points),
                "n_boot_failed": self.joint.n_boot_failed,
            }
        out = {
            "sweep": self.sweep,
            "complete": not self.unreadable,
            "unreadable": list(self.unreadable),
            "flops_convention": list(self.flops_convention),
            "frontier": self.frontier,
            "notes": list(self.notes),
            "missing_seeds": [m.to_dict() for m in self.missing_seeds],
            "curves": [c.to_dict() for c in self.curves],
            "joint": joint,
            "multipliers": [m.to_dict() for m in self.multipliers],
            "chinchilla": {lab: fit.to_dict() for lab, fit in self.chinchilla.items()},
        }
        out["stalls"] = [s.to_dict() for s in self.stalls]
        if self.envelope is not None:
            out["envelope"] = self.envelope.to_dict()
        if self.protocol_cells:
            out["protocol_cells"] = [c.to_dict() for c in self.protocol_cells]
        if self.frontier_multipliers:  # only where there are any: older fit.json files stay byte-identical
            out["frontier_multipliers"] = [m.to_dict() for m in self.frontier_multipliers]
        if self.architecture is not None:
            out["architecture"] = self.architecture.to_dict()
        if self.one_shape is not None:
            out["one_shape"] = self.one_shape.to_dict()
        return out


@dataclass(frozen=True)
class FitReport:
    """All sweeps of a results tree, fitted; ``to_dict()`` is fit.json, :func:`analysis.format_report` of it the
    CLI's output.

    ``problems``: the runs left out of the fitted sweeps, the unreadable ones first. ``unreadable``: those whose
    run.parquet could not be read at all; when there are any the fit is not ``complete``: the fits, and above
    all each headline (M at the largest budget), may have silently lost runs, so ``attnres fit`` marks them
    INCOMPLETE and exits with 1 (docs/analysis.md, "Unreadable runs").
    """

    results_dir: str
    inputs_hash: str
    settings: FitSettings
    sweeps: tuple[SweepFit, ...]
    problems: tuple[Problem, ...]
    n_runs: int
    unreadable: tuple[Problem, ...] = ()
    pooled: tuple[str, ...] = ()  # other results trees fitted with results_dir (--pool)

    @property
    def complete(self) -> bool:
        """False when some run folder of the fitted sweeps has a run.parquet that could not be read."""
        return not self.unreadable

    def sweep(self, name: str) -> SweepFit:
        for s in self.sweeps:
            if s.sweep == name:
                return s
        raise KeyError(f"no sweep {name!r}; have {[s.sweep for s in self.sweeps]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "results_dir": self.results_dir,
            **({"pooled_dirs": list(self.pooled)} if self.pooled else {}),  # absent without --pool: older files
            "inputs_hash": self.inputs_hash,
            "n_runs": self.n_runs,
            "complete": self.complete,
            "unreadable": [p.to_dict() for p in self.unreadable],
            "compute_unit": UNIT_NAMES[self.settings.compute_unit],
            "settings": self.settings.to_dict(),
            "environment": fit_environment(),
            "problems": [p.to_dict() for p in self.problems],
            "sweeps": [s.to_dict() for s in self.sweeps],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"
