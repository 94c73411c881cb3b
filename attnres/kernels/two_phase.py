"""Hand-written forward and backward of the two-phase depth attention (what makes AttnRes cheap).

Plain autograd would keep a copy of every intermediate (stacked sources, phase-1 outputs, normalised keys)
for the backward pass and would accumulate each source's gradient one consumer at a time. These functions
instead keep the completed sources in one preallocated buffer per forward pass, save only the softmax
weights, per-token scalars and each merge's partial sum, and recompute the rest in backward from the buffer:

* :class:`Deposit` writes a completed source into its buffer slot (a block's sum is formed there, from the
  partial sum and the block's last output) and computes its logits against every query that will read it
  (``w_q . RMSNorm_q(b) = (b @ (w_q * g_q)) / rms(b)``: the key norm's gain folds into the query). Its
  backward returns the gradient accumulated for that slot by every reader, plus the key-norm path. Readers
  take the slot's 0-size ``token`` as an input, so autograd runs every reader's backward before the
  deposit's.
* :class:`Phase1` attends the S queries of a block to the k completed slots at once.
* :class:`Merge` is phase 2: one query against the block's partial sum ``p``, merged with phase 1 by the
  online-softmax rule, which for two groups is ``h = p + keep * (o - p)``, ``keep = sigmoid(lse - logit_p)``.
  It also forms ``p`` (the previous partial sum plus the latest output) and returns it for the next reader,
  so the gradients reaching ``p`` are summed in its backward, not by autograd in a pass of their own. Its
  backward also does that query's share of phase 1's backward, so phase 1's backward only handles the
  block's first sublayer.

Who forms a slot's gradient (``Buffers.gather``, on unless the fused kernels run). A reader (a block's first query
in :class:`Phase1`'s backward, a merge in its own) keeps its gradient and a per-token scalar, and each slot's
:class:`Deposit` backward gathers the shares of all its readers at once (:func:`_gather`): every reader's gradient
is read once per slot, where adding each reader's share into a gradient buffer of every slot it read (the scatter,
``Buffers.value_grad``, which the fused kernels and ``AttnRes.gather = False`` use) read and wrote every slot's row
once per reader. Above all it allocates no (M, B, T, D) buffer when backward starts: the kept gradients, one per
query, accumulate while the activations are freed (at 256 x 8, peak memory 1.158 -> 1.089 of the baseline's for
Full AttnRes, 1.115 -> 1.086 for Block N = 8; docs/performance.md). On CPU (``deposit_backward`` of
:mod:`attnres.kernels.cpu`) the slot's backward also forms every reader's softmax backward on it (a merge's too,
which then reads no slot: ``merge_backward_kept``) and its own logits' path, in the same pass over its rows; and a
group of slots shares the reads of their common readers (:func:`gather_plan`): the group's top slot forms the lower
slots' shares of its readers while their rows are at hand, so a reader's gradient is read once a group, not once a
slot (Block N = 8 at 16 sublayers: 28 % fewer (N, D) reads and writes, Full AttnRes 35 %; the same bits).

Layouts are slot-major and query-major, so every (B, T, D) operand is contiguous: values (M, B, T, D),
logits (M, Q, B, T), phase-1 weights (S, k, B, T). With k and S below about 20, a short loop of fused
element-wise ops beats a batched matmul of tiny matrices on CPU and keeps the memory traffic minimal.
Everything runs in at least fp32 (autocast is disabled inside), so the depth softmax is fp32 on any device.
With ``Buffers.fused`` (``runtime.compile`` on GPU), phase 1 and the merge hand their element-wise work to the
torch.compile'd kernels of :mod:`attnres.kernels.fused` instead; on CPU in fp32, to the C++ kernels of
:mod:`attnres.kernels.cpu`. The bookkeeping here stays the same.
Shapes: B batch, T tokens, M slots (blocks + embedding), Q queries (L sublayers + final), D width, S block
length, k completed slots.
"""

from __future__ import annotations

import contextlib
from functools import cache
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd import Function

from attnres.kernels import cpu as cpu_kernels
from attnres.kernels import fused as fused_kernels


class Kept(NamedTuple):
    """What a reader keeps for the slots it read to gather (``Buffers.pending``; :func:`_gather`)."""

    grad: Tensor  # g: its phase-1 output got s * g, (N, D)
    scale: Tensor | None  # s (N): a merge's keep; None for 1
    c: Tensor | None  # (N) for the softmax backward the slots form; None when the reader formed it itself
    weights: Tensor  # its softmax weights over the slots, (k, N)
    # natively, a block's first query keeps its phase-1 output (N, D) instead of c = <out, g>, and the first slot to
    # gather it forms c into ``c`` (unfilled until then) while it reads g anyway: one pass over out, not over both
    out: Tensor | None = None


