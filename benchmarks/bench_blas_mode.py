"""What MKL's strict reproducible mode costs a CPU training step: the same steps in MKL's default mode and in strict.

    python benchmarks/bench_blas_mode.py                          # 1 thread: the demo's sizes and bench_step's
    python benchmarks/bench_blas_mode.py --threads 2 --modes ,AUTO,STRICT,AVX2,STRICT

MKL reads its mode (``MKL_CBWR``) once per process, so the modes cannot share one: one worker process per mode
(``MKL_CBWR=`` empty is MKL's default; attnres sets ``AUTO,STRICT`` otherwise, attnres.blas) builds the same models
and times a training step (forward + backward + AdamW, as bench_step.py) when the parent asks. The parent asks them
in turn, rotating the order every repeat, so both see the same machine within a few seconds of each other, and the
ratio to the first mode is taken within each repeat before the median (with bench_step's distribution-free 95 % CI).
The workers take turns, never run at once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SIZES = "32x2:128:16,80x5:128:16,256x8:256:8"  # d_model x n_layer : seq_len : batch (the demo's ends; bench_step's)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each worker")
    parser.add_argument("--sizes", default=SIZES, help=f"comma list of DxL:seq_len:batch (default {SIZES})")
    parser.add_argument("--variants", default="baseline,block2,full")
    parser.add_argument(
        "--modes",
        default=",AUTO,STRICT",
        help="the MKL_CBWR values to compare, the first the reference: ',AUTO,STRICT' is MKL's default (empty) and "
        "AUTO,STRICT",
    )
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run as the worker of this MKL mode
    args = parser.parse_args(argv)
    args.mode_list = split_modes(args.modes)
    args.size_list = []
    for size in args.sizes.split(","):
        try:
            dl, seq, batch = size.split(":")
            d_model, n_layer = (int(v) for v in dl.lower().split("x"))
            args.size_list.append((size, d_model, n_layer, int(seq), int(batch)))
        except ValueError:
            parser.error(f"--sizes: {size!r} is not d_model x n_layer : seq_len : batch (e.g. 256x8:256:8)")
    return args


def split_modes(text: str) -> list[str]:
    """``",AUTO,STRICT,AVX2,STRICT"`` -> ``["", "AUTO,STRICT", "AVX2,STRICT"]``: a mode is a branch with an optional
    ``,STRICT``; the empty first item is MKL's default."""
    modes: list[str] = []
    for part in text.split(","):
        if part == "STRICT" and modes:
            modes[-1] += ",STRICT"
        else:
            modes.append(part)
    return modes


def worker(args: argparse.Namespace) -> int:
    """Build every (size, variant), then time one step of the one named on each stdin line; print its seconds."""
    import time

    import torch

    from attnres import blas
    from attnres.runtime import pin_malloc
    from benchmarks.bench_step import Runner, variant_config

    torch.set_num_threads(args.threads)
    pin_malloc()
    runners = {}
    for size, d_model, n_layer, seq_len, batch in args.size_list:
        torch.manual_seed(0)
        tokens = torch.randint(0, 256, (batch, seq_len + 1))
        for name in args.variants.split(","):
            from attnres.model import AttnResLM

            torch.manual_seed(0)
            model = AttnResLM(variant_config(name, d_model, n_layer, seq_len, max(1, d_model // 16)))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            runners[f"{size}/{name}"] = runner = Runner(name, model, opt, tokens, False)
            for _ in range(args.warmup):
                runner.step()
    print(json.dumps({"mode": blas.in_effect(), "threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        runner = runners[line.strip()]
        start = time.perf_counter()
        runner.step()
        print(json.dumps(time.perf_counter() - start), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        return worker(args)
    from benchmarks.bench_step import median_ci

    workers = []
    passed = list(argv if argv is not None else sys.argv[1:])
    for mode in args.mode_list:
        env = {**os.environ, "MKL_CBWR": mode}
        cmd = [sys.executable, "-m", "benchmarks.bench_blas_mode", *passed, "--worker", mode]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        workers.append(proc)
    # one at a time: a worker builds and warms up its models before the next starts timing
    heads = [json.loads(w.stdout.readline()) for w in workers]
    print(f"threads={args.threads} repeats={args.repeats}; MKL modes: " + ", ".join(h["mode"] for h in heads))
    keys = [f"{s[0]}/{v}" for s in args.size_list for v in args.variants.split(",")]
    times = {(k, m): [] for k in keys for m in range(len(workers))}
    for rep in range(args.repeats):
        for key in keys:
            order = list(range(len(workers)))
            order = order[rep % len(order) :] + order[: rep % len(order)]
            for m in order:
                workers[m].stdin.write(key + "\n")
                workers[m].stdin.flush()
                times[key, m].append(json.loads(workers[m].stdout.readline()))
    for w in workers:
        w.stdin.close()
        w.wait()
    rows = []
    print(f"{'size/variant':>24} {'mode':>14} {'step ms':>9} {'x ' + heads[0]['mode']:>10} {'95% CI':>16}")
    for key in keys:
        for m, head in enumerate(heads):
            ratios = [t / t0 for t, t0 in zip(times[key, m], times[key, 0])]
            low, high = median_ci(ratios)
            row = {
                "key": key,
                "mode": head["mode"],
                "step_ms": 1e3 * statistics.median(times[key, m]),
                "ratio": statistics.median(ratios),
                "ratio_ci95": [low, high],
            }
            rows.append(row)
            print(f"{key:>24} {head['mode']:>14} {row['step_ms']:9.1f} {row['ratio']:10.3f} [{low:.3f}, {high:.3f}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "modes": [h["mode"] for h in heads], "results": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
