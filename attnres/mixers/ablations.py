"""The paper's ablations (its Table 4) and the other depth-mixing baselines, behind the same mixer interface.

These are written for clarity, like :class:`~attnres.mixers.ReferenceAttnRes` (stack the sources, compute the
equation), not for speed: they exist to rerun the ablation table at small scale.

* :class:`AttnResAblation`: Full / Block AttnRes with one or more of the paper's switches flipped
  (``ModelConfig.key_norm``, ``depth_score``, ``depth_query``, ``depth_mixing``, ``depth_heads``,
  ``depth_window``). With every switch at the paper's setting it computes exactly what AttnRes computes.
* :class:`DenseFormer`: depth-weighted averaging after every transformer block (Pagliardini et al., 2024).
* :class:`HyperConnections`: n residual streams mixed by learned, input-dependent maps: unconstrained
  (Hyper-Connections, Zhu et al., 2025) or manifold-constrained, with a doubly stochastic stream mixing
  (mHC, Xie et al., 2026).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnres.config import ModelConfig
from attnres.mixers.attnres import ReferenceAttnRes
from attnres.mixers.base import DepthMixer, DepthState, Recorder, at_least_fp32


class AttnResAblation(ReferenceAttnRes):
    """AttnRes with the paper's ablation switches (Kimi Team, "Attention Residuals", 2026, Table 4).

    For query l with sources s_i (as in AttnRes: every earlier output for Full, block sums plus the partial
    sum for Block):

    * ``key_norm=False``: the keys are the raw sources instead of ``RMSNorm_l(s_i)``.
    * ``depth_score="sigmoid"``: ``alpha_i = sigmoid(logit_i)`` independently, instead of a softmax over i.
    * ``depth_query="input"``: the query is ``W_l RMSNorm(h_{l-1})``, a d x d projection (zero at init) of the
      previous sublayer's input (the embedding for l = 0), instead of the static pseudo-query ``w_l``.
    * ``depth_mixing="scalar"``: ``logit_i = c_{l,i}``, one learned input-independent scalar per (query,
      source), zero at init: no query and no key.
    * ``depth_heads=H``: channels split into H groups; group h gets ``softmax_i(w_l[h] . k_i[h])`` and mixes
      the values' group h (keys are normalised over all channels, as with one head).
    * ``depth_window=W`` (Full): the sources are the embedding and the last W sublayer outputs.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        queries, d = cfg.n_sublayers + 1, cfg.d_model
        self.cfg = cfg
        if cfg.depth_mixing == "scalar" or cfg.depth_query == "input":
            del self.pseudo_query
            self.pseudo_query = None
        if cfg.depth_mixing == "scalar" or not cfg.key_norm:
            self.key_gain = None
        if cfg.depth_mixing == "scalar":  # one logit per (query, source id); ids are 0..L (Full) or 0..N (Block)
            self.scalar_logits = nn.Parameter(torch.zeros(queries, queries if self.full else len(self.starts) + 1))
        if cfg.depth_query == "input":
            self.pseudo_query_proj = nn.Parameter(torch.zeros(queries, d, d))  # zero: uniform mixing at init

    def start(self, embedding: Tensor, recorder: Recorder | None = None) -> DepthState:
        state = super().start(embedding, recorder)
        state.h = embedding  # the previous query's input, for depth_query="input"
        return state

    def sources_with_ids(self, state: DepthState) -> tuple[list[int], list[Tensor]]:
        if self.full:
            ids = list(range(len(state.outputs)))
            if self.cfg.depth_window:
                ids = [0] + ids[1:][-self.cfg.depth_window :]
            return ids, [state.outputs[i] for i in ids]
        ids = list(range(len(state.blocks))) + ([len(state.blocks)] if state.partial is not None else [])
        return ids, self.sources(state)

    def mix(self, state: DepthState, query: int) -> Tensor:
        ids, sources = self.sources_with_ids(state)
        values = at_least_fp32(torch.stack(sources))  # (n, B, T, D)
        n, b, t, d = values.shape
        heads = self.cfg.depth_heads
        if self.cfg.depth_mixing == "scalar":
            logits = self.scalar_logits[query, ids].view(n, 1, 1, 1).expand(n, b, t, 1)  # (n, B, T, 1)
        else:
            keys = values
            if self.cfg.key_norm:
                keys = F.rms_norm(values, (d,), eps=self.eps)
                if self.key_gain is not None:
                    keys = keys * self.key_gain[query]
            keys = keys.view(n, b, t, heads, d // heads)
            if self.cfg.depth_query == "input":
                prev = F.rms_norm(at_least_fp32(state.h), (d,), eps=self.eps)  # (B, T, D)
                q = (prev @ self.pseudo_query_proj[query].T).view(b, t, heads, d // heads)
                logits = torch.einsum("nbthe,bthe->nbth", keys, q)  # (n, B, T, H)
            else:
                q = at_least_fp32(self.pseudo_query[query]).view(heads, d // heads)
                logits = torch.einsum("nbthe,he->nbth", keys, q)  # (n, B, T, H)
        if self.cfg.depth_score == "softmax":
            alpha = torch.softmax(logits, dim=0)
        else:
            alpha = torch.sigmoid(logits)
        groups = values.view(n, b, t, logits.shape[-1], -1)  # (n, B, T, H, D/H)
        out = torch.einsum("nbth,nbthe->bthe", alpha, groups).reshape(b, t, d)
        if state.recorder is not None:
            state.recorder.depth_weights[query] = alpha.detach().float().mean(dim=(1, 2, 3)).cpu()
            kinds = ["embedding"] + ["sublayer" if self.full else "block"] * (n - 1)
            if not self.full and state.partial is not None:
                kinds[-1] = "partial"
            state.recorder.source_kinds[query] = kinds
        state.h = out
        return out.to(sources[0].dtype)

    def read(self, state: DepthState, layer: int) -> Tensor:
        return self.mix(state, layer)

    def finish(self, state: DepthState) -> Tensor:
        return self.mix(state, self.n_sublayers)


class DenseFormer(DepthMixer):
    """DenseFormer (Pagliardini, Mohtashami, Fleuret, Jaggi, "DenseFormer: Enhancing Information Flow in
    Transformers via Depth Weighted Averaging", NeurIPS 2024).

    Each transformer block keeps its ordinary residual connections; after block i (0-based) a depth-weighted
    average replaces the stream: ``Y_i = sum_{j=0}^{i+1} alpha_{i,j} X_j``, where ``X_0`` is the embedding and
    ``X_{j+1}`` the output of block j (its input ``Y_{j-1}`` plus its two residual branches). ``alpha_{i,i+1} = 1``
    and the others 0 at init, so the model starts as the PreNorm baseline. Scalar weights, no input dependence.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dwa = nn.ParameterList(
            nn.Parameter(torch.cat([torch.zeros(i + 1), torch.ones(1)])) for i in range(cfg.n_layer)
        )  # block i averages X_0 .. X_{i+1}

    def start(self, embedding: Tensor, recorder: Recorder | None = None) -> DepthState:
        state = DepthState(embedding, recorder)
        state.outputs = [embedding]  # X_0, X_1, ...
        return state

    def read(self, state: DepthState, layer: int) -> Tensor:
        return state.h

    def write(self, state: DepthState, layer: int, output: Tensor) -> None:
        state.h = state.h + output
        if layer % 2 == 1:  # the MLP closes transformer block layer // 2
            state.outputs.append(state.h)
            weights = self.dwa[layer // 2]
            state.h = torch.einsum("j,jbtd->btd", weights.to(state.h.dtype), torch.stack(state.outputs))
            if state.recorder is not None:
                state.recorder.depth_weights[layer] = weights.detach().float().cpu()
                state.recorder.source_kinds[layer] = ["embedding"] + ["block"] * (len(weights) - 1)

    def finish(self, state: DepthState) -> Tensor:
        return state.h


def sinkhorn(logits: Tensor, iterations: int = 20) -> Tensor:
    """Sinkhorn-Knopp: alternately normalise the rows and columns of ``exp(logits)`` (..., n, n) in log space,
    converging to a doubly stochastic matrix (every row and every column sums to 1)."""
    log = logits
    for _ in range(iterations):
        log = log - log.logsumexp(dim=-1, keepdim=True)
        log = log - log.logsumexp(dim=-2, keepdim=True)
    return log.exp()


class HyperConnections(DepthMixer):
    """Hyper-Connections (``hc``; Zhu et al., "Hyper-Connections", ICLR 2025) and their manifold-constrained form
    (``mhc``; Xie et al., "mHC: Manifold-Constrained Hyper-Connections", arXiv 2512.24880, 2026).

    The residual stream is widened to n streams ``X`` (n, B, T, D), all equal to the embedding at the start.
    Sublayer l reads ``H_pre X`` (a weighted sum of the streams) and writes ``X <- H_res X + H_post^T f(H_pre X)``.
    The maps are input-dependent, from ``x = RMSNorm(vec(X))`` (per token, over n * D channels)::

        hc:   H_pre = b_pre + a_pre * tanh(x phi_pre)    H_post = b_post + a_post * tanh(x phi_post)
              H_res = b_res + a_res * tanh(mat(x phi_res))
        mhc:  H_pre = sigmoid(b_pre + a_pre * x phi_pre)  H_post = 2 sigmoid(b_post + a_post * x phi_post)
              H_res = SinkhornKnopp(b_res + a_res * mat(x phi_res))   (doubly stochastic, 20 iterations)

    Initialisation (both start as the PreNorm baseline, since the streams start equal): ``phi = 0``;
    ``a = 0.01``; hc: ``b_pre = e_{l mod n}``, ``b_post = 1``, ``b_res = I`` (the HC paper's); mhc:
    ``sigmoid(b_pre) = 1/n``, ``2 sigmoid(b_post) = 1``, ``b_res`` 0 on the diagonal and -8 elsewhere (a
    near-identity after Sinkhorn). The final aggregation is the sum of the streams.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        n, d, L = cfg.hc_streams, cfg.d_model, cfg.n_sublayers
        self.n, self.eps, self.constrained = n, cfg.norm_eps, cfg.residual == "mhc"
        self.phi = nn.Parameter(torch.zeros(L, n * d, n * n + 2 * n))  # dynamic maps: pre | post | res
        self.alpha = nn.Parameter(torch.full((L, 3), 0.01))
        if self.constrained:
            b_pre = torch.full((L, n), -math.log(n - 1) if n > 1 else 10.0)  # sigmoid = 1/n
            b_post = torch.zeros(L, n)  # 2 sigmoid(0) = 1
            b_res = torch.full((L, n, n), -8.0) + 8.0 * torch.eye(n)
        else:
            b_pre = torch.stack([F.one_hot(torch.tensor(l % n), n).float() for l in range(L)])
            b_post = torch.ones(L, n)
            b_res = torch.eye(n).repeat(L, 1, 1)
        self.b_pre, self.b_post, self.b_res = nn.Parameter(b_pre), nn.Parameter(b_post), nn.Parameter(b_res)

    def start(self, embedding: Tensor, recorder: Recorder | None = None) -> DepthState:
        state = DepthState(embedding, recorder)
        state.h = embedding.unsqueeze(0).expand(self.n, *embedding.shape)  # X: (n, B, T, D)
        return state

    def maps(self, streams: Tensor, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        n, b, t, d = streams.shape
        x = F.rms_norm(streams.permute(1, 2, 0, 3).reshape(b, t, n * d), (n * d,), eps=self.eps)  # (B, T, nD)
        dyn = x @ self.phi[layer]  # (B, T, n^2 + 2n)
        pre, post, res = dyn[..., :n], dyn[..., n : 2 * n], dyn[..., 2 * n :].reshape(b, t, n, n)
        a_pre, a_post, a_res = self.alpha[layer]
        if self.constrained:
            return (
                torch.sigmoid(self.b_pre[layer] + a_pre * pre),
                2 * torch.sigmoid(self.b_post[layer] + a_post * post),
                sinkhorn(self.b_res[layer] + a_res * res),
            )
        return (
            self.b_pre[layer] + a_pre * torch.tanh(pre),
            self.b_post[layer] + a_post * torch.tanh(post),
            self.b_res[layer] + a_res * torch.tanh(res),
        )

    def read(self, state: DepthState, layer: int) -> Tensor:
        pre, post, res = self.maps(state.h, layer)  # (B,T,n), (B,T,n), (B,T,n,n)
        state.maps = (post, res)
        return torch.einsum("btn,nbtd->btd", pre.to(state.h.dtype), state.h)

    def write(self, state: DepthState, layer: int, output: Tensor) -> None:
        post, res = state.maps
        mixed = torch.einsum("btmn,nbtd->mbtd", res.to(state.h.dtype), state.h)  # row m of H_res mixes into m
        state.h = mixed + post.permute(2, 0, 1).unsqueeze(-1).to(output.dtype) * output.unsqueeze(0)

    def finish(self, state: DepthState) -> Tensor:
        return state.h.sum(0)