class Buffers:
    """The per-forward depth state: values, logits, 1/rms of every slot, and their gradients."""

    def __init__(
        self,
        like: Tensor,
        slots: int,
        queries: int,
        eps: float,
        fused: bool = False,
        gather: bool = False,
        plan: dict[int, tuple[int, ...]] | None = None,
    ) -> None:
        b, t, d = like.shape
        dtype = torch.promote_types(like.dtype, torch.float32)
        self.eps = eps
        self.fused = fused  # phase 1 and the merge through attnres.kernels.fused (torch.compile)
        # a reader keeps its gradient and a slot's backward gathers every reader's share (Deposit, _gather), instead
        # of each reader adding its share into a gradient buffer of every slot it read (the module docstring)
        self.gather = gather
        # gather: query -> what it kept for the slots it read
        self.pending: dict[int, Kept] = {}
        # gather, natively: a group of slots shares its readers' reads, top slot -> its lower slots (gather_plan; none:
        # each slot reads all of its readers); slot -> (its partial sum of the readers from query ``below`` on, below),
        # formed by its group's top slot
        self.plan = plan or {}
        self.partials: dict[int, tuple[Tensor, int]] = {}
        self.values = like.new_empty(slots, b, t, d, dtype=dtype)  # (M, B, T, D)
        self.source0 = like  # slot 0's value (the embedding) as a tensor of its own: the first block reads it
        self.logits = like.new_empty(slots, queries, b, t, dtype=dtype)  # (M, Q, B, T)
        self.inv_rms = like.new_empty(slots, b, t, dtype=dtype)  # (M, B, T)
        self.value_grad: Tensor | None = None
        self.logit_grad: Tensor | None = None
        self._unwritten: set[int] = set()  # slots whose value gradient holds no value yet

    def grads(self) -> tuple[Tensor | None, Tensor]:
        """Gradient accumulators, allocated on first use in backward (never in an inference forward).

        The value gradient is not zero-filled: the first reader to run backward writes each slot (usually
        the final aggregation, which reads them all), later ones add; see :meth:`add_value_grads`. With
        ``gather`` there is none: each slot's gradient is formed by its own backward.
        """
        if self.logit_grad is None:
            self.logit_grad = torch.zeros_like(self.logits)
            if not self.gather:
                self.value_grad = torch.empty_like(self.values)
                self._unwritten = set(range(self.values.shape[0]))
        return self.value_grad, self.logit_grad

    def add_value_grads(self, grad: Tensor, coef: Tensor) -> None:
        """``value_grad[j] += coef[j, ..., None] * grad`` for j < k; coef (k, B, T), grad (B, T, D).

        One broadcast op once every slot holds a gradient (the usual case: the final aggregation runs its
        backward first and writes them all); slot by slot, writing the unwritten ones, before that.
        """
        k = coef.shape[0]
        if self._unwritten.isdisjoint(range(k)):
            self.value_grad[:k].addcmul_(coef.unsqueeze(-1), grad)
            return
        for slot in range(k):
            if slot in self._unwritten:
                torch.mul(grad, coef[slot].unsqueeze(-1), out=self.value_grad[slot])
                self._unwritten.discard(slot)
            else:
                self.value_grad[slot].addcmul_(grad, coef[slot].unsqueeze(-1))

    def written_value_grad(self, slots: int) -> Tensor:
        """``value_grad[:slots]``, zero-filled where no reader wrote yet (for kernels that only add)."""
        for slot in sorted(self._unwritten & set(range(slots))):
            self.value_grad[slot].zero_()
            self._unwritten.discard(slot)
        return self.value_grad[:slots]

    def take_unwritten(self, slots: int) -> list[bool]:
        """Which of ``value_grad[:slots]`` hold no gradient yet; the caller writes them (so they count as written)."""
        fresh = [slot in self._unwritten for slot in range(slots)]
        self._unwritten.difference_update(range(slots))
        return fresh

    def value_grad_of(self, slot: int) -> Tensor | None:
        """What the readers of ``slot`` sent back, or None if none of them did."""
        return None if slot in self._unwritten else self.value_grad[slot]


