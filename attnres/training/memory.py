"""Peak memory per device of a training step, by simulating the step on fake tensors.

The estimate is not a formula: it runs the run's own model, loss, backward, gradient clipping and optimizer step under
``torch._subclasses.FakeTensorMode`` (shapes and dtypes, no storage, no arithmetic) and replays the allocator: every
storage an operation creates is live until Python frees it. So it holds exactly what training holds (each sublayer's
saved tensors, the depth mixer's buffers, the logits and their gradient, the optimizer's temporaries), at the run's
real sizes, in a second or two, on any machine, and follows the code when the code changes. On CPU it matches the
allocator's measured peak to within 1 % in most cases and 8 % at worst (an over-estimate, for Full AttnRes
accumulating gradients; not traced further); ``tests/attnres/test_memory.py`` holds it to 20 %, every variant, three
sizes, with and without checkpointing. What it cannot see, and docs/training.md says: on a GPU the CUDA context and
library workspaces (not counted by ``torch.cuda.max_memory_allocated`` either) and the caching allocator's
fragmentation, which :data:`HEADROOM` leaves room for; and ``runtime.compile``, which changes what is saved.

Where it differs from a real GPU run by construction: the step is simulated on CPU tensors (autocast to bf16 for
``bf16-mixed``, AdamW's multi-tensor ``foreach`` path as CUDA would pick), and the CPU's scaled-dot-product attention
saves what flash attention saves (queries, keys, values, output and log-sum-exp; nothing of size T^2). Data
parallelism is arithmetic on top of one replica: DDP adds its gradient buckets (a copy of the gradients); FSDP
divides the parameters, gradients and optimizer state by the number of devices and adds what FSDP2 holds unsharded
(:func:`fsdp_gathered_bytes`): the root unit's parameters in fp32 (gathered from the forward to the end of the
backward), two sublayer units' parameters in the gather dtype (the one computing and the one prefetched: bf16 under
``runtime.fsdp_mixed_precision`` in a bf16 run, else fp32) and one unit's unsharded gradient (in the gather dtype,
and under bf16 its fp32 copy for the reduce-scatter); with several micro-batches per step, also every parameter's
unsharded fp32 gradient, which FSDP2 accumulates between a step's micro-batches so that it reduce-scatters once per
step.
"""

from __future__ import annotations

import contextlib
import functools
import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attnres.config import ModelConfig, RunConfig
from attnres.costs import count_params, states_problem
from attnres.kernels import cpu as cpu_kernels
from attnres.kernels import rms_norm
from attnres.runtime import MEMORY_HEADROOM, available_memory_gib

