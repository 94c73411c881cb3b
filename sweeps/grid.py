"""Grid files: what a sweep grid (YAML) may hold, and :func:`load_grid`, which reads one into a validated, frozen
:class:`~sweeps.specs.Grid`.

A grid is the cross product  sizes (the ladder) x budgets x variants x learning rates x seeds,  on top of shared
``defaults:`` (any :class:`attnres.config.RunConfig` field). Its top level (:class:`GridFile`) and each of its
sections (:mod:`sweeps.sections`) are read by the parser run configs use (:func:`attnres.config.from_dict`: OmegaConf
structured configs, with errors that name the field), and every run is then built by the expansion
(:mod:`sweeps.expansion`) with the same parser, so the whole grid is validated when it is loaded, before anything
runs: unknown keys, unknown variants, Block N out of range for a size, an empty ladder, duplicate runs. Grids are
found by name in :mod:`sweeps.lookup`.

The grid format is documented in docs/sweeps.md. This module imports no torch (plans and status stay fast).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnres.config import ConfigError, RunConfig, load_yaml
from sweeps.architecture import check_compute, read_architecture
from sweeps.expansion import expand_grid, expand_runs, read_tuned_values
from sweeps.lookup import resolve_grid_path
from sweeps.sections import (
    read_branches,
    read_budgets,
    read_defaults,
    read_ladder,
    read_lr,
    read_reuse,
    read_section,
    read_seeds,
    read_tune,
    read_variants,
)
from sweeps.slurm import check_resources
from sweeps.specs import Grid
from sweeps.tuned_values import TunedValuesMissing


@dataclass(frozen=True)
class GridFile:
    """A grid file's top level. OmegaConf reads its keys and ``name``; each section is then read on its own, in this
    order (so that a file with several mistakes is told the first), by the schema or normaliser of
    :mod:`sweeps.sections` that its line names."""

    name: str | None = None
    """The sweep: runs go to RESULTS/<name>/ (default: the file's name)."""
    description: Any = None
    """One line on what the grid is for (plain text)."""
    defaults: Any = None
    """Any :class:`attnres.config.RunConfig` field, by section (model, data, train, runtime): every run starts here."""
    ladder: Any = None
    """The sizes: :class:`~sweeps.sections.LadderSection` (a bare list is its sizes)."""
    budgets: Any = None
    """:class:`~sweeps.sections.BudgetEntry`, or a list of them."""
    variants: Any = None
    """Names (baseline, full, block), ``{block: [N, ...]}`` or ``{block: divisors}``,
    :class:`~sweeps.sections.AblationVariant`; a mapping entry may add :class:`~sweeps.sections.VariantRuns`
    (default: baseline, full, block4)."""
    seeds: Any = None
    """A seed or a list of seeds (default: defaults.train.seed)."""
    lr: Any = None
    """A rate, a list of rates, :class:`~sweeps.sections.LrLadder`, or a tuning protocol (tuned, tuned-baseline,
    tuned-per-variant); none: the runs' own train.lr."""
    slurm: Any = None
    """SLURM resources (:func:`sweeps.slurm.resources`; never read by OmegaConf: ``${VAR}`` in a setup: line is the
    shell's, not an interpolation)."""
    tune: Any = None
    """:class:`~sweeps.sections.TuneSection`."""
    branches: Any = None
    """true, or :class:`~sweeps.sections.BranchSection`."""
    reuse: Any = None
    """A sweep name or a list: the sweeps whose finished runs of equal run id are copied (sweeps/reuse.py)."""


# ------------------------------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------------------------------


def load_grid(
    path_or_name: str | Path | Mapping[str, Any],
    overrides: list[str] | tuple[str, ...] = (),
    results: str | Path | None = None,
) -> Grid:
    """Read and validate a grid (a YAML path, a shipped grid's name, or an already-parsed mapping).

    ``overrides`` are ``key=value`` settings (``data.corpus=/data/text``) applied to every run, after the grid.
    Every run is expanded once, here, and kept on the grid (:attr:`Grid.runs`): a grid with ``lr: tuned*`` with
    the tuned values under ``results`` where they exist (a command that knows its results folder expands its grid
    once), else with stand-in rates. Raises :class:`ConfigError` with the grid file and the offending entry in the
    message.
    """
    if isinstance(path_or_name, Mapping):
        path, data = None, copy.deepcopy(dict(path_or_name))
    else:
        path = resolve_grid_path(path_or_name)
        data = load_yaml(path)
    where = f"grid {path}" if path else "grid"

    def named(err: ConfigError) -> ConfigError:
        message = str(err)
        return ConfigError(message if message.startswith(where) else f"{where}: {message}")

    try:
        grid = _parse(data, path, tuple(overrides))
    except ConfigError as err:
        raise named(err) from None
    tuned = None
    if results is not None:  # a tuned file's problems are its own, named with its path
        with contextlib.suppress(TunedValuesMissing):  # not tuned yet: stand-ins, as without a results folder
            tuned = read_tuned_values(grid, results)
    try:
        runs = expand_grid(grid, tuned)  # validate every run now, before anything is trained
        if grid.architecture is not None:
            check_compute(grid.architecture, runs)
    except ConfigError as err:
        raise named(err) from None
    if isinstance(grid.lr, str) and tuned is None:  # stand-in rates until `attnres tune` has run
        runs = [dataclasses.replace(r, to_be_tuned=True) for r in runs]
    tuned_from = None if tuned is None else grid.tuned_file(results)
    return dataclasses.replace(grid, runs=tuple(runs), tuned_from=tuned_from)


def expand(grid: Grid | str | Path, results: str | Path | None = None) -> list[RunConfig]:
    """The grid's runs as :class:`RunConfig` objects (sizes x budgets x variants x lr x seeds, in that order); a
    path or a grid's name is loaded first."""
    if not isinstance(grid, Grid):
        grid = load_grid(grid, results=results if results is not None else "results")
    return [r.cfg for r in expand_runs(grid, results)]


def _parse(data: dict[str, Any], path: Path | None, overrides: tuple[str, ...]) -> Grid:
    sections = tuple(f.name for f in dataclasses.fields(GridFile) if f.name != "name")
    head = read_section(GridFile, data, "", own=sections)
    if head.name is not None and not str(head.name).strip():
        # an empty name fell back to the file's name without a word: say it, as a name that cannot be a folder is
        raise ConfigError(
            f"name: {head.name!r} is empty; give the sweep a name (its results folder), or leave name: out for the "
            f"file's name{f' ({path.stem})' if path else ''}"
        )
    name = str(head.name or (path.stem if path else "sweep"))
    # `attnres tune` trains into <sweep>-tune and WSD trunks into <sweep>-trunk, and `attnres fit` skips those
    # sweeps: a grid of that name would train and then be dropped from the fit without a word
    reserved = next((s for s in ("-tune", "-trunk") if name.endswith(s)), None)
    if reserved:
        raise ConfigError(
            f"name: {name!r} ends in {reserved!r}, which names the sweeps tuning and WSD trunks write; rename the grid"
        )
    defaults = read_defaults(data.get("defaults") or {}, name, overrides)
    if "ladder" not in data:
        raise ConfigError(
            "the ladder is empty: add ladder: {depths: [...], width_per_layer: W, head_dim: H} or ladder: {sizes: "
            "[...]}"
        )
    ladder = data["ladder"]
    architecture = None
    if isinstance(ladder, Mapping) and "architecture" in ladder:
        if set(ladder) != {"architecture"}:
            raise ConfigError("ladder: an architecture sweep's cells are its sizes: give ladder.architecture alone")
        architecture = read_architecture(ladder["architecture"], defaults.get("model") or {})
        sizes = architecture.cells
    else:
        sizes = read_ladder(ladder, defaults.get("model") or {})
    budgets = read_budgets(data.get("budgets"), "budgets")
    if not budgets and any(s.budgets is None for s in sizes):
        raise ConfigError(
            "budgets is empty: add budgets: [{tokens_per_param: 20}] (or tokens / flops), or budgets per size"
        )
    variants = read_variants(data.get("variants", ["baseline", "full", {"block": [4]}]))
    seeds = read_seeds(data.get("seeds", [defaults.get("train", {}).get("seed", 0)]), "seeds")
    lr = read_lr(data.get("lr"))
    slurm = data.get("slurm") or {}
    check_resources(slurm, "slurm.")
    tune = read_tune(data.get("tune") or {})
    branches = read_branches(data.get("branches"))
    reuse = read_reuse(data.get("reuse"), name)
    return Grid(
        name=name,
        path=path,
        description=str(data.get("description") or "").strip(),
        defaults=defaults,
        sizes=sizes,
        budgets=budgets,
        variants=variants,
        seeds=seeds,
        lr=lr,
        slurm=slurm,
        tune=tune,
        overrides=overrides,
        branches=branches,
        reuse=reuse,
        architecture=architecture,
    )
