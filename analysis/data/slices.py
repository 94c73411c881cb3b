"""A sweep that trains every size at several training lengths, fitted once per length.

WSD branches (``branches:`` in a grid) or a size x budget grid give each size several budgets in tokens per
parameter. Loss against compute across all of them mixes allocations (at one compute, a small model trained long
and a large one trained briefly), which one power law in C does not describe. So such a sweep is fitted as one
set of curves per ratio, each the paper's design (one budget per size, tokens proportional to parameters), named
``<sweep>@<r>tpp``; how M moves with the ratio is then read across them. (Within a slice N and D move together, so
no Chinchilla surface is fitted there; one over all of a sweep's (N, D) points is not fitted yet.)
"""

from __future__ import annotations

import math

import pandas as pd

RATIO_RTOL = 0.1  # runs whose tokens per parameter differ by less than this share the ratio (variants' params differ)


def ratio_of(runs: pd.DataFrame) -> pd.Series:
    """Tokens per non-embedding parameter of every run."""
    return runs["tokens"].astype(float) / runs["params"].astype(float)


def ratio_groups(ratios: pd.Series) -> pd.Series:
    """A group id per run: ratios within :data:`RATIO_RTOL` of the previous, in sorted order, share one."""
    order = ratios.sort_values()
    ids, current, last = {}, -1, None
    for index, r in order.items():
        if last is None or r > last * (1 + RATIO_RTOL):
            current += 1
        ids[index] = current
        last = r
    return pd.Series(ids).reindex(ratios.index)


def ratio_label(ratio: float) -> str:
    """``16`` or ``0.5``: the ratio at two significant digits."""
    return f"{float(f'{ratio:.2g}'):g}"


def slices(sweep: str, runs: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """``[(name, runs)]``: the sweep whole, or one slice per ratio when at least two ratios each cover at least
    three sizes (a fit per slice needs three budgets) and every size is trained at more than one ratio."""
    if runs.empty or not {"tokens", "params", "n_layer", "d_model"} <= set(runs.columns):
        return [(sweep, runs)]
    ratios = ratio_of(runs)
    if not ratios.map(math.isfinite).all():
        return [(sweep, runs)]
    groups = ratio_groups(ratios)
    shapes = runs[["n_layer", "d_model"]].apply(tuple, axis=1)
    sizes_per_group = shapes.groupby(groups).nunique()
    groups_per_size = groups.groupby(shapes).nunique()
    if len(sizes_per_group) < 2 or (sizes_per_group < 3).any() or (groups_per_size < 2).any():
        return [(sweep, runs)]
    out = []
    named = runs["variant"].astype(str) == "baseline" if "variant" in runs.columns else None
    for gid in sorted(groups.unique()):
        part = runs[groups == gid]
        # named by the baseline's ratio where there is one: a grid counts tokens per parameter on the baseline
        # (AttnRes's few extra parameters put its runs a little lower: 7.9 for a grid's 8)
        mine = ratios[(groups == gid) & named] if named is not None and (named & (groups == gid)).any() else None
        out.append((f"{sweep}@{ratio_label((ratios[groups == gid] if mine is None else mine).median())}tpp", part))
    return out
