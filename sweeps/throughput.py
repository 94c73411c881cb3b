"""``attnres sweep throughput GRID``: every variant's training throughput at every size, measured side by side.

The wall-clock multiplier scales M by the variant's FLOP/s over the baseline's. Tokens/s logged by runs that
trained at different times on a shared machine measure the machine's load as much as the model (the demo once
gave a ratio of 15), so this measures them together: for each size, one model per variant (the grid's shapes,
seq_len and per-device micro-batch), a few warm-up steps each, then ``rounds`` rounds in which every variant
trains ``steps`` steps in turn, the order rotating each round; the median tokens/s over the rounds. The result goes
to ``RESULTS/<sweep>/throughput.json``, which ``attnres fit`` and the report use for wall-clock M in place of the
runs' own tokens/s. Synthetic tokens (the step's cost does not depend on them); fp32 on CPU, bf16 autocast on GPU.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sweeps.expansion import make_run, variant_labels
from sweeps.specs import Grid

THROUGHPUT_FILE = "throughput.json"


def _step_fn(cfg: Any, device: str) -> tuple[Any, int]:
    import torch
    import torch.nn.functional as F

    from attnres.model import AttnResLM
    from attnres.training.optimizer import parameter_groups

    torch.manual_seed(0)
    model = AttnResLM(cfg.model).to(device)
    model.checkpointing = cfg.runtime.checkpointing == "sublayer"
    opt = torch.optim.AdamW(parameter_groups(model, cfg.train.weight_decay), lr=cfg.train.lr)
    rows = cfg.train.micro_batch_size or cfg.train.batch_size
    tokens = torch.randint(0, cfg.model.vocab_size, (rows, cfg.model.seq_len + 1), device=device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")

    def step() -> None:
        with autocast:
            logits = model(tokens[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    return step, rows * cfg.model.seq_len


def measure(grid: Grid, steps: int = 5, rounds: int = 5, warmup: int = 2, log=print) -> dict[str, Any]:
    """Interleaved tokens/s of every variant at every size of ``grid`` (module docstring)."""
    import statistics

    import torch

    from attnres.costs import run_budget
    from attnres.runtime import pin_malloc, versions

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        pin_malloc()
    budget = (grid.budgets or (grid.tune.budget,))[0]
    measured = []
    for size in grid.sizes:
        budget_here = (size.budgets or (budget,))[0]
        cfgs = {label: make_run(grid, size, label, budget_here, grid.seeds[0]) for label in variant_labels(grid, size)}
        fns = {label: _step_fn(cfg, device) for label, cfg in cfgs.items()}
        for fn, _ in fns.values():
            for _ in range(warmup):
                fn()
        rates: dict[str, list[float]] = {label: [] for label in fns}
        labels = list(fns)
        for r in range(rounds):
            for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
                fn, tokens = fns[label]
                start = time.perf_counter()
                for _ in range(steps):
                    fn()
                rates[label].append(steps * tokens / (time.perf_counter() - start))
        for label, cfg in cfgs.items():
            tokens_per_s = statistics.median(rates[label])
            flops_per_token = run_budget(cfg).flops_per_token
            measured.append(
                {
                    "size": size.name,
                    "variant": label,
                    "residual": cfg.model.residual,
                    "n_blocks": cfg.model.n_blocks if cfg.model.residual == "block" else None,
                    "n_layer": cfg.model.n_layer,
                    "d_model": cfg.model.d_model,
                    "tokens_per_s": tokens_per_s,
                    "flops_per_s": tokens_per_s * flops_per_token,
                    "rounds": [round(x, 1) for x in rates[label]],
                }
            )
            log(f"{size.name} {label}: {tokens_per_s:,.0f} tokens/s (median of {rounds} interleaved rounds)")
    return {
        "method": f"interleaved in one process: {warmup} warm-up steps, then {rounds} rounds of {steps} steps each",
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "versions": versions(),
        "measured": measured,
    }


def write(results: str | Path, grid: Grid, data: dict[str, Any]) -> Path:
    from attnres.storage.schema import atomic_write_bytes

    path = Path(results) / grid.name / THROUGHPUT_FILE
    atomic_write_bytes(path, json.dumps(data, indent=1).encode())
    return path
