"""Training-step time and peak memory of baseline vs Full vs Block AttnRes, side by side in one process.

    python benchmarks/bench_step.py                       # CPU, fp32, 2 threads, the table in docs/performance.md
    python benchmarks/bench_step.py --device cuda --dtype bf16 --sizes 1024x16 --variants baseline,block8
    python benchmarks/bench_step.py --compile             # every variant as runtime.compile=true trains it
    python benchmarks/bench_step.py --sizes 256x8 --variants baseline,block4,block4-eager   # the CPU kernels' gain

Every repeat times one training step (forward + backward + AdamW) of every variant in turn, rotating the
order, and the ratio to the baseline is taken within each repeat before the median: shared machines drift,
so only ratios measured side by side mean anything. ``95% CI`` is the median ratio's distribution-free
confidence interval (order statistics), which says whether a target like 1.05 is met beyond the noise. Peak
memory is measured in a separate pass: on CUDA ``torch.cuda.max_memory_allocated``; on CPU the bytes of
parameters, buffers and optimizer state plus the peak of the step's allocations (gradients included) as recorded
by the PyTorch profiler. ``est/peak`` is the memory estimate of ``attnres sweep plan`` (a simulated step,
``attnres.training.memory``) over that measured peak. ``depth ms`` times the depth mixing alone (forward +
backward of the mixer, with each sublayer replaced by a cheap element-wise stand-in; with ``--compile`` on CUDA or
with ``--fused-depth``, through the fused kernels of ``attnres.kernels.fused``). On CPU the depth attention runs
through the C++ kernels of ``attnres.kernels.cpu`` where they build (the header says ``native=True``); a variant
named with ``-eager`` (``block4-eager``) runs it in torch ops instead, side by side with the others. A variant
named with ``-ckpt`` (``block4-ckpt``) trains with ``runtime.checkpointing=sublayer``: each sublayer recomputed in
backward; its peak memory beside the plain variant's is what activation checkpointing saves. A variant named with
``-scatter`` (``full-scatter``, ``block8-scatter``) forms the slots' gradients as before 2026-12-06, each reader
adding its share into every slot's gradient buffer, instead of each slot gathering its readers' (``Buffers.gather``).
A variant named with ``-ungrouped`` (``full-ungrouped``) gathers each slot's readers in the slot's own backward only, as
before 2026-12-07, instead of a group of slots sharing the reads of their common readers (``two_phase.gather_plan``).
A variant named with ``-sdpa`` (``baseline-sdpa``) runs the token attention through torch's SDPA instead of the
native CPU kernels of ``attnres.kernels.attention`` (what CPU training used before 2026-12-07). With ``--compile``, a
Full / Block variant named with ``-sublayers`` (``block4-sublayers``) compiles each sublayer around the eager two-phase
depth autograd (``attnres.mixers.AttnRes``; what ``runtime.compile`` did on CPU before 2026-12-07 and still does on
GPU) instead of the whole model with the depth attention traced (``attnres.mixers.TracedAttnRes``); one named with
``-whole`` (``block8-whole``) compiles the whole model so on any device (on GPU, where training compiles each sublayer
with the fused depth kernels, it measures the alternative). The ``depth ms`` column times the eager two-phase mixer in
every case (for a variant compiled whole, not its own: its depth attention runs inside its graph).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F

from attnres.config import ConfigError, ModelConfig
from attnres.kernels import attention
from attnres.kernels import cpu as cpu_kernels
from attnres.mixers import AttnRes, build_mixer
from attnres.model import AttnResLM, compile_model
from attnres.runtime import pin_malloc
from attnres.variants import Variant

# torch's profiler (the peak memory below, and profile_step.py's op table) logs two lines to stderr each time it starts
# and stops; kineto's level 6 keeps them out of the benchmarks' output (read when the profiler first starts)
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

EAGER = "-eager"  # variant suffix: the depth attention in torch ops, without attnres.kernels.cpu's CPU kernels
CKPT = "-ckpt"  # variant suffix: runtime.checkpointing=sublayer
SCATTER = "-scatter"  # variant suffix: the slots' gradients scattered by the readers (AttnRes.gather = False)
UNGROUPED = "-ungrouped"  # variant suffix: each slot gathers all of its readers itself (AttnRes.group = False)
SDPA = "-sdpa"  # variant suffix: the token attention through torch's SDPA, without attnres.kernels.attention's kernels
SUBLAYERS = "-sublayers"  # variant suffix, with --compile: each sublayer compiled around the eager two-phase AttnRes
WHOLE = "-whole"  # variant suffix, with --compile: the whole model, its depth attention traced, on any device


def base_name(name: str) -> str:
    """The variant without its -eager / -ckpt / -scatter / -ungrouped / -sdpa / -sublayers / -whole suffixes."""
    for suffix in (EAGER, CKPT, SCATTER, UNGROUPED, SDPA, SUBLAYERS, WHOLE):
        name = name.replace(suffix, "")
    return name


def variant_config(name: str, d_model: int, n_layer: int, seq_len: int, n_head: int) -> ModelConfig:
    base = base_name(name)
    main = Variant.parse_main(base) or Variant(base)  # other residuals (the ablations) as they are
    residual, n_blocks = main.name, main.n_blocks
    extra = {} if n_blocks is None else {"n_blocks": n_blocks}
    return ModelConfig(n_layer=n_layer, d_model=d_model, n_head=n_head, seq_len=seq_len, residual=residual, **extra)


@dataclass
class Runner:
    name: str
    model: AttnResLM
    opt: torch.optim.Optimizer
    tokens: torch.Tensor
    autocast: bool

    def step(self) -> None:
        with native_kernels(EAGER not in self.name), native_attention(SDPA not in self.name):
            with torch.autocast(self.tokens.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                logits = self.model(self.tokens[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), self.tokens[:, 1:].flatten())
            loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


@contextmanager
def switched(kernels: ModuleType, enabled: bool) -> Iterator[None]:
    """``kernels.enabled`` (a module of attnres.kernels) on or off for the block; kernels that are off stay off."""
    saved, kernels.enabled = kernels.enabled, enabled and kernels.enabled
    try:
        yield
    finally:
        kernels.enabled = saved


def native_kernels(enabled: bool) -> AbstractContextManager[None]:
    """attnres.kernels.cpu's CPU kernels on or off for the block (they are on by default where they build)."""
    return switched(cpu_kernels, enabled)


