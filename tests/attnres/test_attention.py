"""The token attention's native CPU kernels (attnres.kernels.attention): torch's SDPA to rounding, forward and
backward, where they run and where they do not, and the same bits at any thread count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnres.kernels import attention
from attnres.kernels import cpu as cpu_kernels
from tests.conftest import needs_native

# native_calls (tests/conftest.py) lists the native kernels that ran; these tests need them built and on
pytestmark = needs_native


def qkv(b: int, h: int, t: int, hd: int, dtype=torch.float64, seed: int = 0) -> list[torch.Tensor]:
    """q, k, v as the model makes them: views of one (B, T, 3, H, hd) projection, so v's rows are strided."""
    gen = torch.Generator().manual_seed(seed)
    fused = torch.randn(b, t, 3, h, hd, generator=gen, dtype=dtype).permute(2, 0, 3, 1, 4)
    return [fused[0].contiguous(), fused[1].contiguous(), fused[2]]


def check_against_sdpa(q, k, v, dout, calls: list[str]) -> None:
    """The native kernels' output and gradients against torch's SDPA in float64, no farther from it than torch's own
    float32 SDPA is (within 3 times its error, or 1e-6 of the tensor's size where that error is smaller). ``q``,
    ``k``, ``v``, ``dout`` float64, in any layout; both float32 runs get copies of the same layouts."""

    eager_out = None

    def run(dtype: torch.dtype, native: bool) -> list[torch.Tensor]:
        inputs = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]  # .to() keeps each tensor's strides
        was, attention.enabled = attention.enabled, native
        try:
            out = attention.causal_attention(*inputs)
        finally:
            attention.enabled = was
        nonlocal eager_out
        eager_out = out
        out.backward(dout.to(dtype))
        return [out.detach().double()] + [x.grad.double() for x in inputs]

    exact = run(torch.float64, False)
    torch32 = run(torch.float32, False)
    assert calls == []
    ours = run(torch.float32, True)
    assert calls == ["attention_forward", "attention_backward"]
    assert type(eager_out.grad_fn).__name__ == "_EagerBackward"  # eager: not through the operators' Python dispatch
    size = max(x.abs().max().item() for x in exact[1:])  # the gradients' scale (a single token's dq is 0 but rounding)
    for name, mine, theirs, truth in zip(("out", "dq", "dk", "dv"), ours, torch32, exact):
        scale = truth.abs().max().item() if name == "out" else size
        allowed = max(3 * (theirs - truth).abs().max().item(), 1e-6 * scale)
        assert (mine - truth).abs().max().item() <= allowed, name


@pytest.mark.parametrize(
    "shape", [(2, 3, 37, 16), (16, 3, 128, 16), (2, 4, 70, 64), (1, 2, 1, 32), (2, 1, 9, 48), (1, 2, 24, 16)]
)
def test_native_attention_is_sdpa_to_rounding_forward_and_backward(shape, native_calls):
    """Odd lengths leave a partial tile of rows and a partial block of keys (24: whole tiles, half a key block); a
    single token attends to itself only."""
    dout = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    check_against_sdpa(*qkv(*shape), dout, native_calls)


def test_large_scores_and_odd_layouts_are_sdpa_to_rounding(native_calls):
    """Scores in the hundreds (the exp's clamps, and later keys' overflowing lanes in backward, which get no weight),
    a gradient broadcast from one row (stride 0) and queries whose last dim is not contiguous (copied first)."""
    q, k, v = qkv(2, 3, 40, 16)
    q = (12 * q).transpose(-1, -2).contiguous().transpose(-1, -2)  # the same values, the last dim strided
    assert q.stride(-1) != 1
    dout = torch.randn(1, 1, 1, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    check_against_sdpa(q, 12 * k, v, dout.expand(2, 3, 40, 16), native_calls)
    native_calls.clear()
    dout = torch.randn(2, 40, 3, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    check_against_sdpa(*qkv(2, 3, 40, 16), dout.transpose(1, 2), native_calls)  # as the projection's gradient comes


def test_the_output_is_laid_out_for_the_projection(native_calls):
    """The heads' concatenation after the attention, out.transpose(1, 2) as (B, T, H * hd), is a view, not a copy."""
    out = attention.causal_attention(*[x.float() for x in qkv(2, 3, 8, 16)])
    assert out.transpose(1, 2).is_contiguous()


def test_it_runs_natively_only_where_it_applies(monkeypatch, native_calls):
    """head_dim not a multiple of 16 (or 0), float64, bf16 autocast, or the kernels off: torch's SDPA, to the bit."""
    cases = [qkv(1, 2, 5, 8, torch.float32), qkv(1, 2, 5, 16, torch.float64), qkv(1, 2, 5, 0, torch.float32)]
    for q, k, v in cases:
        assert torch.equal(attention.causal_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    q, k, v = [x.float() for x in qkv(1, 2, 5, 16)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(attention.causal_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    monkeypatch.setattr(cpu_kernels, "enabled", False)
    assert torch.equal(attention.causal_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert native_calls == []


def test_the_same_bits_at_one_and_two_threads(native_calls):
    """One task per (batch, head) pair, each summed in one order: the thread count does not change a bit."""
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            q, k, v = [x.float().requires_grad_() for x in qkv(3, 3, 40, 16)]
            out = attention.causal_attention(q, k, v)
            out.square().sum().backward()
            results.append([out.detach(), q.grad, k.grad, v.grad])
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(*results):
        assert torch.equal(one, two)


def test_the_log_sum_exp_takes_no_gradient(native_calls):
    """It is the backward's alone: a loss on it is refused, not given a wrong (zero) gradient."""
    q, k, v = [x.float().requires_grad_() for x in qkv(1, 2, 8, 16)]
    out, lse = torch.ops.attnres.causal_attention(q, k, v, 0.25)
    assert out.requires_grad and not lse.requires_grad


def test_fake_tensors_get_the_real_shapes_and_layout():
    """The memory estimate runs the model on fake tensors: the operators' fake functions give what the kernels do."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = [x.float().requires_grad_() for x in qkv(2, 3, 8, 16)]
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(x).requires_grad_() for x in real]
        out, lse = torch.ops.attnres.causal_attention(*fake, 0.25)
        grads = torch.ops.attnres.causal_attention_backward(*fake, out, lse, out, 0.25)
    want_out, want_lse = torch.ops.attnres.causal_attention(*real, 0.25)
    want_grads = torch.ops.attnres.causal_attention_backward(*real, want_out, want_lse, want_out, 0.25)
    for f, r in zip([out, lse, *grads], [want_out, want_lse, *want_grads]):
        assert (f.shape, f.stride()) == (r.shape, r.stride())


@pytest.mark.integration  # Inductor compiles for the CPU: tests/conftest.py's compiles_for_cpu (needs_native: above)
def test_torch_compile_keeps_the_native_kernels(native_calls):
    """Compiled, the operators are opaque calls in the graph (forward and backward) with the eager results."""
    q, k, v = qkv(2, 3, 24, 16, torch.float32)

    def loss(q, k, v):
        return attention.causal_attention(q, k, v).sin().sum()

    grads = []
    for fn in (loss, torch.compile(loss, fullgraph=True)):
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        fn(*inputs).backward()
        grads.append([x.grad for x in inputs])
    assert native_calls.count("attention_forward") == 2 and native_calls.count("attention_backward") == 2
    for eager, compiled in zip(*grads):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
