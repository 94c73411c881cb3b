"""Prepare a corpus once: raw text in, token shards and a manifest out, streaming, in parallel, resumable.

``prepare(spec, out)`` is what ``attnres data prepare`` runs, and what a run does (cached, one worker) when its
``data.corpus`` names raw text. The steps:

1. Lock ``OUT/.prepare.lock`` (``flock``; the kernel drops it when the process dies, even by SIGKILL). A second
   preparation of the same folder waits, says for whom, and then finds the work done: concurrent DDP ranks, sweep
   workers or SLURM array tasks build a corpus exactly once.
2. Record what is being prepared (``OUT/prepare.json``: the spec and every source file's size and mtime) and refuse
   a folder that holds another preparation.
3. The tokenizer: bytes, a ``tokenizer.json`` copied in, or a BPE trained on a bounded, seeded sample and saved as
   ``OUT/tokenizer.json`` before any shard is written (a resumed preparation reuses it).
4. Each unit of input (:func:`attnres.data.sources.plan_units`) becomes ``train-NNNNN.bin`` and ``val-NNNNN.bin``
   plus ``units/NNNNN.json``, its record, written last. Units are independent, so ``workers`` processes take them in
   any order, memory stays bounded by one unit's read buffers per worker, and a killed preparation resumes at the
   units without a record.
5. ``manifest.json`` is written last, atomically: a folder with a manifest is complete.

The split: within each unit every P-th piece (P = round(1 / val_fraction)), from a seeded start, is validation.
Pieces are documents or ~chunk_bytes chunks of long ones, so the validation split holds every file and source in
the proportion the training split does, and no training window overlaps a validation piece.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnres.data import sources
from attnres.data.errors import DataError
from attnres.data.shards import ShardWriter, read_header, read_tokens
from attnres.data.tokenizer import Tokenizer, builtin_tokenizer, load_tokenizer_file, parse_spec, train_bpe
from attnres.runtime import say
from attnres.storage import locks
from attnres.storage.schema import atomic_write_bytes

FORMAT = "attnres-tokens-v1"
MANIFEST = "manifest.json"
REQUEST = "prepare.json"
TOKENIZER_FILE = "tokenizer.json"
VAL_PIECES = "val_pieces.npy"
LOCK = ".prepare.lock"
ENCODE_BATCH_BYTES = 1 << 20
SPLITS = ("train", "val")


@dataclass(frozen=True)
class PrepareSpec:
    """Everything that decides a preparation's output (its identity)."""

    source: str
    tokenizer: str = "bytes"
    text_field: str = "text"
    val_fraction: float = 0.02
    chunk_bytes: int = 8192
    split_seed: int = 1234
    unit_bytes: int = 256 << 20
    sample_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if not 0.0 < self.val_fraction < 0.5:
            raise DataError(f"val_fraction must be in (0, 0.5), got {self.val_fraction!r}")
        for name in ("chunk_bytes", "unit_bytes", "sample_bytes"):
            if getattr(self, name) < 64:
                raise DataError(f"{name} must be at least 64, got {getattr(self, name)!r}")
        parse_spec(self.tokenizer)

    @property
    def period(self) -> int:
        return max(2, round(1.0 / self.val_fraction))


def file_identity(files: list[Path]) -> list[dict[str, Any]]:
    return [{"path": str(f.resolve()), "size": f.stat().st_size, "mtime_ns": f.stat().st_mtime_ns} for f in files]


