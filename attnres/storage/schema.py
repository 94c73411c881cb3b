"""The parquet contract of a run folder: pyarrow schemas defined once, atomic writes, checked reads.

Imports pyarrow only (no torch): ``analysis`` and ``reports`` use this module to read results produced
anywhere. A run folder ``RESULTS/<sweep>/<run_id>/`` holds::

    config.yaml         the fully resolved RunConfig
    data.json           the data it reads: prepared folder, tokenizer, bytes per token, what the splits and the
                        evaluation windows hold per source file
    run.parquet         one row: identity, sizes, budget, status, final metrics, timings, versions
    metrics.parquet     one row per (step, split): the loss curve
    layers.parquet      one row per (step, layer, kind): RMS magnitudes and gradient norms per depth, and the
                        gradient norms of the parameters outside the blocks (embedding, depth mixer, final norm, head)
    depth_attn.parquet  one row per (step, query, source): mean depth-attention weight (AttnRes only)
    checkpoints/        the last checkpoint, for resuming

Every file carries ``schema_version`` in its parquet metadata (and run.parquet also as a column). Readers call
:func:`read_table`, which reads every version in :data:`READABLE_VERSIONS` and fails with a clear message on any
other or on a missing column. Writers call
:func:`write_table`, which writes to a temporary name in the same folder and renames it into place, so a
killed process never leaves a half-written file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

# 2: layers.parquet's gradient norms are taken before gradient clipping (version 1 took them after it, while
# metrics.parquet's grad_norm was before), and it gains rows for the parameters outside the blocks (layer null).
# The columns are version 1's, so version 1 files read as they are; their per-layer grad_norm is after clipping.
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
PRE_CLIP_LAYER_GRADS = 2  # the first version whose layers.parquet grad_norm is before clipping
# layers.parquet kinds of the parameters outside the transformer blocks (attnres.training.module.outer_group)
OUTER_KINDS = ("embedding", "depth", "final_norm", "head")

RUN_FILE = "run.parquet"
METRICS_FILE = "metrics.parquet"
LAYERS_FILE = "layers.parquet"
DEPTH_ATTN_FILE = "depth_attn.parquet"
CONFIG_FILE = "config.yaml"
DATA_FILE = "data.json"  # the data the run reads: prepared folder, tokenizer, composition of splits and eval windows
CHECKPOINT_DIR = "checkpoints"

STATUSES = ("running", "done", "failed", "diverged")


def _schema(*fields: pa.Field, doc: str) -> pa.Schema:
    return pa.schema(list(fields), metadata={"schema_version": str(SCHEMA_VERSION), "doc": doc})


RUN_SCHEMA = _schema(
    pa.field("schema_version", pa.int32(), nullable=False),
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("sweep", pa.string(), nullable=False),
    pa.field("variant", pa.string(), nullable=False),  # baseline | full | block (ablations add names)
    pa.field("n_blocks", pa.int32()),  # depth blocks N: L for full, null for the baseline
    pa.field("block_size", pa.int32()),  # S, sublayers in the longest block: 1 for full, null for baseline
    pa.field("n_layer", pa.int32(), nullable=False),
    pa.field("d_model", pa.int32(), nullable=False),
    pa.field("n_head", pa.int32(), nullable=False),
    pa.field("seq_len", pa.int32(), nullable=False),
    pa.field("vocab_size", pa.int32(), nullable=False),
    pa.field("params", pa.int64(), nullable=False),  # non-embedding parameters
    pa.field("params_total", pa.int64(), nullable=False),
    pa.field("tokens", pa.int64(), nullable=False),  # training tokens of the full budget (steps x batch)
    pa.field("flops", pa.float64(), nullable=False),  # training FLOPs of the full budget, by the counter
    pa.field("flops_per_token", pa.float64(), nullable=False),  # training FLOPs per token (3 x forward)
    pa.field("flops_convention", pa.string(), nullable=False),
    pa.field("lr", pa.float64(), nullable=False),
    pa.field("batch_tokens", pa.int64(), nullable=False),
    pa.field("seed", pa.int64(), nullable=False),
    pa.field("status", pa.string(), nullable=False),  # running | done | failed | diverged
    pa.field("step", pa.int64(), nullable=False),  # optimizer steps completed
    pa.field("max_steps", pa.int64(), nullable=False),
    pa.field("tokens_seen", pa.int64(), nullable=False),
    pa.field("val_loss", pa.float64()),  # last validation loss, nats per token
    pa.field("val_bpb", pa.float64()),  # last validation loss, bits per byte
    pa.field("eval_sets", pa.string()),  # JSON {name: {"loss", "bpb"}} of the last evaluation (data.eval_sets)
    pa.field("train_loss", pa.float64()),  # last logged training loss, nats per token
    pa.field("tokens_per_s", pa.float64()),  # training throughput over the run (excluding evaluation)
    pa.field("wall_s", pa.float64()),  # wall-clock seconds of training, summed over resumed attempts
    pa.field("error", pa.string()),  # the reason for failed / diverged
    pa.field("device", pa.string()),
    pa.field("precision", pa.string()),
    pa.field("threads", pa.int32()),  # torch's CPU threads (of the last attempt); null: written before it was kept
    pa.field("blas", pa.string()),  # MKL's mode: AUTO,STRICT (thread-independent), off, ... (attnres.blas)
    pa.field("git_sha", pa.string()),
    pa.field("versions", pa.string()),  # JSON: python, torch, lightning, attnres
    pa.field("updated_at", pa.string()),  # ISO 8601, UTC
    doc="one row per run",
)

METRICS_SCHEMA = _schema(
    pa.field("step", pa.int64(), nullable=False),
    pa.field("split", pa.string(), nullable=False),  # train | val | the name of a data.eval_sets set
    pa.field("tokens", pa.int64(), nullable=False),  # training tokens seen at this step
    pa.field("flops", pa.float64(), nullable=False),  # training FLOPs spent at this step
    pa.field("loss", pa.float64(), nullable=False),  # nats per token
    pa.field("bpb", pa.float64(), nullable=False),  # bits per byte
    pa.field("lr", pa.float64()),  # train rows
    pa.field("grad_norm", pa.float64()),  # train rows: global gradient norm (every parameter) before clipping
    pa.field("tokens_per_s", pa.float64()),  # train rows: throughput since the previous train row
    pa.field("wall_s", pa.float64(), nullable=False),  # training wall-clock seconds at this step
    doc="one row per (step, split)",
)

LAYERS_SCHEMA = _schema(
    pa.field("step", pa.int64(), nullable=False),
    pa.field("tokens", pa.int64(), nullable=False),
    pa.field("layer", pa.int32()),  # transformer block index, 0-based; null for the OUTER_KINDS rows
    pa.field("sublayer", pa.int32()),  # 0-based sublayer index (2 * layer + 0/1); null for the other rows
    # attn | mlp (a sublayer), block (the whole block), or one of OUTER_KINDS (parameters outside the blocks)
    pa.field("kind", pa.string(), nullable=False),
    pa.field("input_rms", pa.float64()),  # RMS over tokens and channels of the sublayer's / block's input
    pa.field("output_rms", pa.float64()),  # sublayer: its raw output; block: the hidden state it hands on
    # L2 norm of the parameter gradients of the row's parameters, before clipping (version 1: after clipping);
    # the attn, mlp and OUTER_KINDS rows hold every parameter once, so they combine to metrics' grad_norm
    pa.field("grad_norm", pa.float64()),
    doc="one row per (step, layer, kind); block output = the input of the next block's first sublayer",
)

DEPTH_ATTN_SCHEMA = _schema(
    pa.field("step", pa.int64(), nullable=False),
    pa.field("tokens", pa.int64(), nullable=False),
    pa.field("query", pa.int32(), nullable=False),  # reading sublayer 0..L-1, or L for the final aggregation
    pa.field("kind", pa.string(), nullable=False),  # attn | mlp | final
    pa.field("source", pa.int32(), nullable=False),  # 0 = embedding; Full: i = output of sublayer i-1;
    # Block: n = depth block n (1-based), completed or the query's own partial block
    pa.field("source_kind", pa.string(), nullable=False),  # embedding | sublayer | block | partial
    pa.field("weight", pa.float64(), nullable=False),  # mean over tokens of alpha_{source -> query}
    doc="one row per (step, query, source); AttnRes variants only",
)

# Columns added to a contract after its files were first written: a file without one reads as if it held nulls
# there (a run that named no evaluation set has none either), so the files of earlier runs stay readable.
ADDED_COLUMNS = {RUN_FILE: ("eval_sets", "threads", "blas")}

SCHEMAS = {
    RUN_FILE: RUN_SCHEMA,
    METRICS_FILE: METRICS_SCHEMA,
    LAYERS_FILE: LAYERS_SCHEMA,
    DEPTH_ATTN_FILE: DEPTH_ATTN_SCHEMA,
}


class SchemaError(ValueError):
    """A parquet file does not follow the contract (wrong version, missing column)."""


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are meant to be shared
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        if err.filename is None:  # a full disk names no file; the path tells the user which write it stopped
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def to_table(rows: list[dict[str, Any]] | dict[str, list], schema: pa.Schema) -> pa.Table:
    """Rows (list of dicts) or columns (dict of lists) as a table of ``schema``; extra keys are an error."""
    if isinstance(rows, dict):
        columns = rows
    else:
        columns = {name: [row.get(name) for row in rows] for name in schema.names}
        extra = {k for row in rows for k in row} - set(schema.names)
        if extra:
            raise SchemaError(f"columns {sorted(extra)} are not in the schema ({schema.metadata[b'doc'].decode()})")
    return pa.Table.from_pydict({name: columns.get(name) for name in schema.names}, schema=schema)


def write_table(path: str | Path, table: pa.Table) -> None:
    """Write a parquet file atomically (temporary name in the same folder, then rename)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(path, sink.getvalue().to_pybytes())


