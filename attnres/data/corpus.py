"""The tokens a run trains and validates on: a prepared folder read as memory maps, batches, validation windows.

* ``data.corpus`` names raw text (``builtin``, a file, folder or glob) or a folder made by ``attnres data prepare``.
  Raw text is prepared once (:mod:`attnres.data.prepare`) into a cache folder (``$ATTNRES_CACHE_DIR`` or
  ``~/.cache/attnres``) keyed by the source files, the tokenizer and the split; every later run, DDP rank and sweep
  worker reads that folder, and concurrent first runs build it once.
* Training batches are a pure function of (seed, step) in either order of ``train.sampler``
  (:mod:`attnres.data.order`): a run resumed at step s sees exactly the batches an uninterrupted run sees, on any
  number of devices (each rank takes its rows of the global batch).
* The validation windows are spread evenly over the whole validation split (not its first tokens), so they cover
  every source in the proportion the split holds them; :meth:`Corpus.composition` says which.
* ``val_bpb`` divides the loss by the validation split's bytes per token, from the manifest (1 for bytes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from attnres.config import DataConfig, ModelConfig, RunConfig
from attnres.data import sources
from attnres.data.errors import DataError
from attnres.data.order import batch_starts
from attnres.data.prepare import FORMAT, MANIFEST, REQUEST, VAL_PIECES, PrepareSpec, file_identity, prepare
from attnres.data.shards import TokenStream, open_shard
from attnres.data.tokenizer import parse_spec, vocab_size_of


def cache_dir() -> Path:
    return Path(os.environ.get("ATTNRES_CACHE_DIR") or Path.home() / ".cache" / "attnres")


def is_prepared_folder(corpus: str) -> bool:
    path = Path(corpus).expanduser()
    return corpus != "builtin" and path.is_dir() and ((path / MANIFEST).is_file() or (path / REQUEST).is_file())


def prepare_spec(cfg: DataConfig) -> PrepareSpec:
    return PrepareSpec(
        source=cfg.corpus,
        tokenizer=cfg.tokenizer,
        text_field=cfg.text_field,
        val_fraction=cfg.val_fraction,
        chunk_bytes=cfg.chunk_bytes,
        split_seed=cfg.split_seed,
    )


def cached_folder(cfg: DataConfig) -> Path:
    """Where raw text named by ``cfg`` is prepared: a cache folder keyed by its files, tokenizer and split."""
    spec = prepare_spec(cfg)
    identity = {
        "format": FORMAT,
        "spec": dataclasses.asdict(spec),
        "files": file_identity(sources.source_files(spec.source)),
    }
    kind, value = parse_spec(cfg.tokenizer)  # "bytes" is a spec even where a file of that name exists
    if kind == "file":  # the tokenizer's content, not just its path
        identity["tokenizer_sha256"] = hashlib.sha256(value.read_bytes()).hexdigest()
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "tokens" / key


def corpus_folder(cfg: DataConfig) -> Path:
    """The prepared folder a run reads, preparing raw text first if it has not been."""
    if is_prepared_folder(cfg.corpus):
        folder = Path(cfg.corpus).expanduser()
        if not (folder / MANIFEST).is_file():
            raise DataError(
                f"data.corpus={cfg.corpus!r}: its preparation did not finish (no {MANIFEST}); run the same "
                "`attnres data prepare` command again to resume it"
            )
        return folder
    # Always through prepare: under its lock it returns at once when every shard is intact, rebuilds the damaged
    # ones (a cache folder has no command of its own to rerun), and waits for a preparation in another process.
    return prepare(prepare_spec(cfg), cached_folder(cfg))


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"{path} cannot be read ({err}); prepare the folder again") from None
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path} is format {manifest.get('format')!r}, this version reads {FORMAT!r}; prepare again")
    return manifest


@dataclass(frozen=True)
class EvalSet:
    """A named extra evaluation set (``data.eval_sets``, :mod:`attnres.data.eval_sets`): a prepared folder's
    validation split."""

    name: str
    folder: Path
    tokens: TokenStream
    bytes_per_token: float  # of its validation split (nan for token files)


@dataclass(frozen=True)
class Corpus:
    """The train and validation token streams of a prepared folder, and what its manifest says about them."""

    train: TokenStream
    val: TokenStream
    folder: Path
    manifest: dict[str, Any]
    val_pieces: np.ndarray = field(repr=False)  # (n, 3): source file index, start in the val stream, tokens
    eval_sets: dict[str, EvalSet] = field(default_factory=dict)  # name -> extra evaluation set, in config order

    @property
    def key(self) -> str:
        return self.folder.name

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f["path"] for f in self.manifest["files"])

    @property
    def val_bytes_per_token(self) -> float:
        return bytes_per_token(self.manifest, "val")

    def composition(self, windows_starts: np.ndarray | None = None) -> dict[str, Any]:
        """Each source file's share of the training split, the validation split and (given their starts) the
        evaluation windows: what a run folder records about its data."""
        names = [Path(f["path"]).name for f in self.manifest["files"]]
        train = np.array([f["train_tokens"] for f in self.manifest["files"]], dtype=float)
        val = np.array([f["val_tokens"] for f in self.manifest["files"]], dtype=float)
        out: dict[str, Any] = {
            name: {"train_share": t / train.sum(), "val_share": v / val.sum()} for name, t, v in zip(names, train, val)
        }
        if windows_starts is not None and len(self.val_pieces):
            piece = np.searchsorted(self.val_pieces[:, 1], windows_starts, side="right") - 1
            counts = np.bincount(self.val_pieces[piece, 0], minlength=len(names))
            for name, c in zip(names, counts):
                out[name]["eval_window_share"] = c / len(windows_starts)
        return out


def load_corpus(cfg: DataConfig) -> Corpus:
    """The prepared corpus ``cfg`` names (preparing raw text once), every shard checked against the manifest."""
    folder = corpus_folder(cfg)
    manifest = read_manifest(folder)
    if is_prepared_folder(cfg.corpus):
        _check_settings(cfg, manifest, folder)
    dtype = np.dtype(manifest["dtype"])
    digest = manifest["tokenizer"]["hash"]
    streams = {
        split: TokenStream(
            [open_shard(folder / s["file"], dtype, digest, s["tokens"]) for s in manifest["splits"][split]["shards"]]
        )
        for split in ("train", "val")
    }
    try:
        pieces = np.load(folder / VAL_PIECES)
    except (OSError, ValueError) as err:
        raise DataError(f"{folder / VAL_PIECES} cannot be read ({err}); prepare the folder again") from None
    return Corpus(streams["train"], streams["val"], folder, manifest, pieces)


def check_given_settings(cfg: DataConfig, given: Collection[str]) -> None:
    """The data settings a user wrote (``given``: their names, e.g. from ``data.tokenizer=bytes``) checked against
    the prepared folder ``cfg`` names, even where they equal the defaults: ``data.tokenizer=bytes`` on a BPE folder
    asks for bytes, and would otherwise train on BPE tokens without a word."""
    folder = Path(cfg.corpus).expanduser()
    if given and is_prepared_folder(cfg.corpus) and (folder / MANIFEST).is_file():
        _check_settings(cfg, read_manifest(folder), folder, given)


def _check_settings(cfg: DataConfig, manifest: dict[str, Any], folder: Path, given: Collection[str] = ()) -> None:
    """A prepared folder carries its own tokenizer and split: a run config that asks for other ones is told so (a
    setting at its default counts as asked for only when it is in ``given``)."""
    defaults = DataConfig()
    theirs = {"tokenizer": manifest["tokenizer"]["spec"], "text_field": manifest["text_field"], **manifest["split"]}
    for name in ("tokenizer", "text_field", "val_fraction", "chunk_bytes", "split_seed"):
        mine = getattr(cfg, name)
        if (mine != getattr(defaults, name) or name in given) and mine != theirs[name]:
            raise DataError(
                f"data.{name}={mine!r}, but {folder} was prepared with {theirs[name]!r}; drop data.{name} (a prepared "
                "folder brings its own) or prepare the source again with it"
            )


def check_run_data(cfg: RunConfig, corpus: Corpus) -> None:
    """Everything about the data that would fail mid-run, checked before any compute."""
    m, t = cfg.model, cfg.train
    if m.vocab_size != corpus.vocab_size:
        raise DataError(
            f"model.vocab_size={m.vocab_size}, but the data's vocabulary is {corpus.vocab_size:,} ({corpus.folder}); "
            "leave model.vocab_size at its default (the data sets it) or set it to the data's"
        )
    if len(corpus.val) < m.seq_len + 1:
        raise DataError(
            f"model.seq_len={m.seq_len} is longer than the validation split ({len(corpus.val):,} tokens); "
            "lower model.seq_len or raise data.val_fraction"
        )
    if len(corpus.train) < m.seq_len + 1:
        raise DataError(f"model.seq_len={m.seq_len} is longer than the training split ({len(corpus.train):,} tokens)")
    if t.eval_tokens < m.seq_len:
        raise DataError(f"train.eval_tokens={t.eval_tokens} is shorter than one sequence (model.seq_len={m.seq_len})")


@cache
def data_vocab_size(cfg: DataConfig) -> int | None:
    """The vocabulary of the data ``cfg`` names, known without preparing it: the manifest's for a prepared folder,
    the tokenizer's for raw text; None for a corpus that is not on this machine (a cluster path in a plan) with the
    default tokenizer, which could be a prepared folder of any vocabulary."""
    path = Path(cfg.corpus).expanduser()
    if is_prepared_folder(cfg.corpus):
        if (path / MANIFEST).is_file():
            return int(read_manifest(path)["vocab_size"])
    elif cfg.corpus != "builtin" and not path.exists() and not sources.is_glob(cfg.corpus):
        if cfg.tokenizer == DataConfig.tokenizer:
            return None
    return vocab_size_of(cfg.tokenizer)


def with_data_vocab(cfg: RunConfig) -> RunConfig:
    """``cfg`` with model.vocab_size set from the data when it is left at its default (256); any other value must
    equal the data's. Parameter and FLOP counts then use the real vocabulary."""
    vocab = data_vocab_size(cfg.data)
    if vocab is None or cfg.model.vocab_size == vocab:  # unknown here: the run checks it against the data
        return cfg
    if cfg.model.vocab_size != ModelConfig.vocab_size:
        where = cfg.data.corpus if is_prepared_folder(cfg.data.corpus) else f"data.tokenizer={cfg.data.tokenizer!r}"
        raise DataError(
            f"model.vocab_size={cfg.model.vocab_size}, but the data's vocabulary is {vocab:,} ({where}); leave "
            "model.vocab_size at its default (the data sets it) or set it to the data's"
        )
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab))


