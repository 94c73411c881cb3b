"""Whole training runs of baseline and Block AttnRes through `attnres train`, and their tokens/s side by side.

    python benchmarks/train_side_by_side.py --accelerator gpu model.d_model=1024 model.n_layer=16 \
        model.n_head=16 model.seq_len=1024 train.batch_size=16 train.tokens=2000000 runtime.compile=true

Where ``bench_step.py`` times one step of bare models, this runs what a sweep runs (the Lightning module, its
data, logging and checkpoints), one variant after the other, each in its own process and folder, and compares
the training throughput each logged over the second half of its run (compiled and warm by then). Runs are
sequential, not interleaved, so on a shared, noisy CPU prefer ``bench_step.py``; on a GPU of one's own this is the
end-to-end check. Extra arguments are ``key=value`` config overrides for every variant (``attnres train --help``),
checked for every variant before the first one trains.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from attnres.config import ConfigError, resolve_run_config
from attnres.variants import Variant


def variant_overrides(name: str) -> list[str]:
    main = Variant.parse_main(name)  # main() checked the name
    residual, n_blocks = main.name, main.n_blocks
    return [f"model.residual={residual}"] + ([] if n_blocks is None else [f"model.n_blocks={n_blocks}"])


def train_rate(run_dir: Path) -> tuple[pd.Series, float]:
    """The run's row and the median tokens/s of its second half of logged intervals."""
    run = pd.read_parquet(run_dir / "run.parquet").iloc[0]
    logged = pd.read_parquet(run_dir / "metrics.parquet").query("split == 'train'").tokens_per_s.dropna()
    return run, float(logged.iloc[len(logged) // 2 :].median())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="baseline,block8", help="comma list; the first is the reference")
    parser.add_argument("--accelerator", default="auto", choices=("auto", "cpu", "gpu"))
    parser.add_argument("--out", help="folder for the runs (default: a temporary one, removed at the end)")
    args, overrides = parser.parse_known_args(argv)
    variants = args.variants.split(",")
    for name in variants:
        if Variant.parse_main(name) is None:
            parser.error(f"--variants: {name!r} is not baseline, full or blockN (e.g. block8)")
    # one evaluation, at the end; the caller's overrides may change these, the variant's come last
    common = [
        "train.eval_interval=1000000000",
        "train.log_interval=5",
        f"runtime.accelerator={args.accelerator}",
        *overrides,
    ]
    for name in variants:  # every variant's config is checked before the first one trains
        try:
            resolve_run_config(None, [*common, *variant_overrides(name)])
        except ConfigError as err:
            parser.error(f"{name}: {err}")

    with tempfile.TemporaryDirectory(prefix="attnres-side-by-side-") as tmp:
        root = Path(args.out or tmp)
        rates = {}
        for name in variants:
            cmd = [
                sys.executable,
                "-m",
                "attnres.cli",
                "train",
                *common,
                *variant_overrides(name),
                "--no-progress",
                "--out",
                str(root / name),
            ]
            done = subprocess.run(cmd)
            if done.returncode != 0:
                print(f"{name}: attnres train failed (exit {done.returncode}): {' '.join(cmd)}", file=sys.stderr)
                return 1
            run, rates[name] = train_rate(root / name)
            print(
                f"{name:>10}: {run.status}, step {run.step}, val_loss {run.val_loss:.4f}, {run.precision} on "
                f"{run.device}, "
                f"{rates[name]:,.0f} tokens/s"
            )
        reference = variants[0]
        for name in variants[1:]:
            print(f"{name} step time / {reference}'s: {rates[reference] / rates[name]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