def read_table(path: str | Path, schema: pa.Schema | None = None) -> pa.Table:
    """Read a contract file, checking its schema_version and columns; raises :class:`SchemaError`."""
    path = Path(path)
    schema = schema or SCHEMAS.get(path.name)
    # One open file, read whole: pyarrow's path reader takes the size from a stat and the bytes from a later
    # open, so a reader racing a writer's atomic rename mixes the old file's length with the new file's bytes
    # ("Couldn't deserialize thrift"). A file descriptor pins one version of the file. ParquetFile without
    # threads, not read_table: read_table's dataset scanner can leave pool threads running at interpreter
    # exit, which aborts the process ("terminate called without an active exception"; apache/arrow#39862),
    # and these files are small.
    with open(path, "rb") as f:
        table = pq.ParquetFile(pa.BufferReader(f.read())).read(use_threads=False)
    meta = table.schema.metadata or {}
    version = meta.get(b"schema_version", b"?").decode()
    if version not in {str(v) for v in READABLE_VERSIONS}:
        raise SchemaError(
            f"{path}: schema_version {version}, this version of attnres reads "
            f"{', '.join(map(str, READABLE_VERSIONS))}; re-run the run or read it with the matching attnres version"
        )
    if "schema_version" in table.column_names:  # run.parquet says it twice: both must say the same
        column = sorted({v for v in table.column("schema_version").to_pylist()}, key=str)
        if column and column != [int(version)]:
            said = ", ".join(map(str, column))
            raise SchemaError(
                f"{path}: its schema_version column says {said}, its file metadata says {version}; the file was "
                "edited or put together by hand, so which contract it follows is unknown: re-run the run, or restore "
                "the file attnres wrote"
            )
    if schema is not None:
        added = [n for n in ADDED_COLUMNS.get(path.name, ()) if n not in table.column_names and n in schema.names]
        for name in added:
            table = table.append_column(schema.field(name), pa.nulls(table.num_rows, schema.field(name).type))
        if added:  # in the contract's order, as a file written today has them
            table = table.select(
                [n for n in schema.names if n in table.column_names]
                + [n for n in table.column_names if n not in schema.names]
            )
        missing = [n for n in schema.names if n not in table.column_names]
        if missing:
            raise SchemaError(f"{path}: missing columns {missing}")
        # a column of another type (flops saved as text by a hand-made file) would fail later, in a sum or a fit
        wrong = [
            f"{f.name} is {table.schema.field(f.name).type}, not {f.type}"
            for f in schema
            if not table.schema.field(f.name).type.equals(f.type)
        ]
        if wrong:
            raise SchemaError(f"{path}: column types differ from the contract: {'; '.join(wrong)}")
    return table


def file_version(table: pa.Table) -> int:
    """The ``schema_version`` a table read by :func:`read_table` was written with."""
    return int((table.schema.metadata or {})[b"schema_version"])


def read_run_row(run_dir: str | Path) -> dict[str, Any] | None:
    """The run.parquet row of a run folder as a dict, or None when there is none to trust (never started,
    truncated by a crash of an older writer, another schema version, a foreign file): such a run is simply
    trained (again) rather than skipped."""
    try:
        return read_table(Path(run_dir) / RUN_FILE).to_pylist()[0]
    except Exception:
        return None
