"""RMSNorm, ``x / sqrt(mean(x^2) + eps) * weight``, with a one-pass backward on CPU.

torch's ``F.rms_norm`` is a composite op on CPU: its forward is a handful of element-wise ops, and autograd
differentiates them one by one, about ten passes over (tokens, D) tensors in backward. A training step has two norms
per transformer block and a final one, so in eager CPU training that backward was 5 to 8 % of a step
(``benchmarks/bench_step.py``'s ``-eager`` variants measure it; docs/performance.md). Here the forward is torch's own
(``aten::_fused_rms_norm``, which ``F.rms_norm`` calls: the same bits, and it returns the ``1/rms`` the backward
needs) and the backward is the native kernel of :mod:`attnres.kernels.cpu`, which gives the same gradients to
rounding and sums the weight's gradient over the tokens in token order, so it does not depend on the thread count.

Everything else takes ``F.rms_norm`` as before: no gradient wanted, not CPU fp32, autocast, inside ``torch.compile``
(which fuses the norm itself), a sharded (DTensor) weight, or the native kernels off or not built. The memory
estimate (:mod:`attnres.training.memory`, on fake tensors, which the kernel cannot take) sets :data:`simulating`: the
norm then saves what the native path saves and differentiates in torch ops.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from attnres.kernels import cpu as cpu_kernels

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed
    DTensor = ()

simulating = False  # set by attnres.training.memory: take this path, its backward in torch ops


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dimension of ``x`` with gain ``weight``: the native backward where it applies."""
    if _native(x, weight):
        return _NativeRMSNorm.apply(x, weight, eps)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _native(x: Tensor, weight: Tensor) -> bool:
    return (
        torch.is_grad_enabled()
        and (x.requires_grad or weight.requires_grad)
        and not torch.compiler.is_compiling()
        and not torch.is_autocast_enabled(x.device.type)
        and not isinstance(weight, DTensor)  # a sharded weight
        and (simulating or cpu_kernels.usable(x, weight))
    )


class _NativeRMSNorm(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        x = x.contiguous()
        y, rstd = torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], weight, eps)  # rstd (..., 1)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        d = x.shape[-1]
        if cpu_kernels.usable(grad):
            dx, dw = cpu_kernels.ops().rms_norm_backward(
                grad.reshape(-1, d).contiguous(), x.view(-1, d), rstd.reshape(-1), weight.contiguous()
            )
        else:  # the same formula in torch ops (the memory estimate's fake tensors)
            gw = grad * weight
            dx = (gw - x * (rstd.square() * (gw * x).mean(-1, keepdim=True))) * rstd
            dw = (grad * (x * rstd)).flatten(0, -2).sum(0)
        return (dx.view_as(x) if ctx.needs_input_grad[0] else None), (dw if ctx.needs_input_grad[1] else None), None
