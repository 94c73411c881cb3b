"""A validated grid as the code uses it: :class:`Grid`, the specs of its sections (variants, WSD branches, tuning)
and :class:`PlannedRun`, one run of its expansion. The ladder's pieces (:class:`~sweeps.ladder.Size`,
:class:`~sweeps.ladder.BudgetSpec`) are in :mod:`sweeps.ladder`.

These are the parsed, frozen results; what a grid file may spell and how it is read is :mod:`sweeps.grid`. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from attnres.config import ModelConfig, RunConfig
from attnres.variants import Variant
from sweeps.ladder import BudgetSpec, Size
from sweeps.lookup import grid_files


@dataclass(frozen=True)
class BranchSpec:
    """``branches:``: the budgets of each (size, variant, lr, seed) become WSD cooldown branches of one stable trunk.

    ``decay_frac``: each branch's final linear decay, as a fraction of its own steps. ``stable``: the trunk's
    length (None: up to the last branch's decay start, the least that serves every branch). ``max_warmup_frac``:
    the shared warm-up (``train.warmup_frac`` of the longest branch) is capped at this fraction of the shortest
    branch, so that no budget is mostly warm-up (None: no cap, the rule the committed cpu_wsd study ran with)."""

    decay_frac: float = 0.2
    stable: BudgetSpec | None = None
    max_warmup_frac: float | None = 0.1


@dataclass(frozen=True)
class VariantSpec:
    """A depth-mixing variant of the grid; ``n_blocks`` is N for Block AttnRes, or ``"divisors"`` of L.

    An ablation variant (``{name: LABEL, model: {...}}`` in a grid) carries its model.* settings in ``model``
    and its label in ``name``. ``lr`` and ``seeds`` (a mapping entry's ``lr:`` / ``seeds:``) replace the grid's for
    this variant (None: the grid's), e.g. fewer rates and one seed for an arm that costs more.
    """

    residual: str
    n_blocks: int | Literal["divisors"] | None = None
    model: tuple[tuple[str, Any], ...] = ()
    name: str | None = None
    lr: tuple[float, ...] | None = None
    seeds: tuple[int, ...] | None = None

    def for_size(self, n_layer: int, default_n_blocks: int) -> list[tuple[str, str, int | None]]:
        """(label, residual, n_blocks) of this variant at a size with ``n_layer`` transformer blocks.

        ``default_n_blocks`` (:attr:`Grid.default_n_blocks`) stands in for a bare ``block``.
        """
        if self.name is not None:
            return [(self.name, self.residual, self.n_blocks if isinstance(self.n_blocks, int) else None)]
        if self.residual != "block":
            return [(self.residual, self.residual, None)]
        sublayers = 2 * n_layer
        if self.n_blocks == "divisors":
            values = [n for n in range(1, sublayers + 1) if sublayers % n == 0]
        else:
            values = [default_n_blocks if self.n_blocks is None else self.n_blocks]
        return [(Variant("block", n).label, "block", n) for n in values]


@dataclass(frozen=True)
class TuneSpec:
    """The ``tune:`` section: what ``attnres tune`` searches, on which budget, and where the result goes."""

    budget: BudgetSpec | None = None
    trials: int = 12
    lr: tuple[float, float] = (3e-4, 3e-2)
    warmup_frac: tuple[float, float] | None = None
    beta2: tuple[float, float] | None = None
    pruner: Literal["median", "hyperband", "none"] = "median"
    startup_trials: int = 3
    warmup_steps: int = 0
    eval_interval: int | None = None
    variants: tuple[str, ...] = ("baseline",)
    seed: int = 0
    file: str | None = None
    widen: int = 2  # times the lr range may be widened when the best value sits at its edge (0: never)
    finalists: int = 2  # best trials trained again with a second seed; the mean picks the winner (0: none)
    match_schedule: bool = True  # trials warm up and decay as the grid's runs do (False: the trial's own defaults)
    min_prune_frac: float = 0.5  # no trial is pruned before this fraction of its steps
    finalist_spacing: float = 1.25  # two finalists are at least this factor apart in learning rate

    @property
    def searched(self) -> tuple[str, ...]:
        return ("lr",) + tuple(n for n in ("warmup_frac", "beta2") if getattr(self, n) is not None)


@dataclass(frozen=True)
class PlannedRun:
    """One expanded run and where it came from in the grid."""

    cfg: RunConfig
    size: Size
    variant: str  # baseline | full | block<N>
    budget: BudgetSpec
    slurm: Mapping[str, Any]
    to_be_tuned: bool = False  # lr: tuned before `attnres tune` ran: cfg holds a stand-in lr, and so its run id
    role: Literal["run", "trunk", "branch"] = "run"  # branches: a WSD trunk (in <sweep>-trunk) or one of its branches

    @property
    def run_id(self) -> str:
        return self.cfg.run_id


@dataclass(frozen=True)
class Grid:
    """A validated grid file. Read-only; made by :func:`sweeps.grid.load_grid`, which expands it once to validate
    it and keeps that expansion in ``runs`` (:func:`sweeps.expansion.expand_runs` gives a command its runs). A copy
    with other settings (``dataclasses.replace``) would keep the old runs: load the grid again instead."""

    name: str
    path: Path | None
    description: str
    defaults: Mapping[str, Any]
    sizes: tuple[Size, ...]
    budgets: tuple[BudgetSpec, ...]
    variants: tuple[VariantSpec, ...]
    seeds: tuple[int, ...]
    lr: tuple[float, ...] | Literal["tuned", "tuned-baseline", "tuned-per-variant"] | None
    slurm: Mapping[str, Any]
    tune: TuneSpec
    overrides: tuple[str, ...] = ()
    branches: BranchSpec | None = None
    reuse: tuple[str, ...] = ()  # sweeps whose finished runs of equal run id are copied (sweeps/reuse.py)
    architecture: Any = None  # ladder.architecture: (sweeps/architecture.py): its cells are the sizes
    runs: tuple[PlannedRun, ...] = field(default=(), repr=False, compare=False)
    """Every run of the grid as loaded. With ``lr: tuned*``: with the values of the tuned file ``tuned_from``, or,
    with none (no results folder given, or not tuned yet), stand-ins marked ``to_be_tuned``."""
    tuned_from: Path | None = field(default=None, compare=False)
    """The tuned file whose values ``runs`` hold (None: none)."""

    @property
    def label(self) -> str:
        return f"grid {self.path}" if self.path else f"grid {self.name!r}"

    @property
    def default_n_blocks(self) -> int:
        """N of a bare ``block`` variant: the grid's ``defaults.model.n_blocks``, else the config's own default."""
        return int((self.defaults.get("model") or {}).get("n_blocks", ModelConfig.n_blocks))

    @property
    def tune_sweep(self) -> str:
        """The sweep name of ``attnres tune``'s trials (and the folder of its journal and tuned values)."""
        return f"{self.name}-tune"

    @property
    def tune_owner(self) -> str:
        """The grid whose ``attnres tune`` writes the tuned file: this one, or the one whose tuning folder
        ``tune.file`` names (``cpu_wsd-tune/tuned.yaml``: ``cpu_wsd``; such a grid only reads the file)."""
        if self.tune.file:
            first = Path(self.tune.file).parts[0]
            if first.endswith("-tune") and first != self.tune_sweep:
                return first.removesuffix("-tune")
        return self.name

    def tuned_file(self, results: str | Path) -> Path:
        """Where ``attnres tune`` writes, and ``lr: tuned`` reads, the tuned values (relative to the results)."""
        return Path(results) / (self.tune.file or f"{self.tune_sweep}/tuned.yaml")

    def tune_command(self, results: str | Path) -> str:
        """The ``attnres tune`` command that writes :meth:`tuned_file` under ``results``."""
        shipped = self.path is not None and self.path.resolve() in {p.resolve() for p in grid_files().values()}
        every = " --variants all" if self.lr == "tuned-per-variant" else ""
        if self.tune_owner != self.name:  # another grid's tuning writes the file
            return f"attnres tune {self.tune_owner} --results {results}{every}"
        return f"attnres tune {self.name if shipped or self.path is None else self.path} --results {results}{every}"
