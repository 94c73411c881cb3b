"""How far bf16 autocast moves each variant from its fp32 result, on the same weights (CPU).

    python benchmarks/bench_bf16.py                 # d_model 128, 8 blocks (16 sublayers), 60 training steps first

Each variant is trained ``--steps`` steps in fp32 on the built-in corpus (so the pseudo-queries and the sublayer
outputs have left their initial values), then the same weights run the validation windows twice: in fp32 and under
bf16 autocast (what ``runtime.precision=auto`` trains with on a GPU). Printed per variant: the relative RMS error of
the final aggregation (the input of the final norm) and of the logits, and the change of the validation loss. The
baseline's residual stream is fp32 under autocast (fp32 embedding plus bf16 sublayer outputs); this shows whether an
AttnRes variant keeps the same precision in its own sums.
"""

from __future__ import annotations

import argparse
import json

import torch

from attnres.config import resolve_run_config
from attnres.data.corpus import TrainBatches, load_corpus, val_windows
from attnres.model import AttnResLM
from attnres.training.module import lm_loss
from attnres.training.optimizer import build_optimizer

VARIANTS = {
    "baseline": ["model.residual=baseline"],
    "full": ["model.residual=full"],
    "block2": ["model.residual=block", "model.n_blocks=2"],
    "block4": ["model.residual=block", "model.n_blocks=4"],
}


def final_state(model: AttnResLM, tokens: torch.Tensor) -> torch.Tensor:
    """The final aggregation (before the final norm), captured with a forward hook on the norm."""
    seen = {}
    handle = model.final_norm.register_forward_hook(lambda m, args, out: seen.setdefault("h", args[0].float()))
    try:
        logits = model(tokens)
    finally:
        handle.remove()
    return seen["h"], logits.float()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


def measure(name: str, args: argparse.Namespace) -> dict:
    cfg = resolve_run_config(
        None,
        VARIANTS[name]
        + [f"model.d_model={args.d_model}", f"model.n_layer={args.layers}", "model.n_head=4", "model.seq_len=128"]
        + ["train.batch_size=8", "train.lr=1e-2", "train.eval_tokens=8192"],
    )
    corpus = load_corpus(cfg.data)
    torch.manual_seed(0)
    model = AttnResLM(cfg.model)
    opt = build_optimizer(model, cfg.train)
    batches = TrainBatches(corpus.train, 8, 128, seed=0, steps=args.steps)
    for batch in batches:
        lm_loss(model, batch).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    windows = torch.from_numpy(val_windows(corpus.val, 128, 8192))
    model.eval()
    with torch.no_grad():
        h32, logits32 = final_state(model, windows[:, :-1])
        loss32 = float(lm_loss(model, windows))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h16, logits16 = final_state(model, windows[:, :-1])
            loss16 = float(lm_loss(model, windows))
    return {
        "variant": name,
        "final_rel_err": relative(h16, h32),
        "logits_rel_err": relative(logits16, logits32),
        "loss_fp32": loss32,
        "loss_change": loss16 - loss32,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [measure(name, args) for name in args.variants.split(",")]
    print(f"{'variant':10s} {'final h rel err':>16s} {'logits rel err':>15s} {'fp32 loss':>10s} {'bf16 - fp32':>12s}")
    for r in rows:
        print(
            f"{r['variant']:10s} {r['final_rel_err']:16.2e} {r['logits_rel_err']:15.2e} {r['loss_fp32']:10.4f} "
            f"{r['loss_change']:+12.2e}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
