"""The model and its depth mixing, checked against the method's equations and limiting cases."""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from attnres import AttnResLM, ModelConfig, Recorder
from attnres.config import ConfigError
from attnres.costs import count_flops, count_params, depth_sources
from attnres.kernels import cpu as cpu_kernels
from attnres.kernels import fused as fused_kernels
from attnres.kernels import two_phase
from attnres.mixers import TracedAttnRes
from tests.conftest import compiles_for_cpu, needs_cxx, needs_native

VARIANTS = [("baseline", 1), ("full", 1), ("block", 1), ("block", 2), ("block", 3), ("block", 8)]


def small(residual: str = "block", n_blocks: int = 2, **kw) -> ModelConfig:
    base = dict(vocab_size=64, n_layer=4, d_model=32, n_head=2, seq_len=16, residual=residual)
    if residual == "block":
        base["n_blocks"] = n_blocks
    base.update(kw)
    return ModelConfig(**base)


def randomize_depth(model: AttnResLM, scale: float = 1.0, seed: int = 1) -> AttnResLM:
    """Non-zero pseudo-queries and gains, so the depth softmax is far from uniform."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "pseudo_query" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
            elif "key_gain" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
    return model


def fast_and_reference(
    cfg: ModelConfig, fused: bool, scale: float = 1.0, dtype: torch.dtype = torch.float32
) -> tuple[AttnResLM, AttnResLM]:
    """The two-phase model (``fused``: through attnres.kernels.fused) and the direct-formula model, same weights."""
    fast = randomize_depth(AttnResLM(cfg), scale=scale).to(dtype)
    fast.depth.fused = fused
    ref = AttnResLM(cfg, reference_depth=True).to(dtype)
    ref.load_state_dict(fast.state_dict())
    return fast, ref


def tokens(cfg: ModelConfig, batch: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=torch.Generator().manual_seed(seed))


def capture(model: AttnResLM, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every sublayer's input h_l and raw output, in order."""
    inputs, outputs = [], []

    def record(module, args, out) -> None:
        inputs.append(args[0])
        outputs.append(out)

    hooks = [s.register_forward_hook(record) for s in model.sublayers]
    model(x)
    for h in hooks:
        h.remove()
    return inputs, outputs


def assert_same_outputs_and_gradients(model: AttnResLM, ref: AttnResLM, x: torch.Tensor, target: torch.Tensor) -> None:
    """The same logits and every parameter's gradient of a cross-entropy loss, to fp32 rounding."""
    outs = []
    for m in (model, ref):
        logits = m(x)
        F.cross_entropy(logits.flatten(0, 1), target.flatten()).backward()
        outs.append(logits)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


# ---------------------------------------------------------------------------------------------- public API


def test_public_api_shapes_and_names():
    cfg = small()
    model = AttnResLM(cfg)
    logits = model(tokens(cfg))
    assert logits.shape == (3, cfg.seq_len, cfg.vocab_size)
    names = [n for n, _ in model.named_parameters() if "pseudo_query" in n]
    assert names == ["depth.pseudo_query"]
    assert model.depth.pseudo_query.shape == (cfg.n_sublayers + 1, cfg.d_model)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.n_layer = 3  # frozen


def test_full_and_block_state_dicts_interchange():
    full = randomize_depth(AttnResLM(small("full")))
    block = AttnResLM(small("block", n_blocks=3))
    block.load_state_dict(full.state_dict())  # strict: same names and shapes
    assert {k: v.shape for k, v in full.state_dict().items()} == {k: v.shape for k, v in block.state_dict().items()}


# ------------------------------------------------------------------------------------ the method's equations