def no_autocast(x: Tensor) -> Any:
    """Autocast off for the depth attention's fp32 work (a no-op context when it is off already: cheaper)."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.autocast(device_type=x.device.type, enabled=False)
    return contextlib.nullcontext()


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
    """Store ``prev + last`` (B,T,D) in ``slot`` with its logits against the queries ``u[first:]`` (Q,D).

    ``prev`` is None for a single tensor (the embedding, or a block of one sublayer); otherwise it is the
    block's partial sum and ``last`` its last output, and the sum is formed in the slot itself. The backward
    builds the slot's gradient in the slot's own gradient buffer, which no reader needs any more, and returns
    it for both: neither step allocates a new (B, T, D) tensor.

    ``first`` is the first query that reads the slot (0 for the embedding, the next block's first sublayer
    for a block summary): the logits of earlier queries are never read, so they are neither computed nor
    differentiated (for Block N = 4 that halves the depth attention's (Q, D) x (D, B*T) products).
    """

    @staticmethod
    def forward(ctx: Any, prev: Tensor | None, last: Tensor, u: Tensor, bufs: Buffers, slot: int, first: int) -> Tensor:
        with no_autocast(last):
            x = bufs.values[slot]
            if _native(bufs, x, prev, last):
                cpu_kernels.ops().deposit_forward(
                    last.new_empty(0) if prev is None else prev.flatten(0, 1).contiguous(),
                    last.flatten(0, 1).contiguous(),
                    u[first:].contiguous(),
                    x.flatten(0, 1),
                    bufs.inv_rms[slot].flatten(),
                    bufs.logits[slot, first:].flatten(1),
                    bufs.eps,
                )
            else:
                if prev is None:
                    x.copy_(last)
                else:  # the block's sum is formed in its slot (the partial is already in the slot's precision)
                    torch.add(prev, last, out=x)
                r = bufs.inv_rms[slot]
                r.copy_(_inv_rms(x, bufs.eps))
                logits = bufs.logits[slot, first:]  # (Q - first, B, T)
                torch.mm(u[first:].to(x.dtype), x.reshape(-1, x.shape[-1]).T, out=logits.view(logits.shape[0], -1))
                logits.mul_(r)
        ctx.bufs, ctx.slot, ctx.first, ctx.summed = bufs, slot, first, prev is not None
        ctx.last_dtype = last.dtype
        ctx.save_for_backward(u)
        return last.new_empty(0)

    @staticmethod
    def backward(ctx: Any, _token_grad: Tensor) -> tuple[Tensor | None, ...]:
        bufs, slot, first = ctx.bufs, ctx.slot, ctx.first
        (u,) = ctx.saved_tensors
        if bufs.logit_grad is None:  # no reader needed a gradient
            return None, None, None, None, None, None
        with no_autocast(u):
            x = bufs.values[slot]  # (B, T, D)
            if bufs.gather and _native(bufs, x):  # the readers' share and the logits' path in one kernel
                dx, dzr = _gather_native(bufs, slot, first, u)
                du = torch.zeros_like(u)
                torch.mm(dzr, x.reshape(-1, x.shape[-1]), out=du[first:])  # (Q - first, D)
                return (dx if ctx.summed else None), dx.to(ctx.last_dtype), du, None, None, None
            gathered = _gather(bufs, slot, first) if bufs.gather else None
            r = bufs.inv_rms[slot]  # (B, T)
            uq = u[first:].to(x.dtype)
            dzr = bufs.logit_grad[slot, first:] * r  # (Q - first, B, T)
            # z_q = r (x . u_q) and dr/dx = -r^3 x / D, so dx = r dz @ U - (r^2 / D) (dz . z) x
            coef = (dzr * bufs.logits[slot, first:]).sum(0).mul_(r).div_(-x.shape[-1])  # (B, T)
            flat = dzr.reshape(dzr.shape[0], -1)  # (Q - first, B*T)
            # the readers' gradient + r dz @ U, formed in the slot's gradient buffer (every reader is done)
            dx = gathered if bufs.gather else bufs.value_grad_of(slot)
            if dx is None:
                dx = (flat.T @ uq).view_as(x)
            else:
                dx.view(-1, x.shape[-1]).addmm_(flat.T, uq)
            dx.addcmul_(x, coef.unsqueeze(-1))
            du = torch.zeros_like(u)
            du[first:] = flat @ x.reshape(-1, x.shape[-1])  # (Q - first, D)
        return (dx if ctx.summed else None), dx.to(ctx.last_dtype), du, None, None, None


class Phase1(Function):
    """Queries q0..q1-1 against slots 0..k-1: lse (S,B,T), weights (S,k,B,T) and S outputs (B,T,D).

    Only the block's first sublayer sends a gradient back through its output: each later query's share
    of the slots' gradients is computed by its :class:`Merge`, where that query's gradient is at hand.
    With ``Buffers.gather`` the backward keeps that gradient (and ``<out, grad>``) for the slots to gather.
    """

    @staticmethod
    def forward(ctx: Any, bufs: Buffers, k: int, q0: int, q1: int, *tokens: Tensor) -> tuple[Tensor, ...]:
        with no_autocast(bufs.values):
            scores = bufs.logits[:k, q0:q1].transpose(0, 1)  # (S, k, B, T)
            if k == 1:  # the first block reads only the embedding: every weight is exactly 1, every output
                # is the embedding, so the outputs are views of it (S copies would cost memory and passes)
                lse, weights = scores[:, 0].clone(), torch.ones_like(scores)
                source = bufs.source0.to(bufs.values.dtype)
                outs = [source.view_as(source) for _ in range(q1 - q0)]
            elif _fused(bufs) or _native(bufs, bufs.values):
                s, (b, t, d) = q1 - q0, bufs.values.shape[1:]
                kernel = fused_kernels.fused_phase1_forward if _fused(bufs) else cpu_kernels.ops().phase1_forward
                lse, weights, *outs = kernel(scores.reshape(s, k, b * t), bufs.values[:k].flatten(1, 2))
                lse, weights, outs = lse.view(s, b, t), weights.view(s, k, b, t), [o.view(b, t, d) for o in outs]
            else:
                lse = scores.logsumexp(dim=1)  # (S, B, T)
                weights = (scores - lse.unsqueeze(1)).exp_()  # (S, k, B, T)
                # one allocation per query: a sublayer's norm saves its input, which must not pin the others
                outs = [_weighted_sum(w, bufs.values, torch.empty_like(bufs.values[0])) for w in weights]
        ctx.bufs, ctx.k, ctx.q0 = bufs, k, q0
        # gather: the first query's output too, for <out, grad> (its sublayer's norm keeps it until then anyway;
        # the later queries' outputs go to their merges, which differentiate them)
        ctx.save_for_backward(weights, *(outs[:1] if bufs.gather else ()))
        # a merge differentiates its lse and its out itself (in _slot_grads), so only out[0] sends a gradient
        ctx.mark_non_differentiable(lse, weights)
        ctx.set_materialize_grads(False)  # the outputs that get no gradient arrive as None, not as zeros
        return (lse, weights, *outs)

    @staticmethod
    def backward(ctx: Any, _dlse: None, _dweights: None, *douts: Tensor | None) -> tuple[None, ...]:
        bufs, k, q0 = ctx.bufs, ctx.k, ctx.q0
        weights, *outs = ctx.saved_tensors
        bufs.grads()
        if bufs.gather:  # keep the first query's gradient for the slots' backward to gather (_gather)
            if any(dout is not None for dout in douts[1:]):
                raise RuntimeError("Phase1: a later query's output got a gradient; its merge differentiates it")
            if douts[0] is not None:
                with no_autocast(weights):
                    grad = douts[0].to(weights.dtype).flatten(0, 1).contiguous()  # (N, D)
                    out = outs[0].to(weights.dtype).flatten(0, 1).contiguous()
                    if _native(bufs, grad):  # c = <out, g> is formed by the first slot to gather it
                        bufs.pending[q0] = Kept(grad, None, grad.new_empty(grad.shape[0]), weights[0].flatten(1), out)
                    else:
                        bufs.pending[q0] = Kept(grad, None, (out * grad).sum(-1), weights[0].flatten(1))
            return (None,) * len(ctx.needs_input_grad)
        present = [s for s, dout in enumerate(douts) if dout is not None]
        with no_autocast(weights):
            if present and _fused(bufs):
                dlogits = fused_kernels.fused_phase1_backward(
                    weights[present].flatten(2),
                    bufs.values[:k].flatten(1, 2),
                    bufs.written_value_grad(k).flatten(1, 2),
                    *(douts[s].flatten(0, 1) for s in present),
                )
                for i, s in enumerate(present):
                    bufs.logit_grad[:k, q0 + s] += dlogits[i].view_as(weights[s])
            elif present and _native(bufs, weights):
                for s in present:
                    cpu_kernels.ops().slot_backward(
                        douts[s].to(weights.dtype).flatten(0, 1).contiguous(),
                        weights[s].flatten(1),
                        bufs.values[:k].flatten(1, 2),
                        bufs.value_grad[:k].flatten(1, 2),
                        bufs.logit_grad[:k, q0 + s].flatten(1),
                        bufs.take_unwritten(k),
                    )
            else:
                for s in present:
                    dots = _dots(bufs.values, k, douts[s])  # (k, B, T): <v_j, dout>
                    _slot_grads(bufs, q0 + s, weights[s], douts[s], dots, (weights[s] * dots).sum(0), 1.0, None)
        return (None,) * len(ctx.needs_input_grad)


def _readers(bufs: Buffers, slot: int, first: int) -> tuple[Tensor | None, list[int]]:
    """What ``slot`` gathers: the partial sum its group's top slot formed (None if none did), and the queries from
    ``first`` on that kept a gradient and that partial does not cover (those below the top's), in descending order."""
    partial, below = bufs.partials.pop(slot, (None, bufs.logits.shape[1]))
    return partial, [q for q in range(below - 1, first - 1, -1) if q in bufs.pending]


@cache
def gather_plan(firsts: tuple[int, ...], queries: int) -> dict[int, tuple[int, ...]]:
    """Which slots' backward also forms lower slots' share of its readers' gradients: top slot -> those slots.

    Every reader of slot t (queries ``firsts[t]`` on) reads every slot below it too, so slot t's ``deposit_backward``
    can form a lower slot's share of those readers while their rows are at hand (a partial sum), and that slot's own
    backward then reads only its readers below ``firsts[t]`` and the partial: ``R_t - 3`` fewer reads of an (N, D)
    tensor for each slot so grouped (it also reads the slot's rows once more, and writes and reads the partial), where
    ``R_t`` is slot t's readers. The groups are contiguous runs of slots, chosen to read the fewest (N, D) tensors by
    dynamic programming (a slot read by a few queries leads no group; those read by many do). Block N = 8 at 16
    sublayers: 99 -> 71 reads and writes; Full AttnRes at 16 sublayers: 187 -> 122, at 48: 1323 -> 500."""
    readers = [queries - f for f in firsts]
    best, start = [0], [0]
    for end in range(1, len(firsts) + 1):  # the slots [bottom, end), end - 1 their top, the best partition below
        top = end - 1
        costs = [
            (best[bottom] + 2 + readers[top] + sum(5 + readers[i] - readers[top] for i in range(bottom, top)), bottom)
            for bottom in range(end)
        ]
        cost, bottom = min(costs, key=lambda c: (c[0], -c[1]))  # on a tie, the smaller group: fewer partials held
        best.append(cost)
        start.append(bottom)
    plan, end = {}, len(firsts)
    while end > 0:
        bottom = start[end]
        if end - 1 > bottom:
            plan[end - 1] = tuple(range(end - 2, bottom - 1, -1))
        end = bottom
    return plan


def _gather(bufs: Buffers, slot: int, first: int) -> Tensor | None:
    """The gradient of ``slot``'s value from every reader that kept its gradient (a block's first query in Phase1's
    backward, a merge in its own), in descending query order; None when no reader sent one. A reader q whose phase-1
    output got ``s_q g_q`` (``s_q`` a merge's keep, else 1) adds ``w_qj s_q g_q``. A block's first query also leaves
    its softmax backward to the slots: ``w_qj (s_q <v_j, g_q> - c_q)`` with ``c_q = <out_q, g_q>``, added to the
    slot's logit gradient here; so does a merge whose backward ran natively (``merge_backward_kept``: ``c_q = keep
    <dh, h>``); one in torch ops adds its own (``c_q`` None). A slot whose group's top slot ran natively starts from
    the partial sum the top formed and gathers only the readers below the top's (:func:`gather_plan`). Torch ops; the
    native kernels do this and the deposit's logits' path at once (:func:`_gather_native`).
    """
    partial, readers = _readers(bufs, slot, first)  # a partial: its group's top slot ran natively
    if not readers and partial is None:
        return None
    x = bufs.values[slot].flatten(0, 1)  # (N, D)
    dx = partial
    for q in readers:
        grad, scale, c, w, out = bufs.pending[q]
        if out is not None:  # kept for the native kernel to form c (its first slot ran in torch ops after all)
            torch.sum(out * grad, -1, out=c)
        w, lg = w[slot], bufs.logit_grad[slot, q].view(-1)
        if c is not None:  # w (s <x, g> - c): a merge's c (merge_backward_kept) is keep <dh, h>, s its keep
            dots = (x * grad).sum(-1)
            lg.add_((dots if scale is None else dots.mul_(scale)).sub_(c).mul_(w))
        ws = w if scale is None else w * scale
        dx = grad * ws.unsqueeze(-1) if dx is None else dx.addcmul_(grad, ws.unsqueeze(-1))
    _gathered(bufs, slot, readers)
    return dx.view_as(bufs.values[slot])


def _gather_native(bufs: Buffers, slot: int, first: int, u: Tensor) -> tuple[Tensor, Tensor]:
    """The deposit's backward through ``deposit_backward`` (attnres.kernels.cpu): the slot's gradient (B, T, D), its
    readers' share (as :func:`_gather`; a merge's ``c_q`` comes from its kept backward, ``merge_backward_kept``) plus
    its logits' path (as Deposit.backward's torch ops), and ``r dz`` (Q - first, N) for the queries' gradient. The top
    slot of a group (:func:`gather_plan`) also forms its lower slots' partial sums of its readers, in the same pass over
    their rows, and once a group ends at the embedding's slot its readers are let go: no slot left reads them."""
    x = bufs.values[slot].flatten(0, 1)  # (N, D)
    partial, readers = _readers(bufs, slot, first)
    kept = [bufs.pending[q] for q in readers]
    ahead = bufs.plan.get(slot, ()) if readers else ()
    empty = x.new_empty(0)
    dx, dzr, *partials = cpu_kernels.ops().deposit_backward(
        x,
        [k.grad for k in kept],
        [empty if k.scale is None else k.scale for k in kept],
        [k.weights[slot] for k in kept],
        [empty if k.c is None else k.c for k in kept],
        [empty if k.out is None else k.out for k in kept],  # c = <out, g> to form first, into k.c
        [q - first for q in readers],  # each reader's row of the slot's logit gradient, the next argument
        bufs.logit_grad[slot, first:].flatten(1),
        bufs.logits[slot, first:].flatten(1),
        bufs.inv_rms[slot].flatten(),
        u[first:].contiguous(),
        empty if partial is None else partial,
        [bufs.values[i].flatten(0, 1) for i in ahead],
        [k.weights[i] for i in ahead for k in kept],
        [bufs.logit_grad[i, q].view(-1) for i in ahead for q in readers],
    )
    for i, sums in zip(ahead, partials):
        bufs.partials[i] = (sums, first)
    _gathered(bufs, slot, readers)
    if ahead and ahead[-1] == 0:  # its group ends at the embedding: no slot left reads these readers
        for q in readers:
            del bufs.pending[q]
    return dx.view_as(bufs.values[slot]), dzr


def _gathered(bufs: Buffers, slot: int, readers: list[int]) -> None:
    """After ``slot`` gathered ``readers``: a reader's ``c`` is formed now (later slots read it), so its kept output
    is let go; the last slot to run backward (0) has gathered every kept gradient, so all are."""
    if slot == 0:
        bufs.pending.clear()
        return
    for q in readers:
        if bufs.pending[q].out is not None:
            bufs.pending[q] = bufs.pending[q]._replace(out=None)


def _fused(bufs: Buffers) -> bool:
    return bufs.fused and fused_kernels.available()


def _native(bufs: Buffers, *tensors: Tensor | None) -> bool:
    """Through :mod:`attnres.kernels.cpu` (all ``tensors`` CPU fp32), unless the compiled kernels were asked for."""
    return not bufs.fused and cpu_kernels.usable(*tensors)


def _slot_grads(
    bufs: Buffers,
    query: int,
    weights: Tensor,
    grad: Tensor,
    dots: Tensor,
    dot_out: Tensor,
    scale: Tensor | float,
    dscore: Tensor | None,
    gather: Kept | None = None,
) -> None:
    """The completed slots' share of the backward of one query (eager).

    The query's phase-1 output is ``out = sum_j weights[j] v_j``, weights (k, B, T) the softmax of its
    logits; the gradient of out is ``scale * grad`` (``scale`` (B, T) is a merge's keep, 1 for a block's
    first sublayer), ``dots[j] = <v_j, grad>``, ``dot_out = <out, grad> = sum_j weights[j] dots[j]`` and
    ``dscore`` (B, T) is the gradient of its log-sum-exp (a merge's score). Adds ``scale * weights[j] * grad``
    to ``value_grad[j]`` and the softmax's backward to the logits' gradient.
    """
    dlogits = (dots - dot_out).mul_(scale)
    if dscore is not None:
        dlogits += dscore
    bufs.logit_grad[: weights.shape[0], query] += dlogits.mul_(weights)
    if bufs.gather:  # the slots gather the value share later (_gather), from what the reader keeps
        bufs.pending[query] = gather
    else:
        bufs.add_value_grads(grad, weights * scale)


class Merge(Function):
    """Phase 2 for query ``u`` (D,): ``h = p + keep * (out - p)``, ``keep = sigmoid(lse - r_p * (p . u))``.

    ``p = prev + last`` is the block's partial sum (``last`` alone at the block's second sublayer), returned
    as the third output; its backward adds what p's later reader sent back (``dp_later``) into p's gradient
    and returns that for ``prev`` and ``last`` alike.

    The backward also does this query's share of phase 1's backward (:func:`_slot_grads`, with ``dout = keep
    dh``; or, with ``Buffers.gather``, keeps ``dh`` for the slots to gather it), so the gradient of ``out`` is never
    materialised and ``out`` need not be kept: ``<dh, out>`` comes from the dot products with the slots. Natively
    with ``Buffers.gather`` it reads no slot at all: ``<dh, h - p> = keep (<dh, out> - <dh, p>)`` gives the score's
    gradient from ``h`` (saved: the sublayer's norm keeps it anyway), and the softmax's backward on each slot is left
    to the slot's ``deposit_backward``, which reads the slot's and ``dh``'s rows anyway (``merge_backward_kept``).
    It saves the partial sum ``p``, one (B, T, D) tensor per merge (Block N = 4: about 5 % of the baseline's peak
    memory). Rebuilding ``p`` from ``h`` and a recomputed ``out`` instead costs k + 5 more passes over (B, T, D)
    tensors per merge: saving it took Block N = 4's depth mixing from 33.1 to 29.7 ms (``benchmarks/bench_step.py``,
    depth only).
    """

    @staticmethod
    def forward(
        ctx: Any,
        out: Tensor,
        lse: Tensor,
        prev: Tensor | None,
        last: Tensor,
        u: Tensor,
        weights: Tensor,
        bufs: Buffers,
        query: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        with no_autocast(last):
            if _native(bufs, out, prev, last):
                first = last.new_empty(0) if prev is None else prev.flatten(0, 1).contiguous()  # empty: p = last
                h, keep, r, logit, p = cpu_kernels.ops().merge_forward(
                    out.flatten(0, 1).contiguous(),
                    first,
                    last.flatten(0, 1).contiguous(),
                    u.contiguous(),
                    lse.flatten(),
                    bufs.eps,
                )
                h, p = h.view_as(out), p.view_as(last)
                keep, r, logit = keep.view_as(lse), r.view_as(lse), logit.view_as(lse)
            else:
                h, keep, r, logit, p = Merge._forward(out, lse, prev, last, u, bufs)
        ctx.bufs, ctx.query, ctx.summed, ctx.last_dtype = bufs, query, prev is not None, last.dtype
        # h: the native backward with gather reads it instead of the k slots (merge_backward_kept); the sublayer's
        # norm keeps it until then anyway, so saving it costs no memory
        ctx.save_for_backward(p, u, weights, r, logit, keep, h)
        ctx.mark_non_differentiable(keep)
        return h, keep, p

    @staticmethod
    def _forward(
        out: Tensor, lse: Tensor, prev: Tensor | None, last: Tensor, u: Tensor, bufs: Buffers
    ) -> tuple[Tensor, ...]:
        """The forward in torch ops, eager or through the compiled kernel (``bufs.fused``): h, keep, r, logit, p.

        The partial sum is kept in the slots' precision (fp32 under bf16 autocast: the residual stream's, as the
        baseline's ``h + f(h)`` is fp32), so a block's bf16 outputs are not summed in bf16."""
        first = last.view_as(last) if last.dtype == out.dtype else last.to(out.dtype)
        p = first if prev is None else prev + last  # the block's partial sum so far
        pf, uf = p.to(out.dtype), u.to(out.dtype)
        if _fused(bufs):
            h, keep, r, logit = fused_kernels.fused_merge_forward(
                out.flatten(0, 1), pf.flatten(0, 1), uf, lse.flatten(), bufs.eps
            )
            h, keep, r, logit = h.view_as(pf), keep.view_as(lse), r.view_as(lse), logit.view_as(lse)
        else:
            r = _inv_rms(pf, bufs.eps)  # (B, T)
            logit = (pf @ uf).mul_(r)  # (B, T)
            keep = torch.sigmoid(lse - logit)  # weight of the completed blocks, (B, T)
            h = torch.lerp(pf, out, keep.unsqueeze(-1))
        return h, keep, r, logit, p

    @staticmethod
    def backward(ctx: Any, dh: Tensor, _dkeep: Tensor, dp_later: Tensor) -> tuple[Tensor | None, ...]:
        p, u, weights, r, logit, keep, h = ctx.saved_tensors
        bufs = ctx.bufs
        bufs.grads()  # a merge can be the first reader to run backward (a loss on an inner sublayer)
        with no_autocast(p):
            dh, pf, uf = dh.to(weights.dtype), p.to(weights.dtype), u.to(weights.dtype)
            dp_later = dp_later.to(weights.dtype)  # what p's later readers (a merge, the deposit) sent back
            k = weights.shape[0]
            if _native(bufs, dh) and bufs.gather:  # the slots take this query's share later: read none of them
                flat_dh = dh.flatten(0, 1).contiguous()
                dp, du, c = cpu_kernels.ops().merge_backward_kept(
                    flat_dh,
                    pf.flatten(0, 1).contiguous(),
                    h.flatten(0, 1).contiguous(),
                    dp_later.flatten(0, 1).contiguous(),
                    uf.contiguous(),
                    r.flatten(),
                    logit.flatten(),
                    keep.flatten(),
                )
                # what the slots' deposit_backward needs: this query's gradient, its keep, c = keep <dh, h>, weights
                bufs.pending[ctx.query] = Kept(flat_dh, keep.flatten(), c, weights.flatten(1))
                dp = dp.view_as(pf)
            elif _native(bufs, dh):  # the readers scatter (AttnRes.gather = False)
                dp, du = cpu_kernels.ops().merge_backward(
                    dh.flatten(0, 1).contiguous(),
                    pf.flatten(0, 1).contiguous(),
                    dp_later.flatten(0, 1).contiguous(),
                    uf.contiguous(),
                    weights.flatten(1),
                    bufs.values[:k].flatten(1, 2),
                    bufs.written_value_grad(k).flatten(1, 2),
                    r.flatten(),
                    logit.flatten(),
                    keep.flatten(),
                    bufs.logit_grad[:k, ctx.query].flatten(1),
                )
                dp = dp.view_as(pf)
            elif _fused(bufs):
                dlogits, dp, du = fused_kernels.fused_merge_backward(
                    dh.flatten(0, 1),
                    pf.flatten(0, 1),
                    dp_later.flatten(0, 1),
                    uf,
                    weights.flatten(1),
                    bufs.values[:k].flatten(1, 2),
                    bufs.written_value_grad(k).flatten(1, 2),
                    r.flatten(),
                    logit.flatten(),
                    keep.flatten(),
                )
                bufs.logit_grad[:k, ctx.query] += dlogits.view_as(weights)
                dp = dp.view_as(pf)
            else:
                dots = _dots(bufs.values, k, dh)  # (k, B, T): <v_j, dh>
                # dh/dkeep = out - p and dkeep/dscore = keep (1 - keep); <dh, out> = sum_j weights[j] dots[j]
                rest = 1 - keep
                dot_out = (weights * dots).sum(0)  # (B, T)
                dp = torch.mul(dh, pf)  # (B, T, D) scratch for <dh, p>, then reused for dp: one buffer, not two
                dscore = (dot_out - dp.sum(-1)).mul_(keep * rest)  # (B, T)
                # out's gradient: keep * dh; with gather, the slots take their value share later (_gather)
                kept = None
                if bufs.gather:
                    kept = Kept(dh.flatten(0, 1).contiguous(), keep.flatten(), None, weights.flatten(1))
                _slot_grads(bufs, ctx.query, weights, dh, dots, dot_out, keep, dscore, kept)
                # logit = r (p . u) and dlogit/dp = r u - r^2 logit p / D; with a = -dscore r and
                # c = dscore logit r^2 / D:  dp = (1 - keep) dh + a u + c p, du = sum over tokens of a p
                a = -dscore * r
                c = dscore * logit * r.square() / dh.shape[-1]
                torch.addcmul(dp_later, dh, rest.unsqueeze(-1), out=dp)
                dp.addcmul_(a.unsqueeze(-1), uf).addcmul_(pf, c.unsqueeze(-1))
                du = a.reshape(-1) @ pf.reshape(-1, pf.shape[-1])
        dp = dp.to(p.dtype)  # p = prev + last: both get p's whole gradient
        return None, None, (dp if ctx.summed else None), dp.to(ctx.last_dtype), du.to(u.dtype), None, None, None
