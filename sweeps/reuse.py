"""``reuse:`` in a grid: take finished runs of the same identity from other sweeps instead of training them again.

A run id is a function of what makes the run (model, data, recipe), not of the sweep it is filed under
(:meth:`attnres.config.RunConfig.run_id`). So when two grids plan the same run (the per-variant protocol's
baseline is the paper protocol's baseline, tuned by the same trials), the second can take the first's result.
``reuse: [cpu_wsd]`` in grid ``cpu_wsd_pv``: before training, every planned run that is not finished in its own
folder and is finished (``done`` or ``diverged``) in ``RESULTS/cpu_wsd/<run_id>`` is copied there: its tables,
config and log, with the sweep name set to this grid's; a trunk's checkpoints are hard-linked (a branch still to
train starts from them). ``RESULTS/cpu_wsd-trunk`` supplies the trunks of ``RESULTS/cpu_wsd_pv-trunk``.

A copy is built in a hidden folder and renamed into place, so it is all there or not at all, and it is never made
over a folder this sweep already has (a run started here is resumed here).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

import yaml

from attnres.config import RunConfig
from attnres.storage import schema
from attnres.training.branches import TRUNK_SUFFIX

FINISHED = ("done", "diverged")
SWEEP_LINE = re.compile(r"^sweep: .*$", re.MULTILINE)  # config.yaml's first line (attnres.training.run)


def source_sweep(sweep: str, grid_name: str, other: str) -> str | None:
    """The sweep of ``other`` that holds what ``sweep`` (``grid_name`` or ``grid_name-trunk``) holds; None for a
    run filed under another name (a ``sweep=`` override), which is not reused."""
    for suffix in ("", TRUNK_SUFFIX):
        if sweep == grid_name + suffix:
            return other + suffix
    return None


def reuse_finished(
    runs: Iterable[RunConfig], results: str | Path, grid_name: str, sources: Iterable[str]
) -> list[tuple[str, str]]:
    """Copy every run of ``runs`` that has no folder of its own yet and is finished in one of the ``sources``
    sweeps under ``results``; return ``[(run_id, source sweep)]`` of the runs copied."""
    results = Path(results)
    copied = []
    for cfg in runs:
        target = results / cfg.sweep / cfg.run_id
        if target.exists():
            continue
        for other in sources:
            source = source_sweep(cfg.sweep, grid_name, other)
            if source is None:
                break
            origin = results / source / cfg.run_id
            row = schema.read_run_row(origin)
            if row is not None and row.get("status") in FINISHED:
                if _copy_run(origin, target, cfg.sweep):
                    copied.append((cfg.run_id, origin.parent.name))
                break
    return copied


def _copy_run(origin: Path, target: Path, sweep: str) -> bool:
    """``origin``'s run folder as ``target``, filed under ``sweep``; False if ``target`` appeared meanwhile."""
    staging = target.parent / f".{target.name}.reuse-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        for item in origin.iterdir():
            if item.name.startswith("."):  # the claim and lock files belong to the processes that hold them
                continue
            if item.is_file():
                shutil.copy2(item, staging / item.name)
        run = schema.read_table(origin / schema.RUN_FILE)
        column = run.schema.get_field_index("sweep")
        run = run.set_column(column, run.schema.field(column), [[sweep] * run.num_rows])
        schema.write_table(staging / schema.RUN_FILE, run)
        config = (origin / "config.yaml").read_text()
        line = yaml.safe_dump({"sweep": sweep}).strip()  # quoted where YAML would read another type
        (staging / "config.yaml").write_text(SWEEP_LINE.sub(lambda _: line, config, count=1))
        with open(staging / "train.log", "a") as log:
            log.write(f"reused: copied from {origin} (same run id), not trained again\n")
        if (origin / "checkpoints").is_dir():
            _link_tree(origin / "checkpoints", staging / "checkpoints")
        os.rename(staging, target)
        return True
    except OSError:
        if target.exists():  # another launcher made it first
            return False
        raise
    finally:  # after the rename there is nothing left to remove; before it, nothing half-made stays
        shutil.rmtree(staging, ignore_errors=True)


def _link_tree(src: Path, dst: Path) -> None:
    """Hard links of ``src``'s files under ``dst`` (a copy where the file system cannot link)."""
    for path in src.rglob("*"):
        out = dst / path.relative_to(src)
        if path.is_dir():
            out.mkdir(parents=True, exist_ok=True)
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, out)
        except OSError:
            shutil.copy2(path, out)
