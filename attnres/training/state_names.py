"""Parameter names in checkpoints: the eager model's, whatever compiled the model that saved them."""

from __future__ import annotations

from torch import Tensor

COMPILED_PREFIX = "_orig_mod."


def eager_names(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A state dict with the names of the eager model: ``torch.compile(model)`` (how runtime.compile compiled the
    baseline before it compiled in place) put ``_orig_mod.`` into every name, and such a checkpoint must resume
    whatever runtime.compile says now."""
    return {name.replace(COMPILED_PREFIX, ""): value for name, value in state_dict.items()}
