"""Causal self-attention over the tokens: a native CPU forward and backward where they apply, torch's SDPA elsewhere.

On CPU, torch's scaled_dot_product_attention runs the flash kernel, which forms each (batch, head) pair's scores by
small GEMM calls; at the CPU studies' shapes (head_dim 16, 128 tokens) those calls are mostly overhead, and the token
attention was a third of a deep, narrow training step, compiled or not (docs/performance.md). The kernels of
``attention.cpp`` (built with the others, :mod:`attnres.kernels.cpu`) do the same math in register tiles, only the
causal half of the scores: 1.5 to 1.7 times as fast as torch's, forward and backward, there and at head_dim 64
(``benchmarks/bench_attention.py``). They save what torch's flash kernel saves (q, k, v, the output and the
log-sum-exp) and recompute the probabilities in backward; the results match torch's to rounding (fp32) and do not
depend on the thread count (one task per batch row and head).

Where: CPU fp32 tensors, head_dim a multiple of 16, autocast off, the native kernels on and built (``ATTNRES_NATIVE=0``
turns them off). Everything else, a GPU, bf16, other head dims, and decoding's queries against a cache
(:class:`attnres.model.Attention`), takes ``F.scaled_dot_product_attention``. The pair is registered as torch custom
operators (``attnres::causal_attention`` and its backward) with their shapes for fake tensors, so ``torch.compile``
keeps each as one opaque call in the compiled graph (and FlopCounterMode counts them); eager, an autograd function
calls the same kernels directly.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable
from torch.utils._python_dispatch import is_in_torch_dispatch_mode
from torch.utils.flop_counter import register_flop_formula, sdpa_flop_count

from attnres.kernels import cpu as cpu_kernels

WIDTH = 16  # the kernels' vector: head_dim must be a multiple of it
enabled = True  # benchmarks switch it off to time torch's SDPA side by side (benchmarks/bench_step.py's -sdpa)


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """``softmax(q k^T / sqrt(hd) + causal mask) v`` for q, k, v (B, H, T, hd): natively where it applies."""
    if native(q, k, v):
        scale = q.shape[-1] ** -0.5
        if torch.compiler.is_compiling() or is_in_torch_dispatch_mode():
            # one opaque operator in the compiled graph, or one that fake tensors and FlopCounterMode see
            return torch.ops.attnres.causal_attention(q, k, v, scale)[0]
        # eager: the same kernels through an autograd function, without the operators' Python dispatch (0.2 ms of a
        # deep, narrow cell's 1.9 ms forward and backward a layer, measured side by side)
        return _Eager.apply(q, k, v, scale)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def native(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether :func:`causal_attention` of these tensors runs the native kernels."""
    return (
        enabled
        and all(x.device.type == "cpu" and x.dtype == torch.float32 for x in (q, k, v))
        and q.dim() == 4
        and q.shape == k.shape == v.shape
        and q.shape[-1] > 0
        and q.shape[-1] % WIDTH == 0
        and not torch.is_autocast_enabled("cpu")
        and _built()  # last: a GPU run or another dtype never builds the CPU kernels
    )


@torch.compiler.assume_constant_result
def _built() -> bool:
    """The native kernels are on and built (a constant to torch.compile, which then need not trace the build)."""
    return cpu_kernels.enabled and cpu_kernels.ops() is not None


def _last_contiguous(x: Tensor) -> Tensor:
    """``x`` itself when its last dim is contiguous (the kernels take any other strides), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _run_forward(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """(out, lse): out (B, H, T, hd) is a view of a (B, T, H, hd) tensor, so that the heads' concatenation after it is
    a view too; lse (B, H, T)."""
    out, lse = cpu_kernels.ops().attention_forward(_last_contiguous(q), _last_contiguous(k), _last_contiguous(v), scale)
    return out, lse


def _run_backward(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv), each a contiguous (B, H, T, hd) tensor."""
    dq, dk, dv = cpu_kernels.ops().attention_backward(
        *(_last_contiguous(x) for x in (q, k, v, out)), lse.contiguous(), _last_contiguous(dout), scale
    )
    return dq, dk, dv


class _Eager(Function):
    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        out, lse = _run_forward(q, k, v, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dout: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        return (*_run_backward(*ctx.saved_tensors, dout, ctx.scale), None)


@torch.library.custom_op("attnres::causal_attention", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """:func:`_run_forward` as an operator, for torch.compile."""
    return _run_forward(q, k, v, scale)


@_forward.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    b, h, t, hd = q.shape
    return q.new_empty(b, t, h, hd).transpose(1, 2), q.new_empty(b, h, t)


@torch.library.custom_op("attnres::causal_attention_backward", mutates_args=())
def _backward(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`_run_backward` as an operator, for torch.compile."""
    return _run_backward(q, k, v, out, lse, dout, scale)


@_backward.register_fake
def _(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    q, k, v, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.mark_non_differentiable(lse)  # for the backward only: a loss on it would get no gradient, so none is allowed
    ctx.scale = scale


def _differentiate(ctx: Any, dout: Tensor, _dlse: Tensor | None) -> tuple[Tensor, Tensor, Tensor, None]:
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.attnres.causal_attention_backward(q, k, v, out, lse, dout, ctx.scale)
    return dq, dk, dv, None


_forward.register_autograd(_differentiate, setup_context=_setup_context)


# torch's FlopCounterMode counts these as the math backend of SDPA: two (T x T) batched products forward, four backward
# (attnres.costs counts them so, and is checked against FlopCounterMode in tests/attnres/test_model.py)
@register_flop_formula(torch.ops.attnres.causal_attention)
def _forward_flops(q: Any, k: Any, v: Any, *_args: Any, **_kwargs: Any) -> int:
    return sdpa_flop_count(q, k, v)


@register_flop_formula(torch.ops.attnres.causal_attention_backward)
def _backward_flops(q: Any, k: Any, v: Any, *_args: Any, **_kwargs: Any) -> int:
    return 2 * sdpa_flop_count(q, k, v)
