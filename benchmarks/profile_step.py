"""Where a CPU training step's time goes, for the deep, narrow cells the CPU studies train (issue 46).

    python benchmarks/profile_step.py                                   # cpu_depth's deepest cell, d48 x 12 layers
    python benchmarks/profile_step.py --sizes 48x24 --variants baseline,block4 --steps 20
    python benchmarks/profile_step.py --variants baseline,baseline-compiled,block4,block4-compiled
    python benchmarks/profile_step.py --sizes 256x8 --heads 4 --seq-len 256 --batch 8 --threads 2 \
        --variants block8-ungrouped,block8,full-ungrouped,full          # bench_step.py's size; its variant suffixes

For each variant, side by side in one process, their steps in turn (a shared machine drifts: compare the shares
and ratios more than the milliseconds): the step split into forward, backward and optimizer by wall clock; the
profiler's self time of every op grouped by what it does (matmuls, the token attention, the depth mixing, norms,
element-wise, the optimizer's kernels, the rest); the achieved FLOP/s of the whole step (the model's training FLOPs, the
convention of attnres.costs) against the FLOP/s one torch.mm reaches at the step's own matmul shapes and at a
large square one. One torch thread by default, as the studies train. Variant names are bench_step.py's, with its
suffixes (``-eager``, ``-ungrouped``, ...), and ``-compiled`` for runtime.compile=true.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step import Runner, build_model, native_kernels, variant_config  # noqa: E402  (a sibling script)

from attnres.costs import training_flops_per_token  # noqa: E402
from attnres.runtime import pin_malloc  # noqa: E402

GROUPS = (  # (group, substrings of the op name), first match wins
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv")),
    ("token attention", ("scaled_dot_product", "flash_attention", "_efficient_attention", "aten::_softmax")),
    ("token attention", ("causal_attention",)),  # attnres.kernels.attention's operators, before "attnres" below
    ("depth mixing", ("attnres", "Deposit", "Phase1", "Merge", "depth")),
    ("norm", ("rms_norm", "layer_norm", "aten::rsqrt", "aten::norm")),
    ("optimizer", ("_foreach", "adam", "Adam", "lerp", "addcdiv", "addcmul")),
    ("loss", ("cross_entropy", "log_softmax", "nll_loss")),
    ("element-wise", ("aten::add", "aten::mul", "aten::sub", "aten::div", "gelu", "silu", "aten::neg", "aten::pow")),
    ("copies and views", ("aten::copy_", "aten::contiguous", "aten::clone", "aten::cat", "aten::stack", "to_copy")),
    ("allocation", ("aten::empty", "aten::zeros", "aten::fill_", "aten::zero_", "aten::ones")),
    # Inductor's own kernels (the fused element-wise work, the norms, the loss, the depth attention compiled whole)
    ("compiled graphs", ("CompiledFxGraph",)),
)


def group_of(name: str) -> str:
    for group, keys in GROUPS:
        if any(k in name for k in keys):
            return group
    return "other"


def turns(runners: list[Runner], steps: int) -> Iterator[Runner]:
    """Every runner ``steps`` times, in turn, the order rotated each round: the variants share a machine's drift."""
    for step in range(steps):
        yield from runners[step % len(runners) :] + runners[: step % len(runners)]


def phases(runners: list[Runner], steps: int) -> dict[str, dict[str, float]]:
    """Per variant, median seconds of forward, backward and optimizer (with zero_grad) over ``steps`` steps."""
    times: dict[str, dict[str, list[float]]] = {r.name: defaultdict(list) for r in runners}
    for runner in turns(runners, steps):
        with native_kernels("-eager" not in runner.name):
            t0 = time.perf_counter()
            logits = runner.model(runner.tokens[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), runner.tokens[:, 1:].flatten())
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
        runner.opt.step()
        runner.opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        times[runner.name]["forward"].append(t1 - t0)
        times[runner.name]["backward"].append(t2 - t1)
        times[runner.name]["optimizer"].append(t3 - t2)
    return {name: {k: statistics.median(v) for k, v in phase.items()} for name, phase in times.items()}


