"""Depth mixers: how each sublayer's input is formed from the embedding and the earlier sublayers' outputs.

One interface (:class:`DepthMixer`, in :mod:`attnres.mixers.base`), one implementation per variant, and
:func:`build_mixer`, the one place that maps a config to its mixer.
"""

from __future__ import annotations

from attnres.config import ModelConfig
from attnres.mixers import ablations
from attnres.mixers.attnres import AttnRes, ReferenceAttnRes, TracedAttnRes
from attnres.mixers.base import DepthMixer, DepthState, Recorder, at_least_fp32
from attnres.mixers.baseline import ResidualSum

__all__ = [
    "AttnRes",
    "DepthMixer",
    "DepthState",
    "Recorder",
    "ReferenceAttnRes",
    "ResidualSum",
    "TracedAttnRes",
    "at_least_fp32",
    "build_mixer",
]


def build_mixer(cfg: ModelConfig, reference: bool = False, fused: bool = False) -> DepthMixer:
    """The one place that maps a config to its depth mixer (``fused``: see :mod:`attnres.kernels.fused`)."""
    if cfg.residual == "baseline":
        return ResidualSum()
    if cfg.residual in ("full", "block") and not cfg.ablation_switches:
        return ReferenceAttnRes(cfg) if reference else AttnRes(cfg, fused=fused)
    if cfg.residual == "denseformer":
        return ablations.DenseFormer(cfg)
    if cfg.residual in ("hc", "mhc"):
        return ablations.HyperConnections(cfg)
    return ablations.AttnResAblation(cfg)
