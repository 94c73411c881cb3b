"""The regime behind each headline multiplier, so that a reader can compare it with the paper's.

M = C_base(L_var) / C is, for a power law, about exp(-gap / alpha) with the loss gap gap = log(L_var / L_base):
the same 1.5 % gap reads as M = 0.88 at alpha 0.117 and 0.77 at the paper's 0.057. So next to M the report
states, per variant: tokens per parameter over its budgets (the paper trained about 200 per activated
parameter, a tiny CPU study 4), the fitted exponent behind M, the paired loss gap at the largest budget in %
(no law needed), and the M that gap would give at the paper's exponent. The paper's own row comes from its
published fits and its table of losses (../shared/docs/attnres-method.md).

Takes the :class:`analysis.FitReport`; never reads files; never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from analysis.base.bootstrap import Estimate, json_number
from reports.base.paper import PAPER_ALPHA, PAPER_GAP_PCT, PAPER_M, PAPER_TOKENS_PER_PARAM, TABLE2_PARAMS
from reports.base.style import compact_int

if TYPE_CHECKING:  # pragma: no cover
    from analysis import SweepFit, VariantMultiplier


@dataclass(frozen=True)
class Regime:
    """Where one variant's headline M was measured."""

    variant: str
    multiplier: Estimate
    tokens_per_param: tuple[float, float]  # lowest and highest over the variant's budgets
    alpha: Estimate  # the exponent behind M: the shared one, or the baseline's own with separate exponents
    gap_pct: Estimate | None  # the paired loss gap at the largest budget, in % of the baseline's loss
    compute_ratio: float  # C_base / C_var at that budget (the variant pays for its depth attention)

    @property
    def multiplier_at_paper_alpha(self) -> float:
        """The M the same loss gap would give at the paper's exponent: (C_base / C_var) (L_var / L_base)^(-1/0.057)."""
        if self.gap_pct is None or not 1 + self.gap_pct.value / 100 > 0:
            return math.nan
        return self.compute_ratio * math.exp(-math.log1p(self.gap_pct.value / 100) / PAPER_ALPHA)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens_per_param": [json_number(v) for v in self.tokens_per_param],
            "alpha": self.alpha.to_dict(),
            "gap_pct": None if self.gap_pct is None else self.gap_pct.to_dict(),
            "multiplier_at_paper_alpha": json_number(self.multiplier_at_paper_alpha),
        }


def regime(sw: SweepFit, m: VariantMultiplier) -> Regime:
    """The regime of one variant's headline in a fitted sweep."""
    points = sw.curve(m.variant).points
    ratios = [p.tokens / p.params for p in points if p.params > 0 and math.isfinite(p.tokens / p.params)]
    span = (min(ratios), max(ratios)) if ratios else (math.nan, math.nan)
    if m.exponent == "shared" and sw.joint is not None:
        alpha = sw.joint.alpha
    else:
        alpha = sw.curve(m.baseline).fit.alpha
    top = max(m.gaps, key=lambda g: g.compute) if m.gaps else None
    at_top = top is not None and math.isclose(top.compute, m.compute, rel_tol=1e-9)
    return Regime(
        m.variant,
        m.multiplier,
        span,
        alpha,
        top.gap_pct if at_top else None,
        top.baseline_compute / top.compute if at_top else math.nan,
    )


def _span(low: float, high: float) -> str:
    return f"{low:.3g}" if math.isclose(low, high, rel_tol=0.005) else f"{low:.3g} to {high:.3g}"


def regime_rows(sw: SweepFit, order: list[str], labels: dict[str, str]) -> list[dict[str, str]]:
    """The report's regime table: one row per variant (in ``order``, named by ``labels``), then the paper's."""
    rows = []
    for variant in order:
        r = regime(sw, sw.multiplier(variant))
        rows.append(
            {
                "variant": labels.get(variant, variant),
                "M": r.multiplier.text(3),
                "tokens per parameter": _span(*r.tokens_per_param),
                "alpha": r.alpha.text(3),
                "loss gap at the largest budget (%)": "" if r.gap_pct is None else r.gap_pct.text(2),
                f"M from that gap at alpha {PAPER_ALPHA}": Estimate(r.multiplier_at_paper_alpha).text(3),
            }
        )
    rows.append(
        {
            "variant": "the paper: Block AttnRes, its fits and data",
            "M": f"{PAPER_M}",
            "tokens per parameter": _span(*PAPER_TOKENS_PER_PARAM) + " (activated)",
            "alpha": f"{PAPER_ALPHA}",
            "loss gap at the largest budget (%)": f"{PAPER_GAP_PCT:.2g} ({compact_int(TABLE2_PARAMS[-1])})",
            f"M from that gap at alpha {PAPER_ALPHA}": "",
        }
    )
    return rows


def paper_sentence(sw: SweepFit, order: list[str]) -> str:
    """One sentence comparing the sweep's regime with the paper's."""
    regimes = [regime(sw, sw.multiplier(v)) for v in order]
    alphas = sorted({round(r.alpha.value, 3) for r in regimes})
    gaps = [r.gap_pct.value for r in regimes if r.gap_pct is not None]
    tpp = [v for r in regimes for v in r.tokens_per_param if math.isfinite(v)]
    at_paper = [r.multiplier_at_paper_alpha for r in regimes if math.isfinite(r.multiplier_at_paper_alpha)]
    text = (
        f"The paper's {PAPER_M}x comes at alpha {PAPER_ALPHA}, about {PAPER_TOKENS_PER_PARAM[0]:.0f} to "
        f"{PAPER_TOKENS_PER_PARAM[1]:.0f} tokens per activated parameter and a loss gap of {PAPER_GAP_PCT:.2g} % "
        f"(Block at its largest size); here alpha is {' / '.join(f'{a:g}' for a in alphas)}"
    )
    if tpp:
        text += f", with {_span(min(tpp), max(tpp))} tokens per parameter"
    if gaps:
        text += f", and the gap at the largest budget is {_span(min(gaps), max(gaps))} %"
    text += ". M = exp(-gap / alpha) depends on the exponent as much as on the gap"
    if at_paper:
        text += f": at the paper's alpha the same gaps would read M = {_span(min(at_paper), max(at_paper))}"
    return text + ". A smaller model trained on fewer tokens per parameter need not show the paper's regime."
