"""The options of a fit (``attnres fit``, ``attnres report``, :func:`analysis.fit_results`), declared once:
:class:`FitSettings` holds every option with its default, its choices and its help text (each field's metadata),
and the command line is built from it (:func:`analysis.cli.add_fit_options`); :func:`check_settings` is the one
place their values are checked, and :meth:`FitSettings.words` / :meth:`FitSettings.describe` the one place they are
put into words (the CLI's settings lines, the report's provenance and captions, the sensitivity table all read
them). fit.json writes them all (``settings``).

Pure Python; never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from analysis.base.bootstrap import DEFAULT_LEVEL, DEFAULT_N_BOOT
from analysis.base.errors import AnalysisError, FitInputError
from analysis.data.points import LR_RULES, PROTOCOLS
from analysis.data.select import BUDGET_RTOL, SELECT_METHODS
from analysis.data.stalls import STALL_MARGIN
from analysis.estimates.depth import NOISE_FLOOR
from analysis.estimates.study import BUDGETS, INTERVAL_METHODS
from analysis.laws.forms import FORMS, law_for, normalize_form
from analysis.laws.laws import PFLOP_S_DAY, POWER
from analysis.laws.optimizer import AUTO, DELTA_FLOOR, HUBER_K, LEAST_SQUARES_DELTA, check_delta

COMPUTE_UNITS = {"flops": 1.0, "pflops_days": PFLOP_S_DAY}

UNIT_NAMES = {"flops": "training FLOPs", "pflops_days": "PFLOP/s-days (1e15 * 86400 training FLOPs)"}

UNIT_SHORT = {"flops": "FLOPs", "pflops_days": "PFLOP/s-days"}

EXPONENT_MODES = ("auto", "shared", "unshared")
# the headline leaves the shared exponent only when this interval of alpha_var - alpha_base excludes 0

FRONTIER_MODES = ("auto", "on", "off")

DEFAULT_BASELINE = "baseline"

TUNING_SUFFIX = "-tune"  # the sweep name `attnres tune` gives its trials

TRUNK_SUFFIX = "-trunk"  # the sweep of a grid's WSD trunks (attnres.training.branches): constant rate, no budget


# The words for each setting's values (FitSettings.words): what a point stands for, how its rate was chosen, whose
SELECT_WORDS = {"mean": "the mean over seeds", "median": "the median over seeds", "best": "the best of the seeds"}
LR_WORDS = {
    "best": "the best learning rate trained",
    "envelope": "the learning-rate envelope's minimum (--lr envelope: a parabola in ln rate over the 3 rates around "
    "the best, least squares)",
    "split": "the learning-rate envelope's minimum (--lr split: a split parabola over every rate, least squares)",
}
PROTOCOL_WORDS = {
    "per-variant": "each variant at its own",
    "paper": "every variant at the baseline's (the paper's protocol)",
}
RESAMPLE_WORDS = {
    "budgets": "resampling the budgets' deviations from the law",
    "seeds": "resampling the seeds at each budget",
}


def _form_name(text: str) -> str:
    """A form on the command line, by any of its spellings (``curved``), as its canonical name."""
    try:
        return normalize_form(text)
    except FitInputError as err:
        import argparse

        raise argparse.ArgumentTypeError(str(err)) from None


def option(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    choices: tuple | None = None,
    cli: bool = True,
    parse: Callable[[str], Any] | None = None,
) -> Any:
    """A field of :class:`FitSettings` with what the command line needs to offer it: its help text, its choices and
    its flag (default ``--<name>`` with dashes)."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices, "cli": cli, "parse": parse})