@pytest.mark.parametrize("reference", [False, True])
def test_block_with_one_sublayer_per_block_equals_full(reference):
    torch.manual_seed(0)
    full = randomize_depth(AttnResLM(small("full"), reference_depth=reference))
    block = AttnResLM(small("block", n_blocks=8), reference_depth=not reference)  # the other implementation
    block.load_state_dict(full.state_dict())
    x = tokens(full.cfg)
    torch.testing.assert_close(block(x), full(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("residual,n_blocks", [("full", 1), ("block", 1), ("block", 2), ("block", 3), ("block", 8)])
def test_zero_pseudo_queries_give_the_mean_of_the_sources(residual, n_blocks):
    """At init every sublayer reads the uniform mean of its sources, computed here from the raw outputs."""
    torch.manual_seed(0)
    cfg = small(residual, n_blocks)
    model = AttnResLM(cfg)
    assert torch.count_nonzero(model.depth.pseudo_query) == 0
    x = tokens(cfg)
    inputs, outputs = capture(model, x)
    embedding = model.embed(x)
    starts = cfg.block_starts
    for layer, h in enumerate(inputs):
        if residual == "full":
            sources = [embedding] + outputs[:layer]
        else:
            block = max(k for k, s in enumerate(starts) if s <= layer)
            bounds = list(starts[: block + 1]) + [layer]
            sums = [sum(outputs[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]  # completed + partial
            sources = [embedding] + [s for s in sums if not isinstance(s, int)]
        expected = torch.stack(sources).mean(0)
        torch.testing.assert_close(h, expected, rtol=1e-5, atol=1e-6, msg=f"sublayer {layer}")


def test_sources_are_sublayer_outputs_not_cumulative_states():
    """The reimplementation trap: with cumulative hidden states as sources, sublayer 2 would read
    mean(e, e + v1, e + v1 + v2) instead of mean(e, v1, v2). This test tells the two apart."""
    torch.manual_seed(0)
    cfg = small("full")
    model = AttnResLM(cfg)
    x = tokens(cfg)
    inputs, outputs = capture(model, x)
    e = model.embed(x)
    v1, v2 = outputs[0], outputs[1]
    right = (e + v1 + v2) / 3
    trap = (e + (e + v1) + (e + v1 + v2)) / 3
    assert (right - trap).abs().max() > 1e-2  # the two hypotheses differ on this model
    torch.testing.assert_close(inputs[2], right, rtol=1e-5, atol=1e-6)


def test_block_boundaries_do_not_count_the_embedding_twice():
    """N = 4 blocks of S = 2 over L = 8: sublayer 2 starts block 1 and reads [e, v1 + v2] (b_1 holds no e)."""
    torch.manual_seed(0)
    cfg = small("block", n_blocks=4)
    assert cfg.block_starts == (0, 2, 4, 6)
    model = AttnResLM(cfg)
    x = tokens(cfg)
    inputs, outputs = capture(model, x)
    e = model.embed(x)
    torch.testing.assert_close(inputs[2], (e + outputs[0] + outputs[1]) / 2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(inputs[3], (e + outputs[0] + outputs[1] + outputs[2]) / 3, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "n_layer,n_blocks,sizes", [(4, 3, [3, 3, 2]), (4, 5, [2, 2, 2, 1, 1]), (3, 6, [1] * 6), (4, 1, [8])]
)
def test_blocks_that_do_not_divide_the_sublayers(n_layer, n_blocks, sizes):
    cfg = small("block", n_blocks=n_blocks, n_layer=n_layer)
    starts = list(cfg.block_starts) + [cfg.n_sublayers]
    assert [b - a for a, b in zip(starts[:-1], starts[1:])] == sizes
    assert cfg.block_size == max(sizes)


@pytest.mark.parametrize("residual,n_blocks", VARIANTS)
def test_causality(residual, n_blocks):
    torch.manual_seed(0)
    cfg = small(residual, n_blocks)
    model = randomize_depth(AttnResLM(cfg))
    x = tokens(cfg, batch=2)
    t = 9
    y = x.clone()
    y[:, t] = (y[:, t] + 1) % cfg.vocab_size
    a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=0)
    assert (a[:, t:] - b[:, t:]).abs().max() > 0


@pytest.fixture
def kernel_calls(monkeypatch) -> set[str]:
    """Names of the fused depth kernels that ran compiled (attnres.kernels.fused), filled as the test runs."""
    calls: set[str] = set()
    for name in ("phase1_forward", "phase1_backward", "merge_forward", "merge_backward"):
        kernel = getattr(fused_kernels, f"fused_{name}")

        def spy(*args, _kernel=kernel, _name=name):
            out = _kernel(*args)
            if fused_kernels.available():  # compiled, not fallen back to eager
                calls.add(_name)
            return out

        monkeypatch.setattr(fused_kernels, f"fused_{name}", spy)
    return calls


# How the two-phase computation runs on CPU: torch ops only ("eager", the native kernels switched off), through the
# C++ kernels of attnres.kernels.cpu (what CPU training uses), or through the torch.compile'd kernels of
# attnres.kernels.fused (what runtime.compile uses on GPU; compiled for CPU here).
PATHS = pytest.mark.parametrize(
    "path", ["eager", pytest.param("native", marks=needs_native), pytest.param("fused", marks=compiles_for_cpu)]
)


@pytest.fixture
def path_calls(path, monkeypatch, kernel_calls, native_calls) -> tuple[bool, set[str], list[str]]:
    """Sets up ``path``; returns (fused, compiled kernels that ran, native kernels that ran: tests/conftest.py)."""
    monkeypatch.setattr(cpu_kernels, "enabled", path == "native")
    return path == "fused", kernel_calls, native_calls


@pytest.mark.parametrize("residual,n_blocks", [("full", 1), ("block", 1), ("block", 2), ("block", 3), ("block", 8)])
@pytest.mark.parametrize("scale", [1.0, 30.0])
@PATHS
def test_two_phase_matches_the_reference_in_outputs_and_gradients(residual, n_blocks, scale, path, path_calls):
    """fp32, random weights; scale 30 saturates the depth softmax (phase-2 weights near 0 and 1)."""
    fused, kernel_calls, native_calls = path_calls
    torch.manual_seed(0)
    cfg = small(residual, n_blocks)
    fast, ref = fast_and_reference(cfg, fused, scale=scale)
    assert_same_outputs_and_gradients(fast, ref, tokens(cfg), tokens(cfg, seed=1))
    merges = residual == "block" and n_blocks < cfg.n_sublayers  # blocks of more than one sublayer
    expected = {"phase1_forward", "phase1_backward"} | ({"merge_forward", "merge_backward"} if merges else set())
    assert kernel_calls == (expected if fused else set())  # the fused case really ran the compiled kernels
    # the slots gather their readers' gradients (deposit_backward), from a block's first query and merges
    # (merge_backward_kept: a merge leaves its softmax backward to the slots and reads none of them)
    native = {"deposit_forward", "phase1_forward", "rms_norm_backward", "deposit_backward"}
    native |= {"merge_forward", "merge_backward_kept"} if merges else set()
    native |= {"attention_forward", "attention_backward"}  # the token attention's (head_dim 16)
    assert set(native_calls) == (native if path == "native" else set())


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=compiles_for_cpu)], ids=["eager", "fused"])
def test_two_phase_matches_the_reference_in_float64_to_rounding(fused, kernel_calls):
    torch.manual_seed(0)
    cfg = small("block", 3)
    fast, ref = fast_and_reference(cfg, fused, dtype=torch.float64)
    x = tokens(cfg)
    for model in (fast, ref):
        model(x).square().mean().backward()
    assert len(kernel_calls) == (4 if fused else 0)
    for p, q in zip(fast.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12)


def traced(model: AttnResLM) -> AttnResLM:
    """``model`` with its depth attention as TracedAttnRes (what runtime.compile compiles on CPU), same parameters."""
    model.depth = TracedAttnRes(model.cfg, like=model.depth)
    return model


@pytest.mark.parametrize("residual,n_blocks", [("full", 1), ("block", 1), ("block", 2), ("block", 3), ("block", 8)])
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_the_traced_two_phase_matches_the_reference_in_outputs_and_gradients(residual, n_blocks, scale):
    """TracedAttnRes, eager (autograd's backward of its torch ops): the direct formula's outputs and gradients."""
    torch.manual_seed(0)
    cfg = small(residual, n_blocks)
    fast, ref = fast_and_reference(cfg, fused=False, scale=scale)
    assert_same_outputs_and_gradients(traced(fast), ref, tokens(cfg), tokens(cfg, seed=1))


def test_the_traced_two_phase_matches_the_reference_in_float64_to_rounding():
    torch.manual_seed(0)
    fast, ref = fast_and_reference(small("block", 3), fused=False, dtype=torch.float64)
    traced(fast)
    x = tokens(fast.cfg)
    outs = [model(x) for model in (fast, ref)]
    for out in outs:
        out.square().mean().backward()
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)
    for (name, p), q in zip(fast.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("residual,n_blocks", [("full", 1), ("block", 3)])
def test_the_traced_two_phase_records_what_the_two_phase_records(residual, n_blocks):
    cfg = small(residual, n_blocks)
    two_phase_model = randomize_depth(AttnResLM(cfg))
    x = tokens(cfg)
    recs = [Recorder(), Recorder()]
    with torch.no_grad():
        two_phase_model(x, recorder=recs[0])
        traced(two_phase_model)(x, recorder=recs[1])
    assert recs[0].source_kinds == recs[1].source_kinds
    assert sorted(recs[1].depth_weights) == list(range(cfg.n_sublayers + 1))
    for query, weights in recs[0].depth_weights.items():
        torch.testing.assert_close(recs[1].depth_weights[query], weights, rtol=1e-5, atol=1e-6, msg=str(query))


@needs_cxx
@pytest.mark.integration  # Inductor compiles for the CPU (tests/conftest.py: compiles_for_cpu)
@pytest.mark.parametrize("residual,n_blocks", [("full", 1), ("block", 3)])
def test_compile_model_compiles_attnres_whole_and_matches_the_eager_model(residual, n_blocks):
    """runtime.compile on CPU: the whole model, its depth attention traced, with the eager two-phase model's outputs
    and gradients to rounding and its parameter tensors. Compiled again with fullgraph=True, which raises on a graph
    break: the traced model is one graph."""
    from attnres.model import compile_model

    torch.manual_seed(0)
    cfg = small(residual, n_blocks)
    eager = randomize_depth(AttnResLM(cfg))
    compiled = AttnResLM(cfg)
    compiled.load_state_dict(eager.state_dict())
    params = list(compiled.parameters())
    compile_model(compiled, fuse_depth=False)
    assert isinstance(compiled.depth, TracedAttnRes)
    assert all(a is b for a, b in zip(compiled.parameters(), params, strict=True))  # what an optimizer holds
    compiled.compile(fullgraph=True)  # the same compile, asked to fail on a graph break
    assert_same_outputs_and_gradients(compiled, eager, tokens(cfg), tokens(cfg, seed=1))


@pytest.mark.parametrize("gather", [True, False], ids=["gather", "scatter"])
@pytest.mark.parametrize("layer", [3, 4, 6], ids=["block-start", "merge", "merge-late"])
@PATHS
def test_gradients_from_an_inner_sublayer_match_the_reference(layer, gather, path, path_calls):
    """A loss on one sublayer's input h_l, not on the logits: the final aggregation and the later blocks get
    no gradient, so the first reader to run backward is a block's phase 1 or a merge, and some slots are
    never read by anything that differentiates (the gradient buffers must not be assumed zero-filled).
    fp64 to rounding; fp32 for the native kernels, which run in fp32 only. With the slots gathering their gradients
    (the default) and with the readers scattering them (``AttnRes.gather = False``)."""
    fused, _, native_calls = path_calls
    fp32, fp64 = (torch.float32, {"rtol": 1e-4, "atol": 1e-5}), (torch.float64, {"rtol": 1e-10, "atol": 1e-12})
    dtype, tol = fp32 if path == "native" else fp64
    torch.manual_seed(0)
    cfg = small("block", 3)  # 8 sublayers in blocks of 3, 3, 2: layer 3 starts block 1, 4 and 6 merge
    fast, ref = fast_and_reference(cfg, fused, dtype=dtype)
    fast.depth.gather = gather
    x = tokens(cfg)
    probe = torch.randn(3, cfg.seq_len, cfg.d_model, dtype=dtype)
    for model in (fast, ref):
        inputs, _ = capture(model, x)
        (inputs[layer] * probe).sum().backward()
    # block 0 merges, and every layer here reads it
    assert ("merge_backward_kept" in native_calls) == (path == "native" and gather)
    assert ("merge_backward" in native_calls) == (path == "native" and not gather)
    for (name, p), q in zip(fast.named_parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, **tol, msg=name)


@needs_native
@pytest.mark.parametrize("residual,n_blocks", [("full", 1), ("block", 3)])
def test_a_first_querys_deferred_dot_is_formed_by_a_torch_ops_gather_too(residual, n_blocks, monkeypatch):
    """Natively, a block's first query leaves c = <out, g> for the first slot's kernel to form (two_phase.Kept.out);
    should that slot's backward run in torch ops instead (``_gather``), it forms c itself. Here every (B, T, D) tensor
    takes the torch ops and the (N, D) rows of phase 1's backward the native path, against the reference."""
    real = two_phase._native

    def native(bufs, *tensors):
        return real(bufs, *tensors) and all(x is None or x.dim() != 3 for x in tensors)

    monkeypatch.setattr(two_phase, "_native", native)
    torch.manual_seed(0)
    cfg = small(residual, n_blocks)
    fast, ref = fast_and_reference(cfg, fused=False)
    x, target = tokens(cfg), tokens(cfg, seed=1)
    kept_outs = []
    gather = two_phase._gather

    def spy(bufs, slot, first):
        kept_outs.extend(q for q, k in bufs.pending.items() if k.out is not None)
        return gather(bufs, slot, first)

    monkeypatch.setattr(two_phase, "_gather", spy)
    for model in (fast, ref):
        F.cross_entropy(model(x).flatten(0, 1), target.flatten()).backward()
    assert kept_outs  # the deferred path ran
    for (name, p), q in zip(fast.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("gather", [True, False], ids=["gather", "scatter"])
@pytest.mark.parametrize("layer", [0, 1, 5, None], ids=["layer0", "layer1", "layer5", "logits"])
@PATHS
def test_full_attnres_gathers_the_slots_gradients_from_an_inner_sublayer(layer, gather, path, path_calls):
    """Full AttnRes's slots gather their readers' gradients in their own backward (Buffers.gather): with a loss on
    sublayer ``layer``'s input, only the queries up to it keep a gradient, the later slots get none, and the
    embedding's slot (0) gathers last. Against the reference, fp64 (eager) or fp32 (native); and the readers
    scattering them (``AttnRes.gather = False``, what Block AttnRes does) against the same reference."""
    fused, _, native_calls = path_calls
    fp32, fp64 = (torch.float32, {"rtol": 1e-4, "atol": 1e-5}), (torch.float64, {"rtol": 1e-10, "atol": 1e-12})
    dtype, tol = fp32 if path == "native" else fp64
    torch.manual_seed(0)
    cfg = small("full")
    fast, ref = fast_and_reference(cfg, fused, dtype=dtype)
    fast.depth.gather = gather
    x = tokens(cfg)
    probe = torch.randn(3, cfg.seq_len, cfg.d_model, dtype=dtype)
    for model in (fast, ref):
        inputs, _ = capture(model, x)
        loss = model(x).square().mean() if layer is None else (inputs[layer] * probe).sum()
        loss.backward()
    assert ("deposit_backward" in native_calls) == (path == "native" and gather)
    assert ("slot_backward" in native_calls) == (path == "native" and not gather)
    for (name, p), q in zip(fast.named_parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, **tol, msg=name)


def plan_cost(firsts: tuple[int, ...], queries: int, groups: list[tuple[int, ...]]) -> int:
    """The (N, D) tensors the slots' backward reads and writes with slots grouped as ``groups`` (each a run of slots,
    its top first): a slot reads its rows, each reader it gathers and writes its gradient; a group's top also reads
    each lower slot's rows and writes its partial sum of the top's readers, which that slot reads in place of them."""
    readers = [queries - f for f in firsts]
    cost = 0
    for top, *lower in groups:
        cost += 2 + readers[top] + sum(2 + 1 + 2 + readers[i] - readers[top] for i in lower)
    return cost


def partitions(slots: int) -> list[list[tuple[int, ...]]]:
    """Every way to cut slots 0..slots-1 into runs, each run listed top first."""
    found = []
    for cuts in range(2 ** (slots - 1)):
        groups, run = [], [0]
        for slot in range(1, slots):
            if cuts >> (slot - 1) & 1:
                groups.append(tuple(reversed(run)))
                run = []
            run.append(slot)
        found.append([*groups, tuple(reversed(run))])
    return found


@pytest.mark.parametrize(
    "firsts,queries",
    [
        ((0, 2, 4, 6, 8, 10, 12, 14, 16), 17),  # Block N = 8, 16 sublayers
        (tuple(range(9)), 9),  # Full AttnRes, 8 sublayers
        ((0, 4, 8, 12, 16), 17),  # Block N = 4, 16 sublayers
        ((0, 3, 6, 8), 9),  # blocks of 3, 3, 2
        ((0, 1), 2),  # one sublayer
    ],
)
def test_the_gather_plan_reads_the_fewest_tensors(firsts, queries):
    """two_phase.gather_plan against every partition of the slots into runs: none reads and writes fewer (N, D)
    tensors, and of the partitions that tie, it holds no more partial sums."""
    plan = two_phase.gather_plan(firsts, queries)
    groups = [
        (top, *plan.get(top, ()))
        for top in range(len(firsts))
        if top in plan or not any(top in lower for lower in plan.values())
    ]
    assert sorted(slot for group in groups for slot in group) == list(range(len(firsts)))  # each slot once
    for top, *lower in groups:
        assert lower == list(range(top - 1, top - 1 - len(lower), -1))  # a run below its top, in backward order
    best = min(plan_cost(firsts, queries, p) for p in partitions(len(firsts)))
    assert plan_cost(firsts, queries, groups) == best
    held = min(sum(len(g) - 1 for g in p) for p in partitions(len(firsts)) if plan_cost(firsts, queries, p) == best)
    assert sum(len(lower) for lower in plan.values()) == held


def test_the_gather_plan_saves_what_its_docstring_says():
    singles = lambda firsts, q: plan_cost(firsts, q, [(slot,) for slot in range(len(firsts))])  # noqa: E731

    def grouped(firsts, q):
        plan = two_phase.gather_plan(firsts, q)
        lower = {slot for run in plan.values() for slot in run}
        return plan_cost(firsts, q, [(t, *plan.get(t, ())) for t in range(len(firsts)) if t not in lower])

    block8 = (0, 2, 4, 6, 8, 10, 12, 14, 16)
    assert (singles(block8, 17), grouped(block8, 17)) == (99, 71)
    assert (singles(tuple(range(17)), 17), grouped(tuple(range(17)), 17)) == (187, 122)
    assert (singles(tuple(range(49)), 49), grouped(tuple(range(49)), 49)) == (1323, 500)


@pytest.fixture
def ahead_calls(monkeypatch) -> list[int]:
    """How many lower slots each native ``deposit_backward`` call formed partial sums for, filled as the test runs."""
    calls: list[int] = []
    real = cpu_kernels.ops()

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def deposit_backward(self, *args):
            calls.append(len(args[12]))  # ahead_x
            return real.deposit_backward(*args)

    monkeypatch.setattr(cpu_kernels, "ops", lambda: Spy())
    return calls


@needs_native
@pytest.mark.parametrize(
    "cfg",
    [
        small("full"),
        small("block", 8, n_layer=8),  # Block N = 8 of 16 sublayers: merges too
        small("block", 4, n_layer=8),
        small("full", d_model=40),  # 40 columns: 8 after the last whole 16, summed apart (cpu.cpp's combine)
        small("block", 8, n_layer=8, d_model=40),
    ],
    ids=["full", "block8", "block4", "full-d40", "block8-d40"],
)
def test_grouped_slots_give_the_same_gradients_to_the_bit(cfg, ahead_calls):
    """Natively, a group's top slot forms its lower slots' share of their common readers (two_phase.gather_plan), and
    each lower slot adds it first, where those readers came first in the one sum it replaces: every gradient is the
    same bits as each slot gathering all of its readers (``AttnRes.group = False``)."""
    grads = {}
    for group in (True, False):
        torch.manual_seed(0)
        model = randomize_depth(AttnResLM(cfg))
        model.depth.group = group
        x, target = tokens(cfg), tokens(cfg, seed=1)
        F.cross_entropy(model(x).flatten(0, 1), target.flatten()).backward()
        grads[group] = [p.grad for p in model.parameters()]
        assert any(ahead_calls) == group  # grouped: some calls formed partial sums; ungrouped: none
        ahead_calls.clear()
    for (name, _), a, b in zip(model.named_parameters(), grads[True], grads[False], strict=True):
        assert torch.equal(a, b), name


@needs_native
def test_a_slot_that_runs_in_torch_ops_adds_its_partial_sum(monkeypatch, ahead_calls):
    """Should a grouped slot's backward run in torch ops (``_gather``) after its group's top ran natively, it starts
    from the partial sum the top formed and gathers only the readers below the top's: against the reference."""
    real = two_phase._native

    def native(bufs, *tensors):  # slot 0's backward (its values row, (B, T, D)) in torch ops, all else as before
        slot0 = len(tensors) == 1 and tensors[0].dim() == 3 and tensors[0].data_ptr() == bufs.values.data_ptr()
        return real(bufs, *tensors) and not slot0

    monkeypatch.setattr(two_phase, "_native", native)
    consumed = []
    gather = two_phase._gather

    def spy(bufs, slot, first):
        consumed.append(slot in bufs.partials)
        return gather(bufs, slot, first)

    monkeypatch.setattr(two_phase, "_gather", spy)
    torch.manual_seed(0)
    cfg = small("block", 8, n_layer=8)
    fast, ref = fast_and_reference(cfg, fused=False)
    x, target = tokens(cfg), tokens(cfg, seed=1)
    for model in (fast, ref):
        F.cross_entropy(model(x).flatten(0, 1), target.flatten()).backward()
    assert consumed == [True] and any(ahead_calls)  # slot 0 alone took the torch ops, with its group's partial
    for (name, p), q in zip(fast.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("residual,n_blocks", [("full", 1), ("block", 2)])
def test_the_first_block_reads_the_embedding_itself(residual, n_blocks):
    """The first block's only source is the embedding (every depth weight is 1), so its sublayers read the
    embedding's own memory, not copies of it, as the baseline's first sublayer does."""
    cfg = small(residual, n_blocks)
    model = randomize_depth(AttnResLM(cfg))
    embedded = []
    hook = model.embed.register_forward_hook(lambda module, args, out: embedded.append(out))
    inputs, _ = capture(model, tokens(cfg))
    hook.remove()
    assert inputs[0].untyped_storage().data_ptr() == embedded[0].untyped_storage().data_ptr()
    torch.testing.assert_close(inputs[0], embedded[0], rtol=0, atol=0)


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=compiles_for_cpu)], ids=["eager", "fused"])
def test_depth_softmax_runs_in_fp32_under_bf16_autocast(fused, kernel_calls):
    torch.manual_seed(0)
    cfg = small("block", 3)
    model = randomize_depth(AttnResLM(cfg))
    model.depth.fused = fused
    rec = Recorder()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens(cfg), recorder=rec)
        logits.float().mean().backward()
    assert torch.isfinite(model.depth.pseudo_query.grad).all()
    assert len(kernel_calls) == (4 if fused else 0)
    for weights in rec.depth_weights.values():
        assert weights.dtype == torch.float32
        assert abs(weights.sum().item() - 1) < 1e-5