class TrainBatches:
    """Global batch of step s = ``batch_size`` windows of the split, in the order of ``sampler``
    (:mod:`attnres.data.order`: drawn with ``PCG64([seed, s])``, or each window slot once per epoch).

    An iterable from ``step`` to ``steps``. It has deliberately no ``state_dict``: its position counts
    fetched batches (Lightning prefetches, and a checkpoint may be taken mid-step), so a resumed run sets
    ``step`` from the restored global step instead (``LitLM.train_dataloader``). Rank r of w takes rows
    r, r + w, ... of each global batch; with ``micro`` (the micro-batch size) it yields them in consecutive
    micro-batches of that many rows, which gradient accumulation sums back into the step's batch.
    """

    def __init__(
        self,
        tokens: Any,
        batch_size: int,
        seq_len: int,
        seed: int,
        steps: int,
        rank: int = 0,
        world: int = 1,
        micro: int | None = None,
        sampler: str = "replacement",
    ):
        if batch_size % world:
            raise DataError(f"train.batch_size={batch_size} is not divisible by the {world} devices in use")
        per_device = batch_size // world
        self.micro = micro or per_device
        if per_device % self.micro:
            raise DataError(
                f"train.micro_batch_size={micro} does not divide the per-device batch (train.batch_size={batch_size} "
                f"over {world} device(s) = {per_device}); pick a divisor of {per_device}"
            )
        self.tokens, self.batch_size, self.seq_len, self.seed = tokens, batch_size, seq_len, seed
        self.steps, self.rank, self.world, self.sampler = steps, rank, world, sampler
        self.accumulate = per_device // self.micro
        self.step = 0

    def batch(self, step: int) -> np.ndarray:
        starts = batch_starts(self.sampler, len(self.tokens), self.seq_len, self.batch_size, self.seed, step)
        starts = starts[self.rank :: self.world]
        return np.stack([self.tokens[s : s + self.seq_len + 1] for s in starts]).astype(np.int64)

    def __len__(self) -> int:
        return self.steps * self.accumulate

    def __iter__(self) -> Iterator:
        import torch

        while self.step < self.steps:
            batch = torch.from_numpy(self.batch(self.step))
            self.step += 1
            yield from batch.split(self.micro)


