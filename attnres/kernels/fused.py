"""The element-wise work of the two-phase depth attention as fused kernels (used by ``runtime.compile``).

Eager PyTorch runs every element-wise op of :mod:`attnres.kernels.two_phase` as its own pass over a
(B, T, D) tensor: about ten per sublayer, which is most of what Block AttnRes costs over the baseline. The
functions below state the same math in a form ``torch.compile`` fuses into one or two passes (C++/OpenMP on
CPU, Triton on GPU). They are pure: they return what the autograd functions store, and the only mutation is the
value-gradient accumulator that the two backward kernels add into.

Tokens are flattened, so every operand is (k, N, D), (N, D) or (N,) with N = batch x tokens. Compilation is
in torch.compile's automatic-dynamic mode: a kernel is first built for the shapes it sees, and a dimension
that later changes (the number of completed slots k, N at evaluation) becomes symbolic at one recompile. The
width D never changes, and it must stay static: with a symbolic D the CPU kernels are not vectorised and run
no faster than eager. Inductor caches the kernels on disk, so later runs on the machine skip most of the
compile. Where compiling fails (no C++ compiler, no Triton), the first failure is reported once as a warning
and the hand-written eager path of :mod:`attnres.kernels.two_phase` is used from then on; the call that failed is
computed eagerly by the same function, so nothing is lost. The results agree with the eager path to rounding
(the tests hold both to the direct formula at 1e-5).

What it buys is measured by ``benchmarks/bench_step.py --fused-depth``. On CPU the depth attention is bound
by memory traffic, not by the number of passes, and these kernels measured no faster than the eager code
(slower for Full AttnRes), so training uses them on GPU only (:func:`attnres.model.compile_model`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
from torch import Tensor


def phase1_forward(scores: Tensor, values: Tensor) -> tuple[Tensor, ...]:
    """scores (S, k, N), values (k, N, D) -> lse (S, N), weights (S, k, N) and S outputs (N, D)."""
    lse = scores.logsumexp(dim=1)
    weights = (scores - lse.unsqueeze(1)).exp()
    outs = tuple((weights[s].unsqueeze(-1) * values).sum(0) for s in range(scores.shape[0]))
    return (lse, weights, *outs)


def phase1_backward(weights: Tensor, values: Tensor, value_grad: Tensor, *douts: Tensor) -> Tensor:
    """Adds ``sum_s weights[s, j] * douts[s]`` to ``value_grad[j]`` (k, N, D); returns the logits' gradient
    (S, k, N)."""
    dots = torch.stack([(values * d).sum(-1) for d in douts])  # (S, k, N): <v_j, dout_s>
    mean = (weights * dots).sum(1, keepdim=True)
    value_grad.add_(sum(weights[s].unsqueeze(-1) * d for s, d in enumerate(douts)))
    return weights * (dots - mean)


def merge_forward(out: Tensor, p: Tensor, u: Tensor, lse: Tensor, eps: float) -> tuple[Tensor, ...]:
    """Phase 2 (see :class:`attnres.kernels.two_phase.Merge`): h, keep, 1/rms(p), logit of p."""
    r = torch.rsqrt(p.square().mean(-1) + eps)
    logit = (p * u).sum(-1) * r
    keep = torch.sigmoid(lse - logit)
    return p + keep.unsqueeze(-1) * (out - p), keep, r, logit


def merge_backward(
    dh: Tensor,
    p: Tensor,
    dp_later: Tensor,
    u: Tensor,
    weights: Tensor,
    values: Tensor,
    value_grad: Tensor,
    r: Tensor,
    logit: Tensor,
    keep: Tensor,
) -> tuple[Tensor, ...]:
    """Gradients of :func:`merge_forward` with this query's share of phase 1's backward (see
    :class:`attnres.kernels.two_phase.Merge`): adds ``keep * weights[j] * dh`` to ``value_grad[j]`` (k, N, D);
    returns the gradient of the query's logits against the k slots (k, N), of p (including ``dp_later``, what
    p's later reader sent back) and of u."""
    dots = (values * dh).sum(-1)  # (k, N)
    dot_out = (weights * dots).sum(0)
    rest = 1 - keep
    dscore = (dot_out - (dh * p).sum(-1)) * keep * rest
    value_grad.add_((weights * keep).unsqueeze(-1) * dh)
    a = -dscore * r
    c = dscore * logit * r * r / dh.shape[-1]
    dp = dp_later + dh * rest.unsqueeze(-1) + a.unsqueeze(-1) * u + c.unsqueeze(-1) * p
    du = (a.unsqueeze(-1) * p).sum(0)
    return weights * ((dots - dot_out) * keep + dscore), dp, du


_failure: str | None = None


def available() -> bool:
    """False once compiling a kernel has failed in this process (callers then take the eager path)."""
    return _failure is None


# Each shape family is its own graph: the block length S (the number of phase-1 outputs) and k = 1 are
# specialised, and one process may build several models (tests, tuning). Dynamo's default of 8 graphs per
# function is too few for that; the limit is raised for these calls only.
_RECOMPILE_LIMIT = 64


def _compiled_or_eager(fn: Callable) -> Callable:
    compiled = torch.compile(fn, dynamic=None, fullgraph=True)

    @functools.wraps(fn)
    def call(*args):
        global _failure
        if _failure is None:
            try:
                with torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT):
                    return compiled(*args)
            except Exception as err:  # a missing compiler shows up here, at the first call
                first_line = (str(err).strip().splitlines() or [""])[0]
                _failure = f"{type(err).__name__}: {first_line}"
                warnings.warn(
                    f"runtime.compile: torch.compile could not build the depth-attention kernels ({_failure}); "
                    "using the eager depth attention instead (same results, slower). Set runtime.compile=false "
                    "to skip the attempt.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return fn(*args)

    return call


fused_phase1_forward = _compiled_or_eager(phase1_forward)
fused_phase1_backward = _compiled_or_eager(phase1_backward)
fused_merge_forward = _compiled_or_eager(merge_forward)
fused_merge_backward = _compiled_or_eager(merge_backward)
