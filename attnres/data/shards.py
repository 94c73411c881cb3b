"""Token shards: flat arrays of token ids behind a 256-byte header, read as memory maps.

The header (little-endian) holds a magic string, the item size (1, 2 or 4 bytes: uint8 for bytes, uint16 up to 65,536
tokens, uint32 above), the token count and the tokenizer's hash, so a truncated shard, or one written by another
tokenizer, is caught before training instead of read as garbage. After it the tokens are a plain array, so
``np.memmap(path, dtype, offset=256)`` reads a shard with no code from this project (as nanoGPT's ``.bin`` files).
A shard is written to a temporary file and renamed into place: it is complete or absent.
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
from pathlib import Path

import numpy as np

from attnres.data.errors import DataError

MAGIC = b"ATTNTOK1"
HEADER_BYTES = 256
_LAYOUT = struct.Struct("<8sIIQ64s")


class ShardWriter:
    """Append token arrays to a new shard; :meth:`close` makes it appear at ``path`` in one rename."""

    def __init__(self, path: Path, dtype: np.dtype, tokenizer_hash: str):
        self.path, self.dtype, self.hash = Path(path), np.dtype(dtype), tokenizer_hash
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        self.file = os.fdopen(fd, "wb")
        self.file.write(b"\0" * HEADER_BYTES)
        self.tokens = 0

    def append(self, tokens: np.ndarray) -> None:
        try:
            self.file.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        except OSError as err:
            raise self._named(err) from err
        self.tokens += len(tokens)

    def close(self) -> None:
        try:
            self.file.seek(0)
            self.file.write(_LAYOUT.pack(MAGIC, self.dtype.itemsize, 0, self.tokens, self.hash.encode()))
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.chmod(self.tmp, 0o644)
            os.replace(self.tmp, self.path)
        except OSError as err:
            self.abort()
            raise self._named(err) from err

    def abort(self) -> None:
        """Remove the temporary file. Its close may fail (a full disk: the buffered tail cannot be written), and the
        file is removed all the same: a failed preparation left its ``.tmp`` shards, as large as the disk allowed."""
        with contextlib.suppress(OSError):
            self.file.close()
        Path(self.tmp).unlink(missing_ok=True)

    def _named(self, err: OSError) -> OSError:
        """A write's error with the shard it was writing named (a full disk's ENOSPC names no file)."""
        if err.filename is not None:
            return err
        return OSError(err.errno, err.strerror or str(err), str(self.path))


def read_header(path: Path) -> tuple[int, int, str]:
    """(item size, tokens, tokenizer hash) of a shard; a clear error for a missing, truncated or foreign file."""
    fix = "run the same `attnres data prepare` command again: it rebuilds missing or damaged shards"
    try:
        with open(path, "rb") as f:
            head = f.read(_LAYOUT.size)
        size = path.stat().st_size
    except FileNotFoundError:
        raise DataError(f"shard {path} is missing; {fix}") from None
    if len(head) < _LAYOUT.size or head[:8] != MAGIC:
        raise DataError(f"shard {path} is not a token shard (no {MAGIC.decode()} header); {fix}")
    _, itemsize, _, tokens, digest = _LAYOUT.unpack(head)
    if size != HEADER_BYTES + tokens * itemsize:
        raise DataError(
            f"shard {path} is truncated or damaged: {size:,} bytes, its header says "
            f"{HEADER_BYTES + tokens * itemsize:,}; {fix}"
        )
    return itemsize, tokens, digest.decode()


def open_shard(path: Path, dtype: np.dtype, tokenizer_hash: str, tokens: int | None = None) -> np.ndarray:
    """The shard's tokens as a read-only memory map, after checking it against what the manifest says."""
    itemsize, count, digest = read_header(path)
    if digest != tokenizer_hash:
        raise DataError(
            f"shard {path} was written by another tokenizer (hash {digest[:12]}, the manifest's is "
            f"{tokenizer_hash[:12]}); prepare the folder again from its source, or remove the stray shard"
        )
    if itemsize != np.dtype(dtype).itemsize or (tokens is not None and count != tokens):
        raise DataError(
            f"shard {path} holds {count:,} tokens of {itemsize} bytes, the manifest says {tokens:,} of "
            f"{np.dtype(dtype).itemsize}; prepare the folder again"
        )
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(count,))


def read_tokens(path: Path, dtype: np.dtype) -> np.ndarray:
    """A shard's tokens as a memory map, header checked but not compared with a manifest."""
    _, count, _ = read_header(path)
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(count,)) if count else np.zeros(0, dtype)


class TokenStream:
    """Several shards read as one array: ``len()`` and contiguous slices ``[a:b]`` that may span shards."""

    def __init__(self, arrays: list[np.ndarray]):
        self.arrays = [a for a in arrays if len(a)]
        self.offsets = np.cumsum([0] + [len(a) for a in self.arrays])
        self.dtype = self.arrays[0].dtype if self.arrays else np.dtype(np.uint8)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("TokenStream takes contiguous slices only")
        start, stop, _ = key.indices(len(self))
        if stop <= start:
            return np.zeros(0, dtype=self.dtype)
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        last = int(np.searchsorted(self.offsets, stop, side="left")) - 1
        if first == last:
            base = self.offsets[first]
            return self.arrays[first][start - base : stop - base]
        parts = [self.arrays[first][start - self.offsets[first] :]]
        parts += self.arrays[first + 1 : last]
        parts.append(self.arrays[last][: stop - self.offsets[last]])
        return np.concatenate(parts)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[0 : len(self)]
        return out if dtype is None else out.astype(dtype)
