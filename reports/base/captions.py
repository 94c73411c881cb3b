"""The report's words: each figure's title and caption, and the short texts the sections share (the report's
title, unit and sweep names, which points the fits use, what a figure's interval is) with the way a table cell
writes a loss, a count or an exponent. Words only: no drawing, no files; never imports torch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from analysis.fitting.settings import TRUNK_SUFFIX, TUNING_SUFFIX
from reports.base.paper import PAPER_HEADLINE_C, PAPER_M
from reports.base.style import compact_int

if TYPE_CHECKING:  # pragma: no cover
    from analysis import Estimate, FitSettings, Results

# how the loss-rate figure's lines were fitted, per --lr envelope shape (analysis.data.envelope.SHAPES)
ENVELOPE_SHAPES = {
    "local": "a parabola in ln rate over the 3 rates around the best",
    "split": "a parabola in ln rate with its own curvature each side of its minimum, over every rate",
}

CAPTIONS = {  # figure kind -> (title, caption); a caption's {fields} are filled per figure
    "scaling_curves": (
        "Scaling curves",
        "Validation loss against training compute on log-log axes: markers are the points the fits use ({points}; "
        "faint hollow markers are the individual runs), lines the fitted power laws per variant, and the lower panel "
        "shows each as a percentage of the baseline's fitted loss, so below 0 % means a lower loss than the baseline "
        "at the same compute; the box gives each variant's multiplier M at its largest budget {with_interval}.",
    ),
    "multiplier": (
        "Effective compute multiplier",
        "The compute the baseline needs to reach a variant's loss, divided by the variant's own compute (M), at each "
        "measured budget {with_interval}, and from the fitted curves (solid: the headline, shared "
        "exponent or separate exponents; dotted: the other); M above the dashed line at 1 means the variant saves "
        "compute, and the thin dotted grey line is the paper's value from its own fits (their data).",
    ),
    "loss_curves": (
        "Loss during training",
        "Loss against training tokens for each variant at one model size (left: the whole run on log tokens; right: "
        "the second half of training on linear axes), one line per seed of the chosen learning rate; lower is better.",
    ),
    "block_output_rms": (
        "Output magnitude per transformer block",
        "RMS (over tokens and channels) of the hidden state each transformer block hands on to the next, against "
        "depth, at the end of training (for the baseline this is the residual stream); the paper reports that the "
        "baseline's grows with depth while AttnRes keeps it bounded.",
    ),
    "block_grad_norm": (
        "Gradient magnitude per transformer block",
        "L2 norm of the gradients of each transformer block's parameters, before gradient clipping, against depth "
        "at the end of training; the paper reports outsized gradients in the baseline's early blocks and a more even "
        "profile with AttnRes. Runs written before schema version 2 logged these norms after clipping, which scales "
        "every block by the step's clip factor when clipping bites (the title counts such runs).",
    ),
    "block_size_ablation": (
        "Block-size ablation",
        "Validation loss against the block size S in sublayers (S = 1 is Full AttnRes, S = L a single block) at one "
        "model size, labelled with the number of blocks N, error bars the range over seeds, and the baseline as the "
        "horizontal line; points below the line beat the baseline.",
    ),
    "depth_attention": (
        "Depth attention",
        "Mean depth-attention weight (over tokens) that each reading sublayer (row) puts on each source (column; emb = "
        "the embedding), pre-attention sublayers left and pre-MLP sublayers right with the LM head's final aggregation "
        "as the last row; each row sums to 1, grey cells are sources a row cannot see{block}.",
    ),
    "lr_curves": (
        "Loss against learning rate",
        "Validation loss against the learning rate at each size: markers are each variant's mean over seeds at every "
        "rate trained, lines the fitted envelope ({envelope_shape}) "
        "and stars its minimum, the loss the fits read; a hollow star sits at an end of the swept rates, so the "
        "minimum lies beyond the rates tried.",
    ),
    "best_lr": (
        "Best learning rate against size",
        "Each variant's best learning rate (the envelope's minimum; hollow: at an end of the swept rates) against its "
        "non-embedding parameters, with a power law fitted to them (dashed) drawn out to the paper's sizes, where the "
        "crosses are the paper's Table 2 rates (its tokenizer and recipe: a reference, not a target).",
    ),
    "depth_trend": (
        "The gap to the baseline against depth",
        "On a ladder of one width, where only depth moves: left, each variant's paired loss gap to the baseline at "
        "every depth, 100 (ln L_base - ln L_var), above 0 where the variant's loss is lower, with its least-squares "
        "line and the line's {level} band (a t interval on the depths' scatter about it); the legend gives the "
        "line's change from the shallowest to the deepest size with its interval. Right: the paired M at each "
        "depth (the gap through the baseline law's local slope).",
    ),
    "architecture": (
        "Loss over depth and heads at one size and one compute",
        "Every cell a model of about the same non-embedding parameters trained with the same FLOPs (the paper's "
        "Fig. 7): columns are depths, the deeper the narrower (d/L: d_model / n_layer), rows the head counts. One "
        "heatmap of the loss per curve on a shared scale (mean over seeds at the best rate; the star: the curve's "
        "best cell), and per variant the heatmap of its gap to the baseline in each cell, 100 (ln L_var - ln "
        "L_base), blue where the variant's loss is lower, titled with the gap's least-squares change from the "
        "shallowest to the deepest column and its interval (below 0: the variant gains more from depth).",
    ),
    "paper_fits": (
        "The paper's published fits (reference)",
        "The paper's own fits L = A C^-alpha in PFLOP/s-days (their data, tokenizer and FLOP count), drawn apart from "
        "our runs because neither the losses nor the compute are comparable; only the multiplier they imply "
        f"({PAPER_M} for Block at C = {PAPER_HEADLINE_C}) compares with ours.",
    ),
}


def report_title(results: Results) -> str:
    """``AttnRes report: <name of the results folder>``: report.md's first heading and report.html's title."""
    return f"AttnRes report: {Path(str(results.root)).resolve().name or str(results.root)}"


def caption_interval(settings: FitSettings) -> str:
    """What the captions say of the interval: ``with its 90% bootstrap interval``, or why there is none."""
    pct = int(round(settings.level * 100))
    return f"with its {pct}% bootstrap interval" if settings.n_boot > 0 else "(no interval: --n-boot 0)"


def chosen_points(settings: FitSettings) -> str:
    """Which runs a point of the fits stands for and at which learning rate (``--select``, ``--lr``, ``--protocol``):
    the settings' own words (:meth:`analysis.fitting.settings.FitSettings.words`)."""
    return settings.words()["points"]


def unit_name(unit: str) -> str:
    return "PFLOP/s-days" if unit == "pflops_days" else "training FLOPs"


def sweep_name(name: str) -> str:
    """A sweep as the provenance names it, saying why a tuning search or WSD trunks are not fitted."""
    if name.endswith(TUNING_SUFFIX):
        return f"`{name}` (the learning-rate search of `attnres tune`; not fitted, its pruned trials stay unfinished)"
    if name.endswith(TRUNK_SUFFIX):
        return f"`{name}` (the stable trunks of WSD branches; not fitted: their learning rate never decays)"
    return f"`{name}`"


def protocol_text(other: tuple[str, Estimate]) -> str:
    """M under the other tuning protocol, with the protocol's name."""
    return f"{other[1].text(3)} ({other[0]})"


# how the report's tables write their cells (an empty cell where there is no value)


def fmt_loss(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"


def fmt_delta(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.4f}"


def fmt_gap(v: Any) -> str:
    """A gap in points of % (two decimals, signed)."""
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.2f}"


def fmt_count(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else compact_int(v)


def fmt_sci(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def fmt_int(v: Any) -> str:
    return "" if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else str(int(v))