def native_attention(enabled: bool) -> AbstractContextManager[None]:
    """attnres.kernels.attention's CPU kernels for the token attention on or off (torch's SDPA) for the block."""
    return switched(attention, enabled)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def resident_bytes(runner: Runner) -> int:
    """What lives between steps: parameters, buffers and AdamW's state. Not the gradients: zero_grad(set_to_none)
    frees them, and the profiler records their allocation inside the step."""
    tensors = [*runner.model.parameters(), *runner.model.buffers()]
    tensors += [t for s in runner.opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    return sum(t.numel() * t.element_size() for t in tensors)


def estimated_bytes(runner: Runner, batch: int, device: torch.device) -> int:
    """The memory estimate of ``attnres sweep plan`` (:mod:`attnres.training.memory`) for the same step."""
    from attnres.config import RunConfig, RuntimeConfig, TrainConfig
    from attnres.training.memory import estimate

    model = runner.model
    runtime = RuntimeConfig(
        precision="bf16-mixed" if runner.autocast else "32-true",
        checkpointing="sublayer" if model.checkpointing else "none",
    )
    cfg = RunConfig(model=model.cfg, train=TrainConfig(batch_size=batch), runtime=runtime)
    return estimate(cfg, gpu=device.type == "cuda").peak


def peak_bytes(runner: Runner, device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        runner.step()
        sync(device)
        return torch.cuda.max_memory_allocated()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        runner.step()
    current = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        current += event.cpu_memory_usage if event.name == "[memory]" else event.self_cpu_memory_usage
        peak = max(peak, current)
    return resident_bytes(runner) + peak


def depth_only_time(
    cfg: ModelConfig,
    batch: int,
    device: torch.device,
    dtype: torch.dtype,
    fused: bool,
    native: bool = True,
    gather: bool = True,
    group: bool = True,
) -> callable:
    """Forward + backward of the depth mixer alone; sublayer l is the stand-in ``v = h * c_l``."""
    mixer = build_mixer(cfg, fused=fused).to(device)
    if isinstance(mixer, AttnRes):
        mixer.gather, mixer.group = gather, group
    scales = torch.linspace(0.5, 1.5, cfg.n_sublayers, device=device)
    x = torch.randn(batch, cfg.seq_len, cfg.d_model, device=device, dtype=dtype, requires_grad=True)

    def run() -> None:
        with native_kernels(native):
            state = mixer.start(x)
            for layer in range(cfg.n_sublayers):
                mixer.write(state, layer, mixer.read(state, layer) * scales[layer])
            mixer.finish(state).float().square().mean().backward()

    return run


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: the order statistics whose ranks bracket the
    median with binomial probability ``level`` (min and max when there are too few values for that)."""
    from scipy.stats import binom

    x, n = sorted(values), len(values)
    j = int(binom.ppf((1 - level) / 2, n, 0.5))  # P(fewer than j values below the median) <= (1 - level) / 2
    return (x[j - 1], x[n - j]) if j >= 1 else (x[0], x[-1])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, with every variant and size checked before anything is timed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast (GPU)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--sizes", default="256x8,128x4", help="comma list of d_model x n_layer")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument(
        "--variants", default="baseline,full,block2,block4,block8", help="-eager: without the native CPU kernels"
    )
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="torch.compile every variant as runtime.compile=true")
    parser.add_argument(
        "--fused-depth", action="store_true", help="the fused depth kernels (attnres.kernels.fused) on any device"
    )
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda: torch {torch.__version__} sees no CUDA GPU here; run it on a GPU machine")
    # the depth kernels are fused where training fuses them (runtime.compile on GPU) or when asked
    args.fused = args.fused_depth or (args.compile and args.device == "cuda")
    args.variant_names = args.variants.split(",")
    if args.variant_names[0] != "baseline":
        parser.error("--variants must start with baseline (ratios are to the baseline)")
    for name in args.variant_names:
        base = base_name(name)
        if base.startswith("block") and not base[5:].isdigit():
            parser.error(f"--variants: {name!r} is not a variant; Block AttnRes is written block<N>, e.g. block4")
        eager_only = any(suffix in name for suffix in (EAGER, SCATTER, UNGROUPED))
        if base != "baseline" and compiles_whole(name, args.compile, args.fused) and eager_only:
            parser.error(
                f"--variants {name}: -eager, -scatter and -ungrouped choose how the two-phase depth autograd runs, and "
                "compiled whole there is none (its depth attention is traced); add -sublayers to compile around it"
            )
    args.size_list = parse_sizes(parser, args, args.seq_len)
    return args


def parse_sizes(parser: argparse.ArgumentParser, args: argparse.Namespace, seq_len: int) -> list[tuple[str, int, int]]:
    """``--sizes`` as (size, d_model, n_layer), every variant of ``args.variant_names`` built as a config at every size
    (``seq_len`` tokens, ``--head-dim``) before any is timed; a bad size or variant is a parser error."""
    sizes = []
    for size in args.sizes.split(","):
        parts = size.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            parser.error(f"--sizes: {size!r} is not d_model x n_layer (e.g. 256x8)")
        d_model, n_layer = int(parts[0]), int(parts[1])
        try:
            for name in args.variant_names:
                variant_config(name, d_model, n_layer, seq_len, max(1, d_model // args.head_dim))
        except ConfigError as err:
            parser.error(f"--sizes {size} with --variants {args.variants}: {err}")
        sizes.append((size, d_model, n_layer))
    return sizes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
        pin_malloc()
    print(
        f"device={device.type} dtype={args.dtype} threads={torch.get_num_threads()} batch={args.batch} "
        f"seq_len={args.seq_len} repeats={args.repeats} compile={args.compile} fused_depth={args.fused_depth} "
        f"native={device.type == 'cpu' and cpu_kernels.enabled and cpu_kernels.ops() is not None} "
        f"torch={torch.__version__}"
    )
    results = []
    for size, d_model, n_layer in args.size_list:
        results += bench_size(args, size, d_model, n_layer, device, args.fused)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k in ARG_KEYS}, "results": results}, f, indent=2)
    return 0


ARG_KEYS = ("device", "dtype", "threads", "sizes", "seq_len", "batch", "head_dim", "variants", "repeats", "warmup")
ARG_KEYS += ("compile", "fused_depth", "json")


def compiles_whole(name: str, compile: bool, fused: bool) -> bool:
    """Whether variant ``name`` (Full / Block) compiles whole, its depth attention traced: as runtime.compile does
    where the depth kernels are not fused (CPU), unless ``-sublayers``; where they are (GPU), only with ``-whole``."""
    return compile and SUBLAYERS not in name and (not fused or WHOLE in name)


def build_model(name: str, cfg: ModelConfig, device: torch.device, compile: bool, fused: bool) -> AttnResLM:
    """Variant ``name``'s model as it trains (``compile``: as runtime.compile=true), with its suffixes applied."""
    model = AttnResLM(cfg).to(device)
    model.checkpointing = CKPT in name
    if compile and isinstance(model.depth, AttnRes) and not compiles_whole(name, compile, fused):
        model.depth.fused = fused  # runtime.compile on GPU (attnres.model.compile_model), and on CPU before 2026-12-07
        for sublayer in model.sublayers:
            sublayer.compile()
    elif compile:  # the whole model (attnres.model.compile_model)
        model = compile_model(model, fuse_depth=False)
    elif isinstance(model.depth, AttnRes):
        model.depth.fused = fused
    if isinstance(model.depth, AttnRes):
        model.depth.gather, model.depth.group = SCATTER not in name, UNGROUPED not in name
    return model


def bench_size(args, size: str, d_model: int, n_layer: int, device: torch.device, fused: bool) -> list[dict]:
    """Every variant at one size, interleaved: the step's time and peak memory, and depth mixing alone."""
    autocast = args.dtype == "bf16"
    n_head = max(1, d_model // args.head_dim)
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (args.batch, args.seq_len + 1), device=device)
    runners, depth_runs = [], []
    for name in args.variant_names:
        cfg = variant_config(name, d_model, n_layer, args.seq_len, n_head)
        torch.manual_seed(0)
        model = build_model(name, cfg, device, args.compile, fused)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        runners.append(Runner(name, model, opt, tokens, autocast))
        dtype = torch.bfloat16 if autocast else torch.float32
        native, gather, group = EAGER not in name, SCATTER not in name, UNGROUPED not in name
        depth_runs.append(depth_only_time(cfg, args.batch, device, dtype, fused, native, gather, group))
    for runner, depth in zip(runners, depth_runs):
        for _ in range(args.warmup):
            runner.step()
            depth()
    step_s = {r.name: [] for r in runners}
    depth_s = {r.name: [] for r in runners}
    ratios = {r.name: [] for r in runners}
    for rep in range(args.repeats):
        order = list(range(len(runners)))
        order = order[rep % len(order) :] + order[: rep % len(order)]
        for i in order:
            step_s[runners[i].name].append(timed(runners[i].step, device))
            depth_s[runners[i].name].append(timed(depth_runs[i], device))
        for r in runners:
            ratios[r.name].append(step_s[r.name][-1] / step_s["baseline"][-1])
    peaks = {r.name: peak_bytes(r, device) for r in runners}
    estimates = {r.name: estimated_bytes(r, args.batch, device) for r in runners}
    print(f"\nd_model={d_model} n_layer={n_layer} n_head={n_head} (L={2 * n_layer} sublayers)")
    width = max(12, *(len(r.name) for r in runners))
    print(
        f"{'variant':>{width}} {'step ms':>9} {'x base':>7} {'95% CI':>14} {'peak MiB':>9} {'x base':>7} "
        f"{'est/peak':>8} {'depth ms':>9}"
    )
    rows = []
    for r in runners:
        low, high = median_ci(ratios[r.name])
        row = {
            "size": size,
            "variant": r.name,
            "step_ms": 1e3 * statistics.median(step_s[r.name]),
            "step_ratio": statistics.median(ratios[r.name]),
            "step_ratio_ci95": [low, high],
            "step_ratio_min": min(ratios[r.name]),
            "step_ratio_max": max(ratios[r.name]),
            "peak_mib": peaks[r.name] / 2**20,
            "peak_ratio": peaks[r.name] / peaks["baseline"],
            "estimate_mib": estimates[r.name] / 2**20,
            "depth_ms": 1e3 * statistics.median(depth_s[r.name]),
        }
        rows.append(row)
        print(
            f"{r.name:>{width}} {row['step_ms']:9.1f} {row['step_ratio']:7.3f} "
            f"[{low:.3f}, {high:.3f}] {row['peak_mib']:9.1f} "
            f"{row['peak_ratio']:7.3f} {estimates[r.name] / peaks[r.name]:8.3f} {row['depth_ms']:9.2f}"
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
