"""Depth mixing: how each sublayer's input is formed from what came before it.

Every variant is a :class:`DepthMixer` with the same four methods, so the model's block loop never asks which
variant it runs::

    state = mixer.start(embedding)          # v_0
    for l, f in enumerate(sublayers):       # l = 0 .. L-1 (0-based sublayer numbers)
        h = mixer.read(state, l)            # h_l, the input of sublayer l
        mixer.write(state, l, f(h))         # v_{l+1} = f_l(h_l), the raw sublayer output
    h_final = mixer.finish(state)           # what the final RMSNorm and the LM head read

Notation (the method page, with 0-based sublayers): ``v_0`` is the token embedding, ``v_{l+1}`` the output of
sublayer l. L = 2 * n_layer sublayers. Queries are indexed by the sublayer that reads (0..L-1), plus query L
for the final aggregation.

The variants: :mod:`attnres.mixers.baseline` (the residual sum), :mod:`attnres.mixers.attnres` (Full and
Block AttnRes, two-phase and reference), :mod:`attnres.mixers.ablations` (the paper's ablations); the package's
:func:`~attnres.mixers.build_mixer` maps a config to its mixer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from attnres.kernels.two_phase import Buffers


@dataclass
class Recorder:
    """Diagnostics of one forward pass (mean over tokens), filled only when a recorder is passed in.

    ``input_rms[l]`` / ``output_rms[l]``: RMS over tokens and channels of sublayer l's input h_l and raw
    output v_{l+1}; ``final_rms``: RMS of the final aggregation (input of the final norm);
    ``depth_weights[l]``: mean depth-attention weight of query l over its sources (AttnRes variants).
    """

    input_rms: dict[int, float] = field(default_factory=dict)
    output_rms: dict[int, float] = field(default_factory=dict)
    final_rms: float = math.nan
    depth_weights: dict[int, Tensor] = field(default_factory=dict)
    source_kinds: dict[int, list[str]] = field(default_factory=dict)

    @staticmethod
    def rms(x: Tensor) -> float:
        return norm(x).item() / math.sqrt(max(1, x.numel()))


def norm(x: Tensor) -> Tensor:
    """The L2 norm of all of ``x``, the same bits whatever the thread count: torch sums a whole tensor of more than
    32,768 elements in per-thread parts (``x.square().sum()`` differs between 1 and 2 threads), where its norm of one
    contiguous row is one pass in order. In fp64, so that the pass loses nothing worth a digit (in fp32 a million
    elements drifted by 1e-5)."""
    return torch.linalg.vector_norm(x.detach().double().flatten())


def at_least_fp32(x: Tensor) -> Tensor:
    """Upcast bf16/fp16 to fp32 (the depth softmax runs in fp32); fp32 and fp64 pass through unchanged."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


class DepthState:
    """Per-forward state of a mixer (sources, partial sums); created by ``start``, never shared."""

    def __init__(self, embedding: Tensor, recorder: Recorder | None) -> None:
        self.recorder = recorder
        self.h: Tensor = embedding  # ResidualSum: the residual stream
        # ReferenceAttnRes: b_0 = v_0, then completed block sums (TracedAttnRes: the same, in at least fp32)
        self.blocks: list[Tensor] = [embedding]
        self.logits: list[Tensor] = []  # TracedAttnRes: each completed source's logits against its readers
        self.partial: Tensor | None = None  # sum of the current block's outputs so far
        self.last: Tensor | None = None  # AttnRes: the latest output, not yet added to partial
        self.outputs: list[Tensor] = [embedding]  # ReferenceAttnRes (Full): every source v_0, v_1, ...
        self.bufs: Buffers | None = None  # AttnRes: the slot buffers of this forward
        self.u: Tensor | None = None  # AttnRes: query vectors w_q * g_q, (Q, D)
        self.tokens: list[Tensor] = []  # AttnRes: one per deposited slot, so readers depend on deposits
        self.phase1: tuple | None = None  # AttnRes: (lse (S,B,T), weights (S,k,B,T), S outputs (B,T,D))
        self.maps: tuple | None = None  # HyperConnections: (H_post, H_res) of the sublayer in progress


class DepthMixer(nn.Module):
    """The interface every depth-mixing variant implements."""

    def start(self, embedding: Tensor, recorder: Recorder | None = None) -> DepthState:
        return DepthState(embedding, recorder)

    def read(self, state: DepthState, layer: int) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def write(self, state: DepthState, layer: int, output: Tensor) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def finish(self, state: DepthState) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError
