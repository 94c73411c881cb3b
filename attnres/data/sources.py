"""Raw text sources, read as a stream of pieces: which files a SOURCE names, how they are cut into units of work, and
the pieces (documents, or chunks of long ones) each unit yields.

* A SOURCE is ``builtin``, a file, a folder (searched recursively) or a glob, of ``.txt`` / ``.txt.gz`` (each file
  one document), ``.jsonl`` / ``.jsonl.gz`` (one document per line, in a text field) and ``.parquet`` (one document
  per row of a text column, read in row-group batches).
* A **unit** is what one worker prepares into one shard per split: consecutive files up to ``unit_bytes`` of input
  together, and a plain ``.txt`` file larger than that cut into ranges at safe line breaks. The plan depends only
  on the files' sizes, so a resumed preparation cuts the same units.
* A **piece** is a document, or a chunk of about ``chunk_bytes`` of a longer one. Chunks end at a *safe* line break:
  a newline with a non-space character on both sides. Byte-level BPE pre-tokenizers (GPT-2's, Llama 3's) split
  text there anyway, so tokenizing a document piece by piece gives the same tokens as tokenizing it in one go. A
  chunk with no safe line break within twice its size is cut at a character boundary instead.

Memory is bounded by a read block and one document (a jsonl line, a parquet batch), whatever the corpus size.
"""

from __future__ import annotations

import codecs
import glob
import gzip
import io
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from attnres.config import path_kind
from attnres.data.errors import DataError

BUILTIN = ("kjv.txt.gz", "shakespeare.txt.gz")
KINDS = {
    ".txt": "text",
    ".txt.gz": "text",
    ".jsonl": "jsonl",
    ".jsonl.gz": "jsonl",
    ".parquet": "parquet",
    ".bin": "tokens",  # flat uint16 token ids (nanoGPT's train.bin / val.bin)
    ".npy": "tokens",  # a 1-D integer array (OLMo-style numpy token files)
}
SPACE = b" \t\n\r\x0b\x0c"
READ_BLOCK = 1 << 20


def kind_of(path: Path) -> str | None:
    name = path.name.lower()
    return next((kind for ext, kind in KINDS.items() if name.endswith(ext)), None)


def is_glob(source: str) -> bool:
    """Whether a source is a glob pattern (matched by :func:`source_files`) rather than a path."""
    return any(c in source for c in "*?[")


def source_files(source: str, label: str = "data.corpus") -> list[Path]:
    """The files ``source`` names, in a fixed (sorted) order; one clear error (naming it ``label``) if there are
    none."""
    if source == "builtin":
        root = resources.files("attnres.data") / "builtin"
        return [Path(str(root / name)) for name in BUILTIN]
    exts = ", ".join(KINDS)
    if is_glob(source):
        files = sorted(Path(p) for p in glob.glob(str(Path(source).expanduser()), recursive=True))
        files = [f for f in files if f.is_file() and kind_of(f)]
        if not files:
            raise DataError(f"{label}={source!r}: the pattern matches no {exts} files")
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise DataError(f"{label}={source!r} does not exist; use 'builtin' or a path to text ({exts})")
        if path.is_file():
            if kind_of(path) is None:
                raise DataError(f"{label}={source!r}: {path.suffix or 'no'} extension; supported: {exts}")
            files = [path]
        elif not path.is_dir():  # /dev/zero, a FIFO: read as a folder with nothing in it, it was called one
            raise DataError(
                f"{label}={source!r} is {path_kind(path)}, not a file or a folder; give a file of text ({exts}), a "
                "folder of them, or a glob"
            )
        else:
            files = sorted(p for p in path.rglob("*") if p.is_file() and kind_of(p))
            if not files:
                raise DataError(f"{label}={source!r} is a folder with no {exts} files in it")
    if sum(f.stat().st_size for f in files) == 0:
        raise DataError(f"{label}={source!r} holds no text (every file is empty)")
    if len({kind_of(f) == "tokens" for f in files}) > 1:
        raise DataError(f"{label}={source!r} mixes token files (.bin, .npy) with text; prepare them separately")
    for f in files:
        _check_gzip_header(f)
    return files


GZIP_MAGIC = b"\x1f\x8b"


def _check_gzip_header(path: Path) -> None:
    """A ``.gz`` file that is not gzip at all, refused up front (two bytes read); a truncated one can only be found
    by reading it to its end, so :func:`_gzip_errors` says that when the preparation gets there."""
    if not path.name.lower().endswith(".gz") or path.stat().st_size == 0:
        return
    with open(path, "rb") as f:
        if f.read(2) != GZIP_MAGIC:
            raise DataError(f"{path}: not a gzip file, though it is named .gz; compress it with gzip, or drop the .gz")