GIB = 2**30
HEADROOM = MEMORY_HEADROOM  # a run fits when its estimated peak is at most this share of runtime.device_memory_gb


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device at the peak of a training step, and what they are."""

    weights: int  # parameters and buffers
    grads: int
    optimizer: int  # the optimizer's state: AdamW's two moments (Muon: one momentum per matrix)
    peak: int  # the whole peak: the three above plus activations and temporaries
    rows: int  # sequences per micro-batch
    checkpointing: str

    @property
    def activations(self) -> int:
        """What the peak holds beyond weights, gradients and optimizer state (saved tensors, logits, temporaries)."""
        return self.peak - self.weights - self.grads - self.optimizer

    @property
    def peak_gib(self) -> float:
        return self.peak / GIB

    @property
    def peak_text(self) -> str:
        """``44.1 GiB``, or ``9.3 MiB`` below one GiB."""
        return f"{self.peak_gib:.1f} GiB" if self.peak >= GIB else f"{self.peak / 2**20:.1f} MiB"


class _Allocator(TorchDispatchMode):
    """Live bytes of every storage the dispatched operations create, and their running peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._sizes: dict[int, int] = {}

    def hold(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key, size = id(storage), storage.nbytes()
        if size == 0 or key in self._sizes:
            return
        self._sizes[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's signature)
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.hold(t)
        return out


@contextlib.contextmanager
def _eager_depth_kernels() -> Iterator[None]:
    """The native CPU kernels cannot take fake tensors: the depth kernels' eager twins save the same tensors, and
    RMSNorm takes its native path with a backward in torch ops (it saves x, the weight and 1/rms; autograd of the
    composite norm would count one more (tokens, D) tensor per norm)."""
    was, cpu_kernels.enabled = cpu_kernels.enabled, False
    norm_was, rms_norm.simulating = rms_norm.simulating, True
    try:
        yield
    finally:
        cpu_kernels.enabled, rms_norm.simulating = was, norm_was


def _simulate(model_cfg: ModelConfig, cfg: RunConfig, rows: int, micro_steps: int, bf16: bool, gpu: bool) -> tuple:
    """(weights, grads, optimizer, peak) bytes of a steady training step (the optimizer's state exists: AdamW's two
    moments, or Muon's momentum and AdamW's moments of the rest) of ``micro_steps`` micro-batches of ``rows``
    sequences."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from attnres.model import AttnResLM
    from attnres.training.module import lm_loss
    from attnres.training.optimizer import build_optimizer

    with _eager_depth_kernels(), FakeTensorMode():
        model = AttnResLM(model_cfg)
        model.checkpointing = cfg.runtime.checkpointing == "sublayer"
        opt = build_optimizer(model, cfg.train, foreach=gpu)
        batch = torch.zeros(rows, model_cfg.seq_len + 1, dtype=torch.long)
        params = list(dict.fromkeys(model.parameters()))

        def step() -> None:
            for _ in range(micro_steps):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # as Lightning's bf16-mixed
                    loss = lm_loss(model, batch)
                (loss / micro_steps).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=gpu)
            opt.step()
            opt.zero_grad(set_to_none=True)

        for p in params:  # the optimizer's state, as the first step creates it (a real first step costs twice the time)
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        alloc = _Allocator()
        for t in [*params, *model.buffers()]:
            alloc.hold(t)
        weights = alloc.live
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    alloc.hold(value)
        optimizer = alloc.live - weights
        with alloc:
            step()
        grads = sum(p.numel() * p.element_size() for p in params)
        return weights, grads, optimizer, alloc.peak


@functools.lru_cache(maxsize=256)
def _cached(model_cfg: ModelConfig, cfg: RunConfig, rows: int, micro_steps: int, bf16: bool, gpu: bool) -> tuple:
    return _simulate(model_cfg, cfg, rows, micro_steps, bf16, gpu)


def _memory_key(cfg: RunConfig) -> RunConfig:
    """The run with everything that does not change memory set to defaults (so the simulations are shared)."""
    t = cfg.train
    train = replace(type(t)(), batch_size=t.batch_size, micro_batch_size=t.micro_batch_size, optimizer=t.optimizer)
    runtime = replace(type(cfg.runtime)(), checkpointing=cfg.runtime.checkpointing)
    return replace(type(cfg)(), train=train, runtime=runtime)


def estimate(cfg: RunConfig, gpu: bool, devices: int = 1) -> MemoryEstimate:
    """Peak bytes per device of one training step of ``cfg`` on ``devices`` devices (CPU or GPU)."""
    rows_per_device = max(1, cfg.train.batch_size // devices)
    rows = min(rows_per_device, cfg.train.micro_batch_size or rows_per_device)
    precision = cfg.runtime.precision
    bf16 = precision == "bf16-mixed" or (precision == "auto" and gpu)
    # two micro-batches hold what any number holds: the second runs with the first's gradients allocated
    micro_steps = min(2, math.ceil(rows_per_device / rows))
    weights, grads, optimizer, peak = _cached(cfg.model, _memory_key(cfg), rows, micro_steps, bf16, gpu)
    if devices > 1 and cfg.runtime.strategy == "fsdp":
        states = weights + grads + optimizer
        full_grads = grads  # fp32, every parameter's: what FSDP2 accumulates unsharded between micro-batches
        weights, grads, optimizer = (-(-x // devices) for x in (weights, grads, optimizer))
        peak = peak - states + weights + grads + optimizer + fsdp_gathered_bytes(cfg.model, fsdp_bf16_params(cfg, bf16))
        if micro_steps > 1:
            peak += full_grads
    elif devices > 1:
        peak += grads  # DDP's gradient buckets: a second copy of every gradient
    return MemoryEstimate(weights, grads, optimizer, peak, rows, cfg.runtime.checkpointing)


def fsdp_bf16_params(cfg: RunConfig, bf16: bool) -> bool:
    """Whether an FSDP run gathers its sublayers in bf16 (attnres.training.parallel.sublayer_policy)."""
    return bf16 and cfg.runtime.fsdp_mixed_precision


@functools.lru_cache(maxsize=256)
def fsdp_unit_params(model: ModelConfig) -> tuple[int, int]:
    """(parameters of FSDP's root unit, of its largest sublayer unit), counted on the model built on the meta device
    (no storage): the root holds what no attention / MLP sublayer holds (attnres.training.parallel.shard_model)."""
    from attnres.model import AttnResLM

    with torch.device("meta"):
        lm = AttnResLM(model)
    sublayers = [sum(p.numel() for p in sublayer.parameters()) for sublayer in lm.sublayers]
    return sum(p.numel() for p in lm.parameters()) - sum(sublayers), max(sublayers)


def fsdp_gathered_bytes(model: ModelConfig, bf16_params: bool) -> int:
    """Bytes FSDP2 holds unsharded at the peak of a step beside the shards: the root unit in fp32, two sublayer units
    in the gather dtype (2 bytes a parameter with ``bf16_params``, else 4), and one unit's unsharded gradient in the
    gather dtype (and, with ``bf16_params``, its fp32 copy for the reduce-scatter)."""
    root, sublayer = fsdp_unit_params(model)
    gathered = 2 if bf16_params else 4
    gradient = gathered + (4 if bf16_params else 0)
    return 4 * root + 2 * gathered * sublayer + gradient * sublayer


@dataclass(frozen=True)
class Fit:
    """Whether a run fits a device, and if not, the setting that would (None: nothing does)."""

    estimate: MemoryEstimate
    fits: bool
    suggestion: str | None = None  # e.g. "train.micro_batch_size=2" or "runtime.checkpointing=sublayer ..."
    smallest: MemoryEstimate | None = None  # the least memory any setting needs (micro-batch 1, checkpointing)


def check_fit(cfg: RunConfig, gpu: bool, devices: int, memory_gib: float) -> Fit:
    """Does ``cfg`` fit ``memory_gib`` per device (within :data:`HEADROOM`)? If not, which micro-batch / checkpointing
    setting would: the largest micro-batch without checkpointing, else the largest with it."""
    limit = HEADROOM * memory_gib * GIB
    own = estimate(cfg, gpu, devices)
    if own.peak <= limit:
        return Fit(own, True)
    rows_per_device = max(1, cfg.train.batch_size // devices)
    divisors = [m for m in range(rows_per_device, 0, -1) if rows_per_device % m == 0]
    for checkpointing in ("none", "sublayer"):
        for micro in divisors:
            trial = _with(cfg, micro, checkpointing)
            found = estimate(trial, gpu, devices)
            if found.peak <= limit:
                return Fit(own, False, _describe(own, found))
    smallest = estimate(_with(cfg, 1, "sublayer"), gpu, devices)
    return Fit(own, False, None, smallest)


def _with(cfg: RunConfig, micro: int, checkpointing: str) -> RunConfig:
    train = replace(cfg.train, micro_batch_size=micro)
    return replace(cfg, train=train, runtime=replace(cfg.runtime, checkpointing=checkpointing))


def _describe(own: MemoryEstimate, found: MemoryEstimate) -> str:
    parts = []
    if found.rows != own.rows:
        parts.append(f"train.micro_batch_size={found.rows}")
    if found.checkpointing != own.checkpointing:
        parts.append(f"runtime.checkpointing={found.checkpointing}")
    return " ".join(parts) + f" (~{found.peak_text})"


def fit_problem(cfg: RunConfig, gpu: bool, devices: int) -> str | None:
    """Why ``cfg`` will not fit its ``runtime.device_memory_gb`` and what would (None: it fits). Without that setting
    a CPU run is checked against the memory this machine has available, so a model or vocabulary too large is
    refused before it starts instead of failing at its first large allocation; a GPU run is not checked."""
    if cfg.runtime.device_memory_gb is not None:
        return problem_text(cfg, check_fit(cfg, gpu, devices, cfg.runtime.device_memory_gb))
    available = None if gpu else available_memory_gib()
    if available is None or _rough_peak(cfg) < CPU_SIMULATE_ABOVE * available * GIB:
        return None  # far below the machine's memory: not worth a simulation (every small run would pay for one)
    if problem := states_problem(cfg, available):  # no micro-batch or checkpointing shrinks them
        return problem
    where = f"the {available:.1f} GiB this machine has available (set runtime.device_memory_gb to check another)"
    return problem_text(cfg, check_fit(cfg, gpu, devices, available), where)


CPU_SIMULATE_ABOVE = 0.2  # a CPU run whose rough bound is above this share of the available memory is simulated


def _rough_peak(cfg: RunConfig) -> float:
    """A cheap over-estimate of a CPU run's peak bytes: fp32 weights, gradients and AdamW's two moments (16 bytes per
    parameter) and, per sequence of a micro-batch, every sublayer's activations, an unfused attention's T x T scores
    and the logits several times over, doubled."""
    m = cfg.model
    rows = min(cfg.train.micro_batch_size or cfg.train.batch_size, cfg.train.batch_size)
    per_token = m.n_layer * (64 * m.d_model + 4 * m.hidden_dim + 8 * m.n_head * m.seq_len) + 8 * m.vocab_size
    return 2 * (16 * count_params(m).total + 4 * rows * m.seq_len * per_token)


def problem_text(cfg: RunConfig, fit: Fit, memory: str | None = None) -> str | None:
    """The sentence for a run that does not fit (None: it fits): what it needs, and what would fit. ``memory``: what
    it was held to (default: runtime.device_memory_gb)."""
    if fit.fits:
        return None
    memory = memory or f"runtime.device_memory_gb={cfg.runtime.device_memory_gb:g}"
    needs = (
        f"{cfg.run_id} needs ~{fit.estimate.peak_text} per device at micro-batch {fit.estimate.rows} "
        f"(checkpointing {fit.estimate.checkpointing}), more than {HEADROOM:.0%} of {memory}"
    )
    if fit.suggestion:
        return f"{needs}; set {fit.suggestion}"
    return (
        f"{needs}, and even micro-batch 1 with runtime.checkpointing=sublayer needs ~{fit.smallest.peak_text}: "
        "use devices with more memory, runtime.strategy=fsdp over more devices, or a smaller model or seq_len"
    )
