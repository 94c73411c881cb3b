"""How every figure looks: one color, marker and legend name per variant, fixed sizes, readable log axes.

A variant's color depends on its name only (never on the order curves happen to appear in), so the baseline
is the same near-black, Full AttnRes the same blue and Block AttnRes the same orange in every figure and every
report. Block curves of a block-size ablation (``block-N4``, ``block-N8``) get shades of the Block orange by N;
known ablation variants have fixed colors; any other name gets a color from a fixed palette chosen by a hash
of the name. Each helper takes the :class:`~attnres.variants.Variant` a curve stands for (a result's
``curve_variant``, or :func:`analysis.data.select.curve_variants` of a point table) and shows the N it carries; a
figure that shows N only where the curve's name says it (a Block curve of one N per size stands for every N) passes
``variant.as_named(curve)``. Imports matplotlib lazily (only the helpers that draw need it); never imports torch.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

from attnres.variants import Variant

BASELINE_COLOR = "#222222"
FULL_COLOR = "#1f6fb4"
BLOCK_COLOR = "#e0710c"

_FIXED_COLORS = {
    "baseline": BASELINE_COLOR,
    "full": FULL_COLOR,
    "block": BLOCK_COLOR,
    "denseformer": "#8a8a8a",
    "full+input_query": "#17becf",
    "full+scalar": "#6baed6",
    "full+sigmoid": "#2ca02c",
    "full+no_key_norm": "#08306b",
    "block+no_key_norm": "#8c2d04",
    "block+heads16": "#e7298a",
}
_PREFIX_COLORS = [("mhc", "#7b3294"), ("hc", "#c2a5cf"), ("full+window", "#4dac26")]
_PALETTE = [
    "#1b9e77",
    "#d95f02",
    "#7570b3",
    "#e7298a",
    "#66a61e",
    "#e6ab02",
    "#a6761d",
    "#666666",
    "#a6cee3",
    "#b2df8a",
    "#fb9a99",
    "#cab2d6",
]
_MARKERS = {"baseline": "o", "full": "s", "block": "^", "denseformer": "P", "hc": "X", "mhc": "D"}
_OTHER_MARKERS = ["v", "<", ">", "p", "h", "*", "d", "8"]

FIGSIZE = (7.0, 4.6)  # inches; at 150 dpi a PNG of about 1050 x 690 pixels
DPI = 150

RC = {
    "figure.dpi": 100,
    "savefig.dpi": DPI,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 8.5,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.hashsalt": "attnres-report",  # fixed ids inside SVG files: same figure, same bytes
    "svg.fonttype": "path",
    "pdf.compression": 6,
    "path.simplify": False,
    "image.interpolation": "nearest",
}


def variant_color(variant: Variant) -> str:
    """The fixed color of a variant (Block AttnRes with its N: a shade of the Block color by N)."""
    name = variant.name
    if name == "block" and variant.n_blocks is not None:
        return _block_shade(variant.n_blocks)
    if name in _FIXED_COLORS:
        return _FIXED_COLORS[name]
    for prefix, color in _PREFIX_COLORS:
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            return color
        if prefix.endswith("window") and name.startswith(prefix):
            return color
    return _PALETTE[_stable_index(name, len(_PALETTE))]


_BLOCK_SHADES = ["#f6b26b", "#f08a24", "#d9620b", "#a84a06", "#7a3304", "#4d2002", "#2e1301"]  # N ~ 1, 2, 4, .. 64


def _block_shade(n: int) -> str:
    """Block AttnRes with N blocks: light orange for N = 1 (one block), darker browns for more blocks."""
    k = min(len(_BLOCK_SHADES) - 1, max(0, round(math.log2(max(n, 1)))))
    return _BLOCK_SHADES[k]


def _stable_index(name: str, n: int) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % n


def variant_marker(variant: Variant) -> str:
    name, base = variant.name, variant.residual
    if name in _MARKERS:
        return _MARKERS[name]
    for prefix in ("mhc", "hc"):
        if base.startswith(prefix) and base[len(prefix) :].isdigit():
            return _MARKERS[prefix]
    return _OTHER_MARKERS[_stable_index(name, len(_OTHER_MARKERS))]


def variant_linestyle(variant: Variant) -> str:
    name = variant.name
    if name == "baseline":
        return "-"
    if name.startswith("block"):
        return "--"
    if name.startswith("full"):
        return "-"
    return "-."


def variant_label(variant: Variant) -> str:
    """The legend name (:attr:`Variant.title`): ``baseline``, ``Full AttnRes``, ``Block AttnRes (N=4)`` (with the N
    the variant carries); other names as they are, with an N they carry (``block+heads16 (N=4)``)."""
    return variant.title


def wrap_to_width(text: str, width_in: float, fontsize: float) -> str:
    """``text`` with each line broken at spaces so that it fits ``width_in`` inches at ``fontsize`` points (0.6 em a
    character: wider than the sans-serif font's average, so a wrapped line never reaches the figure's edge)."""
    import textwrap

    chars = max(20, int(width_in * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.fill(line, chars) for line in text.split("\n"))


def rc_context() -> Any:
    """The figures' matplotlib settings as a context manager (so importing reports changes nothing global)."""
    import matplotlib as mpl

    return mpl.rc_context(RC)


def readable_log_ticks(ax: Any, axis: str = "y", values: Sequence[float] | None = None, max_ticks: int = 7) -> None:
    """Plain-number tick labels on a log axis spanning less than a few decades (e.g. losses 2.4 .. 3.6).

    A log axis inside one decade gets no labelled major tick from matplotlib's default locator; here the
    ticks are "nice" linear values across the visible range, labelled as plain numbers.
    """
    # numpy with matplotlib, only where a figure is drawn: the colours and labels stay a light import
    import numpy as np
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter, NullLocator

    target = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    lo, hi = min(lo, hi), max(lo, hi)
    if not (lo > 0 and math.isfinite(lo) and math.isfinite(hi)):
        return
    if hi / lo > 30:  # several decades: matplotlib's own decade ticks read well
        return
    ticks = values if values is not None else MaxNLocator(nbins=max_ticks, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)
    ticks = [t for t in ticks if lo <= t <= hi]
    if len(ticks) < 2:
        ticks = list(np.geomspace(lo, hi, 4))
    digits = _digits_for(ticks)
    target.set_major_locator(FixedLocator(ticks))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.{digits}f}"))
    target.set_minor_locator(NullLocator())
    target.set_minor_formatter(NullFormatter())


def _digits_for(ticks: Sequence[float]) -> int:
    for digits in range(0, 6):
        labels = [f"{t:.{digits}f}" for t in ticks]
        if len(set(labels)) == len(labels) and all(
            abs(float(s) - t) <= 1e-9 * max(abs(t), 1) for s, t in zip(labels, ticks)
        ):
            return digits
    return 4


def compact_int(x: float) -> str:
    """``57.7M``, ``1.83B``, ``96.0k``: parameter and token counts in tables and titles."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "nan"
    x = float(x)
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.0f}"


def compact_ticks(ax: Any, axis: str = "x", log: bool = True) -> None:
    """Tick labels like ``200M``, ``1B`` (token counts); on a log axis at 1, 2 and 5 per decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    target = ax.xaxis if axis == "x" else ax.yaxis
    if log:
        target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        target.set_minor_formatter(NullFormatter())
    else:
        target.set_major_locator(MaxNLocator(nbins=6))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: compact_int(v)))
