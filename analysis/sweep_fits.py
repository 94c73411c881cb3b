"""Everything ``attnres fit`` prints and saves, computed once: :func:`fit_results` returns a :class:`FitReport`.

The report package and the CLI both read these numbers instead of recomputing them: ``FitReport.to_dict()``
is exactly what ``fit.json`` holds, and ``analysis.format_report(report)`` is exactly what the CLI prints (its tables
are built by :mod:`analysis.tables`, which the report's tables are made from too).
Per sweep (a sweep is one designed study; sweeps are never pooled):

1. points: one per (curve, size, budget) from the finished runs (:mod:`analysis.select`; kept in
   :attr:`SweepFit.points`), or the IsoFLOP frontier when a budget has several sizes;
2. one power law per curve, the joint fit with a shared exponent, and one bootstrap shared by all of them
   (:func:`analysis.multiplier.run_study`);
3. per variant: M at every measured budget, M at the largest budget from the curves (shared or separate
   exponents, chosen by the exponent test), the wall-clock multiplier, the exponent test;
4. the Chinchilla surface per curve where N and D vary independently.

No I/O here beyond loading a results tree when given a path; no plotting; never imports torch.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.bootstrap import DEFAULT_LEVEL, DEFAULT_N_BOOT, Estimate, estimate, json_number
from analysis.checks import MissingSeeds, check_budget_ranges, check_form_budgets, missing_seeds
from analysis.envelope import Envelopes, has_rate_sweeps
from analysis.errors import AnalysisError, FitInputError
from analysis.fit import (
    HUBER_DELTA,
    OFFSET_POWER,
    PFLOP_S_DAY,
    POWER,
    ChinchillaFit,
    JointPowerLawFit,
    PowerLawFit,
    fit_chinchilla,
    joint_result,
    law_arrays,
    normalize_form,
)
from analysis.frontier import FrontierMultiplier, frontier_multipliers
from analysis.load import Problem, Results, load_results
from analysis.local import LocalMultiplier, local_multipliers
from analysis.multiplier import (
    BUDGETS,
    INTERVAL_METHODS,
    MIN_BUDGETS,
    SEEDS,
    CurveData,
    Study,
    bootstrap_p_value,
    curves_log_multiplier,
    exponent_difference,
    multiplier_estimates,
    points_log_multiplier,
    run_study,
    shared_log_multiplier,
    wall_clock_multiplier,
)
from analysis.paired import PairedMultiplier, agreement, paired_multiplier
from analysis.points import LR_RULES, PROTOCOLS, choose_points, labelled
from analysis.select import BUDGET_RTOL, SELECT_METHODS, isoflop_frontier, needs_frontier, select_points
from analysis.sensitivity import Sensitivity, sweep_sensitivity
from analysis.slices import slices
from analysis.stalls import STALL_MARGIN, Stall, find_stalls
from analysis.throughput import RATIO_HIGH, RATIO_LOW, implausible, read_side_by_side, side_by_side_by_shape

FORMAT = "attnres-fit/1"
COMPUTE_UNITS = {"flops": 1.0, "pflops_days": PFLOP_S_DAY}
UNIT_NAMES = {"flops": "training FLOPs", "pflops_days": "PFLOP/s-days (1e15 * 86400 training FLOPs)"}
_UNIT_SHORT = {"flops": "FLOPs", "pflops_days": "PFLOP/s-days"}
EXPONENT_MODES = ("auto", "shared", "unshared")
# the headline leaves the shared exponent only when this interval of alpha_var - alpha_base excludes 0
EXPONENT_TEST_LEVEL = 0.99
FRONTIER_MODES = ("auto", "on", "off")

DEFAULT_BASELINE = "baseline"
LACK_OF_FIT_P = 0.01  # a lack-of-fit p-value below this: the law misses its budgets beyond the seed noise
TUNING_SUFFIX = "-tune"  # the sweep name `attnres tune` gives its trials
TRUNK_SUFFIX = "-trunk"  # the sweep of a grid's WSD trunks (attnres.training.branches): constant rate, no budget


@dataclass(frozen=True)
class FitSettings:
    """The options a report was made with (all of them are written into fit.json)."""

    form: str = POWER
    select: str = "mean"
    baseline: str = "baseline"
    level: float = DEFAULT_LEVEL
    n_boot: int = DEFAULT_N_BOOT
    seed: int = 0
    delta: float = HUBER_DELTA
    exponent: str = "auto"
    frontier: str = "auto"
    compute_unit: str = "flops"
    budget_rtol: float = BUDGET_RTOL
    chinchilla: bool = True
    interval: str = BUDGETS
    lr: str = "best"  # a cell's rate: the best the grid trained, or the learning-rate envelope (analysis.envelope)
    protocol: str = "per-variant"  # every variant at its own best rate, or at the baseline's ("paper")
    stall_margin: float = STALL_MARGIN  # a run lagging its cell's other seeds by more is flagged (0: no detector)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


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
    """A curve's power-law fit (intervals from the report's shared bootstrap) and its points."""

    curve: str
    variant: str
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


def lack_of_fit(study: Study, label: str) -> LackOfFit:
    """The lack-of-fit test of one curve of a study (:class:`LackOfFit`)."""
    fit, data = study.fits[label], study.data[label]
    resid = fit.y - fit.fitted
    k, p = resid.size, fit.model.n_params
    rms = float(np.sqrt(np.mean(resid**2)))
    var_mean, df_seed = [], 0
    for runs in data.run_losses:
        if runs is not None and len(runs) >= 2:
            logs = np.log(np.asarray(runs, dtype=float))
            var_mean.append(float(np.var(logs, ddof=1)) / logs.size)
            df_seed += logs.size - 1
    if not var_mean or k <= p or df_seed == 0:
        return LackOfFit(rms, math.sqrt(np.mean(var_mean)) if var_mean else math.nan, math.nan, math.nan)
    from scipy.stats import f as f_dist

    noise = float(np.mean(var_mean))
    stat = float(np.sum(resid**2) / (k - p) / noise) if noise > 0 else math.inf
    return LackOfFit(rms, math.sqrt(noise), stat, float(f_dist.sf(stat, k - p, df_seed)))


def _reliability(study: Study, label: str, base: str, tests: Mapping[str, LackOfFit]) -> tuple[bool, str]:
    """Whether the study can give ``label``'s multiplier a calibrated interval, and why not."""
    if study.n_boot == 0:
        return True, ""
    n_budgets = min(study.data[base].n_budgets, study.data[label].n_budgets)
    if study.interval == BUDGETS and n_budgets < MIN_BUDGETS:
        return False, (
            f"only {n_budgets} budgets: a bootstrap over budgets is calibrated from {MIN_BUDGETS} on (at 4 it covers "
            "about 82% where 90% is asked); run more budgets"
        )
    if study.interval == SEEDS:
        missed = [lab for lab in (base, label) if tests[lab].significant]
        if missed:
            t = tests[missed[0]]
            return False, (
                f"{missed[0]}'s law misses its budgets by {100 * t.rms:.2g}% RMS, more than its seeds explain "
                f"(seed SE {100 * t.seed_se:.2g}%, lack-of-fit p = {t.p_value:.2g}); the seeds interval ignores "
                "that, use --interval budgets"
            )
    return True, ""


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


