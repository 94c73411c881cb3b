"""The token attention alone: torch's SDPA against the native CPU kernels (attnres.kernels.attention), side by side.

    python benchmarks/bench_attention.py                  # the CPU studies' shape and the default size's
    python benchmarks/bench_attention.py --shapes 16x3x128x16 --threads 1 --repeats 40

Each shape is B x H x T x head_dim. Every repeat times SDPA's and the native kernels' forward (no gradient) and
forward + backward in turn, rotating the order, and the speed-up (SDPA's time over the native one's) is taken within
each repeat before the median; ``95% CI`` is the median's distribution-free interval (``bench_step.median_ci``).
What the kernels buy in a whole training step is ``bench_step.py``'s ``-sdpa`` variants.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from attnres.kernels import attention

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step import median_ci, native_attention  # noqa: E402  (a sibling script, not a package)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="16x3x128x16,8x4x256x64", help="B x H x T x head_dim, comma-separated")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        args.shape_list = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    except ValueError:
        parser.error(f"--shapes {args.shapes!r}: each shape is B x H x T x head_dim, e.g. 16x3x128x16")
    for shape in args.shape_list:
        if len(shape) != 4 or min(shape) < 1 or shape[3] % attention.WIDTH:
            parser.error(f"--shapes: {'x'.join(map(str, shape))} needs four positive sizes, head_dim a multiple of 16")
    return args


def bench_shape(shape: tuple[int, ...], repeats: int, warmup: int) -> dict:
    """Median times (ms) and speed-ups of forward and forward + backward at one shape."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(shape, generator=gen) for _ in range(4))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]

    def forward(native: bool):
        def run() -> None:
            with native_attention(native), torch.no_grad():
                attention.causal_attention(q, k, v)

        return run

    def training(native: bool):
        def run() -> None:
            with native_attention(native):
                attention.causal_attention(*leaves).backward(dout)
            for x in leaves:
                x.grad = None

        return run

    cases = {"fwd sdpa": forward(False), "fwd native": forward(True), "f+b sdpa": training(False)}
    cases["f+b native"] = training(True)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    names = list(cases)
    for rep in range(repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            start = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - start)
    row = {"shape": "x".join(map(str, shape))}
    for part in ("fwd", "f+b"):
        speedups = [s / n for s, n in zip(times[f"{part} sdpa"], times[f"{part} native"])]
        row[f"{part} sdpa ms"] = 1e3 * statistics.median(times[f"{part} sdpa"])
        row[f"{part} native ms"] = 1e3 * statistics.median(times[f"{part} native"])
        row[f"{part} speedup"] = statistics.median(speedups)
        row[f"{part} ci95"] = median_ci(speedups)
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if not attention.native(*(torch.zeros(1, 1, 1, attention.WIDTH) for _ in range(3))):
        print("the native kernels are off or did not build (ATTNRES_NATIVE, a C++ compiler): nothing to compare")
        return 1
    print(f"threads={args.threads} repeats={args.repeats} torch={torch.__version__}")
    print(f"{'B x H x T x hd':>15} {'part':>5} {'sdpa ms':>8} {'native ms':>9} {'speed-up':>8} {'95% CI':>14}")
    for shape in args.shape_list:
        row = bench_shape(shape, args.repeats, args.warmup)
        for part in ("fwd", "f+b"):
            low, high = row[f"{part} ci95"]
            print(
                f"{row['shape']:>15} {part:>5} {row[f'{part} sdpa ms']:8.3f} {row[f'{part} native ms']:9.3f} "
                f"{row[f'{part} speedup']:8.2f} [{low:.2f}, {high:.2f}]"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
