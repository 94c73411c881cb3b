"""The memory estimate (attnres.training.memory) against the allocator's measured peak of real training steps."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from attnres.config import ConfigError, ModelConfig, RunConfig, RuntimeConfig, TrainConfig
from attnres.model import AttnResLM
from attnres.training import memory
from attnres.training.module import lm_loss
from attnres.training.optimizer import build_optimizer
from tests.attnres.test_ablations import ABLATIONS

VARIANTS = [dict(residual="baseline"), dict(residual="full"), dict(residual="block", n_blocks=2), *ABLATIONS]
SIZES = [  # (n_layer, d_model, seq_len, batch, micro-batch)
    (2, 32, 64, 4, None),
    (3, 48, 96, 4, 2),
    (4, 64, 128, 2, None),
]


def run_of(kw: dict, size: tuple, checkpointing: str) -> RunConfig:
    n_layer, d_model, seq_len, batch, micro = size
    model = ModelConfig(vocab_size=256, n_layer=n_layer, d_model=d_model, n_head=2, seq_len=seq_len, **kw)
    train = TrainConfig(batch_size=batch, micro_batch_size=micro)
    return RunConfig(model=model, train=train, runtime=RuntimeConfig(checkpointing=checkpointing))


def measured_peak(cfg: RunConfig) -> int:
    """Bytes at the peak of a real CPU training step (the second: AdamW's state exists), by the profiler's record of
    every allocation and free, plus what is resident before it: parameters, buffers and optimizer state."""
    torch.manual_seed(0)
    model = AttnResLM(cfg.model)
    model.checkpointing = cfg.runtime.checkpointing == "sublayer"
    opt = build_optimizer(model, cfg.train)
    micro = cfg.train.micro_batch_size or cfg.train.batch_size
    batches = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size // micro, micro, cfg.model.seq_len + 1))

    def step() -> None:
        for batch in batches:
            (lm_loss(model, batch) / len(batches)).backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    resident = [*model.parameters(), *model.buffers(), *(v for s in opt.state.values() for v in s.values())]
    before = sum(t.numel() * t.element_size() for t in resident if t.dim() > 0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    live = peak = 0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return before + peak


CORE = VARIANTS[:3]
EVERY_CASE = [(kw, size, ck) for kw in VARIANTS for size in SIZES for ck in ("none", "sublayer")]
# the default tier: baseline, Full and Block at the size that accumulates gradients, with and without checkpointing;
# the integration tier adds the other sizes and every ablation at that size; the whole matrix (84 cases) is slow
DEFAULT_CASES = [c for c in EVERY_CASE if c[0] in CORE and c[1] == SIZES[1]]
WIDER_CASES = [c for c in EVERY_CASE if c[0] in CORE or (c[1] == SIZES[1] and c[2] == "none")]


def worst_error(cases: list) -> tuple[str, float]:
    errors = {}
    for kw, size, checkpointing in cases:
        cfg = run_of(kw, size, checkpointing)
        name = f"{cfg.model.variant} L{size[0]}-d{size[1]} checkpointing {checkpointing}"
        errors[name] = memory.estimate(cfg, gpu=False).peak / measured_peak(cfg) - 1
    assert len(errors) == len(cases)
    worst = max(errors, key=lambda k: abs(errors[k]))
    return worst, errors[worst]


def test_estimate_is_within_20_percent_of_the_measured_peak():
    """The main variants under gradient accumulation, with and without checkpointing."""
    assert len(DEFAULT_CASES) == 3 * 2
    worst, error = worst_error(DEFAULT_CASES)
    assert abs(error) < 0.20, f"{worst}: {error:+.1%}"


@pytest.mark.integration  # 25 measured peaks (about 45 s): pytest -m integration
def test_estimate_is_within_20_percent_at_three_sizes_and_for_every_ablation():
    """Three sizes (one with gradient accumulation) x checkpointing for the main variants, every ablation at one."""
    assert len(WIDER_CASES) == 3 * 3 * 2 + len(ABLATIONS)
    worst, error = worst_error(WIDER_CASES)
    assert abs(error) < 0.20, f"{worst}: {error:+.1%}"


@pytest.mark.slow
def test_estimate_is_within_20_percent_for_every_variant_size_and_checkpointing():
    worst, error = worst_error(EVERY_CASE)
    assert abs(error) < 0.20, f"{worst}: {error:+.1%}"


def test_a_run_that_will_not_fit_is_refused_before_compute():
    from attnres.training.run import prepare

    cfg = run_of({"residual": "block", "n_blocks": 2}, SIZES[0], "none")
    small = replace(cfg, runtime=replace(cfg.runtime, device_memory_gb=1e-5))
    with pytest.raises(ConfigError, match=r"needs ~.* MiB per device .* even micro-batch 1"):
        prepare(small)
    with pytest.raises(ConfigError, match="device_memory_gb must be positive"):
        RuntimeConfig(device_memory_gb=0)


def test_data_parallel_arithmetic_on_one_replica():
    """DDP adds a copy of the gradients (its buckets); FSDP divides the states over the devices."""
    cfg = replace(run_of({"residual": "full"}, SIZES[2], "none"), train=TrainConfig(batch_size=8))
    one, ddp = memory.estimate(cfg, gpu=False, devices=1), memory.estimate(cfg, gpu=False, devices=4)
    assert one.rows == 8 and ddp.rows == 2
    per_row = (one.activations - memory.estimate(replace(cfg, train=TrainConfig(batch_size=4)), False).activations) / 4
    assert ddp.peak == pytest.approx(one.peak - 6 * per_row + one.grads, rel=0.02)
    fsdp = replace(cfg, runtime=replace(cfg.runtime, strategy="fsdp", devices=4, accelerator="gpu"))
    sharded = memory.estimate(fsdp, gpu=False, devices=4)
    assert sharded.weights == -(-one.weights // 4) and sharded.peak < ddp.peak


def test_fsdp_counts_its_gathered_units_in_the_gather_dtype():
    """FSDP's peak: the replica's, less its states, plus their shards, the root unit gathered in fp32, two sublayer
    units gathered in bf16 under runtime.fsdp_mixed_precision in a bf16 run (else fp32) and one unit's unsharded
    gradient; with micro-batches, every parameter's unsharded fp32 gradient too (accumulated between them). The
    unit sizes are those of the real model's FSDP units (attnres.training.parallel.shard_model)."""
    model = ModelConfig(vocab_size=256, n_layer=3, d_model=48, n_head=2, seq_len=64, residual="block", n_blocks=2)
    real = AttnResLM(model)
    sublayers = [sum(p.numel() for p in s.parameters()) for s in real.sublayers]
    root = sum(p.numel() for p in real.parameters()) - sum(sublayers)
    assert memory.fsdp_unit_params(model) == (root, max(sublayers))
    largest = max(sublayers)

    def run(precision: str, mixed: bool, micro: int | None = None) -> RunConfig:
        runtime = RuntimeConfig(strategy="fsdp", devices=2, precision=precision, fsdp_mixed_precision=mixed)
        return RunConfig(model=model, train=TrainConfig(batch_size=8, micro_batch_size=micro), runtime=runtime)

    def replica(cfg: RunConfig) -> tuple[memory.MemoryEstimate, int]:
        """One replica at the same rows per device, and its peak (DDP's estimate, less its gradient buckets)."""
        ddp = memory.estimate(replace(cfg, runtime=replace(cfg.runtime, strategy="ddp")), gpu=True, devices=2)
        return ddp, ddp.peak - ddp.grads

    one, one_peak = replica(run("bf16-mixed", True))
    bf16 = memory.estimate(run("bf16-mixed", True), gpu=True, devices=2)
    states = one.weights + one.grads + one.optimizer
    shards = sum(-(-x // 2) for x in (one.weights, one.grads, one.optimizer))
    gathered = 4 * root + 2 * 2 * largest + (2 + 4) * largest
    assert bf16.peak == one_peak - states + shards + gathered
    fp32_gathers = memory.estimate(run("bf16-mixed", False), gpu=True, devices=2)
    assert fp32_gathers.peak - bf16.peak == (2 * 4 * largest + 4 * largest) - (2 * 2 * largest + 6 * largest)
    # fp32 training gathers fp32 whatever the setting
    assert memory.estimate(run("32-true", True), True, 2).peak == memory.estimate(run("32-true", False), True, 2).peak
    # two micro-batches per device: FSDP2 holds every parameter's fp32 gradient unsharded between them
    one_micro, one_micro_peak = replica(run("bf16-mixed", True, 2))
    accumulating = memory.estimate(run("bf16-mixed", True, 2), gpu=True, devices=2)
    expected = one_micro_peak - states + shards + gathered + one_micro.grads
    assert accumulating.peak == expected and one_micro.grads == 4 * sum(p.numel() for p in real.parameters())
