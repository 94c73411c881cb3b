"""Extra evaluation sets (``data.eval_sets``): other prepared folders whose validation split a run evaluates beside
its own, so runs trained on different data, or on one corpus, can be compared on a common held-out text.

A set is read exactly as the run's own validation split is (the same evenly spread windows, the same
``train.eval_tokens``), so naming a folder as an evaluation set gives the loss the run would report if it trained
on that folder. Every check that would fail mid-run is made when the sets are opened, before any compute: the
folder is prepared, its tokenizer is the training data's (same hash, same vocabulary), and its validation split
holds at least one window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from attnres.data.corpus import EvalSet, bytes_per_token, read_manifest
from attnres.data.errors import DataError
from attnres.data.prepare import MANIFEST
from attnres.data.shards import TokenStream, open_shard


def parse_eval_sets(items: tuple[str, ...]) -> list[tuple[str, Path]]:
    """``NAME=FOLDER`` items (checked by :class:`attnres.config.DataConfig`) as (name, folder) pairs."""
    return [(name, Path(folder).expanduser()) for name, _, folder in (item.partition("=") for item in items)]


def open_eval_sets(
    items: tuple[str, ...], train_folder: Path, train_manifest: dict[str, Any], seq_len: int
) -> dict[str, EvalSet]:
    """The sets ``items`` names, each checked against the training data (its prepared folder and manifest)."""
    tokenizer, vocab_size = train_manifest["tokenizer"], int(train_manifest["vocab_size"])
    same = str(train_folder / tokenizer["file"]) if tokenizer.get("file") else tokenizer["spec"]
    sets = {}
    for name, folder in parse_eval_sets(items):
        where = f"data.eval_sets {name}={folder}"
        if not (folder / MANIFEST).is_file():
            raise DataError(
                f"{where}: not a prepared folder (no {MANIFEST}); make it with `attnres data prepare SOURCE --out "
                f"{folder} --tokenizer {same}`"
            )
        manifest = read_manifest(folder)
        theirs = manifest["tokenizer"]
        if theirs["hash"] != tokenizer["hash"] or int(manifest["vocab_size"]) != vocab_size:
            raise DataError(
                f"{where}: prepared with tokenizer {theirs['spec']!r} (hash {theirs['hash'][:12]}, vocabulary "
                f"{int(manifest['vocab_size']):,}), but the run's data uses {tokenizer['spec']!r} (hash "
                f"{tokenizer['hash'][:12]}, vocabulary {vocab_size:,}); prepare it again with --tokenizer {same}"
            )
        shards = manifest["splits"]["val"]["shards"]
        stream = TokenStream(
            [open_shard(folder / s["file"], np.dtype(manifest["dtype"]), theirs["hash"], s["tokens"]) for s in shards]
        )
        if len(stream) < seq_len + 1:
            raise DataError(
                f"{where}: its validation split holds {len(stream):,} tokens, fewer than one window of "
                f"model.seq_len + 1 = {seq_len + 1}; prepare it with more text or a larger --val-fraction"
            )
        sets[name] = EvalSet(name, folder, stream, bytes_per_token(manifest, "val"))
    return sets
