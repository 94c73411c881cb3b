"""Grid files found by name: the generic grids in sweeps/, and each committed study's in its own folder,
studies/<study>/ (a study's grids live beside its results). ``attnres sweep run NAME`` finds them here.

Imports nothing but the config's error type, so that ``attnres --help`` can list the grids quickly.
"""

from __future__ import annotations

from pathlib import Path

from attnres.config import ConfigError, path_kind

GRID_DIR = Path(__file__).resolve().parent
STUDIES_DIR = GRID_DIR.parent / "studies"  # a committed study keeps its grids beside its results: studies/<study>/


def grid_files() -> dict[str, Path]:
    """Every grid found by name: the generic ones in sweeps/, and each committed study's in studies/<study>/
    (a study's grids live beside its results; a name in sweeps/ wins)."""
    found = {p.stem: p for p in sorted(STUDIES_DIR.glob("*/*.yaml"))} if STUDIES_DIR.is_dir() else {}
    found.update({p.stem: p for p in sorted(GRID_DIR.glob("*.yaml"))})
    return dict(sorted(found.items()))


def shipped_grids() -> list[str]:
    """The names of the grids ``attnres sweep run NAME`` finds (:func:`grid_files`)."""
    return list(grid_files())


def resolve_grid_path(path_or_name: str | Path) -> Path:
    """A grid file: a path, or the name of a grid in sweeps/ or a study's folder (``smoke`` -> sweeps/smoke.yaml)."""
    path = Path(path_or_name)
    if path.is_file():
        return path
    found = grid_files().get(path.stem if path.suffix == ".yaml" else path.name)
    if len(path.parts) == 1 and found is not None:
        return found
    kind = path_kind(path)
    if kind == "a folder":
        inside = sorted(p.name for p in path.glob("*.yaml"))
        listed = f" (it holds {', '.join(inside[:5])}{' ...' if len(inside) > 5 else ''})" if inside else ""
        raise ConfigError(f"grid file {str(path_or_name)!r} is a folder, not a grid file; give a YAML file{listed}")
    if kind != "missing":
        raise ConfigError(f"grid file {str(path_or_name)!r} is {kind}, not a grid file; give a YAML file")
    raise ConfigError(f"grid file {str(path_or_name)!r} does not exist; shipped grids: {', '.join(shipped_grids())}")
