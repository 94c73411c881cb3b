"""Training text as byte tokens: the built-in corpus or the user's files, a fixed split, cached memory maps.

* Tokens are bytes (vocabulary 256): no tokenizer to download or train, and bits per byte is just the loss in
  bits. A user points ``data.corpus`` at a text file or a folder of ``.txt`` files instead of the built-in
  KJV Bible + Shakespeare (``attnres/data/builtin/``, public domain, see PROVENANCE.md there).
* The validation split is a fixed, seeded set of contiguous chunks (``data.chunk_tokens`` each), never a
  byte-level shuffle, so no training window overlaps a validation window.
* The split is written once as two uint8 files in a cache folder (``$ATTNRES_CACHE_DIR`` or
  ``~/.cache/attnres``) keyed by the corpus and the split settings, and read back as memory maps.
* Training batches are a pure function of (seed, step): a run resumed at step s sees exactly the batches an
  uninterrupted run sees, on any number of devices (each rank takes its rows of the global batch).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from attnres.config import ConfigError, DataConfig, RunConfig
from attnres.storage.schema import atomic_write_bytes

BUILTIN = ("kjv.txt.gz", "shakespeare.txt.gz")
TOKENIZER = "bytes-v1"  # part of the cache key: change it if the tokenization ever changes


def cache_dir() -> Path:
    return Path(os.environ.get("ATTNRES_CACHE_DIR") or Path.home() / ".cache" / "attnres")


def corpus_files(corpus: str) -> list[Path]:
    """The files a ``data.corpus`` value names, in a fixed order; a clear error if there are none."""
    if corpus == "builtin":
        root = resources.files("attnres.data") / "builtin"
        return [Path(str(root / name)) for name in BUILTIN]
    path = Path(corpus).expanduser()
    if not path.exists():
        raise ConfigError(f"data.corpus={corpus!r} does not exist; use 'builtin' or a path to a text file or folder")
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise ConfigError(f"data.corpus={corpus!r} is a folder with no .txt files in it")
    if sum(f.stat().st_size for f in files) == 0:
        raise ConfigError(f"data.corpus={corpus!r} holds no text (every file is empty)")
    return files


def read_text_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def _split_key(cfg: DataConfig, files: list[Path]) -> str:
    identity = {
        "tokenizer": TOKENIZER,
        "files": [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files],
        "val_fraction": cfg.val_fraction,
        "chunk_tokens": cfg.chunk_tokens,
        "split_seed": cfg.split_seed,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def split_chunks(n_tokens: int, cfg: DataConfig) -> np.ndarray:
    """Indices of the validation chunks: a seeded choice of ``val_fraction`` of the whole chunks."""
    n_chunks = n_tokens // cfg.chunk_tokens
    if n_chunks < 2:
        raise ConfigError(
            f"data.corpus has {n_tokens:,} tokens, fewer than two chunks of data.chunk_tokens={cfg.chunk_tokens:,}; "
            "lower data.chunk_tokens or use a larger corpus"
        )
    n_val = min(n_chunks - 1, max(1, round(cfg.val_fraction * n_chunks)))
    return np.sort(np.random.default_rng(cfg.split_seed).choice(n_chunks, size=n_val, replace=False))


@dataclass(frozen=True)
class Corpus:
    """The train and validation token arrays (read-only memory maps) and where they came from."""

    train: np.ndarray
    val: np.ndarray
    key: str
    files: tuple[str, ...]


def load_corpus(cfg: DataConfig) -> Corpus:
    """Build the split once (cached), then memory-map it."""
    files = corpus_files(cfg.corpus)
    key = _split_key(cfg, files)
    folder = cache_dir() / "tokens" / key
    train_path, val_path = folder / "train.u8", folder / "val.u8"
    if not (train_path.exists() and val_path.exists()):
        tokens = np.frombuffer(b"\n\n".join(read_text_bytes(f) for f in files), dtype=np.uint8)
        val_chunks = split_chunks(len(tokens), cfg)
        is_val = np.zeros(len(tokens), dtype=bool)
        for c in val_chunks:
            is_val[c * cfg.chunk_tokens : (c + 1) * cfg.chunk_tokens] = True
        atomic_write_bytes(train_path, tokens[~is_val].tobytes())
        atomic_write_bytes(val_path, tokens[is_val].tobytes())
        atomic_write_bytes(folder / "source.json", json.dumps({"files": [str(f) for f in files]}).encode())
    return Corpus(
        train=np.memmap(train_path, dtype=np.uint8, mode="r"),
        val=np.memmap(val_path, dtype=np.uint8, mode="r"),
        key=key,
        files=tuple(str(f) for f in files),
    )


def check_run_data(cfg: RunConfig, corpus: Corpus) -> None:
    """Everything about the data that would fail mid-run, checked before any compute."""
    m, t = cfg.model, cfg.train
    if m.vocab_size < 256:
        raise ConfigError(f"model.vocab_size={m.vocab_size} is too small for byte tokens; use 256 (or more)")
    if len(corpus.val) < m.seq_len + 1:
        raise ConfigError(
            f"model.seq_len={m.seq_len} is longer than the validation split ({len(corpus.val):,} tokens); "
            "lower model.seq_len or raise data.val_fraction / data.chunk_tokens"
        )
    if len(corpus.train) < m.seq_len + 1:
        raise ConfigError(f"model.seq_len={m.seq_len} is longer than the training split ({len(corpus.train):,} tokens)")
    if t.eval_tokens < m.seq_len:
        raise ConfigError(f"train.eval_tokens={t.eval_tokens} is shorter than one sequence (model.seq_len={m.seq_len})")


class TrainBatches:
    """Global batch of step s = ``batch_size`` random windows drawn with ``PCG64([seed, s])``.

    An iterable from ``step`` to ``steps``. It has deliberately no ``state_dict``: its position counts
    fetched batches (Lightning prefetches, and a checkpoint may be taken mid-step), so a resumed run sets
    ``step`` from the restored global step instead (``LitLM.train_dataloader``). Rank r of w takes rows
    r, r + w, ... of each global batch.
    """

    def __init__(
        self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, steps: int, rank: int = 0, world: int = 1
    ):
        if batch_size % world:
            raise ConfigError(f"train.batch_size={batch_size} is not divisible by the {world} devices in use")
        self.tokens, self.batch_size, self.seq_len, self.seed = tokens, batch_size, seq_len, seed
        self.steps, self.rank, self.world = steps, rank, world
        self.step = 0

    def batch(self, step: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64([self.seed, step]))
        starts = rng.integers(0, len(self.tokens) - self.seq_len - 1, size=self.batch_size, endpoint=True)
        starts = starts[self.rank :: self.world]
        return np.stack([self.tokens[s : s + self.seq_len + 1] for s in starts]).astype(np.int64)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator:
        import torch

        while self.step < self.steps:
            batch = torch.from_numpy(self.batch(self.step))
            self.step += 1
            yield batch


def val_windows(tokens: np.ndarray, seq_len: int, max_tokens: int) -> np.ndarray:
    """The fixed validation set: consecutive windows of seq_len + 1 tokens (stride seq_len), up to max_tokens."""
    n = min((len(tokens) - 1) // seq_len, max(1, max_tokens // seq_len))
    return np.stack([np.asarray(tokens[i * seq_len : i * seq_len + seq_len + 1]) for i in range(n)]).astype(np.int64)