@dataclass(frozen=True)
class FitSettings:
    """Every option of a fit, declared once: its default, help text and choices (each field's metadata). The
    command line of ``attnres fit`` and ``attnres report`` is built from these fields (:func:`add_arguments`),
    :func:`analysis.fit_results` and the bootstrap take this object, and fit.json writes it whole (``settings``;
    ``resample`` under its earlier key ``interval``, which older files have too)."""

    form: str = option(
        POWER,
        "curve form, each law's own formula (analysis.laws.forms): "
        + "; ".join(f"{name!r}: {form.short}" for name, form in FORMS.items())
        + f" (default {POWER!r}, the paper's)",
        choices=tuple(FORMS),
        parse=_form_name,
    )
    select: str = option(
        "mean",
        "point per (variant, size, budget): mean over seeds at the best LR (default), their median, or the best run",
        choices=SELECT_METHODS,
    )
    baseline: str = option(DEFAULT_BASELINE, "the variant the others are compared with (default: baseline)")
    level: float = option(DEFAULT_LEVEL, "confidence level of the intervals (default 0.9)")
    n_boot: int = option(DEFAULT_N_BOOT, "bootstrap resamples (default 1000; 0: no intervals)")
    seed: int = option(0, "seed of the bootstrap (default 0)")
    delta: float | str = option(
        AUTO,
        "scale of the robust (pseudo-Huber) loss on log-loss residuals: auto (default: 1.345 robust standard "
        "deviations of the least-squares residuals, at least 1e-3) or a number (10: least squares)",
    )
    exponent: str = option(
        "auto",
        "headline multiplier from a shared exponent, separate ones, or auto: shared unless the test says they differ",
        choices=EXPONENT_MODES,
    )
    frontier: str = option(
        "auto",
        "IsoFLOP minima per budget when a budget has several sizes (auto), always, or never",
        choices=FRONTIER_MODES,
    )
    compute_unit: str = option(
        "flops",
        "compute unit of the fits and tables (default: training FLOPs as stored)",
        flag="--units",
        choices=tuple(COMPUTE_UNITS),
    )
    budget_rtol: float = option(BUDGET_RTOL, "runs whose FLOPs differ by less share a budget", cli=False)
    chinchilla: bool = option(True, "skip the Chinchilla surface fits", flag="--no-chinchilla")
    resample: str = option(
        BUDGETS,
        "how the bootstrap makes a replicate: budgets (default: each budget's deviation from the law, with its seed "
        "noise, resampled over budgets, the same budget for every variant; calibrated by the coverage studies of "
        "docs/analysis.md) or seeds (the seeds at each budget only; too narrow when the points stray from the law, "
        "and then marked unreliable); --interval is its earlier name",
        choices=INTERVAL_METHODS,
    )
    lr: str = option(
        "best",
        "each cell's learning rate where a grid trained several: the best rate trained (default); envelope: the "
        "minimum of a parabola fitted to log loss against ln(rate) over the 3 rates around the best; split: the "
        "minimum of a parabola with its own curvature each side, over every rate (4 or more a cell; "
        "docs/analysis.md)",
        choices=LR_RULES,
    )
    protocol: str = option(
        "per-variant",
        "every variant at its own best learning rate (default), or at the baseline's (the paper's protocol); a grid "
        "that swept rates gets the other one beside the headline too",
        choices=PROTOCOLS,
    )
    stall_margin: float = option(
        STALL_MARGIN,
        "flag a run whose training loss lags its cell's other seeds by more than this fraction early in training "
        "(default 0.05; 0: no flags); the headline is also given without the flagged runs",
    )

    noise_floor: float = option(
        NOISE_FLOOR,
        "the least per-seed noise (%% of loss) of one depth's paired gap that a depth trend's interval assumes, "
        "however closely the depths' gaps sit on their line (default 0.61, measured in cpu_envelope; 0: the "
        'residuals alone; docs/analysis.md, "The depth trend")',
    )

    metric: str = option(
        "val",
        "the loss fitted: val (each run's validation split, default) or the name of an extra evaluation set the runs "
        "were evaluated on (data.eval_sets)",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "form", normalize_form(self.form))
        check_settings(self)

    def loss_words(self, delta: float | None = None) -> str:
        """The fits' loss in words; ``delta``: the scale a fit used, where the setting is "auto"."""
        if self.delta != AUTO:
            if self.delta >= LEAST_SQUARES_DELTA:
                return "least squares on log loss"
            return f"pseudo-Huber loss on log loss, scale {self.delta:g}"
        rule = f"{HUBER_K} robust sd of the least-squares residuals, at least {DELTA_FLOOR:g}"
        if delta is None:
            return f"pseudo-Huber loss on log loss, its scale from each sweep's residuals ({rule})"
        return f"pseudo-Huber loss on log loss, scale {delta:.2g} ({rule})"

    def words(self, delta: float | None = None) -> dict[str, str]:
        """Every setting that decides a number, in words, by what it decides: ``form``, ``points`` (which runs a
        point stands for and at which learning rate), ``loss``, ``intervals``, ``exponent``, ``baseline``."""
        pct = int(round(self.level * 100))
        intervals = (
            f"{pct}% bootstrap intervals from {self.n_boot} resamples (seed {self.seed}), "
            f"{RESAMPLE_WORDS[self.resample]}"
            if self.n_boot > 0
            else "no interval (--n-boot 0): point estimates only"
        )
        exponent = {
            "auto": "a shared exponent unless the exponent test says they differ",
            "shared": "a shared exponent",
            "unshared": "each curve's own exponent",
        }[self.exponent]
        return {
            "form": law_for(self.form).words,
            "points": f"{SELECT_WORDS[self.select]} at {LR_WORDS[self.lr]}, {PROTOCOL_WORDS[self.protocol]}",
            "loss": self.loss_words(delta),
            "intervals": intervals,
            "exponent": exponent,
            "baseline": f"compared with `{self.baseline}`",
        }

    def points_short(self) -> str:
        """What a point stands for, short enough for a figure's title: ``mean over seeds at the envelope minimum``."""
        rate = {"best": "the best rate", "envelope": "the envelope minimum", "split": "the split envelope minimum"}
        return f"{SELECT_WORDS[self.select].removeprefix('the ')} at {rate[self.lr]}"

    def describe(self, delta: float | None = None) -> str:
        """The settings in one sentence (the report's provenance): ``fits: L = A * C^-alpha (the paper's form);
        points: the mean over seeds at ...; loss: ...; intervals: ...; exponent: ...; compared with `baseline```."""
        w = self.words(delta)
        return (
            f"fits: {w['form']}; points: {w['points']}; loss: {w['loss']}; intervals: {w['intervals']}; "
            f"exponent: {w['exponent']}; {w['baseline']}"
        )

    @property
    def interval(self) -> str:
        """The resampling method under its earlier name (fit.json's ``settings.interval``)."""
        return self.resample

    def to_dict(self) -> dict[str, Any]:
        # metric only where it is not the validation split: fit.json files written before it existed stay the same
        return {
            ("interval" if f.name == "resample" else f.name): getattr(self, f.name)
            for f in fields(self)
            if not (f.name == "metric" and self.metric == "val")
        }