def val_starts(n_tokens: int, seq_len: int, max_tokens: int) -> np.ndarray:
    """Starts of the validation windows: up to ``max_tokens // seq_len`` windows of seq_len + 1 tokens spread
    evenly over the whole split (they never overlap by more than the one token a window predicts last)."""
    n = min((n_tokens - 1) // seq_len, max(1, max_tokens // seq_len))
    if n <= 1:
        return np.zeros(1, dtype=np.int64)
    span = n_tokens - seq_len - 1
    return (np.arange(n, dtype=np.int64) * span) // (n - 1)


def val_windows(tokens: Any, seq_len: int, max_tokens: int) -> np.ndarray:
    """The fixed validation set: the windows of :func:`val_starts`."""
    starts = val_starts(len(tokens), seq_len, max_tokens)
    return np.stack([np.asarray(tokens[s : s + seq_len + 1]) for s in starts]).astype(np.int64)


def bytes_per_token(manifest: dict[str, Any], split: str) -> float:
    """Bytes of text per token in a split; nan for token files, whose text is not known."""
    counts = manifest["splits"][split]
    return counts["bytes"] / counts["tokens"] if counts["bytes"] else math.nan


def bits_per_byte(loss_nats: float, bytes_per_token: float) -> float:
    """Nats per token to bits per byte of text, with the split's bytes per token."""
    return loss_nats / math.log(2.0) / bytes_per_token
