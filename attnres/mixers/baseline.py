"""The PreNorm baseline: the fixed residual sum that AttnRes replaces."""

from __future__ import annotations

from torch import Tensor

from attnres.mixers.base import DepthMixer, DepthState


class ResidualSum(DepthMixer):
    """The PreNorm baseline: ``h_{l+1} = h_l + f_l(h_l)``."""

    def read(self, state: DepthState, layer: int) -> Tensor:
        return state.h

    def write(self, state: DepthState, layer: int, output: Tensor) -> None:
        state.h = state.h + output

    def finish(self, state: DepthState) -> Tensor:
        return state.h
