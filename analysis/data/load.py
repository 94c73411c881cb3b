"""Load a whole results tree into DataFrames, reporting every run that cannot be used instead of failing.

Reads only the parquet contract of :mod:`attnres.storage.schema` (pyarrow, no torch). A results tree is
``RESULTS/<sweep>/<run_id>/`` folders; any folder below ``RESULTS`` holding a ``run.parquet`` or a
``config.yaml`` and no run folder below it is a run folder (so a single sweep folder or a single run folder
loads too, and a sweep folder with its own config.yaml is not mistaken for a run).

What is reported as a :class:`Problem` (the run folder and the reason), never raised:

* no ``run.parquet`` (never started, or crashed before its first write);
* an unreadable file, or one written with another ``schema_version`` (:class:`attnres.storage.schema.SchemaError`);
* a run not finished: status ``running`` (with its step), ``failed`` / ``diverged`` (with its error);
* a finished run without a final ``val_loss``.

Unfinished and failed runs stay in ``Results.runs`` with their status (``sweep status`` style views need
them); the fits use only ``status == "done"`` runs with a finite loss.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa

from analysis.base.errors import ResultsError
from attnres.storage.schema import (
    ADDED_COLUMNS,
    CONFIG_FILE,
    DEPTH_ATTN_FILE,
    DEPTH_ATTN_SCHEMA,
    LAYERS_FILE,
    LAYERS_SCHEMA,
    METRICS_FILE,
    METRICS_SCHEMA,
    RUN_FILE,
    RUN_SCHEMA,
    STATUSES,
    SchemaError,
    read_table,
)

TABLES = ("metrics", "layers", "depth_attn")
ADDED_RUN_COLUMNS = frozenset(ADDED_COLUMNS[RUN_FILE])
_PER_RUN = {
    "metrics": (METRICS_FILE, METRICS_SCHEMA),
    "layers": (LAYERS_FILE, LAYERS_SCHEMA),
    "depth_attn": (DEPTH_ATTN_FILE, DEPTH_ATTN_SCHEMA),
}


@dataclass(frozen=True)
class Problem:
    """A run that cannot be used as it is: its folder (relative to the results root), run id and the reason.

    ``unreadable``: the folder has a run.parquet whose content could not be read (corrupt, truncated, another
    schema_version, no row), so a run that may have finished is missing from the fits without anyone knowing
    its status; a fit that lost such runs is incomplete (docs/analysis.md, "Unreadable runs")."""

    path: str
    run_id: str
    reason: str
    unreadable: bool = False

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"

    def to_dict(self) -> dict[str, str | bool]:
        return {"path": self.path, "run_id": self.run_id, "reason": self.reason, "unreadable": self.unreadable}


@dataclass(frozen=True, eq=False)
class Results:
    """A loaded results tree.

    ``runs``: one row per readable run.parquet (every RUN_SCHEMA column, plus ``path``, the run folder
    relative to ``root``). ``metrics``, ``layers``, ``depth_attn``: the per-run tables concatenated, with
    ``sweep`` and ``run_id`` columns first. ``problems``: the runs that cannot be used, by name.
    ``inputs_hash``: sha256 of the runs' content (all run.parquet rows, every column, canonical JSON sorted by
    sweep and run_id; not the folders they were read from), which identifies what a fit was made from.
    """

    root: Path
    runs: pd.DataFrame
    metrics: pd.DataFrame
    layers: pd.DataFrame
    depth_attn: pd.DataFrame
    problems: tuple[Problem, ...] = field(default_factory=tuple)
    inputs_hash: str = ""
    # the loss in runs.val_loss: the validation split's, or an evaluation set's (analysis.fitting.metric)
    metric: str = "val"
    pooled: tuple[Path, ...] = ()  # other results trees read with this one (load_results's ``pool``)

    @property
    def sweeps(self) -> list[str]:
        return sorted(self.runs["sweep"].dropna().unique().tolist()) if len(self.runs) else []

    @property
    def finished(self) -> pd.DataFrame:
        """Runs with status ``done`` and a finite, positive ``val_loss``: what the fits use."""
        runs = self.runs
        if runs.empty:
            return runs
        loss = pd.to_numeric(runs["val_loss"], errors="coerce")
        return runs[(runs["status"] == "done") & loss.notna() & (loss > 0) & loss.map(math.isfinite)]


def sweep_of(problem: Problem) -> str:
    """The sweep folder a problem run lies in (problems of sweeps left out of the fits are not reported); a pooled
    tree's run (``../<tree>/<sweep>/<run>``) lies in its run folder's parent."""
    parts = problem.path.split("/")
    return parts[-2] if parts[0] == ".." and len(parts) > 1 else parts[0]


def may_belong(problem: Problem, sweep: str, results: Results) -> bool:
    """Whether a problem run may belong to ``sweep``: it lies in that sweep's folder, or in no sweep folder of
    the results (the results root is a sweep folder or a run folder itself)."""
    where = sweep_of(problem)
    return where == sweep or where not in results.sweeps


def _empty(schema: pa.Schema, lead: Iterable[str] = ()) -> pd.DataFrame:
    frame = schema.empty_table().to_pandas()
    for i, name in enumerate(lead):
        frame.insert(i, name, pd.Series([], dtype="str"))
    return frame


def _run_folders(root: Path) -> list[Path]:
    found = set()
    for name in (RUN_FILE, CONFIG_FILE):
        for path in root.rglob(name):
            rel = path.relative_to(root).parts
            if any(part.startswith(".") or part == "checkpoints" for part in rel[:-1]):
                continue
            found.add(path.parent)
    # a folder holding run folders (a sweep folder with its own config.yaml, say) is not itself a run
    ancestors = {parent for folder in found for parent in folder.parents}
    return sorted(found - ancestors)


def _hash_runs(runs: pd.DataFrame) -> str:
    """sha256 of the runs' content: every run.parquet column of every row, as canonical JSON, sorted by sweep,
    run_id (and the row itself, for a run_id found in two folders).

    The ``path`` column (the run folder relative to the folder that was loaded) is left out, so the same runs
    give the same hash whichever folder above them was passed (``results`` or ``results/<sweep>``); so is a column
    added to the contract later (``ADDED_COLUMNS``) where a run has none, so older runs keep their hash."""
    if runs.empty:
        return hashlib.sha256(b"[]").hexdigest()
    records = []
    for row in runs.drop(columns=["path"], errors="ignore").to_dict(orient="records"):
        clean = {}
        for key, value in row.items():
            if isinstance(value, float) and math.isnan(value):
                value = None
            elif value is pd.NA or value is pd.NaT:
                value = None
            elif hasattr(value, "item"):
                value = value.item()
            if value is None and key in ADDED_RUN_COLUMNS:
                continue
            clean[key] = value
        records.append(clean)
    keyed = [
        (str(r.get("sweep")), str(r.get("run_id")), json.dumps(r, sort_keys=True, default=repr, separators=(",", ":")))
        for r in records
    ]
    text = "[" + ",".join(item for _, _, item in sorted(keyed)) + "]"
    return hashlib.sha256(text.encode()).hexdigest()


def load_results(root: str | Path, *, tables: Iterable[str] = TABLES, pool: Iterable[str | Path] = ()) -> Results:
    """Load every run under ``root`` (``RESULTS/<sweep>/<run_id>/``) into a :class:`Results`.

    ``pool``: other results trees whose runs join this one's, as if they lay under ``root``: a study carried on
    in a folder of its own (studies/cpu_depth_deep adds depths to studies/cpu_depth's sweep, under the same
    sweep name) is fitted with the runs it extends. Their runs' ``path`` is relative to ``root`` (it starts with
    ``..``), so everything that reads a run's files finds them; a run in two trees is refused as below.

    ``tables`` chooses which per-run tables to read besides run.parquet ("metrics", "layers",
    "depth_attn"; ``()`` for the runs table alone, which is all the fits need). Unreadable or unfinished
    runs are listed in ``Results.problems`` by folder and reason; nothing about a single run raises.
    Raises :class:`ResultsError` when ``root`` is not a folder, and when one run (sweep and run id) is in two
    folders, which every fit would count twice.
    """
    root = Path(root)
    if not root.is_dir():
        raise ResultsError(f"results directory {str(root)!r} does not exist or is not a folder; pass RESULTS_DIR")
    pooled = tuple(Path(p) for p in pool)
    for other in pooled:
        if not other.is_dir():
            raise ResultsError(f"pooled results directory {str(other)!r} (--pool) does not exist or is not a folder")
        if other.resolve() == root.resolve():
            raise ResultsError(f"--pool {str(other)!r} is RESULTS_DIR itself: its runs would count twice")
    tables = tuple(tables)
    unknown = set(tables) - set(TABLES)
    if unknown:
        raise ResultsError(f"unknown table(s) {sorted(unknown)}; choose from {', '.join(TABLES)}")
    problems: list[Problem] = []
    run_frames: list[pd.DataFrame] = []
    per_run: dict[str, list[pd.DataFrame]] = {name: [] for name in tables}
    folders = [*_run_folders(root), *(f for other in pooled for f in _run_folders(other))]
    for folder in folders:
        # relative to root even for a pooled tree's run (``../<tree>/<sweep>/<run>``): root / path is the folder
        rel = Path(os.path.relpath(folder, root)).as_posix()
        frame = _read_run(folder, rel, problems)
        if frame is None:
            continue
        row = frame.iloc[0]
        status_problem = _status_problem(rel, row)
        if status_problem is not None:
            problems.append(status_problem)
        run_frames.append(frame)
        for tname in tables:
            t = _read_per_run(folder, rel, row, tname, problems)
            if t is not None:
                per_run[tname].append(t)
    runs = (
        pd.concat(run_frames, ignore_index=True)
        if run_frames
        else _empty(RUN_SCHEMA).assign(path=pd.Series([], dtype="str"))
    )
    _check_unique(runs)
    frames = {}
    for tname, (_, schema) in _PER_RUN.items():
        parts = per_run.get(tname, [])
        frames[tname] = pd.concat(parts, ignore_index=True) if parts else _empty(schema, ("sweep", "run_id"))
    return Results(
        root=root,
        runs=runs,
        metrics=frames["metrics"],
        layers=frames["layers"],
        depth_attn=frames["depth_attn"],
        problems=tuple(problems),
        inputs_hash=_hash_runs(runs),
        pooled=pooled,
    )


def _check_unique(runs: pd.DataFrame) -> None:
    """One run in two folders (a sweep folder copied under another name) would count twice in every fit: refused,
    with the folders named, before anything is fitted."""
    if runs.empty:
        return
    dupes = runs[runs.duplicated(["sweep", "run_id"], keep=False)]
    if dupes.empty:
        return
    first = dupes.groupby(["sweep", "run_id"], sort=True)["path"].apply(list)
    (sweep, run_id), paths = next(iter(first.items()))
    raise ResultsError(
        f"run {run_id} of sweep {sweep} is in {len(paths)} folders ({', '.join(sorted(paths))})"
        + (f", and {len(first) - 1} more run(s) are too" if len(first) > 1 else "")
        + ": it would count more than once; move the copies out of the results tree"
    )


def _read_run(folder: Path, rel: str, problems: list[Problem]) -> pd.DataFrame | None:
    """A run folder's run.parquet as one row with its ``path`` (``rel``), or None when it cannot be read; what
    is wrong with it goes into ``problems``."""
    name = folder.name
    run_path = folder / RUN_FILE
    if not run_path.exists():
        problems.append(Problem(rel, name, "no run.parquet: the run never started or crashed before writing it"))
        return None
    try:
        table = read_table(run_path, RUN_SCHEMA)
    except SchemaError as err:
        problems.append(Problem(rel, name, f"run.parquet does not follow this version's contract: {err}", True))
        return None
    except (pa.ArrowException, OSError, ValueError) as err:
        problems.append(Problem(rel, name, f"run.parquet is unreadable ({type(err).__name__}: {err})", True))
        return None
    frame = table.select(RUN_SCHEMA.names).to_pandas()
    if len(frame) != 1:
        problems.append(Problem(rel, name, f"run.parquet holds {len(frame)} rows instead of one", frame.empty))
        if frame.empty:
            return None
        frame = frame.iloc[[-1]]
    frame.insert(len(frame.columns), "path", rel)
    return frame


def _status_problem(rel: str, row: pd.Series) -> Problem | None:
    """Why a run is left out of the fits by its status or its loss, or None for a finished run with a loss."""
    run_id = str(row["run_id"])
    status = str(row["status"])
    if status not in STATUSES:
        return Problem(rel, run_id, f"unknown status {status!r} (expected one of {', '.join(STATUSES)})")
    if status == "running":
        return Problem(rel, run_id, f"unfinished: status running at step {row['step']} of {row['max_steps']}")
    if status in ("failed", "diverged"):
        error = row["error"] if isinstance(row["error"], str) and row["error"] else "no error recorded"
        return Problem(rel, run_id, f"{status}: {error}")
    loss = pd.to_numeric(pd.Series([row["val_loss"]]), errors="coerce").iloc[0]
    if pd.isna(loss) or not math.isfinite(loss) or loss <= 0:
        shown = "missing" if pd.isna(loss) else f"{float(loss)!r}"
        return Problem(rel, run_id, f"status done but val_loss is {shown}: the run is left out of the fits")
    return None


def _read_per_run(folder: Path, rel: str, row: pd.Series, tname: str, problems: list[Problem]) -> pd.DataFrame | None:
    """One per-run table of a run (``tname``: "metrics", "layers" or "depth_attn") with its sweep and run_id
    in front, or None when it is missing or unreadable (a finished run without metrics is a problem)."""
    run_id, status = str(row["run_id"]), str(row["status"])
    fname, schema = _PER_RUN[tname]
    path = folder / fname
    if not path.exists():
        if tname == "metrics" and status == "done":
            problems.append(Problem(rel, run_id, "no metrics.parquet (loss curves of this run are missing)"))
        return None
    try:
        t = read_table(path, schema).select(schema.names).to_pandas()
    except SchemaError as err:
        problems.append(Problem(rel, run_id, f"{fname} does not follow this version's contract: {err}"))
        return None
    except (pa.ArrowException, OSError, ValueError) as err:
        problems.append(Problem(rel, run_id, f"{fname} is unreadable ({type(err).__name__}: {err})"))
        return None
    t.insert(0, "run_id", run_id)
    t.insert(0, "sweep", str(row["sweep"]))
    return t
