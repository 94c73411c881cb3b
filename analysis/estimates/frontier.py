"""The effective compute multiplier read at the compute-optimal frontier of two Chinchilla surfaces.

Where N and D vary independently (a WSD-branched sweep, every size at several tokens per parameter; an IsoFLOP
grid), each curve's points are fitted as one surface ``L(N, D) = E + A / N^alpha + B / D^beta``
(:func:`analysis.laws.fit.fit_chinchilla`). Its frontier is the lowest loss the curve reaches at compute C::

    L*(C) = min over N in [N_min, N_max] of L(N, C / f(N))

``f(N)``: the curve's FLOPs per token, interpolated in log-log between its trained sizes; N stays within the
sizes trained, where the surface was measured. The multiplier at C is ``M = C_base / C`` with
``L*_base(C_base) = L*_var(C)``: the compute the baseline needs, at its own best size, to reach the loss the
variant reaches at C at its best size (Hoffmann et al. 2022's compute-optimal frontier, compared as in the paper's
Figure 4). It is read at the smallest, a middle and the largest compute the variant trained.

Interval: the surfaces' own case bootstrap over the (size, budget) cells, whose draws are the same for both
surfaces when both have the same cells (what the two share at a cell, such as the data order of a seed, cancels;
other cells: no interval), percentiles at the fit's level. The coverage study (docs/analysis.md) has not
calibrated it, and every table says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.base.bootstrap import Estimate, estimate, json_number
from analysis.data.select import curve_variants
from analysis.laws.fit import ChinchillaFit
from attnres.variants import Variant

SIZE = ["n_layer", "d_model"]
N_GRID = 96  # candidate sizes per frontier (log-spaced over the trained range)
C_SPAN = 6.0  # the baseline's frontier is searched over C_var x e^-6 .. e^6 (M within 1/400 .. 400)
C_STEP = 0.02  # of log C on that search (linear interpolation between: M to well under 0.1 %)
CHUNK = 100  # replicates evaluated at once (memory: CHUNK x computes x N_GRID floats)
NOT_CALIBRATED = "case bootstrap over (size, budget) cells, paired; not calibrated by the coverage study"


@dataclass(frozen=True)
class FrontierMultiplier:
    """M of ``variant`` (a curve name; ``curve_variant``: the variant it stands for, with Block AttnRes's N) over
    ``baseline`` at compute ``compute``, read between their frontiers."""

    variant: str
    curve_variant: Variant
    baseline: str
    compute: float  # FLOPs at which the variant's frontier is read
    M: Estimate
    n_opt: float  # the variant's compute-optimal size at ``compute`` (non-embedding params)
    n_opt_baseline: float  # the baseline's at ``compute x M``
    edge: str  # "" or which optimum sits at the edge of the trained sizes (the frontier is then that size's)
    paired: bool  # both surfaces were resampled with the same draws (they share every cell)
    n_boot_failed: int

    def to_dict(self) -> dict:
        return {
            "variant": self.variant,
            "baseline": self.baseline,
            "compute": json_number(self.compute),
            "M": self.M.to_dict(),
            "n_opt": json_number(self.n_opt),
            "n_opt_baseline": json_number(self.n_opt_baseline),
            "edge": self.edge,
            "paired": self.paired,
            "interval": NOT_CALIBRATED,
            "n_boot_failed": self.n_boot_failed,
        }


@dataclass(frozen=True)
class _Curve:
    """What a frontier needs of one curve: its cells (in its fit's point order), sizes and FLOPs per token."""

    cells: list[tuple]
    log_n: np.ndarray  # the trained sizes, sorted
    log_f: np.ndarray  # their FLOPs per token
    flops: np.ndarray  # each point's training FLOPs

    @classmethod
    def of(cls, points: pd.DataFrame) -> _Curve:
        """A cell is a size and the rank of its budget among that size's (tokens differ between variants under
        a FLOP budget, each converting it with its own FLOPs per token)."""
        sizes = points.groupby("params")["flops_per_token"].mean().sort_index()
        rank = points.groupby(SIZE)["tokens"].rank(method="first").astype(int)
        return cls(
            [(*row, r) for row, r in zip(points[SIZE].itertuples(index=False), rank)],
            np.log(sizes.index.to_numpy(float)),
            np.log(sizes.to_numpy(float)),
            points["flops"].to_numpy(float),
        )

    def grid(self) -> tuple[np.ndarray, np.ndarray]:
        log_n = np.linspace(self.log_n[0], self.log_n[-1], N_GRID)
        return log_n, np.interp(log_n, self.log_n, self.log_f)


def frontier(params: Mapping[str, np.ndarray], log_c: np.ndarray, curve: _Curve) -> tuple[np.ndarray, np.ndarray]:
    """``(L*, index of the optimal size)`` of every parameter set (B,) at every ``log_c`` (B, K) or (K,)."""
    log_n, log_f = curve.grid()
    E, A, B, alpha, beta = (np.asarray(params[k], dtype=float)[:, None, None] for k in ("E", "A", "B", "alpha", "beta"))
    log_c = np.broadcast_to(np.atleast_2d(log_c), (E.shape[0], np.shape(log_c)[-1]))[:, :, None]
    loss = E + A * np.exp(-alpha * log_n) + B * np.exp(-beta * (log_c - log_f))
    best = np.nanargmin(np.where(np.isfinite(loss), loss, np.inf), axis=-1)
    return np.take_along_axis(loss, best[..., None], axis=-1)[..., 0], best


def multipliers_at(
    var: Mapping[str, np.ndarray],
    base: Mapping[str, np.ndarray],
    log_c: np.ndarray,
    var_curve: _Curve,
    base_curve: _Curve,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """M (B, K) of every parameter-set pair at every ``log_c`` (K,), with the optimal-size indices of both."""
    out_m, out_iv, out_ib = [], [], []
    size = np.asarray(var["E"]).shape[0]
    search = np.arange(log_c.min() - C_SPAN, log_c.max() + C_SPAN + C_STEP, C_STEP)  # the baseline's computes
    for start in range(0, size, CHUNK):
        part = slice(start, start + CHUNK)
        target, iv = frontier({k: np.asarray(x)[part] for k, x in var.items()}, log_c, var_curve)  # (b, K)
        curve, idx = frontier({k: np.asarray(x)[part] for k, x in base.items()}, search, base_curve)  # (b, G)
        m = np.full(target.shape, np.nan)
        ib = np.full(target.shape, -1)  # no baseline optimum where M is beyond the searched compute (0 or inf)
        for i, k in np.ndindex(*target.shape):
            lo, hi = np.searchsorted(search, [log_c[k] - C_SPAN, log_c[k] + C_SPAN])
            row = curve[i, lo:hi]  # non-increasing in C: a minimum of losses that all fall with C
            if not np.isfinite(target[i, k]) or not np.all(np.isfinite(row)):
                continue
            if target[i, k] > row[0]:
                m[i, k] = 0.0  # the baseline reaches the variant's loss with less than C / 400
            elif target[i, k] < row[-1]:
                m[i, k] = math.inf  # the baseline does not reach it within 400 x C
            else:
                at = np.interp(target[i, k], row[::-1], search[lo:hi][::-1])
                m[i, k] = math.exp(at - log_c[k])
                ib[i, k] = idx[i, lo + min(np.searchsorted(-row, -target[i, k]), row.size - 1)]
        out_m.append(m)
        out_iv.append(iv)
        out_ib.append(ib)
    return np.concatenate(out_m), np.concatenate(out_iv), np.concatenate(out_ib)


def frontier_multipliers(
    points: pd.DataFrame,
    fits: Mapping[str, ChinchillaFit],
    baseline: str,
    level: float,
    variants: Mapping[str, Variant] | None = None,
) -> tuple[list[FrontierMultiplier], list[str]]:
    """M at the frontier for every curve with a surface, against ``baseline``'s surface; and notes.

    ``points``: the sweep's point table (:func:`analysis.select_points`); each fit's points are its curve's rows
    in that order (as :func:`analysis.fitting.sweep_fits` fitted them). The intervals come from the surfaces' own
    bootstrap replicates (:attr:`ChinchillaFit.replicates`), paired where the two curves have the same cells.
    ``variants``: the curves' variants (default: :func:`analysis.data.select.curve_variants` of ``points``)."""
    notes: list[str] = []
    if baseline not in fits:
        return [], notes
    variants = curve_variants(points) if variants is None else variants
    curves = {lab: _Curve.of(points[points["curve"] == lab]) for lab in fits}
    base_curve, base_fit = curves[baseline], fits[baseline]
    out = []
    for label, fit in fits.items():
        if label == baseline:
            continue
        curve = curves[label]
        paired = (
            curve.cells == base_curve.cells
            and fit.n_points == base_fit.n_points == len(curve.cells)  # no point dropped by the fit's checks
            and fit.seed == base_fit.seed
            and fit.n_boot == base_fit.n_boot
        )
        if not paired:
            notes.append(
                f"{label}: its points are not {baseline}'s (size, budget) cells, so the frontier M has no interval "
                "(the surfaces' resamples cannot be paired)"
            )
        log_c = np.log(_read_at(curve.flops))
        m, iv, ib = multipliers_at(_params(fit), _params(base_fit), log_c, curve, base_curve)
        samples, failed = None, 0
        if paired and fit.replicates is not None and base_fit.replicates is not None:
            samples = multipliers_at(fit.replicates, base_fit.replicates, log_c, curve, base_curve)[0]
            failed = int(np.sum(np.isnan(fit.replicates["E"]) | np.isnan(base_fit.replicates["E"])))
        n_var, n_base = curve.grid()[0], base_curve.grid()[0]
        for k, c in enumerate(np.exp(log_c)):
            kept = None if samples is None else samples[:, k][~np.isnan(samples[:, k])]
            out.append(
                FrontierMultiplier(
                    label,
                    variants[label],
                    baseline,
                    float(c),
                    _estimate(float(m[0, k]), kept, level),
                    float(math.exp(n_var[iv[0, k]])),
                    float(math.exp(n_base[ib[0, k]])) if ib[0, k] >= 0 else math.nan,
                    edge_note(iv[0, k], ib[0, k], label, baseline),
                    paired,
                    failed,
                )
            )
    return out, notes


def at_largest_compute(found: Sequence[FrontierMultiplier]) -> list[FrontierMultiplier]:
    """Each variant's M at its largest compute (the one the headline shows), in ``found``'s order."""
    top = {}
    for m in found:
        if m.variant not in top or m.compute > top[m.variant].compute:
            top[m.variant] = m
    return [m for m in found if top[m.variant] is m]


def _params(fit: ChinchillaFit) -> dict[str, np.ndarray]:
    law = fit.law
    return {k: np.array([getattr(law, k)]) for k in ("E", "A", "B", "alpha", "beta")}


def _read_at(flops: np.ndarray) -> np.ndarray:
    """The computes M is read at: the smallest, the geometric middle and the largest trained."""
    low, high = float(np.min(flops)), float(np.max(flops))
    return np.array([low, math.sqrt(low * high), high])


def edge_note(iv: int, ib: int, label: str, baseline: str) -> str:
    """Why a frontier M may not be what it seems: a surface's optimum at an end of the searched sizes (grid index
    ``iv`` of the variant, ``ib`` of the baseline; -1: beyond the searched compute); "" when neither is."""
    where = [] if ib >= 0 else [f"{baseline} beyond the searched compute"]
    for who, i in ((label, iv), (baseline, ib)):
        if i == 0:
            where.append(f"{who}'s optimum at the smallest size")
        elif i == N_GRID - 1:
            where.append(f"{who}'s optimum at the largest size")
    return "; ".join(where)


def _estimate(value: float, samples: np.ndarray | None, level: float) -> Estimate:
    """M's estimate; replicates at 0 or inf (beyond the searched compute) stay in, as possible ends."""
    if samples is None or samples.size == 0:
        return Estimate(value, math.nan, math.nan, level)
    return estimate(value, samples, level)