def _gzip_errors(path: Path, pieces: Iterator) -> Iterator:
    """``pieces`` read from a .gz file, its damage (a truncated or corrupt stream) said as one :class:`DataError`."""
    try:
        yield from pieces
    except EOFError:
        raise DataError(f"{path}: the gzip stream ends early (a truncated file); fetch or compress it again") from None
    except (gzip.BadGzipFile, zlib.error) as err:
        raise DataError(f"{path}: a damaged gzip stream ({err}); download or compress it again") from None


def is_tokens(piece: object) -> bool:
    return isinstance(piece, np.ndarray)


def _token_pieces(path: Path, chunk: int) -> Iterator[tuple[np.ndarray, bool]]:
    """Chunks of ``chunk`` token ids from a flat uint16 .bin file or a 1-D integer .npy file, read as a memory map."""
    if path.name.lower().endswith(".npy"):
        try:
            tokens = np.load(path, mmap_mode="r")
        except ValueError as err:
            raise DataError(f"{path}: not a readable .npy file ({err})") from None
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise DataError(
                f"{path}: a .npy token file must hold a 1-D integer array, not {tokens.dtype} {tokens.shape}"
            )
    else:
        if path.stat().st_size % 2:
            raise DataError(f"{path}: {path.stat().st_size:,} bytes is not a whole number of uint16 token ids")
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
    for start in range(0, len(tokens), chunk):
        yield np.asarray(tokens[start : start + chunk]), False


@dataclass(frozen=True)
class Range:
    """Bytes [start, end) of file ``index`` (end None: to the end; only plain .txt files are ever cut)."""

    index: int
    start: int = 0
    end: int | None = None


def _safe_break_after(f: io.BufferedReader, offset: int) -> int | None:
    """The position just after the first safe line break at or after ``offset`` in an open file, or None."""
    f.seek(max(0, offset - 1))
    carry = b""
    base = max(0, offset - 1)
    while block := f.read(READ_BLOCK):
        data = carry + block
        i = _find_safe_break(data, 1)
        if i is not None:
            return base - len(carry) + i
        carry, base = data[-2:], base + len(block)
    return None


def _find_safe_break(data: bytes, start: int, stop: int | None = None) -> int | None:
    """Index just after the first newline in data[start:stop] with a non-space byte on both sides."""
    stop = len(data) - 1 if stop is None else min(stop, len(data) - 1)
    i = data.find(b"\n", max(start, 1), stop)
    while i != -1:
        if data[i - 1] not in SPACE and data[i + 1] not in SPACE:
            return i + 1
        i = data.find(b"\n", i + 1, stop)
    return None


def plan_units(files: list[Path], unit_bytes: int) -> list[tuple[Range, ...]]:
    """Group small files and cut large plain-text files so that every unit holds about ``unit_bytes`` of input."""
    units: list[tuple[Range, ...]] = []
    group: list[Range] = []
    size = 0
    for index, path in enumerate(files):
        n = path.stat().st_size
        if n > unit_bytes and path.name.lower().endswith(".txt"):
            if group:
                units.append(tuple(group))
                group, size = [], 0
            with open(path, "rb") as f:
                start = 0
                while start < n:
                    cut = _safe_break_after(f, start + unit_bytes) if start + unit_bytes < n else None
                    units.append((Range(index, start, cut),))
                    if cut is None:
                        break
                    start = cut
            continue
        if group and size + n > unit_bytes:
            units.append(tuple(group))
            group, size = [], 0
        group.append(Range(index))
        size += n
    if group:
        units.append(tuple(group))
    return units


