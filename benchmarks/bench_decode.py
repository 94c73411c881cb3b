"""Inference latency of baseline vs Full vs Block AttnRes, side by side in one process: the prefill of a prompt and
each decode step after it, with the KV cache of ``attnres.model.KVCache`` (what ``attnres generate`` runs).

    python benchmarks/bench_decode.py                         # CPU, fp32, 1 thread: the table in docs/performance.md
    python benchmarks/bench_decode.py --device cuda --sizes 1024x16 --batches 1,8

Every repeat runs each variant in turn, rotating the order: a prefill of ``--prompt`` tokens, then ``--new`` decode
steps of one token each (greedy). The ratio to the baseline is taken within each repeat before the median, since only
ratios measured side by side mean anything on a shared machine; ``95% CI`` is the median ratio's distribution-free
interval (order statistics) and ``spread`` the smallest and largest ratio of the repeats. The paper's claim is that
Block AttnRes with about 8 blocks adds under 2 % to inference latency (with its two-phase computation); the targets
here are in docs/performance.md ("Inference").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step import median_ci, parse_sizes, timed, variant_config  # noqa: E402  (a sibling script, not a package)

from attnres.kernels import cpu as cpu_kernels  # noqa: E402
from attnres.model import AttnResLM, KVCache  # noqa: E402
from attnres.runtime import pin_malloc  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, every variant and size checked before anything is timed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--sizes", default="256x8", help="comma list of d_model x n_layer")
    parser.add_argument("--variants", default="baseline,full,block4,block8")
    parser.add_argument("--batches", default="1,8", help="comma list of sequences decoded together")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens (the prefill)")
    parser.add_argument("--new", type=int, default=32, help="decode steps timed after the prefill")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda: torch {torch.__version__} sees no CUDA GPU here; run it on a GPU machine")
    args.variant_names = args.variants.split(",")
    if args.variant_names[0] != "baseline":
        parser.error("--variants must start with baseline (ratios are to the baseline)")
    try:
        args.batch_list = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches {args.batches!r}: a comma list of whole numbers, e.g. 1,8")
    if min(args.batch_list) < 1 or args.prompt < 1 or args.new < 1 or args.repeats < 1:
        parser.error("--batches, --prompt, --new and --repeats must be at least 1")
    args.size_list = parse_sizes(parser, args, args.prompt + args.new)
    return args


class Decoder:
    """One variant's model: a prefill and the decode steps after it, each timed on its own."""

    def __init__(self, name: str, model: AttnResLM, prompt: torch.Tensor, new: int) -> None:
        self.name, self.model, self.prompt, self.new = name, model, prompt, new

    @torch.inference_mode()
    def run(self, device: torch.device) -> tuple[float, float]:
        """(prefill seconds, seconds per decode step)."""
        batch, length = self.prompt.shape
        cache = KVCache(self.model.cfg, batch, length + self.new, device, torch.float32)
        logits = []
        prefill = timed(lambda: logits.append(self.model(self.prompt, cache=cache)[:, -1]), device)

        def steps() -> None:
            last = logits[-1]
            for _ in range(self.new):
                last = self.model(last.argmax(-1, keepdim=True), cache=cache)[:, -1]

        return prefill, timed(steps, device) / self.new


def bench(args, size: str, d_model: int, n_layer: int, batch: int, device: torch.device) -> list[dict]:
    n_head = max(1, d_model // args.head_dim)
    seq_len = args.prompt + args.new
    prompt = torch.randint(0, 256, (batch, args.prompt), generator=torch.Generator().manual_seed(0)).to(device)
    decoders = []
    for name in args.variant_names:
        torch.manual_seed(0)
        model = AttnResLM(variant_config(name, d_model, n_layer, seq_len, n_head)).to(device).eval()
        decoders.append(Decoder(name, model, prompt, args.new))
    for decoder in decoders:
        for _ in range(args.warmup):
            decoder.run(device)
    times = {d.name: ([], []) for d in decoders}
    ratios = {d.name: ([], []) for d in decoders}
    for rep in range(args.repeats):
        order = list(range(len(decoders)))
        for i in order[rep % len(order) :] + order[: rep % len(order)]:
            for kept, value in zip(times[decoders[i].name], decoders[i].run(device)):
                kept.append(value)
        for d in decoders:
            for k in (0, 1):
                ratios[d.name][k].append(times[d.name][k][-1] / times["baseline"][k][-1])
    print(f"\nd_model={d_model} n_layer={n_layer} (L={2 * n_layer} sublayers) batch={batch} prompt={args.prompt}")
    print(
        f"{'variant':>9} {'prefill ms':>10} {'x base':>7} {'95% CI':>14} {'spread':>14} "
        f"{'decode ms/token':>15} {'x base':>7} {'95% CI':>14} {'spread':>14}"
    )
    rows = []
    for d in decoders:
        row = {"size": size, "batch": batch, "variant": d.name}
        cells = []
        for k, what in ((0, "prefill"), (1, "decode")):
            values, r = times[d.name][k], ratios[d.name][k]
            low, high = median_ci(r)
            row |= {
                f"{what}_ms": 1e3 * statistics.median(values),
                f"{what}_ratio": statistics.median(r),
                f"{what}_ratio_ci95": [low, high],
                f"{what}_ratio_spread": [min(r), max(r)],
            }
            cells.append(
                f"{row[f'{what}_ms']:{10 if k == 0 else 15}.2f} {row[f'{what}_ratio']:7.3f} "
                f"{f'[{low:.3f}, {high:.3f}]':>14} {f'[{min(r):.3f}, {max(r):.3f}]':>14}"
            )
        rows.append(row)
        print(f"{d.name:>9} " + " ".join(cells))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
        pin_malloc()
    native = device.type == "cpu" and cpu_kernels.enabled and cpu_kernels.ops() is not None
    print(
        f"device={device.type} fp32 threads={torch.get_num_threads()} prompt={args.prompt} new={args.new} "
        f"repeats={args.repeats} native={native} torch={torch.__version__}"
    )
    results = []
    for size, d_model, n_layer in args.size_list:
        for batch in args.batch_list:
            results += bench(args, size, d_model, n_layer, batch, device)
    if args.json:
        with open(args.json, "w") as f:
            kept = {k: v for k, v in vars(args).items() if k not in ("variant_names", "batch_list", "size_list")}
            json.dump({"args": kept, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
