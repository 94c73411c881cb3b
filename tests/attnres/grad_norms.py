"""The check that a run's per-layer gradient norms are the pre-clip ones (issue 53), shared by the one-device test
(test_train.py) and the two-process ones (test_parallel.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from attnres.storage import schema


def assert_layer_norms_combine(run_dir: Path, grad_clip: float, rtol: float = 1e-6) -> None:
    """At every step with both a train row and per-layer rows, the root of the sum of squares of the sublayers' and
    the outer groups' gradient norms (every parameter once) equals the logged pre-clip global norm to ``rtol``, and
    clipping was active there (the norm above ``grad_clip``), so post-clip values could not pass."""
    metrics = pd.read_parquet(run_dir / schema.METRICS_FILE)
    layers = pd.read_parquet(run_dir / schema.LAYERS_FILE)
    train = metrics[metrics.split == "train"].set_index("step").grad_norm
    parts = layers[layers.kind != "block"]
    assert set(parts.kind) >= {"attn", "mlp", "embedding", "final_norm"}, set(parts.kind)
    assert parts.loc[~parts.kind.isin(["attn", "mlp"]), "layer"].isna().all()  # outside the blocks: no layer
    combined = parts.groupby("step").grad_norm.apply(lambda g: float(np.sqrt(np.square(g.to_numpy(float)).sum())))
    steps = sorted(set(combined.index) & set(train.index))
    assert len(steps) >= 2, (sorted(combined.index), sorted(train.index))
    logged = train.loc[steps].to_numpy(float)
    assert (logged > 2 * grad_clip).all(), logged  # clipping bit at every compared step
    np.testing.assert_allclose(combined.loc[steps].to_numpy(float), logged, rtol=rtol, atol=0)
    # a block's norm combines its two sublayers'
    for _, at in layers.groupby("step"):
        sub = at[at.kind.isin(["attn", "mlp"])].groupby("layer").grad_norm.apply(lambda g: np.sqrt((g**2).sum()))
        block = at[at.kind == "block"].set_index("layer").grad_norm
        np.testing.assert_allclose(block.loc[sub.index].to_numpy(float), sub.to_numpy(float), rtol=1e-12)
