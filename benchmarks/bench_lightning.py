"""Tokens/s of the Lightning training path against a plain PyTorch loop on the same model, in one process.

    python benchmarks/bench_lightning.py              # 2 threads, two model sizes, 5 rounds

Both paths train the same model on the same batches with the same optimizer, schedule and clipping. The
Lightning path is what ``attnres train`` runs (LitLM, the parquet logging callback, the progress bar), minus
evaluation and checkpoints, which the plain loop does not have. Rounds alternate the two paths and the
overhead is the median over rounds of (plain tokens/s) / (Lightning tokens/s) - 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import lightning as L
import torch

from attnres.config import resolve_run_config
from attnres.costs import run_budget
from attnres.data.corpus import TrainBatches, load_corpus
from attnres.runtime import pin_malloc
from attnres.training.module import LitLM, build_scheduler
from attnres.training.optimizer import parameter_groups
from attnres.training.run_log import RunLogger, RunRow


class _Timer(L.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        self.seconds = time.perf_counter() - self.start


def lightning_tokens_per_s(cfg, corpus, steps: int, out: Path) -> float:
    lit = LitLM(cfg, corpus, steps)
    timer = _Timer()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        max_epochs=-1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=True,
        callbacks=[RunLogger(out, RunRow(cfg, run_budget(cfg))), timer],
    )
    trainer.fit(lit)
    return steps * cfg.train.batch_size * cfg.model.seq_len / timer.seconds


def plain_tokens_per_s(cfg, corpus, steps: int) -> float:
    lit = LitLM(cfg, corpus, steps)  # the same model and initialisation; used here as a plain nn.Module
    model = lit.model
    opt = torch.optim.AdamW(
        parameter_groups(model, cfg.train.weight_decay), lr=cfg.train.lr, betas=(cfg.train.beta1, cfg.train.beta2)
    )
    sched = build_scheduler(opt, cfg, steps)
    batches = TrainBatches(corpus.train, cfg.train.batch_size, cfg.model.seq_len, cfg.train.seed, steps)
    start = time.perf_counter()
    for batch in batches:
        loss = lit.loss(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        float(loss)  # the Lightning path reads the loss every step too (progress bar, divergence check)
    return steps * cfg.train.batch_size * cfg.model.seq_len / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="64x4,128x4", help="comma list of d_model x n_layer")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pin_malloc()
    warnings.filterwarnings("ignore")
    print(
        f"threads={torch.get_num_threads()} steps={args.steps} rounds={args.rounds} torch={torch.__version__} "
        f"lightning={L.__version__}"
    )
    for size in args.sizes.split(","):
        d_model, n_layer = (int(v) for v in size.split("x"))
        cfg = resolve_run_config(
            None, [f"model.d_model={d_model}", f"model.n_layer={n_layer}", "model.seq_len=256", "train.batch_size=16"]
        )
        corpus = load_corpus(cfg.data)
        lightning, plain = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.rounds):
                lightning.append(lightning_tokens_per_s(cfg, corpus, args.steps, Path(tmp)))
                plain.append(plain_tokens_per_s(cfg, corpus, args.steps))
        overhead = statistics.median(p / q - 1 for p, q in zip(plain, lightning))
        print(
            f"d_model={d_model} n_layer={n_layer}: Lightning {statistics.median(lightning):,.0f} tok/s, "
            f"plain loop {statistics.median(plain):,.0f} tok/s, Lightning overhead {100 * overhead:+.1f} %",
            file=sys.stdout,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
