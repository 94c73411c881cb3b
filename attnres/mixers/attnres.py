"""Full and Block AttnRes: the two-phase computation that training uses, and the reference that checks it.

Notation (the method page, with 0-based sublayers): ``v_0`` is the token embedding, ``v_{l+1}`` the output of
sublayer l. L = 2 * n_layer sublayers. Queries are indexed by the sublayer that reads (0..L-1), plus query L
for the final aggregation.

* :class:`AttnRes` (Full and Block AttnRes, the two-phase computation used for training): for a sublayer in
  depth block n (0-based), the sources are the completed block summaries ``b_0 = v_0, b_1, ..., b_n`` and,
  unless it is the first sublayer of its block, the partial sum ``p`` of the outputs of the earlier
  sublayers of its own block::

      alpha_j = softmax_j( w_l . RMSNorm_l(s_j) )     # over the sources s_j, per token, in fp32, unscaled
      h_l     = sum_j alpha_j * s_j                   # values are the raw sources

  ``w_l`` (``pseudo_query[l]``) is zero at init, so every input starts as the mean of its sources. Full
  AttnRes is the case of one sublayer per block (N = L): the sources are then every earlier sublayer output.
* :class:`ReferenceAttnRes`: the same equations computed directly (stack the sources, normalise, dot,
  softmax, weighted sum), used by the tests to check :class:`AttnRes`.

The two-phase computation (Kimi Team, "Attention Residuals", 2026, section on efficient computation):
because ``w_l`` does not depend on the input, the logits of a completed block against every later query are
computed once, when the block completes (one (B, T, D) x (D, Q) product). Phase 1, at the first sublayer of
block n, attends all S queries of the block to the completed blocks at once and keeps each query's
normalised output and log-sum-exp; phase 2, at each later sublayer of the block, merges the single
intra-block source (the partial sum) with the online-softmax rule, which for two groups is a sigmoid:
``h = lerp(p, o, sigmoid(lse - logit_p))``. The result equals the direct formula to rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnres.config import ModelConfig
from attnres.kernels.two_phase import Buffers, Deposit, Merge, Phase1, gather_plan, no_autocast
from attnres.mixers.base import DepthMixer, DepthState, Recorder, at_least_fp32


class _AttnResBase(DepthMixer):
    """Parameters and block layout shared by the two-phase and the reference AttnRes.

    ``pseudo_query[l]`` and ``key_gain[l]`` belong to query l (sublayer l for l < L, the final aggregation for
    l = L). Full and Block models of the same size have identical parameters, so state dicts interchange.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        queries, d = cfg.n_sublayers + 1, cfg.d_model
        self.n_sublayers = cfg.n_sublayers
        self.eps = cfg.norm_eps
        self.full = cfg.residual == "full"
        self.pseudo_query = nn.Parameter(torch.zeros(queries, d))
        self.key_gain = nn.Parameter(torch.ones(queries, d)) if cfg.key_norm_gain else None
        starts = cfg.block_starts
        self.starts = starts
        self.ends = starts[1:] + (cfg.n_sublayers,)
        self.block_of = [max(k for k, s in enumerate(starts) if s <= l) for l in range(cfg.n_sublayers)]
        # slot j's first reader: query 0 for the embedding, the next block's first sublayer for a block's summary
        self.first_reader = (0, *self.ends)

    def query_vectors(self, first: int, last: int) -> Tensor:
        """``w_l * g_l`` for queries first..last-1, in fp32: the key norm's gain folds into the query."""
        w = at_least_fp32(self.pseudo_query[first:last])
        return w if self.key_gain is None else w * at_least_fp32(self.key_gain[first:last])

    def _record(self, rec: Recorder, layer: int, weights: Tensor, keep: Tensor | None = None) -> None:
        """Mean weight per source over tokens: weights (k, B, T) over the completed sources (source 0 the embedding);
        with a merge's ``keep`` (B, T), they share ``keep`` and the block's partial sum, the last source, the rest."""
        if keep is not None:
            weights = torch.cat([weights * keep, (1 - keep).unsqueeze(0)])  # (k + 1, B, T)
        rec.depth_weights[layer] = weights.detach().float().mean(dim=(1, 2)).cpu()
        kinds = ["embedding"] + ["sublayer" if self.full else "block"] * (weights.shape[0] - 1)
        if keep is not None:
            kinds[-1] = "partial"
        rec.source_kinds[layer] = kinds