ALIASES = {"interval": "resample"}  # earlier names of options, still accepted by fit_results


def add_arguments(parser: Any) -> None:
    """The command-line options of every :class:`FitSettings` field marked for it (an argparse parser or group)."""
    for f in fields(FitSettings):
        meta = f.metadata
        if not meta.get("cli"):
            continue
        flags = [meta["flag"] or "--" + f.name.replace("_", "-")]
        flags += [f"--{old}" for old, new in ALIASES.items() if new == f.name]
        if f.type == "bool":  # a switch that turns a default-on option off
            parser.add_argument(*flags, dest=f.name, action="store_false", help=meta["help"])
            continue
        kind = meta.get("parse") or {"float": float, "int": int, "float | str": _number_or_auto}.get(f.type, str)
        parser.add_argument(
            *flags, dest=f.name, type=kind, default=f.default, choices=meta["choices"], help=meta["help"]
        )


def _number_or_auto(text: str) -> float | str:
    """A command-line value that is "auto" or a number."""
    if text == AUTO:
        return AUTO
    try:
        return float(text)
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"{text!r} is neither 'auto' nor a number") from None


def from_arguments(args: Any) -> FitSettings:
    """The :class:`FitSettings` of parsed options (:func:`add_arguments`)."""
    return FitSettings(**{f.name: getattr(args, f.name) for f in fields(FitSettings) if f.metadata.get("cli")})


def check_settings(s: FitSettings) -> None:
    """One clear error for an option value no fit can use."""
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
    if s.resample not in INTERVAL_METHODS:
        raise AnalysisError(f"resample={s.resample!r}: use one of {', '.join(INTERVAL_METHODS)}")
    if s.compute_unit not in COMPUTE_UNITS:
        raise AnalysisError(f"compute_unit={s.compute_unit!r}: use one of {', '.join(COMPUTE_UNITS)}")
    if not 0 < s.level < 1:
        raise AnalysisError(f"level must be between 0 and 1 (e.g. 0.9 for a 90% interval), got {s.level!r}")
    if s.n_boot < 0:
        raise AnalysisError(f"n_boot must be >= 0 (0 skips the bootstrap), got {s.n_boot!r}")
    if not (s.metric and all(c.isalnum() or c in "-_." for c in s.metric)):
        raise AnalysisError(f"metric={s.metric!r}: use val or the name of an evaluation set (data.eval_sets)")
    check_delta(s.delta, AnalysisError)
    if not (s.noise_floor >= 0 and math.isfinite(s.noise_floor)):
        raise AnalysisError(f"noise_floor must be >= 0 (% of loss; 0: the residuals alone), got {s.noise_floor!r}")
