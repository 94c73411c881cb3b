"""AttnRes scaling-law suite: baseline vs Full vs Block Attention Residuals.

Public API::

    from attnres import ModelConfig, AttnResLM
    model = AttnResLM(ModelConfig(n_layer=4, d_model=128, residual="block", n_blocks=4))
    logits = model(tokens)  # (B, T) -> (B, T, vocab_size)

Names are resolved lazily so that torch-free parts (configs, FLOP counts, the parquet schemas used by
``analysis``) import without importing torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from attnres import blas

# before anything imports torch or calls MKL: a run's losses must not depend on its thread count (attnres.blas)
blas.request_strict_mode()

__version__ = "0.1.0"

_EXPORTS = {
    "ModelConfig": "attnres.config",
    "DataConfig": "attnres.config",
    "TrainConfig": "attnres.config",
    "RuntimeConfig": "attnres.config",
    "RunConfig": "attnres.config",
    "ConfigError": "attnres.config",
    "count_params": "attnres.costs",
    "count_flops": "attnres.costs",
    "AttnResLM": "attnres.model",
    "Recorder": "attnres.mixers",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'attnres' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