class AttnRes(_AttnResBase):
    """Full / Block AttnRes, two-phase (see the module docstring). What training uses.

    Completed sources live in one buffer slot each (slot 0 = embedding, slot n = depth block n), with their
    logits against every query computed once at deposit; the autograd functions of
    :mod:`attnres.kernels.two_phase` recompute what backward needs instead of storing it. ``fused`` runs their
    element-wise work through the compiled kernels of :mod:`attnres.kernels.fused`.
    """

    def __init__(self, cfg: ModelConfig, fused: bool = False) -> None:
        super().__init__(cfg)
        self.fused = fused
        # the slots gather their readers' gradients (False: the readers scatter them into the slots' gradient
        # buffers; benchmarks/bench_step.py's -scatter variants compare the two; the fused kernels always scatter)
        self.gather = True
        # natively, a group of slots forms its shares of their common readers in one pass (two_phase.gather_plan;
        # the same bits; False: each slot reads all of its readers, for bench_step.py's -ungrouped variants)
        self.group = True

    def start(self, embedding: Tensor, recorder: Recorder | None = None) -> DepthState:
        state = DepthState(embedding, recorder)
        state.bufs = Buffers(
            embedding,
            slots=len(self.starts) + 1,
            queries=self.n_sublayers + 1,
            eps=self.eps,
            fused=self.fused,
            # the slots gather their readers' gradients in their own backward (attnres.kernels.two_phase.Buffers)
            gather=self.gather and not self.fused,
            plan=gather_plan(self.first_reader, self.n_sublayers + 1) if self.group else None,
        )
        state.u = self.query_vectors(0, self.n_sublayers + 1)  # (Q, D)
        state.tokens = [Deposit.apply(None, embedding, state.u, state.bufs, 0, 0)]
        return state

    def write(self, state: DepthState, layer: int, output: Tensor) -> None:
        # The block's partial sum is state.partial (None at the block's start) + state.last. Its next reader
        # forms it: a merge (which returns it as the new state.partial) or, once the block is complete, the
        # deposit, which sums straight into slot block + 1. No pass of its own, no tensor of its own.
        block = self.block_of[layer]
        state.last = output
        if layer + 1 == self.ends[block]:
            state.tokens.append(Deposit.apply(state.partial, output, state.u, state.bufs, block + 1, layer + 1))
            state.partial = state.last = None

    def _phase1(self, state: DepthState, first: int, last: int) -> tuple[Tensor, Tensor, list[Tensor]]:
        lse, weights, *outs = Phase1.apply(state.bufs, len(state.tokens), first, last, *state.tokens)
        return lse, weights, outs

    def read(self, state: DepthState, layer: int) -> Tensor:
        block = self.block_of[layer]
        i = layer - self.starts[block]
        if i == 0:  # phase 1 for every sublayer of this block; the first has no intra-block source
            state.phase1 = self._phase1(state, layer, self.ends[block])
            if state.recorder is not None:
                self._record(state.recorder, layer, state.phase1[1][0])
            return state.phase1[2][0]
        # phase 2: merge this block's partial sum with phase 1 by the online-softmax rule
        lse, weights, outs = state.phase1
        h, keep, state.partial = Merge.apply(
            outs[i], lse[i], state.partial, state.last, state.u[layer], weights[i], state.bufs, layer
        )
        # drop what the merge consumed, so the next sublayer can reuse its memory
        outs[i] = state.last = None
        if state.recorder is not None:
            self._record(state.recorder, layer, weights[i], keep)
        return h

    def finish(self, state: DepthState) -> Tensor:
        _, weights, outs = self._phase1(state, self.n_sublayers, self.n_sublayers + 1)
        if state.recorder is not None:
            self._record(state.recorder, self.n_sublayers, weights[0])
        return outs[0]


