"""``attnres train [CONFIG.yaml] [key=value ...]``: one run into a run folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnres.config import help_text


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "train",
        help="train one run into a run folder (resumes or skips as needed)",
        description="Train one run. Settings: defaults < CONFIG.yaml < key=value overrides (e.g. model.n_layer=4 "
        "train.lr=3e-3). The run folder is RESULTS/<sweep>/<run_id> unless --out is given; running the same "
        "config into the same folder again resumes it, or does nothing if it is done.",
        epilog="fields (section.name: type = default):\n" + help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("items", nargs="*", metavar="CONFIG.yaml | key=value", help="a YAML config, then overrides")
    parser.add_argument("--results", help="results root (default: ./results); not with --out")
    parser.add_argument("--out", help="the run folder itself (default: RESULTS/<sweep>/<run_id>); not with --results")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def split_items(items: list[str]) -> tuple[str | None, list[str]]:
    """The optional config file comes first; everything else must be key=value."""
    from attnres.config import ConfigError

    config = None
    if items and "=" not in items[0]:
        config, items = items[0], items[1:]
    for item in items:
        if "=" not in item:
            raise ConfigError(f"{item!r} is not of the form key=value (the config file, if any, comes first)")
    return config, items


def run(args: argparse.Namespace) -> int:
    from attnres.config import ConfigError, resolve_run_config

    if args.out and args.results:  # one of them would be ignored without a word
        raise ConfigError(
            f"--out {args.out} is the run folder itself and --results {args.results} the root a run folder is made "
            "under; give one of them"
        )
    config, overrides = split_items(args.items)
    from attnres.config import apply_overrides, load_yaml
    from attnres.data.corpus import check_given_settings, with_data_vocab

    cfg = resolve_run_config(config, overrides)
    from attnres.runtime import check_slurm

    check_slurm(cfg.runtime)  # before the data is looked at (attnres.training.run.train checks it again)
    given = apply_overrides(load_yaml(config) if config else {}, overrides).get("data") or {}
    check_given_settings(cfg.data, list(given))
    cfg = with_data_vocab(cfg)  # the run id counts the data's vocabulary
    from attnres.training.run import run_dir_for, train

    run_dir = Path(args.out) if args.out else run_dir_for(cfg, args.results or "results")

    print(f"run {cfg.run_id} -> {run_dir}")
    result = train(cfg, run_dir, progress=False if args.no_progress else None)
    if not result.trained:
        why = {"done": "already done", "busy": "being trained by another process"}.get(
            result.status, f"{result.status}: global rank 0 did not train it"
        )
        print(f"nothing to do: {run_dir} is {why}")
    val = f", val_loss {result.val_loss:.4f} nats/token" if result.val_loss is not None else ""
    print(f"{result.status}: step {result.step}{val} ({run_dir})")
    return 0 if result.status in ("done", "busy") else 1