def _mean_draws(values: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap means of ``values`` (deviations scaled by sqrt(m / (m - 1)))."""
    m = values.size
    centre = values.mean()
    scaled = centre + math.sqrt(m / (m - 1)) * (values - centre)
    return scaled[rng.integers(0, m, size=(n_boot, m))].mean(axis=1)


def budget_gaps(study: Study, label: str, base: str, rng: np.random.Generator) -> tuple[BudgetGap, ...]:
    """Per budget the variant shares with the baseline (same budget key), the paired loss gap."""
    v, b = study.data[label], study.data[base]
    where = {repr(k): i for i, k in enumerate(b.budget_keys)}
    level, n_boot = study.level, study.n_boot
    out = []
    for i, key in enumerate(v.budget_keys):
        j = where.get(repr(key))
        if j is None:
            continue
        rv, rb = v.run_losses[i], b.run_losses[j]
        rv = np.array([v.loss[i]]) if rv is None else np.asarray(rv, dtype=float)
        rb = np.array([b.loss[j]]) if rb is None else np.asarray(rb, dtype=float)
        sv, sb = v.run_seeds[i], b.run_seeds[j]
        common = [] if sv is None or sb is None else sorted(set(map(int, sv)) & set(map(int, sb)))
        base_mean = float(rb.mean())
        paired = len(common) >= 2
        draws = None
        if paired:
            iv = [list(map(int, sv)).index(x) for x in common]
            ib = [list(map(int, sb)).index(x) for x in common]
            diff, base_vals = rv[iv] - rb[ib], rb[ib]
            value, base_mean, n, df = float(diff.mean()), float(base_vals.mean()), len(common), len(common) - 1
            if n_boot > 0:
                pick = rng.integers(0, n, size=(n_boot, n))
                scale = math.sqrt(n / (n - 1))
                d = diff.mean() + scale * (diff - diff.mean())
                bv = base_vals.mean() + scale * (base_vals - base_vals.mean())
                draws = (d[pick].mean(axis=1), bv[pick].mean(axis=1))
        else:
            value, n = float(rv.mean() - rb.mean()), min(rv.size, rb.size)
            df = rv.size + rb.size - 2
            if n_boot > 0 and rv.size >= 2 and rb.size >= 2:
                mb = _mean_draws(rb, n_boot, rng)
                draws = (_mean_draws(rv, n_boot, rng) - mb, mb)
        gap = estimate(value, None if draws is None else draws[0], level, df)
        pct = estimate(100 * value / base_mean, None if draws is None else 100 * draws[0] / draws[1], level, df)
        out.append(BudgetGap(float(v.compute[i]), float(b.compute[j]), n, paired, gap, pct))
    return tuple(out)


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
    local: LocalMultiplier | None = None  # against the baseline's law fitted to its nearest budgets (analysis.local)

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
    """

    variant: str
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
    sensitivity: Sensitivity | None = None  # M under other analysis choices (analysis.sensitivity)
    paired: PairedMultiplier | None = None  # M per size from paired losses, t-interval over sizes (analysis.paired)
    without_stalls: Estimate | None = None  # the headline refitted without the flagged runs (analysis.stalls)
    other_protocol: OtherProtocol | None = None  # the headline under the other tuning protocol, from the same runs

    def to_dict(self) -> dict[str, Any]:
        return {
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
    (:func:`analysis.checks.missing_seeds`), printed by ``attnres fit`` under the sweep's heading.
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
    stalls: tuple[Stall, ...] = ()  # runs flagged as stalled (analysis.stalls)
    protocol_cells: tuple[ProtocolCell, ...] = ()  # both protocols per (variant, size, budget), a grid that swept rates

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
            params["A"] = {lab: est.to_dict() for lab, est in self.joint.A.items()}
            joint = {
                "form": self.joint.form,
                "status": self.joint.status,
                "message": self.joint.message,
                "params": params,
                "objective": json_number(self.joint.objective),
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
            "inputs_hash": self.inputs_hash,
            "n_runs": self.n_runs,
            "complete": self.complete,
            "unreadable": [p.to_dict() for p in self.unreadable],
            "compute_unit": UNIT_NAMES[self.settings.compute_unit],
            "settings": self.settings.to_dict(),
            "problems": [p.to_dict() for p in self.problems],
            "sweeps": [s.to_dict() for s in self.sweeps],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Computing a report
# ---------------------------------------------------------------------------------------------------------


def _power_fit(study: Study, label: str, settings: FitSettings) -> PowerLawFit:
    cf, data = study.fits[label], study.data[label]
    law = cf.model.law(cf.theta)
    samples: dict[str, np.ndarray | None] = {"A": None, "alpha": None, "E": None}
    failed = 0
    if study.n_boot > 0:
        ok = study.ok[label]
        failed = int((~ok).sum())
        log_a, alpha, e_value = law_arrays(cf.model, study.theta[label][ok])
        samples = {"A": np.exp(log_a), "alpha": alpha, "E": e_value}
    df = study.df(label)
    return PowerLawFit(
        form=study.form,
        law=law,
        A=estimate(law.A, samples["A"], settings.level, df),
        alpha=estimate(law.alpha, samples["alpha"], settings.level, df),
        E=estimate(law.E, samples["E"], settings.level, df) if study.form == OFFSET_POWER else None,
        status=cf.solution.status,
        message=cf.solution.message,
        objective=cf.solution.objective,
        compute=tuple(float(c) for c in data.compute),
        loss=tuple(float(v) for v in data.loss),
        run_ids=None,
        delta=study.delta,
        level=settings.level,
        n_boot=study.n_boot,
        n_boot_failed=failed,
        seed=settings.seed,
    )


def _collect_warnings(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Call fn, re-emit its warnings, and return their texts too (they go into the report's notes)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out, [str(w.message) for w in caught]


@dataclass
class _Prepared:
    """A sweep's points, chosen and checked, before any law is fitted (:func:`prepare_sweep`)."""

    sweep: str
    points: pd.DataFrame
    conventions: tuple[str, ...]
    frontier: bool
    data: list[CurveData]
    rows: dict[str, pd.DataFrame]
    notes: list[str]
    missing_seeds: tuple[MissingSeeds, ...]
    runs: pd.DataFrame
    envelopes: Envelopes | None = None


def _conventions(runs: pd.DataFrame) -> tuple[str, ...]:
    """The FLOP conventions of a sweep's finished runs."""
    return tuple(sorted(runs.loc[runs["status"] == "done", "flops_convention"].dropna().astype(str).unique()))


def prepare_sweep(runs: pd.DataFrame, sweep: str, settings: FitSettings) -> _Prepared:
    """Step 1 of the module docstring, and the checks of :mod:`analysis.checks`: the points of every curve,
    a :class:`FitInputError` for what no fit can support, and the seeds missing at some budget."""
    notes: list[str] = []
    (points, envelopes), warned = _collect_warnings(
        choose_points,
        runs,
        select=settings.select,
        lr=settings.lr,
        protocol=settings.protocol,
        baseline=settings.baseline,
    )
    notes += warned
    conventions = _conventions(runs)
    if len(conventions) > 1:
        notes.append(
            f"runs use {len(conventions)} different FLOP conventions; compute values are not comparable across them"
        )
    use_frontier = settings.frontier == "on" or (
        settings.frontier == "auto" and needs_frontier(points, settings.budget_rtol)
    )
    curve_points = points
    if use_frontier and not points.empty:
        curve_points, frontier_notes = isoflop_frontier(points, rtol=settings.budget_rtol, delta=settings.delta)
        notes += list(frontier_notes)
    data, rows = _curve_data(curve_points, settings, notes, sweep)
    check_budget_ranges(sweep, data, settings.baseline, _UNIT_SHORT[settings.compute_unit], settings.budget_rtol)
    return _Prepared(
        sweep, points, conventions, use_frontier, data, rows, notes, missing_seeds(points), runs, envelopes
    )


def _curves_under(prepared: _Prepared, settings: FitSettings) -> list[CurveData]:
    """The sweep's curves under other settings (for the sensitivity table); its warnings and notes were
    already given once, under the report's own settings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prepare_sweep(prepared.runs, prepared.sweep, settings).data


def _fit_sweep(
    prepared: _Prepared, settings: FitSettings, folders: tuple[Path, ...] = (), stalls: tuple[Stall, ...] = ()
) -> SweepFit:
    """Curves, joint fit, multipliers and Chinchilla surfaces of one prepared sweep (the module docstring's
    steps 2-4), with each variant's paired per-size M, its headline without the ``stalls`` and under the other
    tuning protocol; every note on the way goes into the sweep's notes."""
    p, notes = prepared, prepared.notes
    if not p.data:
        notes.append("no curve could be fitted")
        return SweepFit(
            p.sweep,
            p.conventions,
            p.frontier,
            (),
            None,
            (),
            {},
            tuple(notes),
            p.points,
            missing_seeds=p.missing_seeds,
            envelope=p.envelopes,
            stalls=stalls,
        )
    fitted = [d.label for d in p.data]
    entries, source = read_side_by_side(list(folders))
    if source is not None:
        throughput = side_by_side_by_shape(p.points, entries)
        notes.append(f"wall-clock M from throughput measured side by side ({source.name})")
    else:
        throughput = _throughput_by_shape(p.points)
        notes.append(
            "wall-clock M from the tokens/s each run logged while it trained (at different times, on a machine that "
            "may have been shared); `attnres sweep throughput GRID` measures the variants side by side"
        )
    study, joint, multipliers = fit_curves(p.data, settings, p.rows, throughput, notes)
    for m in multipliers:
        if implausible(m.throughput_ratio):
            notes.append(
                f"{m.variant}: FLOP/s ratio {m.throughput_ratio:.3g} to the baseline is outside "
                f"[{RATIO_LOW:g}, {RATIO_HIGH:g}] (flagged !): its wall-clock M says more about the machine's load "
                "than about the model"
            )
    found = sweep_sensitivity(p.data, settings, multipliers, lambda other: _curves_under(p, other))
    multipliers = [replace(m, sensitivity=sens) for m, sens in zip(multipliers, found)]
    multipliers = [replace(m, paired=_paired(study, m.variant, m.multiplier, settings)) for m in multipliers]
    if stalls:
        flagged = {s.run_id for s in stalls}
        kept = p.runs[~p.runs["run_id"].astype(str).isin(flagged)]
        without = _headlines(kept, p.sweep, settings, notes, f"without the {len(flagged)} run(s) flagged as stalled")
        multipliers = [
            replace(m, without_stalls=without[m.variant][0]) if m.variant in without else m for m in multipliers
        ]
    protocol_cells: tuple[ProtocolCell, ...] = ()
    if has_rate_sweeps(labelled(p.runs)):
        other = PROTOCOLS[1 - PROTOCOLS.index(settings.protocol)]
        under = _headlines(p.runs, p.sweep, replace(settings, protocol=other), notes, f"under the {other} protocol")
        multipliers = [
            replace(m, other_protocol=OtherProtocol(other, *under[m.variant][:3], under[m.variant][3]))
            if m.variant in under
            else m
            for m in multipliers
        ]
        protocol_cells = _protocol_cells(p.runs, settings, notes)
    curves = [_curve_result(study, label, p.rows[label], settings, notes) for label in fitted]
    chinchilla, at_frontier = {}, []
    if settings.chinchilla and not p.points.empty:
        chinchilla = _chinchilla_fits(p.points, fitted, settings, notes)
        at_frontier = _frontier_multipliers(p.points, chinchilla, settings, notes)
    return SweepFit(
        p.sweep,
        p.conventions,
        p.frontier,
        tuple(curves),
        joint,
        tuple(multipliers),
        chinchilla,
        tuple(notes),
        p.points,
        missing_seeds=p.missing_seeds,
        frontier_multipliers=tuple(at_frontier),
        envelope=p.envelopes,
        stalls=stalls,
        protocol_cells=protocol_cells,
    )


def _paired(study: Study, label: str, headline: Estimate, settings: FitSettings) -> PairedMultiplier | None:
    found = paired_multiplier(study, label, settings.baseline, settings.level)
    if found is not None and settings.n_boot == 0:  # --n-boot 0 asks for point estimates only, everywhere
        return replace(found, mean=Estimate(found.mean.value, level=settings.level))
    return None if found is None else agreement(found, headline)


def _headlines(
    runs: pd.DataFrame, sweep: str, settings: FitSettings, notes: list[str], what: str
) -> dict[str, tuple[Estimate, str, bool, PairedMultiplier | None]]:
    """Each variant's headline M (with its exponent, reliability and paired M) from ``runs`` under ``settings``:
    the sweep fitted again without some runs or under the other protocol; a fit that cannot be made is a note."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the sweep's own fit gave these warnings already
            prepared = prepare_sweep(runs, sweep, settings)
            study, _, found = fit_curves(prepared.data, settings, notes=[])
    except AnalysisError as err:
        notes.append(f"M {what}: not fitted ({err})")
        return {}
    return {
        m.variant: (m.multiplier, m.exponent, m.reliable, _paired(study, m.variant, m.multiplier, settings))
        for m in found
    }


def _protocol_cells(runs: pd.DataFrame, settings: FitSettings, notes: list[str]) -> tuple[ProtocolCell, ...]:
    """Every (variant, size, budget) under both protocols (:class:`ProtocolCell`)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tables = {
                protocol: choose_points(
                    runs, select=settings.select, lr=settings.lr, protocol=protocol, baseline=settings.baseline
                )[0]
                for protocol in PROTOCOLS
            }
    except AnalysisError as err:
        notes.append(f"the two tuning protocols are not compared ({err})")
        return ()
    keys = ["curve", "n_layer", "d_model", "tokens"]
    both = tables["per-variant"].merge(tables["paper"], on=keys, suffixes=("", "_paper"))
    cells = []
    for r in both.itertuples():
        if r.curve == settings.baseline:
            continue
        cells.append(
            ProtocolCell(
                str(r.curve),
                int(r.n_layer),
                int(r.d_model),
                float(r.tokens),
                float(r.lr),
                float(r.loss),
                float(r.lr_paper),
                float(r.loss_paper),
                str(getattr(r, "lr_edge", "") or ""),
            )
        )
    return tuple(cells)


def _frontier_multipliers(
    points: pd.DataFrame, chinchilla: Mapping[str, ChinchillaFit], settings: FitSettings, notes: list[str]
) -> list[FrontierMultiplier]:
    found, more = frontier_multipliers(points, chinchilla, settings.baseline, settings.level)
    notes += more
    return found


def _surface_sweep(runs: pd.DataFrame, sweep: str, settings: FitSettings) -> SweepFit:
    """A sweep fitted once per ratio (:mod:`analysis.slices`), taken whole: each curve's (N, D) points as one
    Chinchilla surface, and M between the surfaces' frontiers (:mod:`analysis.frontier`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its slices gave the points' warnings already
        points = select_points(runs, method=settings.select)
    conventions = _conventions(runs)
    notes = [
        "every (size, budget) point of the sweep, each curve fitted as one Chinchilla surface L(N, D); the power "
        f"laws in C are fitted per ratio ({sweep}@<r>tpp)"
    ]
    labels = sorted(points["curve"].unique()) if not points.empty else []
    chinchilla = _chinchilla_fits(points, labels, settings, notes) if labels else {}
    if not chinchilla:
        notes.append("no Chinchilla surface could be fitted")
    at_frontier = _frontier_multipliers(points, chinchilla, settings, notes)
    return SweepFit(
        sweep,
        conventions,
        False,
        (),
        None,
        (),
        chinchilla,
        tuple(notes),
        points,
        missing_seeds=missing_seeds(points),
        frontier_multipliers=tuple(at_frontier),
    )


def fit_curves(
    data: list[CurveData],
    settings: FitSettings,
    rows: dict[str, pd.DataFrame] | None = None,
    throughput: dict[tuple[str, int, int], float] | None = None,
    notes: list[str] | None = None,
) -> tuple[Study, JointPowerLawFit | None, list[VariantMultiplier]]:
    """The fits, the shared bootstrap and every variant's multiplier from the curves' data: what
    ``attnres fit`` computes per sweep once its points are chosen (the coverage study calls it on simulated
    points). ``rows`` / ``throughput`` (the curves' point tables, FLOP/s per shape) give the wall-clock
    multipliers; without them those are nan."""
    notes = [] if notes is None else notes
    check_budget_ranges("", data, settings.baseline, _UNIT_SHORT[settings.compute_unit], settings.budget_rtol)
    study = run_study(
        data,
        settings.form,
        delta=settings.delta,
        level=settings.level,
        n_boot=settings.n_boot,
        seed=settings.seed,
        joint=len(data) >= 2,
        interval=settings.interval,
    )
    joint = _joint_fit(study, settings)
    multipliers = []
    labels = [d.label for d in data]
    if settings.baseline not in labels:
        notes.append(
            f"no fitted baseline curve {settings.baseline!r}: no multipliers (set the baseline with --baseline)"
        )
    else:
        for label in labels:
            if label != settings.baseline:
                multipliers.append(_variant_multiplier(study, label, settings, rows, throughput or {}, joint, notes))
    return study, joint, multipliers


def _curve_data(
    curve_points: pd.DataFrame, settings: FitSettings, notes: list[str], sweep: str = ""
) -> tuple[list[CurveData], dict[str, pd.DataFrame]]:
    """The data of every curve with enough budgets for the form (baseline first, then by name), and each
    fitted curve's points; a curve with one budget gets a note, one with two under the form with E an error
    (:func:`analysis.checks.check_form_budgets`)."""
    unit = COMPUTE_UNITS[settings.compute_unit]
    labels = sorted(curve_points["curve"].unique().tolist()) if not curve_points.empty else []
    if settings.baseline in labels:
        labels = [settings.baseline] + [lab for lab in labels if lab != settings.baseline]
    n_params = 3 if settings.form == OFFSET_POWER else 2
    data, rows = [], {}
    for label in labels:
        g = curve_points[curve_points["curve"] == label].sort_values("flops", kind="stable")
        distinct = g["flops"].nunique()
        check_form_budgets(sweep, label, distinct, settings.form)
        if distinct < n_params:
            notes.append(f"{label}: not fitted, {distinct} budget(s) for a form with {n_params} parameters")
            continue
        run_losses = [
            np.asarray(r, dtype=float)
            if r is not None and not (isinstance(r, float) and math.isnan(r)) and len(r) >= 2
            else None
            for r in g["run_losses"]
        ]
        data.append(
            CurveData(
                label,
                g["flops"].to_numpy(float) / unit,
                g["loss"].to_numpy(float),
                run_losses,
                g["n_runs"].to_numpy(int),
                settings.select,
                budget_keys=_budget_keys(g),
                # the seeds behind every point of runs, a single one too (the paired M pairs it by seed)
                run_seeds=[
                    np.asarray(r, dtype=int)
                    if isinstance(r, tuple) and (run_losses[i] is not None or len(r) == 1)
                    else None
                    for i, r in enumerate(g["run_seeds"] if "run_seeds" in g else [None] * len(g))
                ],
            )
        )
        rows[label] = g
    return data, rows


def _budget_keys(g: pd.DataFrame) -> list[Any] | None:
    """What names each point's budget across curves: its model shape and tokens (a variant's FLOPs differ
    from the baseline's at the same shape); None (the points' ranks) for IsoFLOP minima, whose shapes vary."""
    if "n_sizes" in g.columns or not {"n_layer", "d_model", "tokens"} <= set(g.columns):
        return None
    keys = [(int(r.n_layer), int(r.d_model), int(round(float(r.tokens)))) for r in g.itertuples()]
    return keys if len(set(keys)) == len(keys) else None


def _curve_result(study: Study, label: str, g: pd.DataFrame, settings: FitSettings, notes: list[str]) -> CurveResult:
    """A fitted curve with its points (``g``: the curve's rows of points); a fit that did not converge gets a
    note."""
    unit = COMPUTE_UNITS[settings.compute_unit]
    pts = tuple(
        CurvePoint(
            float(r.flops) / unit,
            float(r.loss),
            int(r.n_runs),
            tuple(r.run_ids),
            float(r.params),
            float(r.tokens),
            float(r.flops_per_s),
        )
        for r in g.itertuples()
    )
    fit = _power_fit(study, label, settings)
    if fit.status != "converged":
        notes.append(f"{label}: fit status {fit.status} ({fit.message})")
    return CurveResult(label, str(g["variant"].iloc[0]), fit, pts)


def _joint_fit(study: Study, settings: FitSettings) -> JointPowerLawFit | None:
    """The joint fit with a shared exponent, with the study's bootstrap intervals (None without one)."""
    if study.joint is None:
        return None
    draws, failed = None, 0
    if study.n_boot > 0:
        failed = int((~study.joint_ok).sum())
        draws = study.joint_theta[study.joint_ok]
    return joint_result(
        study.joint,
        study.joint_labels,
        settings.form,
        settings.delta,
        settings.level,
        study.n_boot,
        failed,
        settings.seed,
        draws,
        study.df(joint=True),
    )


def _sweep_folders(root: Path, runs: pd.DataFrame) -> tuple[Path, ...]:
    """The folders holding a sweep's run folders (where ``attnres sweep throughput`` writes its file)."""
    if "path" not in runs:
        return ()
    return tuple(sorted({(Path(root) / str(p)).parent for p in runs["path"]}))


def _throughput_by_shape(points: pd.DataFrame) -> dict[tuple[str, int, int], float]:
    """Median measured FLOP/s per (curve, n_layer, d_model) over the points of that shape."""
    out = {}
    for (curve, n_layer, d_model), g in points.groupby(["curve", "n_layer", "d_model"]):
        values = g["flops_per_s"].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        out[(str(curve), int(n_layer), int(d_model))] = float(np.median(values)) if values.size else math.nan
    return out


def _variant_multiplier(
    study: Study,
    label: str,
    settings: FitSettings,
    rows: dict[str, pd.DataFrame] | None,
    throughput: dict[tuple[str, int, int], float],
    joint: JointPowerLawFit | None,
    notes: list[str],
) -> VariantMultiplier:
    """Everything about one variant against the baseline (module docstring, step 3)."""
    base = settings.baseline
    level = settings.level
    per_point = points_log_multiplier(study, label, base)
    m_points = multiplier_estimates(per_point, level)
    data = study.data[label]
    c_max = float(data.compute.max())
    unshared = multiplier_estimates(curves_log_multiplier(study, label, base, np.array([c_max])), level)[0]
    shared = None
    if study.joint is not None:
        shared = multiplier_estimates(shared_log_multiplier(study, label, base), level)[0]
    test = _exponent_test(study, label, base, level)
    tests = {lab: lack_of_fit(study, lab) for lab in (base, label)}
    reliable, why = _reliability(study, label, base, tests)
    exponent, reason = _choose_exponent(settings, test, shared is not None, joint, reliable)
    headline = shared if exponent == "shared" else unshared
    data = study.data[label]
    if rows is None:
        ratios = [math.nan] * data.compute.size
    else:
        ratios = _throughput_ratios(label, base, rows[label], throughput, notes)
    n_runs_base = int(study.data[base].n_runs.sum())
    local = local_multipliers(study, label, base, level, study.n_boot, np.random.default_rng([settings.seed, 2]))
    budgets = tuple(
        BudgetMultiplier(
            compute=float(c),
            loss=float(l),
            n_runs_variant=int(n),
            n_runs_baseline=n_runs_base,
            multiplier=m,
            wall_clock=wall_clock_multiplier(m, ratio, 1.0),
            throughput_ratio=ratio,
            local=near,
        )
        for c, l, n, m, ratio, near in zip(data.compute, data.loss, data.n_runs, m_points, ratios, local)
    )
    top_ratio = ratios[int(np.argmax(data.compute))]
    return VariantMultiplier(
        variant=label,
        baseline=base,
        exponent=exponent,
        exponent_reason=reason,
        exponent_test=test,
        compute=c_max,
        multiplier=headline,
        multiplier_shared=shared,
        multiplier_unshared=unshared,
        wall_clock=wall_clock_multiplier(headline, top_ratio, 1.0),
        throughput_ratio=top_ratio,
        budgets=budgets,
        n_runs_variant=int(data.n_runs.sum()),
        n_runs_baseline=n_runs_base,
        n_boot_failed=per_point.failed,
        baseline_status=study.fits[base].solution.status,
        variant_status=study.fits[label].solution.status,
        joint_status=None if joint is None else joint.status,
        interval=study.interval,
        reliable=reliable,
        why=why,
        lack_of_fit=tests,
        gaps=budget_gaps(study, label, base, np.random.default_rng([settings.seed, 1])),
    )


def _exponent_test(study: Study, label: str, base: str, level: float) -> ExponentTest:
    """alpha_var - alpha_base from the separate fits, with its interval and bootstrap p-value."""
    d = exponent_difference(study, label, base)
    diff = estimate(float(d.value[0]), None if d.draws is None else d.draws[:, 0], level, d.df)
    scale = max(
        abs(float(m.alpha(study.fits[lab].theta[None])[0]))
        for lab, m in ((base, study.fits[base].model), (label, study.fits[label].model))
    )
    # "differ" needs strong evidence (the 99% interval excludes 0), not the table's level: the headline switches
    # to the separate fits when it does, and given a switch by chance their interval covers a third to a half
    # of the time (docs/analysis.md, "Exponent test")
    strict = estimate(float(d.value[0]), None if d.draws is None else d.draws[:, 0], EXPONENT_TEST_LEVEL, d.df)
    # a difference at rounding level (exact data give a zero-width interval next to 0) is no difference
    differ = strict.has_interval and not strict.contains(0.0) and abs(diff.value) > 1e-9 * max(scale, 1e-12)
    return ExponentTest(diff, bootstrap_p_value(None if d.draws is None else d.draws[:, 0]), differ)


def _choose_exponent(
    settings: FitSettings, test: ExponentTest, has_shared: bool, joint: JointPowerLawFit | None, reliable: bool
) -> tuple[str, str]:
    """The headline's exponent, "shared" or "unshared", and why (``settings.exponent``, then the test).

    An interval marked unreliable comes from a bootstrap that is not calibrated, and so is the test's: it does
    not move the headline off the shared exponent (at 4 budgets it finds "differ" with p = 0 on equal exponents).
    """
    pct = int(round(EXPONENT_TEST_LEVEL * 100))
    joint_ok = joint is not None and joint.status != "not_converged"  # E or alpha on a bound is still a fit
    if settings.exponent == "unshared" or not has_shared:
        return "unshared", "requested" if settings.exponent == "unshared" else "no joint fit"
    if settings.exponent == "shared":
        return "shared", "requested"
    if test.differ and not reliable:
        return "shared", (
            f"the {pct}% interval of alpha_var - alpha_base excludes 0, but this bootstrap is not calibrated (the "
            "interval is marked unreliable), so the test does not move the headline off the shared exponent"
        )
    if test.differ:
        return "unshared", f"the exponents differ ({pct}% interval of alpha_var - alpha_base excludes 0)"
    if not joint_ok:
        return "unshared", f"the joint fit did not converge cleanly ({joint.status if joint else 'none'})"
    if not test.difference.has_interval:
        return "shared", "no bootstrap to test the exponents; shared by default"
    return "shared", f"the exponents do not differ ({pct}% interval of alpha_var - alpha_base contains 0)"


def _throughput_ratios(
    label: str,
    base: str,
    g_var: pd.DataFrame,
    throughput: dict[tuple[str, int, int], float],
    notes: list[str],
) -> list[float]:
    """Per point of the variant (``g_var``), its measured FLOP/s over the baseline's at the same model size
    (nan where either is missing, with a note)."""
    ratios = []
    for r in g_var.itertuples():
        r_var = throughput.get((label, int(r.n_layer), int(r.d_model)), math.nan)
        r_base = throughput.get((base, int(r.n_layer), int(r.d_model)), math.nan)
        ratios.append(r_var / r_base if r_base and math.isfinite(r_base) and math.isfinite(r_var) else math.nan)
    if any(math.isnan(x) for x in ratios):
        notes.append(
            f"{label}: no throughput of the baseline at the same model size for some budgets; "
            "wall-clock multiplier is nan there"
        )
    return ratios


def _chinchilla_fits(
    points: pd.DataFrame, fitted: list[str], settings: FitSettings, notes: list[str]
) -> dict[str, ChinchillaFit]:
    """The Chinchilla surface of every curve whose N and D vary independently (an IsoFLOP or N x D grid)."""
    out = {}
    for label in fitted:
        g = points[points["curve"] == label]
        log_n, log_d = np.log(g["params"].to_numpy(float)), np.log(g["tokens"].to_numpy(float))
        if len(g) < 8 or np.unique(log_n).size < 3 or np.unique(log_d).size < 3:
            continue
        if abs(np.corrcoef(log_n, log_d)[0, 1]) > 0.99:
            continue  # N and D move together (one size per budget): the surface is not identifiable
        try:
            fit, warned = _collect_warnings(
                fit_chinchilla,
                g["params"],
                g["tokens"],
                g["loss"],
                delta=settings.delta,
                level=settings.level,
                n_boot=settings.n_boot,
                seed=settings.seed,
                run_ids=["+".join(ids) for ids in g["run_ids"]],
            )
        except FitInputError as err:
            notes.append(f"{label}: Chinchilla surface not fitted ({err})")
            continue
        notes += warned
        out[label] = fit
    return out


def fit_results(
    results: Results | str | Path,
    settings: FitSettings | None = None,
    *,
    sweeps: Iterable[str] | None = None,
    **options: Any,
) -> FitReport:
    """Fit every sweep of a results tree: curves, joint fit, multipliers with intervals, Chinchilla surfaces.

    ``results``: a :class:`Results` from :func:`analysis.load_results`, or a results directory. ``settings``: the
    fit's options (:class:`FitSettings`, its defaults those of ``attnres fit``); ``options`` change single fields
    of it (``form="E+A*C^-alpha"``, ``lr="envelope"``, ``n_boot=0`` ...). ``sweeps``: restrict to these sweep
    names (default: every sweep, each fitted on its own, except the learning-rate searches of ``attnres tune``,
    whose sweeps are named ``<sweep>-tune``, and the WSD trunks of a grid with ``branches:``, in
    ``<sweep>-trunk``). The fields are documented in docs/analysis.md.
    """
    unknown = sorted(set(options) - set(FitSettings.__dataclass_fields__))
    if unknown:
        raise AnalysisError(
            f"unknown fit option(s) {', '.join(unknown)}" + _did_you_mean(unknown[0], FitSettings.__dataclass_fields__)
        )
    settings = replace(settings or FitSettings(), **options)
    settings = replace(settings, form=normalize_form(settings.form))
    _check(settings)
    if not isinstance(results, Results):
        results = load_results(results, tables=())
    runs = results.runs
    # learning-rate searches (``attnres tune`` writes them to ``<sweep>-tune``) and WSD trunks (``<sweep>-trunk``,
    # whose rate never decays) are not scaling studies
    names = [name for name in results.sweeps if not name.endswith((TUNING_SUFFIX, TRUNK_SUFFIX))]
    if sweeps is not None:
        wanted = list(sweeps)
        missing = [s for s in wanted if s not in results.sweeps]
        if missing:
            raise AnalysisError(
                f"sweep(s) {', '.join(map(repr, missing))} not found in {results.root}"
                + _did_you_mean(missing[0], results.sweeps)
                + f"; sweeps found: {', '.join(results.sweeps) or 'none'} (choose with --sweep)"
            )
        names = wanted
    _check_variant_names(settings, runs[runs["sweep"].isin(names)], results.root)
    problems = [p for p in results.problems if _sweep_of(p) in names or _sweep_of(p) not in results.sweeps]
    unreadable = tuple(p for p in problems if p.unreadable)
    # every sweep's points are chosen and checked before the first law is fitted: bad input is one error up front;
    # a sweep with several training lengths per size is fitted once per length (analysis.slices)
    sliced = {name: slices(name, runs[runs["sweep"] == name]) for name in names}
    parts = [(name, label, part) for name in names for label, part in sliced[name]]
    prepared = [(name, part, prepare_sweep(part, label, settings)) for name, label, part in parts]
    fits = []
    for i, (name, part, p) in enumerate(prepared):
        belongs = tuple(path.path for path in unreadable if _may_belong(path, name, results))
        stalls = find_stalls(results.root, labelled(part), runs, margin=settings.stall_margin)
        fitted = _fit_sweep(p, settings, _sweep_folders(results.root, part), stalls)
        fits.append(replace(fitted, unreadable=belongs))
        last_slice = i + 1 == len(prepared) or prepared[i + 1][0] != name
        if last_slice and len(sliced[name]) > 1 and settings.chinchilla:  # then the whole sweep as one surface
            fits.append(replace(_surface_sweep(runs[runs["sweep"] == name], name, settings), unreadable=belongs))
    fitted = tuple(fits)
    return FitReport(
        results_dir=str(results.root),
        inputs_hash=results.inputs_hash,
        settings=settings,
        sweeps=fitted,
        problems=unreadable + tuple(p for p in problems if not p.unreadable),
        n_runs=len(runs),
        unreadable=unreadable,
    )


def _may_belong(problem: Problem, sweep: str, results: Results) -> bool:
    """Whether a problem run may belong to ``sweep``: it lies in that sweep's folder, or in no sweep folder of
    the results (the results root is a sweep folder or a run folder itself)."""
    where = _sweep_of(problem)
    return where == sweep or where not in results.sweeps


def _did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'baseline'?)`` when ``name`` is close to one of ``choices``, else ""."""
    import difflib

    hint = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def variant_names(runs: pd.DataFrame) -> list[str]:
    """The variant names a fit option may name in these runs: every ``variant`` and every curve label
    (``<variant>-N<n_blocks>`` where a block-size ablation splits a variant)."""
    from analysis.select import curve_labels

    if runs.empty:
        return []
    return sorted(set(runs["variant"].dropna().astype(str)) | set(curve_labels(runs).astype(str)))


def _check_variant_names(settings: FitSettings, runs: pd.DataFrame, root: Path) -> None:
    """Refuse, before any fitting, a baseline that names no variant of the runs to fit (a typo would otherwise
    give a report without multipliers). An empty tree has nothing to check, and the default name ("baseline")
    is not refused: a tree without baseline runs still gets its curves fitted, with a note."""
    found = variant_names(runs)
    if found and settings.baseline not in found and settings.baseline != DEFAULT_BASELINE:
        raise AnalysisError(
            f"baseline {settings.baseline!r} is not a variant of the runs under {root}"
            + _did_you_mean(settings.baseline, found)
            + f"; variants found: {', '.join(found)} (choose with --baseline)"
        )


def _sweep_of(problem: Problem) -> str:
    """The sweep folder a problem run lies in (problems of sweeps left out of the fits are not reported)."""
    return problem.path.split("/")[0]


def _check(s: FitSettings) -> None:
    if s.select not in SELECT_METHODS:
        raise AnalysisError(
            f"select={s.select!r}: use 'mean' (mean over seeds), 'median' (median over seeds) or 'best' (best run)"
        )
    if s.exponent not in EXPONENT_MODES:
        raise AnalysisError(f"exponent={s.exponent!r}: use one of {', '.join(EXPONENT_MODES)}")
    if s.frontier not in FRONTIER_MODES:
        raise AnalysisError(f"frontier={s.frontier!r}: use one of {', '.join(FRONTIER_MODES)}")
    if s.lr not in LR_RULES:
        raise AnalysisError(f"lr={s.lr!r}: use one of {', '.join(LR_RULES)}")
    if s.protocol not in PROTOCOLS:
        raise AnalysisError(f"protocol={s.protocol!r}: use one of {', '.join(PROTOCOLS)}")
    if not (s.stall_margin >= 0 and math.isfinite(s.stall_margin)):
        raise AnalysisError(f"stall_margin must be >= 0 (0: no stall detector), got {s.stall_margin!r}")
    if s.interval not in INTERVAL_METHODS:
        raise AnalysisError(f"interval={s.interval!r}: use one of {', '.join(INTERVAL_METHODS)}")
    if s.compute_unit not in COMPUTE_UNITS:
        raise AnalysisError(f"compute_unit={s.compute_unit!r}: use one of {', '.join(COMPUTE_UNITS)}")
    if not 0 < s.level < 1:
        raise AnalysisError(f"level must be between 0 and 1 (e.g. 0.9 for a 90% interval), got {s.level!r}")
    if s.n_boot < 0:
        raise AnalysisError(f"n_boot must be >= 0 (0 skips the bootstrap), got {s.n_boot!r}")
    if not s.delta > 0:
        raise AnalysisError(f"delta must be positive, got {s.delta!r}")