class TracedAttnRes(_AttnResBase):
    """Full / Block AttnRes, two-phase, in plain torch ops whose backward is autograd's: what ``runtime.compile``
    trains on CPU, where torch.compile traces it into the model's one graph and Inductor fuses it with the sublayers'
    element-wise work (:func:`attnres.model.compile_model`).

    The same equations as :class:`AttnRes`: a completed source's logits against every query that will read it are
    computed once, when it completes (``(x @ u^T) * rms(x)^-1``, from its first reader on); a reader's softmax over
    the completed sources is merged with its block's partial sum by the online-softmax rule,
    ``h = lerp(p, out, sigmoid(lse - logit_p))``. What :class:`AttnRes` hand-writes (the slot buffers, the kept
    gradients, the native kernels) is left to the compiler, which sees the whole step. Compiled whole, it steps faster
    than the sublayers compiled around :class:`AttnRes`'s native kernels (docs/performance.md, "One compiled graph").
    Eager it is slower and keeps more for backward than :class:`AttnRes`; a compiled model runs it eagerly only for
    its diagnostics (``LitLM.diagnose``, without gradients) and where its compile failed (one warning).
    """

    def __init__(self, cfg: ModelConfig, like: _AttnResBase | None = None) -> None:
        super().__init__(cfg)
        if like is not None:  # the same parameters (the same tensors): what an optimizer built on ``like`` steps
            self.pseudo_query, self.key_gain = like.pseudo_query, like.key_gain

    def start(self, embedding: Tensor, recorder: Recorder | None = None) -> DepthState:
        state = DepthState(embedding, recorder)
        state.u = self.query_vectors(0, self.n_sublayers + 1)  # (Q, D)
        state.blocks = []  # the embedding joins in at least fp32, with its logits
        self._complete(state, embedding)
        return state

    def _complete(self, state: DepthState, source: Tensor) -> None:
        """A completed source (the embedding or a block's sum) joins the slots, with its logits (B, T, Q - first)."""
        with no_autocast(source):
            x = at_least_fp32(source)
            first = self.first_reader[len(state.blocks)]
            state.blocks.append(x)
            state.logits.append((x @ state.u[first:].T) * self._inv_rms(x).unsqueeze(-1))

    def _inv_rms(self, x: Tensor) -> Tensor:
        """``1 / rms(x)`` over the last dim (B, T): the key norm's scale, its gain folded into the queries."""
        return torch.rsqrt(x.square().mean(-1) + self.eps)

    def _attend(self, state: DepthState, query: int) -> tuple[Tensor, Tensor, Tensor]:
        """Query ``query`` against the completed slots: output (B, T, D), log-sum-exp (B, T), weights (k, B, T)."""
        z = torch.stack([z[..., query - self.first_reader[j]] for j, z in enumerate(state.logits)])  # (k, B, T)
        if len(state.blocks) == 1:  # the embedding alone: weight exactly 1, output the embedding itself
            return state.blocks[0], z[0], torch.ones_like(z)
        lse = torch.logsumexp(z, dim=0)
        weights = torch.exp(z - lse)
        out = state.blocks[0] * weights[0].unsqueeze(-1)
        for value, w in zip(state.blocks[1:], weights[1:]):
            out = out + value * w.unsqueeze(-1)
        return out, lse, weights

    def read(self, state: DepthState, layer: int) -> Tensor:
        with no_autocast(state.u):
            out, lse, weights = self._attend(state, layer)
            if state.partial is None:  # the block's first sublayer: no intra-block source yet
                if state.recorder is not None:
                    self._record(state.recorder, layer, weights)
                return out
            p = state.partial
            logit = (p @ state.u[layer]) * self._inv_rms(p)
            keep = torch.sigmoid(lse - logit)  # the completed slots' share of the softmax, (B, T)
            if state.recorder is not None:
                self._record(state.recorder, layer, weights, keep)
            return torch.lerp(p, out, keep.unsqueeze(-1))

    def write(self, state: DepthState, layer: int, output: Tensor) -> None:
        block = self.block_of[layer]
        # summed in at least fp32, like the residual stream: bf16 outputs not in bf16
        output = at_least_fp32(output)
        state.partial = output if state.partial is None else state.partial + output
        if layer + 1 == self.ends[block]:
            self._complete(state, state.partial)
            state.partial = None

    def finish(self, state: DepthState) -> Tensor:
        with no_autocast(state.u):
            out, _, weights = self._attend(state, self.n_sublayers)
        if state.recorder is not None:
            self._record(state.recorder, self.n_sublayers, weights)
        return out


class ReferenceAttnRes(_AttnResBase):
    """The equations computed directly, source by source (for tests; slow and memory-hungry by design)."""

    def write(self, state: DepthState, layer: int, output: Tensor) -> None:
        state.outputs.append(output)
        first = layer == self.starts[self.block_of[layer]]
        # summed in at least fp32, like the residual stream (and the two-phase AttnRes): bf16 outputs not in bf16
        state.partial = at_least_fp32(output) if first else state.partial + output
        if layer + 1 == self.ends[self.block_of[layer]]:
            state.blocks.append(state.partial)
            state.partial = None

    def sources(self, state: DepthState) -> list[Tensor]:
        """Full: every earlier output and the embedding. Block: completed blocks, then the partial sum."""
        if self.full:
            return list(state.outputs)
        return list(state.blocks) + ([state.partial] if state.partial is not None else [])

    def attend(self, sources: list[Tensor], query: int) -> Tensor:
        values = torch.stack(sources)  # (n, B, T, D)
        gain = 1.0 if self.key_gain is None else self.key_gain[query]
        # fp32 throughout, as the two-phase path: autocast would run the einsums in bf16
        with torch.autocast(values.device.type, enabled=False):
            values = at_least_fp32(values)
            keys = F.rms_norm(values, (values.shape[-1],), eps=self.eps) * gain  # (n, B, T, D)
            logits = torch.einsum("nbtd,d->nbt", keys, at_least_fp32(self.pseudo_query[query]))  # (n, B, T)
            alpha = torch.softmax(logits, dim=0)  # over sources, no scaling
            return torch.einsum("nbt,nbtd->btd", alpha, values).to(sources[0].dtype)

    def read(self, state: DepthState, layer: int) -> Tensor:
        return self.attend(self.sources(state), layer)

    def finish(self, state: DepthState) -> Tensor:
        return self.attend(self.sources(state), self.n_sublayers)
