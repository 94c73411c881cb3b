"""The tuned-values file: what ``attnres tune`` writes and a grid with ``lr: tuned`` reads.

One YAML file per tuned grid, by default ``RESULTS/<sweep>-tune/tuned.yaml``::

    sweep: cpu_small
    sizes:
      L4-d64:                      # Size.name: L<n_layer>-d<d_model>
        baseline: {lr: 0.0031, val_loss: 2.41, trials: 12, complete: 9, pruned: 3, budget: 2 tok/param}
        full: {lr: 0.0042, ...}    # present only if the variant was tuned on its own

``lr: tuned`` uses a variant's own values when it was tuned, else the baseline's of the same size (the paper's
protocol: every variant of a size shares the baseline's tuned hyper-parameters); ``lr: tuned-baseline`` always
uses the baseline's; ``lr: tuned-per-variant`` only a variant's own (every variant tuned with the same trials:
``attnres tune GRID --variants all``, its default for such a grid). The searched fields (lr, and warmup_frac /
beta2 when searched) are applied to the runs. No torch, no optuna.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attnres.config import ConfigError

APPLIED = ("lr", "warmup_frac", "beta2")  # the train.* fields a tuned entry may set


class TunedValuesMissing(ConfigError):
    """A grid with ``lr: tuned`` whose tuned file does not exist yet (``attnres tune`` has not run)."""


def read_tuned(
    path: Path, lr: str, command: str, owner: str | None = None, results: str | Path = "results"
) -> dict[str, Any]:
    """The tuned file at ``path`` (a grid's ``tuned_file``, for its ``lr`` setting); a :class:`ConfigError` naming
    ``command`` (the ``attnres tune`` that writes it) if it is missing or unreadable. ``owner``: the reading grid's
    name; a file another grid's tuning wrote names that grid's ``attnres tune`` in later errors instead."""
    import yaml

    hint = f"run `{command}` first (or set lr to a value)"
    if not path.is_file():
        raise TunedValuesMissing(f"lr: {lr} needs tuned values, but {path} does not exist; {hint}")
    from attnres.config import DuplicateKey, _yaml_loader

    try:
        # the grid's own loader: a rate written twice for one cell (a hand edit) is refused, not the last one kept
        data = yaml.load(path.read_text(), Loader=_yaml_loader()) or {}  # noqa: S506 (a SafeLoader)
    except DuplicateKey as dup:
        raise ConfigError(
            f"{path}: key {dup.key!r} is given twice in one mapping (lines {dup.first} and {dup.again}), and YAML "
            f"would keep the second without a word; remove one of them, or {hint}"
        ) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML ({err}); {hint}") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("sizes"), Mapping):
        raise ConfigError(f"{path} has no sizes: section; {hint}")
    if owner and data.get("sweep") not in (None, owner):  # another grid's tuning writes it (check_writer)
        hint = f"tune them with `attnres tune {data['sweep']} --results {results} --variants ...` first"
    return {**data, "_path": str(path), "_hint": hint}


def tuned_values(
    tuned: Mapping[str, Any], size: str, variant: str, baseline_only: bool = False, own_only: bool = False
) -> dict[str, float]:
    """The train.* values for (size, variant): the variant's own entry, else the baseline's (``baseline_only``:
    always the baseline's; ``own_only``: only its own, the per-variant protocol)."""
    entries = (tuned.get("sizes") or {}).get(size) or {}
    entry = None if baseline_only else entries.get(variant)
    if not own_only:
        entry = entry or entries.get("baseline")
    if not entry:
        which = "baseline" if baseline_only else variant if own_only else f"{variant} or baseline"
        raise ConfigError(
            f"lr: tuned, but {tuned.get('_path', 'the tuned file')} has no value for size {size} (variant {which}); "
            f"{tuned.get('_hint', 'run attnres tune first')}"
        )
    return {k: float(entry[k]) for k in APPLIED if entry.get(k) is not None}


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check_writer(path: str | Path, sweep: str, owner: str | None = None) -> None:
    """A tuned file of another grid's tuning (a grid whose ``tune.file`` reads it, as the per-variant protocol's
    ``cpu_wsd_pv`` reads ``cpu_wsd``'s) is that grid's to tune: a :class:`ConfigError` before any trial. ``owner``:
    the grid its path names (:attr:`Grid.tune_owner`), else the grid the file records."""
    owner = owner if owner not in (None, sweep) else _recorded_owner(Path(path))
    if owner not in (None, sweep):
        raise ConfigError(
            f"{path} is written by the tuning of grid {owner!r}; this grid ({sweep!r}) only reads it (tune.file). "
            f"Tune with `attnres tune {owner} ...`, or give this grid a tuned file of its own"
        )


def _recorded_owner(path: Path) -> str | None:
    """The ``sweep:`` a tuned file records (None: no file, or none readable: read_tuned names the problem)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) if path.is_file() else None
    except yaml.YAMLError:
        return None
    return data.get("sweep") if isinstance(data, Mapping) else None


def write_tuned(path: str | Path, sweep: str, size: str, variant: str, values: Mapping[str, Any]) -> None:
    """Merge one (size, variant) entry into the tuned file (atomically; safe with several tune processes)."""
    import yaml

    from attnres.storage.schema import atomic_write_bytes

    path = Path(path)
    with _locked(path):
        data = (yaml.safe_load(path.read_text()) if path.is_file() else None) or {}
        check_writer(path, sweep)  # again under the lock: another tuner may have written it meanwhile
        data["sweep"] = sweep
        data.setdefault("sizes", {}).setdefault(size, {})[variant] = dict(values)
        header = "# Written by `attnres tune`; read by grids with `lr: tuned` (see docs/sweeps.md).\n"
        atomic_write_bytes(path, (header + yaml.safe_dump(data, sort_keys=False)).encode())