def test_the_traced_depth_softmax_runs_in_fp32_under_bf16_autocast():
    """Under bf16 autocast the traced depth attention's logits, softmax and sums stay fp32, as the two-phase one's:
    the same depth weights (here to 1e-7; with the source logits in bf16 they differ by 6e-3) and the same logits up
    to the bf16 sublayers' rounding."""
    torch.manual_seed(0)
    cfg = small("block", 3)
    two_phase_model = randomize_depth(AttnResLM(cfg))
    traced_model = AttnResLM(cfg)
    traced_model.load_state_dict(two_phase_model.state_dict())
    traced(traced_model)
    recs, outs = [Recorder(), Recorder()], []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for model, rec in zip((two_phase_model, traced_model), recs):
            outs.append(model(tokens(cfg), recorder=rec).float())
    for query, weights in recs[0].depth_weights.items():
        torch.testing.assert_close(recs[1].depth_weights[query], weights, rtol=0, atol=1e-4, msg=str(query))
    torch.testing.assert_close(outs[1], outs[0], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kind", ["two-phase", "traced", "reference"])
def test_a_blocks_bf16_outputs_are_summed_in_the_residual_streams_precision(kind):
    """Under bf16 autocast the baseline's stream is fp32 (fp32 embedding + bf16 outputs); a block's partial sum must
    be too. Outputs 256, 1, 1, 1 (each exact in bf16): summed in bf16 every +1 rounds away (256 + 1 is a tie, to
    256), in fp32 the block is 259. Zero pseudo-queries: the final aggregation is the mean of the embedding (0) and
    the block, exactly 129.5."""
    from attnres.mixers import AttnRes, ReferenceAttnRes

    cfg = ModelConfig(n_layer=2, d_model=8, n_head=2, residual="block", n_blocks=1)
    depth = {"two-phase": AttnRes, "traced": TracedAttnRes, "reference": ReferenceAttnRes}[kind](cfg)
    state = depth.start(torch.zeros(1, 2, 8))
    for layer, value in enumerate([256.0, 1.0, 1.0, 1.0]):
        depth.read(state, layer)
        depth.write(state, layer, torch.full((1, 2, 8), value, dtype=torch.bfloat16))
    h = depth.finish(state)
    assert h.dtype == torch.float32 and torch.equal(h, torch.full_like(h, 129.5))


@pytest.mark.gpu  # deselected by default (pyproject: -m 'not gpu'); `pytest -m gpu` where a CUDA GPU is visible
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("residual,n_blocks", [("full", 1), ("block", 3)])
@pytest.mark.parametrize("path", ["eager", "fused", "traced", "whole"])
def test_two_phase_matches_the_reference_on_cuda(residual, n_blocks, path, kernel_calls, device="cuda"):
    """The GPU path: the compiled kernels through Triton ("fused"), and the traced depth attention eager and with the
    whole model compiled ("whole", as runtime.compile trains on CPU), in fp32 (to rounding) and under bf16 autocast
    (what training uses there: its error from the fp32 reference must be no larger than the direct formula's own).
    CI has no GPU; run where one is lent (docs/performance.md)."""
    torch.manual_seed(0)
    cfg = small(residual, n_blocks)
    fused = path == "fused"
    fast, ref = (m.to(device) for m in fast_and_reference(cfg, fused))
    if path in ("traced", "whole"):
        traced(fast)
    if path == "whole":
        fast.compile(fullgraph=True)
    x, target = tokens(cfg).to(device), tokens(cfg, seed=1).to(device)

    def run(model: AttnResLM, bf16: bool) -> list[torch.Tensor]:
        """The logits and every parameter's gradient, in fp32."""
        model.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
            F.cross_entropy(logits.flatten(0, 1).float(), target.flatten()).backward()
        return [logits.float(), *(p.grad.float() for p in model.parameters())]

    names = ["logits", *(n for n, _ in fast.named_parameters())]
    exact = run(ref, bf16=False)
    for name, a, b in zip(names, run(fast, bf16=False), exact):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    error = lambda got: [((g - e).norm() / e.norm()).item() for g, e in zip(got, exact)]  # noqa: E731
    for name, fast_error, ref_error in zip(names, error(run(fast, bf16=True)), error(run(ref, bf16=True))):
        assert fast_error <= 2 * ref_error + 1e-3, (name, fast_error, ref_error)
    assert bool(kernel_calls) == fused


# -------------------------------------------------------------------------------------------- diagnostics


@pytest.mark.parametrize("residual,n_blocks", VARIANTS)
def test_recorder_collects_diagnostics(residual, n_blocks):
    cfg = small(residual, n_blocks)
    model = randomize_depth(AttnResLM(cfg))
    x = tokens(cfg)
    rec = Recorder()
    with torch.no_grad():
        logits = model(x, recorder=rec)
        plain = model(x)
    torch.testing.assert_close(logits, plain, rtol=0, atol=0)  # recording does not change the result
    assert sorted(rec.input_rms) == sorted(rec.output_rms) == list(range(cfg.n_sublayers))
    assert rec.final_rms > 0
    if residual == "baseline":
        assert rec.depth_weights == {}
        return
    assert sorted(rec.depth_weights) == list(range(cfg.n_sublayers + 1))
    for query, weights in rec.depth_weights.items():
        assert len(weights) == depth_sources(cfg)[query] == len(rec.source_kinds[query])
        assert abs(weights.sum().item() - 1) < 1e-5
        assert rec.source_kinds[query][0] == "embedding"


# ------------------------------------------------------------------------------------ parameters and FLOPs


@pytest.mark.parametrize(
    "cfg",
    [
        small("baseline"),
        small("full"),
        small("block", 3),
        small("block", 3, tie_embeddings=True),
        small("full", key_norm_gain=False),
        small("block", 2, d_ff=100, n_layer=3, d_model=48, n_head=3),
    ],
    ids=str,
)
def test_parameter_counts_match_the_built_model(cfg):
    model = AttnResLM(cfg)
    counts = count_params(cfg)
    assert counts.total == sum(p.numel() for p in model.parameters())
    embedding_like = {id(model.embed.weight), id(model.lm_head.weight)}
    non_embedding = sum(p.numel() for p in model.parameters() if id(p) not in embedding_like)
    assert counts.non_embedding == non_embedding
    assert counts.total == counts.non_embedding + counts.embedding + counts.lm_head


FLOP_CONFIGS = [(2, 64, 4, 32, 256), (4, 128, 4, 128, 256), (3, 96, 2, 64, 512)]


@pytest.mark.parametrize("residual,n_blocks", [("baseline", 4), ("full", 4), ("block", 2), ("block", 3)])
@pytest.mark.parametrize("n_layer,d_model,n_head,seq_len,vocab", FLOP_CONFIGS)
def test_flop_counter_matches_torch_flop_counter(residual, n_blocks, n_layer, d_model, n_head, seq_len, vocab):
    """Within 2 % of FlopCounterMode, forward and training. On CPU the fused SDPA kernel has no FLOP
    formula registered with FlopCounterMode, so attention runs through the math backend here, which
    FlopCounterMode counts as its two batched matmuls over the full T x T; the native attention of
    attnres.kernels.attention (head_dim 32 and 64 here) registers the same count."""
    cfg = ModelConfig(
        n_layer=n_layer,
        d_model=d_model,
        n_head=n_head,
        seq_len=seq_len,
        vocab_size=vocab,
        residual=residual,
        n_blocks=n_blocks,
    )
    model = AttnResLM(cfg)
    x = torch.randint(0, vocab, (2, seq_len))
    n_tokens = x.numel()
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as forward:
        model(x)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as training:
        model(x).sum().backward()
    ours = count_flops(cfg)
    assert ours.forward == pytest.approx(forward.get_total_flops() / n_tokens, rel=0.02)
    assert ours.training == pytest.approx(training.get_total_flops() / n_tokens, rel=0.02)


def test_depth_attention_is_counted():
    assert count_flops(small("baseline")).depth_attention == 0
    full, block = count_flops(small("full")), count_flops(small("block", 2))
    assert full.depth_attention > block.depth_attention > 0
    # Full: sublayer l reads l + 1 sources, the final aggregation L + 1
    assert depth_sources(small("full")) == list(range(1, 9)) + [9]


# ---------------------------------------------------------------------------------------- config validation


@pytest.mark.parametrize(
    "kwargs,fragments",
    [
        (dict(residual="resnet"), ["residual", "baseline, full, block"]),
        (dict(residual="block", n_blocks=0), ["n_blocks", "1 <= n_blocks <= 2 * n_layer = 8"]),
        (dict(residual="block", n_blocks=9), ["n_blocks", "1 <= n_blocks <= 2 * n_layer = 8"]),
        (dict(d_model=30, n_head=4), ["d_model=30", "n_head", "divisible"]),
        (dict(n_layer=0), ["n_layer", "positive"]),
        (dict(d_model=-8), ["d_model", "positive"]),
        (dict(seq_len=0), ["seq_len", "positive"]),
        (dict(vocab_size=0), ["vocab_size", "positive"]),
        (dict(n_head=0), ["n_head", "positive"]),
        # a setting the residual does not read is refused, not silently ignored (the default passes)
        (dict(residual="baseline", n_blocks=9), ["n_blocks=9 applies to residual block only", "residual='baseline'"]),
        (dict(residual="full", n_blocks=-7), ["n_blocks=-7 applies to residual block only"]),
        (dict(residual="block", hc_streams=2), ["hc_streams=2 applies to residual hc / mhc only"]),
        (dict(residual="hc", key_norm_gain=False), ["key_norm_gain=False applies to residual full / block only"]),
        (dict(residual="baseline", depth_heads=2), ["depth_heads=2 only apply to AttnRes"]),
    ],
)
def test_invalid_configs_are_rejected_with_a_clear_message(kwargs, fragments):
    base = dict(n_layer=4, d_model=32, n_head=2)
    base.update(kwargs)
    with pytest.raises(ConfigError) as err:
        ModelConfig(**base)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_settings_a_residual_does_not_read_may_stay_at_their_defaults():
    for residual in ("baseline", "full", "denseformer", "hc"):
        assert ModelConfig(n_layer=2, residual=residual, n_blocks=4).n_blocks == 4  # the default: nothing set


def test_torch_free_modules_do_not_import_torch():
    code = "import sys, attnres.config, attnres.costs, attnres.storage.schema; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_fused_kernels_fall_back_to_eager_with_one_warning(monkeypatch):
    """No C++ compiler / Triton: the first failing compile is reported once and the math still runs."""

    def cannot_compile(fn, **kwargs):
        def run(*args):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore detail")

        return run

    monkeypatch.setattr(torch, "compile", cannot_compile)
    monkeypatch.setattr(fused_kernels, "_failure", None)
    kernel = fused_kernels._compiled_or_eager(fused_kernels.merge_forward)
    out, p, lse, u = torch.randn(5, 4), torch.randn(5, 4), torch.randn(5), torch.randn(4)
    with pytest.warns(RuntimeWarning, match="InvalidCxxCompiler: No working C.. compiler found\\);") as caught:
        h, keep, _, _ = kernel(out, p, u, lse, 1e-6)
        kernel(out, p, u, lse, 1e-6)
    assert len(caught) == 1 and "runtime.compile" in str(caught[0].message)
    assert not fused_kernels.available()  # the autograd functions now take their hand-written eager path
    torch.testing.assert_close(h, torch.lerp(p, out, keep.unsqueeze(-1)))


def test_native_kernel_falls_back_to_eager_with_one_warning(monkeypatch):
    """No compiler or no ninja: the build failure is reported once and the depth attention runs in torch ops."""
    from torch.utils import cpp_extension

    def cannot_build(**kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions\nmore detail")

    monkeypatch.setattr(cpp_extension, "load", cannot_build)
    monkeypatch.setattr(cpu_kernels, "ops", functools.cache(cpu_kernels.ops.__wrapped__))  # a fresh, failing build
    monkeypatch.setattr(cpu_kernels, "enabled", True)
    cfg = small("block", 3)
    model = randomize_depth(AttnResLM(cfg))
    with pytest.warns(RuntimeWarning, match="Ninja is required to load C.. extensions\\);") as caught:
        model(tokens(cfg)).mean().backward()
    assert len(caught) == 1 and "ATTNRES_NATIVE=0" in str(caught[0].message)
    assert not cpu_kernels.usable(torch.zeros(1))
    assert torch.isfinite(model.depth.pseudo_query.grad).all()


LOAD_NATIVE = [
    sys.executable,
    "-c",
    "import sys; from attnres.kernels import cpu as cpu_kernels; sys.exit(cpu_kernels.ops() is None)",
]


@needs_cxx
def test_a_build_killed_part_way_does_not_stop_later_processes():
    """torch's builder leaves its lock file behind when it is killed mid-build, then waits on it forever in every
    later process (a SLURM job pre-empted during its first build would hang every job after it)."""
    assert cpu_kernels.ops() is not None  # built (or loaded) in this session's cache
    stale = cpu_kernels.build_dir() / "lock"
    stale.touch()
    loaded = subprocess.run(LOAD_NATIVE, timeout=120, capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert not stale.exists()


@needs_cxx
def test_a_process_waits_for_a_build_in_progress_and_says_so():
    import os

    from attnres.storage import locks

    assert cpu_kernels.ops() is not None
    with locks.exclusive(cpu_kernels.build_dir() / cpu_kernels.BUILD_LOCK_FILE) as ours:
        assert ours  # this test process stands for a builder
        loader = subprocess.Popen(LOAD_NATIVE, stderr=subprocess.PIPE, text=True)
        try:
            said = loader.stderr.readline()  # blocks until it says something or ends
            assert f"waiting for pid {os.getpid()} on " in said, said
            assert loader.poll() is None  # still waiting while the lock is held
        except BaseException:
            loader.kill()
            raise
    _, err = loader.communicate(timeout=300)
    assert loader.returncode == 0, err


@pytest.mark.parametrize(
    "overrides, builds",
    [
        ([], True),  # Block AttnRes on this (CPU-only) machine
        (["model.residual=baseline"], True),  # no depth attention, but RMSNorm's backward
        (["model.residual=full", "runtime.accelerator=gpu"], False),  # the GPU takes torch's and compiled kernels
    ],
)
def test_a_launcher_builds_the_native_kernels_only_for_runs_that_use_them(monkeypatch, overrides, builds):
    from attnres.config import resolve_run_config

    calls = []
    monkeypatch.setattr(cpu_kernels, "ops", lambda: calls.append(1))
    monkeypatch.setattr(cpu_kernels, "enabled", True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu_kernels.build_for([resolve_run_config(None, overrides)])
    assert calls == ([1] if builds else [])


def test_the_kernel_build_is_keyed_on_its_source_and_flags(monkeypatch, tmp_path):
    """A changed source (either of them) or flag gives a new build folder (so a build happens exactly when its folder
    has no module, and is announced); an unchanged one the same folder, whichever ninja is on PATH."""
    sources = []
    for path in cpu_kernels.SOURCES:
        sources.append(tmp_path / path.name)
        sources[-1].write_bytes(path.read_bytes())
    monkeypatch.setattr(cpu_kernels, "SOURCES", tuple(sources))
    keys = [cpu_kernels.build_key()]
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert cpu_kernels.build_key() == keys[0]
    for source in sources:
        source.write_bytes(source.read_bytes() + b"\n// a change\n")
        keys.append(cpu_kernels.build_key())
    assert len(set(keys)) == len(sources) + 1, keys


def test_the_kernels_build_with_this_environments_ninja(monkeypatch, tmp_path):
    """Another ninja first on PATH (the system's, when the venv is not activated) is not the one torch runs: two
    ninja versions read each other's build log as stale and rebuilt the kernels silently at every switch."""
    import shutil

    import ninja

    other = tmp_path / "ninja"
    other.write_text("#!/bin/sh\necho 1.11.0\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("ninja") == str(other)
    cpu_kernels._use_package_ninja(tmp_path / "build")
    found = Path(shutil.which("ninja"))
    real = Path(ninja.BIN_DIR) / "ninja"
    assert found == real or str(real) in found.read_text()  # on Linux, through attnres.kernels.ninja_guard
    version = [subprocess.run([p, "--version"], capture_output=True, text=True).stdout for p in (found, real)]
    assert version[0] == version[1] and version[0].strip(), version


def test_rotary_is_the_rotate_half_formula_to_the_bit():
    """attnres.model.Rotary folds rotate_half's sign into its sin table; the products are the same bits, at any
    start position (decoding) and for queries and keys rotated in one call."""
    from attnres.model import Rotary

    head_dim, seq_len, base = 16, 32, 10_000.0
    rotary = Rotary(head_dim, seq_len, base)
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().float(), angles.sin().float()
    qk = torch.randn(2, 3, 4, 8, head_dim, generator=torch.Generator().manual_seed(0))  # (q/k, B, H, T, hd)
    for start in (0, 5):
        x1, x2 = qk.chunk(2, dim=-1)
        c, s = cos[start : start + 8], sin[start : start + 8]
        expected = qk * c + torch.cat([-x2, x1], dim=-1) * s
        assert torch.equal(rotary(qk, start), expected)
        assert torch.equal(rotary(qk[1], start), expected[1])


def test_rms_norm_keeps_torchs_forward_and_differentiates_it():
    """attnres.kernels.rms_norm: torch's forward bits; the native backward's gradients against fp64 autograd."""
    from attnres.kernels import rms_norm as norm_module

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 48, generator=gen, requires_grad=True)
    w = (torch.rand(48, generator=gen) + 0.5).requires_grad_()
    g = torch.randn(4, 16, 48, generator=gen)
    y = norm_module.rms_norm(x, w, 1e-6)
    assert torch.equal(y, F.rms_norm(x.detach(), (48,), w.detach(), 1e-6))
    y.backward(g)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    F.rms_norm(x64, (48,), w64, 1e-6).backward(g.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-5, atol=1e-5)


@needs_native
def test_rms_norm_runs_natively_only_where_a_gradient_is_wanted_on_cpu_fp32(monkeypatch, native_calls):
    from attnres.kernels import rms_norm as norm_module

    monkeypatch.setattr(cpu_kernels, "enabled", True)
    x, w = torch.randn(2, 4, 8, requires_grad=True), torch.ones(8, requires_grad=True)
    with torch.no_grad():
        norm_module.rms_norm(x, w, 1e-6)
    norm_module.rms_norm(x.detach(), w.detach(), 1e-6).sum()  # nothing to differentiate
    with torch.autocast("cpu", dtype=torch.bfloat16):
        norm_module.rms_norm(x, w, 1e-6).float().sum().backward()
    norm_module.rms_norm(x.double(), w.double(), 1e-6).sum().backward()
    assert native_calls == []
    norm_module.rms_norm(x, w, 1e-6).sum().backward()
    assert native_calls == ["rms_norm_backward"]