# ------------------------------------------------------------------------------------------------- tokenizer
def _sample(files: list[Path], units: list[tuple[sources.Range, ...]], spec: PrepareSpec) -> Iterator[bytes]:
    """A bounded, seeded sample for training a BPE: units in a seeded order, at most ``sample_bytes`` in all and an
    eighth of it from any one unit, so that no single file dominates a large corpus."""
    order = np.random.default_rng(spec.split_seed).permutation(len(units))
    per_unit = max(spec.chunk_bytes, spec.sample_bytes // min(8, len(units)))
    left = spec.sample_bytes
    for u in order:
        taken = 0
        for _, piece, _ in sources.unit_pieces(files, units[u], spec.text_field, spec.chunk_bytes):
            yield piece
            taken += len(piece)
            left -= len(piece)
            if left <= 0:
                return
            if taken >= per_unit:
                break


def _tokenizer(spec: PrepareSpec, out: Path, files: list[Path], units: list) -> Tokenizer:
    kind, value = parse_spec(spec.tokenizer)
    if (simple := builtin_tokenizer(spec.tokenizer)) is not None:
        return simple
    saved = out / TOKENIZER_FILE
    if saved.is_file():  # a resumed preparation: the shards already written used this one
        return load_tokenizer_file(saved, spec.tokenizer)
    if kind == "file":
        tokenizer = load_tokenizer_file(value, spec.tokenizer)
    else:
        say(f"attnres data: training a {spec.tokenizer} tokenizer on up to {spec.sample_bytes / 2**20:.0f} MiB")
        tokenizer = train_bpe(value, _sample(files, units, spec))
    atomic_write_bytes(saved, tokenizer.json.encode())
    return tokenizer


# ------------------------------------------------------------------------------------------------- one unit
def _unit_stem(index: int) -> str:
    return f"{index:05d}"


def unit_record_path(out: Path, index: int) -> Path:
    return out / "units" / f"{_unit_stem(index)}.json"


def prepare_unit(
    spec: PrepareSpec,
    out: Path,
    files: list[Path],
    unit: tuple[sources.Range, ...],
    index: int,
    tokenizer: Tokenizer,
    writer_id: str,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Tokenize one unit into its two shards and write its record; returns the record."""
    offset = int(np.random.default_rng([spec.split_seed, index]).integers(spec.period))
    writers = {s: ShardWriter(out / f"{s}-{_unit_stem(index)}.bin", tokenizer.dtype, tokenizer.hash) for s in SPLITS}
    per_file: dict[int, dict[str, int]] = {}
    val_pieces: list[list[int]] = []  # [file, start in this unit's val shard, tokens, train position it was taken at]
    counter = 0
    max_id = -1
    eot = np.array([max(tokenizer.eot_id, 0)], dtype=tokenizer.dtype)  # token files (eot -1) end no documents

    def flush(batch: list[tuple[int, bytes, bool]]) -> None:
        nonlocal counter, max_id
        n_bytes = n_tokens = 0
        for (file, piece, doc_end), ids in zip(batch, tokenizer.encode([p for _, p, _ in batch])):
            split = "val" if (counter + offset) % spec.period == 0 else "train"
            if len(ids) and (int(ids.max()) >= tokenizer.vocab_size or int(ids.min()) < 0):
                seen = sum(per_file.get(file, {}).get(f"{s}_tokens", 0) for s in SPLITS)
                bad = int(ids.max()) if int(ids.max()) >= tokenizer.vocab_size else int(ids.min())
                raise DataError(
                    f"{files[file]}: token id {bad} near token {seen:,} is outside the vocabulary of "
                    f"{tokenizer.vocab_size:,}; give the files' vocabulary size (--tokenizer tokens:<vocab>)"
                )
            ids = ids.astype(tokenizer.dtype, copy=False)
            counter += 1
            if doc_end:
                ids = np.concatenate([ids, eot])
            if split == "val":
                val_pieces.append([file, writers["val"].tokens, len(ids), writers["train"].tokens])
            writers[split].append(ids)
            if len(ids):
                max_id = max(max_id, int(ids.max()))
            stats = per_file.setdefault(file, {f"{s}_{k}": 0 for s in SPLITS for k in ("tokens", "bytes")})
            stats[f"{split}_tokens"] += len(ids)
            # text bytes behind the tokens, the end-of-text token counting as one byte; 0 for token files (unknown)
            stats[f"{split}_bytes"] += 0 if sources.is_tokens(piece) else len(piece) + doc_end
            n_bytes += piece.nbytes if sources.is_tokens(piece) else len(piece)
            n_tokens += len(ids)
        if progress is not None:
            progress(n_bytes, n_tokens)

    try:
        batch: list[tuple[int, bytes, bool]] = []
        size = 0
        for item in sources.unit_pieces(files, unit, spec.text_field, spec.chunk_bytes):
            batch.append(item)
            size += item[1].nbytes if sources.is_tokens(item[1]) else len(item[1])
            if size >= ENCODE_BATCH_BYTES:
                flush(batch)
                batch, size = [], 0
        if batch:
            flush(batch)
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    if max_id >= tokenizer.vocab_size:
        for w in writers.values():
            w.abort()
        raise DataError(f"unit {index}: token id {max_id} is not below the vocabulary size {tokenizer.vocab_size}")
    for w in writers.values():
        w.close()
    record = {
        "unit": index,
        "ranges": [dataclasses.asdict(r) for r in unit],
        "tokens": {s: writers[s].tokens for s in SPLITS},
        "files": {str(k): v for k, v in sorted(per_file.items())},
        "val_pieces": val_pieces,
        "max_token_id": max_id,
        "written_by": writer_id,
    }
    atomic_write_bytes(unit_record_path(out, index), json.dumps(record).encode())
    return record


def unit_tokens_in_order(out: Path, index: int) -> np.ndarray:
    """A unit's tokens in source order: its validation pieces put back where the split took them out (what the
    checks compare with tokenizing the unit's text in one go)."""
    record = json.loads(unit_record_path(out, index).read_text())
    dtype = np.dtype(json.loads((out / MANIFEST).read_text())["dtype"])
    train, val = (read_tokens(out / f"{split}-{_unit_stem(index)}.bin", dtype) for split in SPLITS)
    parts, at = [], 0
    for _, start, n, train_pos in record["val_pieces"]:
        parts += [train[at:train_pos], val[start : start + n]]
        at = train_pos
    parts.append(train[at:])
    return np.concatenate(parts)


def _unit_done(out: Path, index: int, tokenizer_hash: str) -> dict[str, Any] | None:
    """The unit's record, if the unit is complete and its shards are intact; None if it must be (re)built."""
    path = unit_record_path(out, index)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    for split in SPLITS:
        try:
            _, tokens, digest = read_header(out / f"{split}-{_unit_stem(index)}.bin")
        except DataError:
            return None
        if digest != tokenizer_hash or tokens != record["tokens"][split]:
            return None
    return record


# ------------------------------------------------------------------------------------------------- workers
_WORKER: dict[str, Any] = {}


def _init_worker(spec: PrepareSpec, out: Path, files: list[Path], tokenizer_json: str | None, counter: Any) -> None:
    try:  # die with the parent: a killed preparation leaves no workers writing behind the next one
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if tokenizer_json is None:
        tokenizer = builtin_tokenizer(spec.tokenizer)
    else:
        from attnres.data.tokenizer import from_json

        tokenizer = from_json(spec.tokenizer, tokenizer_json, TOKENIZER_FILE)
    _WORKER.update(spec=spec, out=out, files=files, tokenizer=tokenizer, counter=counter)


def _count(counter: Any) -> Callable[[int, int], None]:
    def add(n_bytes: int, n_tokens: int) -> None:
        with counter.get_lock():
            counter[0] += n_bytes
            counter[1] += n_tokens

    return add


def _work(job: tuple[int, tuple[sources.Range, ...], str]) -> dict[str, Any]:
    index, unit, writer_id = job
    w = _WORKER
    return prepare_unit(w["spec"], w["out"], w["files"], unit, index, w["tokenizer"], writer_id, _count(w["counter"]))


# ------------------------------------------------------------------------------------------------- the whole
def _check_request(out: Path, spec: PrepareSpec, files: list[Path]) -> bool:
    """Refuse a folder that holds another preparation; record this one's request. True if it is new here."""
    request = {"format": FORMAT, "spec": dataclasses.asdict(spec), "files": file_identity(files)}
    path = out / REQUEST
    if path.is_file():
        try:
            previous = json.loads(path.read_text())
        except ValueError:
            previous = None
        if previous != request:
            spec_then = (previous or {}).get("spec") or {}
            changed = [k for k, v in request["spec"].items() if spec_then.get(k) != v]
            if changed:
                what = "other settings (" + ", ".join(f"{k} was {spec_then.get(k)!r}" for k in changed) + ")"
            else:
                what = "the same source as it was before its files changed"
            raise DataError(f"{out} holds a preparation with {what}; prepare into another folder (--out) or delete it")
        return False
    if out.exists() and any(p.name not in (LOCK,) for p in out.iterdir()):
        raise DataError(f"{out} is not empty and holds no preparation; prepare into an empty or new folder (--out)")
    atomic_write_bytes(path, json.dumps(request, indent=1).encode())
    return True


def is_prepared(out: Path) -> bool:
    return (Path(out) / MANIFEST).is_file()


def prepare(
    spec: PrepareSpec, out: Path, workers: int = 1, progress: bool | None = None, label: str = "data.corpus"
) -> Path:
    """Prepare ``spec`` into ``out`` (once; resuming what a killed preparation left) and return ``out``."""
    if workers < 1:
        raise DataError(f"--workers must be at least 1, got {workers}")
    out = Path(out)
    files = sources.source_files(spec.source, label)
    if (sources.kind_of(files[0]) == "tokens") != (parse_spec(spec.tokenizer)[0] == "tokens"):
        raise DataError(
            f"{label}={spec.source!r}: token files (.bin, .npy) take the tokenizer tokens:<vocab> (their vocabulary "
            "size), and only they do"
        )
    made = [p for p in (out, *out.parents) if not p.exists()]  # the folders this call creates
    out.mkdir(parents=True, exist_ok=True)
    try:
        with locks.exclusive(
            out / LOCK, wait=lambda who: say(f"attnres data: waiting for {out}, being prepared by {who}")
        ):
            new = _check_request(out, spec, files)
            try:
                _prepare_locked(spec, out, files, workers, progress, label)
            except DataError:
                # Bad input found part way (a truncated .gz, a null row): fixing it changes the files, and then this
                # folder's request no longer matches them, so what this call began is of no use; remove it, so that
                # the error leaves nothing behind. A folder it resumed, or Ctrl-C, keeps its work.
                if new:
                    _empty_folder(out)
                raise
    except DataError:
        if made and not any(p.name != LOCK for p in out.iterdir()):
            (out / LOCK).unlink(missing_ok=True)
            for folder in made:
                with contextlib.suppress(OSError):
                    folder.rmdir()
        raise
    except OSError as err:
        if err.filename is None and err.errno is not None:  # a full disk names no file: name the folder at least
            raise OSError(err.errno, err.strerror or str(err), str(out)) from err
        raise
    return out


def _empty_folder(out: Path) -> None:
    """Remove everything in ``out`` but its lock (held by this process)."""
    for entry in out.iterdir():
        if entry.name == LOCK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _prepare_locked(spec: PrepareSpec, out: Path, files: list[Path], workers: int, progress, label: str) -> None:
    """The preparation itself, with ``out``'s lock held and its request recorded."""
    units = sources.plan_units(files, spec.unit_bytes)
    if is_prepared(out):
        digest = json.loads((out / MANIFEST).read_text())["tokenizer"]["hash"]
        if all(_unit_done(out, i, digest) is not None for i in range(len(units))):
            return
        say(f"attnres data: {out} has missing or damaged shards; rebuilding them")
        (out / MANIFEST).unlink()
    for stale in [*out.glob(".*.tmp"), *out.glob("units/.*.tmp")]:  # a killed preparation's; we hold the lock
        stale.unlink(missing_ok=True)
    tokenizer = _tokenizer(spec, out, files, units)
    records: dict[int, dict[str, Any]] = {}
    for i in range(len(units)):
        if (record := _unit_done(out, i, tokenizer.hash)) is not None:
            records[i] = record
    todo = [i for i in range(len(units)) if i not in records]
    writer_id = f"pid {os.getpid()} on {socket.gethostname()}"
    total = sum(sum(files[r.index].stat().st_size for r in units[i]) for i in todo)
    if todo:
        records.update(_run_units(spec, out, files, units, todo, tokenizer, writer_id, workers, total, progress))
    _write_manifest(spec, out, files, units, records, tokenizer, label)


def _run_units(spec, out, files, units, todo, tokenizer, writer_id, workers, total, progress) -> dict:
    from attnres.data.progress import PrepareProgress

    done: dict[int, dict[str, Any]] = {}
    bar = PrepareProgress(total, len(todo), len(units) - len(todo), progress)
    if workers == 1 or len(todo) == 1:
        for i in todo:
            done[i] = prepare_unit(spec, out, files, units[i], i, tokenizer, writer_id, bar.add_bytes)
            bar.unit_done(done[i])
        bar.close()
        return done
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # no fork after torch or threads; workers rebuild the tokenizer from its json
    counter = ctx.Array("q", 2)  # bytes read, tokens written: the workers' progress
    args = (spec, out, files, tokenizer.json, counter)
    # a Pool, not a ProcessPoolExecutor: leaving the block on an error or Ctrl-C terminates the workers at once
    # instead of waiting for their units (a unit's temporary files are cleaned up by the next preparation)
    with ctx.Pool(min(workers, len(todo)), initializer=_init_worker, initargs=args) as pool:
        results = pool.imap_unordered(_work, [(i, units[i], writer_id) for i in todo])
        while len(done) < len(todo):
            try:
                record = results.next(timeout=0.5)
            except mp.TimeoutError:
                bar.set(counter[0], counter[1])
                continue
            bar.set(counter[0], counter[1])
            done[record["unit"]] = record
            bar.unit_done(record)
    bar.close()
    return done


def _write_manifest(spec, out, files, units, records, tokenizer, label) -> None:
    per_file = [dict(f, **{f"{s}_{k}": 0 for s in SPLITS for k in ("tokens", "bytes")}) for f in file_identity(files)]
    shards: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    val_pieces = []
    val_start = 0
    for i in range(len(units)):
        record = records[i]
        unit_bytes: dict[str, int] = {s: 0 for s in SPLITS}
        for file, stats in record["files"].items():
            for key, value in stats.items():
                per_file[int(file)][key] += value
            for s in SPLITS:
                unit_bytes[s] += stats[f"{s}_bytes"]
        for s in SPLITS:
            shards[s].append(
                {"file": f"{s}-{_unit_stem(i)}.bin", "tokens": record["tokens"][s], "bytes": unit_bytes[s]}
            )
        val_pieces += [[file, val_start + start, n] for file, start, n, _ in record["val_pieces"]]
        val_start += record["tokens"]["val"]
    for s in SPLITS:
        if sum(x["tokens"] for x in shards[s]) == 0:
            raise DataError(
                f"{label}={spec.source!r} gives no {s} tokens (too little text for val_fraction="
                f"{spec.val_fraction} of {spec.chunk_bytes}-byte chunks); use more text or smaller chunks"
            )
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(val_pieces, dtype=np.int64).reshape(-1, 3))
    atomic_write_bytes(out / VAL_PIECES, buffer.getvalue())
    kind, _ = parse_spec(spec.tokenizer)
    manifest = {
        "format": FORMAT,
        "source": spec.source,
        "tokenizer": {
            "spec": spec.tokenizer,
            "hash": tokenizer.hash,
            "file": None if kind == "bytes" else TOKENIZER_FILE,
        },
        "vocab_size": tokenizer.vocab_size,
        "eot_id": tokenizer.eot_id,
        "dtype": tokenizer.dtype.name,
        "text_field": spec.text_field,
        "split": {
            "rule": "every P-th piece of each unit from a seeded start is validation, P = round(1 / val_fraction)",
            "val_fraction": spec.val_fraction,
            "chunk_bytes": spec.chunk_bytes,
            "split_seed": spec.split_seed,
            "unit_bytes": spec.unit_bytes,
        },
        "splits": {
            s: {
                "tokens": sum(x["tokens"] for x in shards[s]),
                "bytes": sum(x["bytes"] for x in shards[s]),
                "shards": shards[s],
            }
            for s in SPLITS
        },
        "files": per_file,
        "max_token_id": max(r["max_token_id"] for r in records.values()),
    }
    atomic_write_bytes(out / MANIFEST, json.dumps(manifest, indent=1).encode())
