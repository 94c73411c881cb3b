"""``attnres demo``: the main job (placeholder until the training, sweep, analysis and report parts land)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("demo", help="run a small baseline / Full / Block study on the built-in corpus")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print("attnres demo: coming soon (trains baseline, Full and Block AttnRes on the built-in corpus, fits, reports).")
    return 0