def op_groups(runners: list[Runner], steps: int) -> dict[str, tuple[dict[str, float], list[tuple[str, float, int]]]]:
    """Per variant, self CPU time per group (seconds a step) and the ten costliest ops (name, seconds a step, calls a
    step): each step profiled alone, the variants' steps in turn (rotating the order), so they share the drift."""
    from torch.profiler import ProfilerActivity, profile

    seconds: dict[str, dict[str, float]] = {r.name: defaultdict(float) for r in runners}
    counts: dict[str, dict[str, int]] = {r.name: defaultdict(int) for r in runners}
    for runner in turns(runners, steps):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            runner.step()
        for event in prof.key_averages():
            seconds[runner.name][event.key] += event.self_cpu_time_total / 1e6 / steps
            counts[runner.name][event.key] += event.count
    result = {}
    for runner in runners:
        groups: dict[str, float] = defaultdict(float)
        for key, s in seconds[runner.name].items():
            groups[group_of(key)] += s
        ops = sorted(
            ((k, s, counts[runner.name][k] // steps) for k, s in seconds[runner.name].items()), key=lambda op: -op[1]
        )
        result[runner.name] = (dict(groups), ops[:10])
    return result


def mm_flops_per_s(m: int, k: int, n: int, seconds: float = 0.3) -> float:
    """FLOP/s of torch.mm at (m x k) @ (k x n), timed for about ``seconds``."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        calls += 1
    return 2.0 * m * k * n * calls / (time.perf_counter() - start)


COMPILED = "-compiled"  # variant suffix: runtime.compile=true (attnres.model.compile_model, inductor's CPU C++)


def make_runner(name: str, d_model: int, n_layer: int, n_head: int, seq_len: int, batch: int) -> Runner:
    torch.manual_seed(0)
    cfg = variant_config(name.replace(COMPILED, ""), d_model, n_layer, seq_len, n_head)
    model = build_model(name.replace(COMPILED, ""), cfg, torch.device("cpu"), compile=COMPILED in name, fused=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1))
    return Runner(name, model, opt, tokens, autocast=False)


def losses(runner: Runner, steps: int) -> list[float]:
    """The training loss of ``steps`` steps on the runner's one batch (its parameters move: a trajectory)."""
    out = []
    for _ in range(steps):
        with native_kernels("-eager" not in runner.name):
            logits = runner.model(runner.tokens[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), runner.tokens[:, 1:].flatten())
            loss.backward()
        runner.opt.step()
        runner.opt.zero_grad(set_to_none=True)
        out.append(float(loss))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="48x12", help="d_modelxn_layer, comma-separated (default: 48x12)")
    parser.add_argument("--variants", default="baseline,block4")
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the studies train with 1)")
    parser.add_argument(
        "--agree", type=int, default=30, help="steps of the eager and compiled twins' loss trajectories compared"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pin_malloc()  # as training and bench_step.py do: no variant pays page faults for the heap the others left
    tokens = args.batch * args.seq_len
    for size in args.sizes.split(","):
        d_model, n_layer = (int(x) for x in size.split("x"))
        runners = [
            make_runner(v, d_model, n_layer, args.heads, args.seq_len, args.batch) for v in args.variants.split(",")
        ]
        for r in runners:  # warm-up: the kernels' build, the allocator, the first AdamW state
            for _ in range(3):
                r.step()
        shapes = [(tokens, d_model, 3 * d_model), (tokens, d_model, 4 * d_model), (tokens, 4 * d_model, d_model)]
        peak_here = max(mm_flops_per_s(*s) for s in shapes)
        peak_large = mm_flops_per_s(1024, 1024, 1024)
        print(
            f"d_model {d_model} x {n_layer} layers, {args.batch} x {args.seq_len} tokens a step, {args.threads} "
            f"thread(s); torch.mm "
            f"reaches {peak_here / 1e9:.1f} GFLOP/s at the step's shapes ({tokens}x{d_model}x{4 * d_model}) and "
            f"{peak_large / 1e9:.1f} at 1024^3"
        )
        base_step = None
        profiles = op_groups(runners, max(2, args.steps // 2))
        timed = phases(runners, args.steps)
        for r in runners:
            times = timed[r.name]
            step = sum(times.values())
            base_step = base_step or step
            groups, top = profiles[r.name]
            profiled = sum(groups.values())
            achieved = training_flops_per_token(r.model.cfg) * tokens / step
            print(
                f"\n{r.name}: step {1e3 * step:.1f} ms (x{step / base_step:.2f} the first variant), "
                f"{tokens / step:,.0f} tokens/s; forward {times['forward'] / step:.0%}, backward "
                f"{times['backward'] / step:.0%}, optimizer {times['optimizer'] / step:.0%}; "
                f"{achieved / 1e9:.1f} GFLOP/s = {achieved / peak_here:.0%} of torch.mm at these shapes"
            )
            print(
                "  self time by group: "
                + ", ".join(
                    f"{g} {s / profiled:.0%} ({1e3 * s:.1f} ms)"
                    for g, s in sorted(groups.items(), key=lambda kv: -kv[1])
                    if s / profiled >= 0.01
                )
            )
            print(
                "  costliest ops: "
                + "; ".join(f"{name} {s / profiled:.0%} ({calls}/step)" for name, s, calls in top[:6])
            )
            if COMPILED in r.name and args.agree:  # the same model from the same seed, eager and compiled
                names = (r.name.replace(COMPILED, ""), r.name)
                twins = [make_runner(n, d_model, n_layer, args.heads, args.seq_len, args.batch) for n in names]
                eager, compiled = (losses(t, args.agree) for t in twins)
                worst = max(abs(a - b) / a for a, b in zip(eager, compiled))
                print(
                    f"  its loss over {args.agree} steps against eager's: largest relative difference {worst:.1e} "
                    f"(last step {eager[-1]:.6f} eager, {compiled[-1]:.6f} compiled)"
                )


if __name__ == "__main__":
    main()
