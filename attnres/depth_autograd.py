"""Hand-written forward and backward of the two-phase depth attention (what makes AttnRes cheap).

Plain autograd would keep a copy of every intermediate (stacked sources, phase-1 outputs, normalised keys)
for the backward pass and would accumulate each source's gradient one consumer at a time. These functions
instead keep the completed sources in one preallocated buffer per forward pass, save only small tensors
(softmax weights, per-token scalars) and recompute the rest in backward from the buffer:

* :class:`Deposit` writes a completed source into its buffer slot and computes its logits against every
  query at once (``w_q . RMSNorm_q(b) = (b @ (w_q * g_q)) / rms(b)``: the key norm's gain folds into the
  query). Its backward returns the gradient accumulated for that slot by every reader, plus the key-norm
  path. Readers take the slot's 0-size ``token`` as an input, so autograd runs every reader's backward
  before the deposit's.
* :class:`Phase1` attends the S queries of a block to the k completed slots at once.
* :class:`Merge` is phase 2: one query against the block's partial sum ``p``, merged with phase 1 by the
  online-softmax rule, which for two groups is ``h = p + keep * (o - p)``, ``keep = sigmoid(lse - logit_p)``.

Layouts are slot-major and query-major, so every (B, T, D) operand is contiguous: values (M, B, T, D),
logits (M, Q, B, T), phase-1 weights (S, k, B, T). With k and S below about 20, a short loop of fused
element-wise ops beats a batched matmul of tiny matrices on CPU and keeps the memory traffic minimal.
Everything runs in at least fp32 (autocast is disabled inside), so the depth softmax is fp32 on any device.
With ``Buffers.fused`` (``runtime.compile``), phase 1 and the merge hand their element-wise work to the
torch.compile'd kernels of :mod:`attnres.depth_kernels` instead; the bookkeeping here stays the same.
Shapes: B batch, T tokens, M slots (blocks + embedding), Q queries (L sublayers + final), D width, S block
length, k completed slots.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd import Function

from attnres import depth_kernels


class Buffers:
    """The per-forward depth state: values, logits, 1/rms of every slot, and their gradients."""

    def __init__(self, like: Tensor, slots: int, queries: int, eps: float, fused: bool = False) -> None:
        b, t, d = like.shape
        dtype = torch.promote_types(like.dtype, torch.float32)
        self.eps = eps
        self.fused = fused  # phase 1 and the merge through attnres.depth_kernels (torch.compile)
        self.values = like.new_empty(slots, b, t, d, dtype=dtype)  # (M, B, T, D)
        self.logits = like.new_empty(slots, queries, b, t, dtype=dtype)  # (M, Q, B, T)
        self.inv_rms = like.new_empty(slots, b, t, dtype=dtype)  # (M, B, T)
        self.value_grad: Tensor | None = None
        self.logit_grad: Tensor | None = None

    def grads(self) -> tuple[Tensor, Tensor]:
        """Gradient accumulators, allocated on first use in backward (never in an inference forward)."""
        if self.value_grad is None:
            self.value_grad = torch.zeros_like(self.values)
            self.logit_grad = torch.zeros_like(self.logits)
        return self.value_grad, self.logit_grad


def _no_autocast(x: Tensor) -> Any:
    return torch.autocast(device_type=x.device.type, enabled=False)


def _inv_rms(x: Tensor, eps: float) -> Tensor:
    """``1 / sqrt(mean(x^2) + eps)`` over the last dim without materialising x^2."""
    return torch.rsqrt(torch.linalg.vector_norm(x, dim=-1).square_().div_(x.shape[-1]).add_(eps))


def _weighted_sum(weights: Tensor, values: Tensor, out: Tensor) -> Tensor:
    """``out = sum_j weights[j, ..., None] * values[j]``; weights (k, B, T), values (>=k, B, T, D)."""
    torch.mul(values[0], weights[0].unsqueeze(-1), out=out)
    for j in range(1, weights.shape[0]):
        out.addcmul_(values[j], weights[j].unsqueeze(-1))
    return out


def _dots(values: Tensor, k: int, grad: Tensor) -> Tensor:
    """``<values[j], grad>`` over D for j < k: (k, B, T).

    One batched product over tokens, (k, D) x (D, 1) each; the operand strides are chosen so that the
    CPU kernels take their fast path (a plain (N, D, 1) column is several times slower here).
    """
    d = values.shape[-1]
    slots = values[:k].reshape(k, -1, d).permute(1, 0, 2)  # (B*T, k, D), no copy
    column = grad.reshape(1, -1, d).permute(1, 2, 0)  # (B*T, D, 1)
    return torch.bmm(slots, column).view(*grad.shape[:-1], k).permute(2, 0, 1)


class Deposit(Function):
    """Store source ``value`` (B,T,D) in ``slot`` with its logits against all queries ``u`` (Q,D)."""

    @staticmethod
    def forward(ctx: Any, value: Tensor, u: Tensor, bufs: Buffers, slot: int) -> Tensor:
        with _no_autocast(value):
            x = bufs.values[slot]
            x.copy_(value)
            r = bufs.inv_rms[slot]
            r.copy_(_inv_rms(x, bufs.eps))
            logits = bufs.logits[slot]  # (Q, B, T)
            torch.mm(u.to(x.dtype), x.reshape(-1, x.shape[-1]).T, out=logits.view(logits.shape[0], -1))
            logits.mul_(r)
        ctx.bufs, ctx.slot = bufs, slot
        ctx.save_for_backward(u)
        return value.new_empty(0)

    @staticmethod
    def backward(ctx: Any, _token_grad: Tensor) -> tuple[Tensor | None, ...]:
        bufs, slot = ctx.bufs, ctx.slot
        (u,) = ctx.saved_tensors
        if bufs.value_grad is None:  # no reader needed a gradient
            return None, None, None, None
        with _no_autocast(u):
            x = bufs.values[slot]  # (B, T, D)
            r = bufs.inv_rms[slot]  # (B, T)
            dzr = bufs.logit_grad[slot] * r  # (Q, B, T)
            # z_q = r (x . u_q) and dr/dx = -r^3 x / D, so dx = r dz @ U - (r^2 / D) (dz . z) x
            coef = (dzr * bufs.logits[slot]).sum(0).mul_(r).div_(-x.shape[-1])  # (B, T)
            flat = dzr.reshape(dzr.shape[0], -1)  # (Q, B*T)
            dx = (flat.T @ u.to(x.dtype)).view_as(x)
            dx.addcmul_(x, coef.unsqueeze(-1)).add_(bufs.value_grad[slot])
            du = flat @ x.reshape(-1, x.shape[-1])  # (Q, D)
        return dx, du.to(u.dtype), None, None


class Phase1(Function):
    """Queries q0..q1-1 against slots 0..k-1: lse (S,B,T), weights (S,k,B,T) and S outputs (B,T,D)."""

    @staticmethod
    def forward(ctx: Any, bufs: Buffers, k: int, q0: int, q1: int, *tokens: Tensor) -> tuple[Tensor, ...]:
        with _no_autocast(bufs.values):
            scores = bufs.logits[:k, q0:q1].transpose(0, 1)  # (S, k, B, T)
            if _fused(bufs):
                s, (b, t, d) = q1 - q0, bufs.values.shape[1:]
                lse, weights, *outs = depth_kernels.fused_phase1_forward(
                    scores.reshape(s, k, b * t), bufs.values[:k].flatten(1, 2)
                )
                lse, weights, outs = lse.view(s, b, t), weights.view(s, k, b, t), [o.view(b, t, d) for o in outs]
            else:
                lse = scores.logsumexp(dim=1)  # (S, B, T)
                weights = (scores - lse.unsqueeze(1)).exp_()  # (S, k, B, T)
                # one allocation per query: a sublayer's norm saves its input, which must not pin the others
                outs = [_weighted_sum(w, bufs.values, torch.empty_like(bufs.values[0])) for w in weights]
        ctx.bufs, ctx.k, ctx.q0, ctx.q1 = bufs, k, q0, q1
        ctx.save_for_backward(weights)
        ctx.mark_non_differentiable(weights)
        return (lse, weights, *outs)

    @staticmethod
    def backward(ctx: Any, dlse: Tensor, _dweights: Tensor, *douts: Tensor) -> tuple[None, ...]:
        bufs, k, q0, q1 = ctx.bufs, ctx.k, ctx.q0, ctx.q1
        (weights,) = ctx.saved_tensors
        value_grad, logit_grad = bufs.grads()
        with _no_autocast(weights):
            if _fused(bufs):
                dlogits = depth_kernels.fused_phase1_backward(
                    weights.flatten(2), bufs.values[:k].flatten(1, 2), dlse.flatten(1), value_grad[:k].flatten(1, 2),
                    *(dout.flatten(0, 1) for dout in douts),
                ).view_as(weights)
            else:
                dots = torch.stack([_dots(bufs.values, k, dout) for dout in douts])  # (S, k, B, T)
                mean = (weights * dots).sum(dim=1, keepdim=True)  # (S, 1, B, T)
                dlogits = weights * (dots - mean + dlse.unsqueeze(1))
                for s, dout in enumerate(douts):
                    for j in range(k):
                        value_grad[j].addcmul_(dout, weights[s, j].unsqueeze(-1))
            logit_grad[:k, q0:q1] += dlogits.transpose(0, 1)
        return (None,) * len(ctx.needs_input_grad)


def _fused(bufs: Buffers) -> bool:
    return bufs.fused and depth_kernels.available()


class Merge(Function):
    """Phase 2 for query ``u`` (D,): ``h = p + keep * (out - p)``, ``keep = sigmoid(lse - r_p * (p . u))``.

    Neither ``out`` nor ``p`` is saved, only ``h`` (the sublayer's PreNorm keeps it anyway): ``out`` is
    recomputed from this query's phase-1 ``weights`` (k, B, T) and the value buffer, and
    ``p = h - keep / (1 - keep) * (out - h)``. That division amplifies the rounding of h (and of the
    recomputed out, which the fused kernels need not reproduce bit for bit) when keep is near 1, but every
    term of the backward that uses p carries a factor ``out - h = (1 - keep)(out - p)``, so the gradient's
    error stays at the rounding level of the forward (the tests compare with the direct formula to 1e-5).
    Saving p or out instead would cost one (B, T, D) tensor per sublayer: about 4.5 % of the peak memory
    of a Block N = 4 step, for 2-3 ms of its 600 (measured).
    """

    @staticmethod
    def forward(
        ctx: Any, out: Tensor, lse: Tensor, p: Tensor, u: Tensor, weights: Tensor, bufs: Buffers
    ) -> tuple[Tensor, Tensor]:
        with _no_autocast(p):
            pf, uf = p.to(out.dtype), u.to(out.dtype)
            if _fused(bufs):
                h, keep, r, logit = depth_kernels.fused_merge_forward(
                    out.flatten(0, 1), pf.flatten(0, 1), uf, lse.flatten(), bufs.eps
                )
                h, keep, r, logit = h.view_as(pf), keep.view_as(lse), r.view_as(lse), logit.view_as(lse)
            else:
                r = _inv_rms(pf, bufs.eps)  # (B, T)
                logit = (pf @ uf).mul_(r)  # (B, T)
                keep = torch.sigmoid(lse - logit)  # weight of the completed blocks, (B, T)
                h = torch.lerp(pf, out, keep.unsqueeze(-1))
        ctx.bufs, ctx.p_dtype = bufs, p.dtype
        ctx.save_for_backward(h, u, weights, r, logit, keep)
        ctx.mark_non_differentiable(keep)
        return h, keep

    @staticmethod
    def backward(ctx: Any, dh: Tensor, _dkeep: Tensor) -> tuple[Tensor | None, ...]:
        h, u, weights, r, logit, keep = ctx.saved_tensors
        bufs = ctx.bufs
        with _no_autocast(h):
            dh, uf = dh.to(h.dtype), u.to(h.dtype)
            if _fused(bufs):
                k = weights.shape[0]
                dout, dscore, dp, du = depth_kernels.fused_merge_backward(
                    dh.flatten(0, 1), h.flatten(0, 1), uf, weights.flatten(1), bufs.values[:k].flatten(1, 2),
                    r.flatten(), logit.flatten(), keep.flatten(),
                )
                return dout.view_as(h), dscore.view_as(r), dp.view_as(h).to(ctx.p_dtype), du.to(u.dtype), None, None
            gap = _weighted_sum(weights, bufs.values, torch.empty_like(h)).sub_(h)  # out - h
            # d h / d keep = out - p = gap / (1 - keep), so the score (lse - logit) gets keep * <dh, gap>
            dscore = torch.linalg.vecdot(dh, gap).mul_(keep)  # (B, T)
            rest = 1 - keep
            ratio = torch.where(rest > 0, keep / rest, 0.0)  # keep == 1 exactly: gap = 0, no gradient
            # p = h - ratio * gap; logit = r (p . u) and dlogit/dp = r u - r^2 logit p / D, so with
            # a = -dscore r and c = dscore logit r^2 / D:  dp = (1 - keep) dh + a u + c h - c ratio gap
            a = -dscore * r  # (B, T)
            c = dscore * logit * r.square() / h.shape[-1]
            dp = torch.mul(dh, rest.unsqueeze(-1))
            dp.addcmul_(a.unsqueeze(-1), uf).addcmul_(h, c.unsqueeze(-1)).addcmul_(gap, (c * ratio).unsqueeze(-1), value=-1.0)
            flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
            du = a.reshape(-1) @ flat(h) - (a * ratio).reshape(-1) @ flat(gap)  # sum over tokens of a p
            dout = dh * keep.unsqueeze(-1)
        return dout, dscore, dp.to(ctx.p_dtype), du.to(u.dtype), None, None