def cut_pieces(data: bytes, chunk_bytes: int, final: bool) -> tuple[list[bytes], bytes]:
    """Cut ``data`` into pieces of about ``chunk_bytes`` at safe line breaks; returns (pieces, the rest). With
    ``final`` the rest is empty: the last piece takes it."""
    pieces: list[bytes] = []
    pos = 0
    while len(data) - pos > 2 * chunk_bytes or (final and len(data) - pos > chunk_bytes):
        cut = _find_safe_break(data, pos + chunk_bytes, pos + 2 * chunk_bytes)
        if cut is None:
            cut = _find_safe_break(data, pos + chunk_bytes // 2, pos + chunk_bytes)
        if cut is None:  # no safe line break near: cut at a UTF-8 character boundary
            cut = pos + chunk_bytes
            while cut > pos + 1 and (data[cut] & 0xC0) == 0x80:
                cut -= 1
        pieces.append(data[pos:cut])
        pos = cut
    if final:
        if pos < len(data):
            pieces.append(data[pos:])
        return pieces, b""
    return pieces, data[pos:]


def _check_utf8(decoder: codecs.IncrementalDecoder, data: bytes, where: str, offset: int, final: bool) -> None:
    nul = data.find(b"\x00")
    if nul != -1:
        raise DataError(f"{where}: byte {offset + nul:,} is NUL: a binary file, not text; remove it from the source")
    try:
        decoder.decode(data, final)
    except UnicodeDecodeError as err:
        raise DataError(
            f"{where}: not UTF-8 text (bad byte at offset {offset + err.start:,}); convert it to UTF-8 "
            "(e.g. iconv -f latin1 -t utf-8) or remove it from the source"
        ) from None


def _open(path: Path) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def _text_pieces(path: Path, rng: Range, chunk_bytes: int) -> Iterator[tuple[bytes, bool]]:
    decoder = codecs.getincrementaldecoder("utf-8")()
    with _open(path) as f:
        if rng.start:
            f.seek(rng.start)
        left = None if rng.end is None else rng.end - rng.start
        offset, rest = rng.start, b""
        while True:
            block = f.read(READ_BLOCK if left is None else min(READ_BLOCK, left))
            if left is not None:
                left -= len(block)
            final = not block or left == 0
            _check_utf8(decoder, block, str(path), offset, final)
            offset += len(block)
            pieces, rest = cut_pieces(rest + block, chunk_bytes, final)
            for i, piece in enumerate(pieces):
                # the document ends with the file, not with a range cut inside it
                yield piece, final and i == len(pieces) - 1 and rng.end is None
            if final:
                return


def _document_pieces(text: str, chunk_bytes: int) -> Iterator[tuple[bytes, bool]]:
    data = text.encode("utf-8")
    if b"\x00" in data:
        data = data.replace(b"\x00", b"")  # JSON can carry a \u0000 escape; it is the bytes end-of-text token
    pieces, _ = cut_pieces(data, chunk_bytes, final=True)
    for i, piece in enumerate(pieces):
        yield piece, i == len(pieces) - 1


def _jsonl_pieces(path: Path, field: str, chunk_bytes: int) -> Iterator[tuple[bytes, bool]]:
    with _open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(
                    f"{where}: not UTF-8 text (bad byte at column {err.start + 1}); convert it to UTF-8"
                ) from None
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not a JSON object ({err}); every line must be one JSON document") from None
            if not isinstance(record, dict) or field not in record:
                keys = ", ".join(map(repr, record)) if isinstance(record, dict) else type(record).__name__
                raise DataError(
                    f"{where}: no {field!r} field (it has {keys}); set data.text_field / --text-field to the field "
                    "that holds the text"
                )
            text = record[field]
            if not isinstance(text, str):
                raise DataError(f"{where}: field {field!r} holds {type(text).__name__}, not text")
            if text:
                yield from _document_pieces(text, chunk_bytes)


def _parquet_pieces(path: Path, column: str, chunk_bytes: int) -> Iterator[tuple[bytes, bool]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises ArrowInvalid, OSError, ... for a file that is not parquet
        raise DataError(f"{path}: not a readable parquet file ({err})") from None
    names = pf.schema_arrow.names
    if column not in names:
        raise DataError(
            f"{path}: no column {column!r} (it has {', '.join(map(repr, names))}); set data.text_field / "
            "--text-field to the column that holds the text"
        )
    row = 0
    for batch in pf.iter_batches(batch_size=1024, columns=[column]):
        values = batch.column(0)
        if not (values.type == "string" or values.type == "large_string"):
            raise DataError(f"{path}: column {column!r} holds {values.type}, not text")
        if values.null_count:  # a missing document is a hole in the data, not an empty one: said, not skipped
            first = row + next(i for i, v in enumerate(values.is_null().to_pylist()) if v)
            raise DataError(
                f"{path}: column {column!r} is null in {values.null_count:,} row(s) from row {first:,} on; drop or "
                "fill those rows (e.g. pyarrow's table.filter(pc.is_valid(table[column])))"
            )
        row += len(values)
        for text in values.to_pylist():
            if text:
                yield from _document_pieces(text, chunk_bytes)


def unit_pieces(
    files: list[Path], unit: tuple[Range, ...], text_field: str, chunk_bytes: int
) -> Iterator[tuple[int, bytes | np.ndarray, bool]]:
    """(file index, piece, ends a document) for every piece of a unit, in order. Token files give arrays of
    ``chunk_bytes`` token ids instead of text."""
    for rng in unit:
        path = files[rng.index]
        kind = kind_of(path)
        if kind == "tokens":
            pieces = _token_pieces(path, chunk_bytes)
        elif kind == "text":
            pieces = _text_pieces(path, rng, chunk_bytes)
        elif kind == "jsonl":
            pieces = _jsonl_pieces(path, text_field, chunk_bytes)
        else:
            pieces = _parquet_pieces(path, text_field, chunk_bytes)
        if path.name.lower().endswith(".gz"):
            pieces = _gzip_errors(path, pieces)
        for piece, doc_end in pieces:
            yield rng.index, piece, doc_end
