"""Grid files: load and validate a sweep grid (YAML) into a frozen :class:`Grid`, and expand it into runs.

A grid is the cross product  sizes (the ladder) x budgets x variants x learning rates x seeds,  on top of
shared ``defaults:`` (any :class:`attnres.config.RunConfig` field). Every expanded run is built with
:func:`attnres.config.from_dict`, so a grid's settings are type-checked with the same messages as
``attnres train``. The whole grid is validated when it is loaded, before anything runs: unknown keys,
unknown variants, Block N out of range for a size, an empty ladder, duplicate runs.

The size ladder is two small functions, as in the OLMo ladder: :func:`model_of_size` ("what is a model
of depth n") and :func:`tokens_for` ("how many tokens for it"); ``Grid.sizes`` are the sizes of a grid.

This module imports no torch (plans and status stay fast). The grid format is documented in docs/sweeps.md.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from attnres.config import (
    ONLY_FOR,
    ConfigError,
    ModelConfig,
    RunConfig,
    TrainConfig,
    apply_overrides,
    as_number,
    from_dict,
    load_yaml,
    unknown_key,
)
from attnres.costs import count_params, run_budget
from attnres.data.corpus import with_data_vocab
from attnres.variants import Variant

GRID_DIR = Path(__file__).resolve().parent
STUDIES_DIR = GRID_DIR.parent / "studies"  # a committed study keeps its grids beside its results: studies/<study>/
TOP_KEYS = (
    "name", "description", "defaults", "ladder", "budgets", "variants", "seeds", "lr", "slurm", "tune", "branches",
    "reuse",
)  # fmt: skip
BUDGET_KINDS = ("tokens_per_param", "tokens", "flops")
TUNED = ("tuned", "tuned-baseline", "tuned-per-variant")  # the tuning protocols (sweeps/tuned_values.py)


# ------------------------------------------------------------------------------------------------------------
# the pieces of a grid
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetSpec:
    """One training budget: tokens per (non-embedding) parameter of the size, a token count, or training FLOPs."""

    kind: Literal["tokens_per_param", "tokens", "flops"]
    value: float

    @property
    def label(self) -> str:
        if self.kind == "tokens_per_param":
            return f"{self.value:g} tok/param"
        if self.kind == "tokens":
            return f"{self.value:.3g} tokens"
        return f"{self.value:.3g} FLOPs"


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

        ``default_n_blocks`` (the grid's defaults.model.n_blocks) stands in for a bare ``block``.
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
class Size:
    """One rung of the ladder: the model shape, plus settings that belong to this size only."""

    n_layer: int
    d_model: int
    n_head: int
    train: Mapping[str, Any] = field(default_factory=dict)
    """Per-size train.* settings (e.g. the paper's lr and batch per size)."""
    budgets: tuple[BudgetSpec, ...] | None = None
    """Per-size budgets, replacing the grid's."""
    slurm: Mapping[str, Any] = field(default_factory=dict)
    """Per-size SLURM resources, over the grid's slurm: section."""

    @property
    def name(self) -> str:
        """The size's key (tuned values are stored under it): ``L<n_layer>-d<d_model>``."""
        return f"L{self.n_layer}-d{self.d_model}"

    @property
    def model(self) -> dict[str, int]:
        return {"n_layer": self.n_layer, "d_model": self.d_model, "n_head": self.n_head}


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
class Grid:
    """A validated grid file. Read-only; :func:`expand` turns it into runs."""

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

    @property
    def label(self) -> str:
        return f"grid {self.path}" if self.path else f"grid {self.name!r}"

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


# ------------------------------------------------------------------------------------------------------------
# the ladder: two small functions
# ------------------------------------------------------------------------------------------------------------


def model_of_size(n_layer: int, width_per_layer: int, head_dim: int) -> dict[str, int]:
    """The model of depth ``n_layer``: width tied to depth, ``d_model ~ width_per_layer * n_layer``.

    d_model is rounded to a multiple of ``head_dim`` (at least one head), n_head = d_model / head_dim.
    """
    heads = max(1, round(width_per_layer * n_layer / head_dim))
    return {"n_layer": n_layer, "d_model": heads * head_dim, "n_head": heads}


def tokens_for(params: int, budget: BudgetSpec) -> dict[str, float | int | None]:
    """The train.* budget fields of a run of ``params`` non-embedding parameters under ``budget``.

    Tokens per parameter are counted on the size's baseline model, so every variant of a size trains on the
    same tokens (AttnRes adds a few thousand parameters; its extra FLOPs are paid in the compute axis). A FLOP
    budget is passed on as train.flops: each variant converts it to tokens with its own FLOP count.
    """
    if budget.kind == "tokens_per_param":
        return {"tokens": max(1, round(budget.value * params)), "flops": None}
    if budget.kind == "tokens":
        return {"tokens": int(budget.value), "flops": None}
    return {"tokens": None, "flops": float(budget.value)}


# ------------------------------------------------------------------------------------------------------------
# loading and validation
# ------------------------------------------------------------------------------------------------------------


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
    raise ConfigError(f"grid file {str(path_or_name)!r} does not exist; shipped grids: {', '.join(shipped_grids())}")


def load_grid(path_or_name: str | Path | Mapping[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> Grid:
    """Read and validate a grid (a YAML path, a shipped grid's name, or an already-parsed mapping).

    ``overrides`` are ``key=value`` settings (``data.corpus=/data/text``) applied to every run, after the grid.
    Raises :class:`ConfigError` with the grid file and the offending entry in the message.
    """
    if isinstance(path_or_name, Mapping):
        path, data = None, copy.deepcopy(dict(path_or_name))
    else:
        path = resolve_grid_path(path_or_name)
        data = load_yaml(path)
    where = f"grid {path}" if path else "grid"
    try:
        grid = _parse(data, path, tuple(overrides))
        _expand(grid, tuned=None)  # validate every run now, before anything is trained
    except ConfigError as err:
        message = str(err)
        raise ConfigError(message if message.startswith(where) else f"{where}: {message}") from None
    return grid


def _check_keys(data: Mapping, allowed: tuple[str, ...] | list[str], section: str) -> None:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{section.rstrip('.') or 'the grid'} must be a mapping, got {data!r}")
    for key in data:
        if key not in allowed:
            raise unknown_key(section, key, allowed)


def _number(value: Any, where: str, positive: bool = True) -> float:
    number = as_number(value)
    if number is None:
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if not math.isfinite(number) or (positive and not number > 0):
        raise ConfigError(f"{where} must be a {'positive' if positive else 'finite'} number, got {value!r}")
    return number


def _integer(value: Any, where: str, minimum: int = 1) -> int:
    number = _number(value, where, positive=False)
    if not float(number).is_integer() or number < minimum:
        raise ConfigError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return int(number)


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _parse(data: dict[str, Any], path: Path | None, overrides: tuple[str, ...]) -> Grid:
    _check_keys(data, TOP_KEYS, "")
    name = str(data.get("name") or (path.stem if path else "sweep"))
    # `attnres tune` trains into <sweep>-tune and WSD trunks into <sweep>-trunk, and `attnres fit` skips those
    # sweeps: a grid of that name would train and then be dropped from the fit without a word
    reserved = next((s for s in ("-tune", "-trunk") if name.endswith(s)), None)
    if reserved:
        raise ConfigError(
            f"name: {name!r} ends in {reserved!r}, which names the sweeps tuning and WSD trunks write; rename the grid"
        )
    defaults = data.get("defaults") or {}
    _check_keys(defaults, ("model", "data", "train", "runtime"), "defaults.")
    try:
        from_dict(RunConfig, apply_overrides({**defaults, "sweep": name}, list(overrides)))
    except ConfigError as err:
        raise ConfigError(f"defaults: {err}") from None
    if "ladder" not in data:
        raise ConfigError(
            "the ladder is empty: add ladder: {depths: [...], width_per_layer: W, head_dim: H} or ladder: {sizes: "
            "[...]}"
        )
    model_defaults = defaults.get("model") or {}
    sizes = _parse_ladder(data["ladder"], model_defaults)
    budgets = _parse_budgets(data.get("budgets"), "budgets")
    if not budgets and any(s.budgets is None for s in sizes):
        raise ConfigError(
            "budgets is empty: add budgets: [{tokens_per_param: 20}] (or tokens / flops), or budgets per size"
        )
    variants = _parse_variants(data.get("variants", ["baseline", "full", {"block": [4]}]))
    seeds = _parse_seeds(data.get("seeds", [defaults.get("train", {}).get("seed", 0)]), "seeds")
    lr = _parse_lr(data.get("lr"))
    slurm = data.get("slurm") or {}
    from sweeps.slurm import check_resources

    check_resources(slurm, "slurm.")
    tune = _parse_tune(data.get("tune") or {})
    branches = _parse_branches(data.get("branches"))
    reuse = _parse_reuse(data.get("reuse"), name)
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
    )


def _parse_ladder(value: Any, model_defaults: Mapping[str, Any]) -> tuple[Size, ...]:
    if isinstance(value, list):
        value = {"sizes": value}
    _check_keys(value, ("depths", "width_per_layer", "head_dim", "sizes"), "ladder.")
    if "sizes" in value and "depths" in value:
        raise ConfigError("ladder: give either depths (with width_per_layer and head_dim) or sizes, not both")
    sizes: list[Size] = []
    if "depths" in value:
        for key in ("width_per_layer", "head_dim"):
            if key not in value:
                raise ConfigError(
                    f"ladder.depths needs ladder.{key} (d_model = width_per_layer * n_layer, n_head = d_model / "
                    "head_dim)"
                )
        width = _integer(value["width_per_layer"], "ladder.width_per_layer")
        head_dim = _integer(value["head_dim"], "ladder.head_dim")
        for depth in _as_list(value["depths"] or []):
            sizes.append(Size(**model_of_size(_integer(depth, "ladder.depths"), width, head_dim)))
    else:
        for i, entry in enumerate(_as_list(value.get("sizes") or [])):
            where = f"ladder.sizes[{i}]."
            _check_keys(entry, ("n_layer", "d_model", "n_head", "head_dim", "train", "budgets", "slurm"), where)
            for key in ("n_layer", "d_model"):
                if key not in entry:
                    raise ConfigError(
                        f"{where}{key} is missing (each size needs n_layer and d_model, and n_head or head_dim)"
                    )
            n_layer = _integer(entry["n_layer"], where + "n_layer")
            d_model = _integer(entry["d_model"], where + "d_model")
            if "n_head" in entry:
                n_head = _integer(entry["n_head"], where + "n_head")
            elif "head_dim" in entry:
                n_head = max(1, d_model // _integer(entry["head_dim"], where + "head_dim"))
            else:
                n_head = int(model_defaults.get("n_head", ModelConfig.n_head))
            train = entry.get("train") or {}
            from_dict(TrainConfig, train, where + "train.")  # typed and checked here, applied per run
            budgets = _parse_budgets(entry["budgets"], where + "budgets") if "budgets" in entry else None
            slurm = entry.get("slurm") or {}
            from sweeps.slurm import check_resources

            check_resources(slurm, where + "slurm.")
            sizes.append(Size(n_layer, d_model, n_head, train=train, budgets=budgets, slurm=slurm))
    if not sizes:
        raise ConfigError("the ladder is empty: ladder.depths (or ladder.sizes) must list at least one size")
    names = Counter(s.name for s in sizes)
    repeated = [n for n, c in names.items() if c > 1]
    if repeated:
        raise ConfigError(f"ladder: size {repeated[0]} appears {names[repeated[0]]} times; list every size once")
    return tuple(sizes)


def _parse_reuse(value: Any, name: str) -> tuple[str, ...]:
    """``reuse: [sweep, ...]``: other sweeps of the same results folder whose finished runs this grid takes."""
    if value is None:
        return ()
    names = tuple(str(v) for v in _as_list(value))
    for other in names:
        if not other or not all(c.isalnum() or c in "-_." for c in other):
            raise ConfigError(f"reuse: {other!r} is not a sweep name (letters, digits, '-', '_' or '.')")
        if other == name:
            raise ConfigError(f"reuse: {other!r} is this grid's own sweep; name other sweeps, e.g. reuse: [cpu_wsd]")
    return names


def _parse_branches(value: Any) -> BranchSpec | None:
    if value is None or value is False:
        return None
    if value is True:
        return BranchSpec()
    if not isinstance(value, Mapping):
        raise ConfigError(f"branches must be a mapping like {{decay_frac: 0.2}}, got {value!r}")
    _check_keys(value, ("decay_frac", "stable", "max_warmup_frac"), "branches.")
    frac = value.get("decay_frac", BranchSpec.decay_frac)
    if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 < frac < 1:
        raise ConfigError(f"branches.decay_frac must be a fraction in (0, 1), got {frac!r}")
    cap = value.get("max_warmup_frac", BranchSpec.max_warmup_frac)
    if cap is not None and (not isinstance(cap, (int, float)) or isinstance(cap, bool) or not 0 <= cap < 1):
        raise ConfigError(
            f"branches.max_warmup_frac must be a fraction in [0, 1) of the shortest branch, or null (no cap), got "
            f"{cap!r}"
        )
    stable = None
    if value.get("stable") is not None:
        (stable,) = _parse_budgets([value["stable"]], "branches.stable")
    return BranchSpec(float(frac), stable, None if cap is None else float(cap))


def _parse_budgets(value: Any, where: str) -> tuple[BudgetSpec, ...]:
    if value is None:
        return ()
    out: list[BudgetSpec] = []
    for i, entry in enumerate(_as_list(value)):
        at = f"{where}[{i}]"
        if not isinstance(entry, Mapping) or len(entry) != 1:
            raise ConfigError(
                f"{at} must be one of {{tokens_per_param: X}}, {{tokens: N}} or {{flops: F}} (a value or a list), "
                f"got {entry!r}"
            )
        ((kind, values),) = entry.items()
        if kind not in BUDGET_KINDS:
            raise unknown_key(at + ".", kind, BUDGET_KINDS)
        for v in _as_list(values):
            out.append(BudgetSpec(kind, _number(v, f"{at}.{kind}")))
    return tuple(out)


def _parse_model_variant(entry: Mapping[str, Any]) -> VariantSpec:
    """``{name: LABEL, model: {residual: ..., ...}}``: a variant with its own model.* settings (an ablation)."""
    unknown = set(entry) - {"name", "model"}
    if unknown:
        raise unknown_key("variants: ", sorted(unknown)[0], ("name", "model", *VARIANT_RUN_KEYS))
    model = entry.get("model")
    if not isinstance(model, Mapping) or "residual" not in model:
        raise ConfigError(f"variants: {dict(entry)!r} needs model: {{residual: ..., ...}} (any model.* fields)")
    cfg = from_dict(ModelConfig, dict(model), "variants: model.")
    if "name" in entry:
        name = str(entry["name"]).strip()
    else:
        name = Variant.of(cfg).label
    if not name or any(c.isspace() or c == "/" for c in name):
        raise ConfigError(f"variants: name {entry.get('name')!r} must be a non-empty label without spaces or '/'")
    n_blocks = cfg.n_blocks if cfg.residual == "block" else None
    return VariantSpec(cfg.residual, n_blocks, model=tuple(sorted(dict(model).items())), name=name)


VARIANT_RUN_KEYS = ("lr", "seeds")  # a variant entry's own learning rates and seeds, replacing the grid's


def _parse_variants(value: Any) -> tuple[VariantSpec, ...]:
    """Every variant entry; a mapping entry may carry its own ``lr:`` and ``seeds:`` (:class:`VariantSpec`)."""
    out: list[VariantSpec] = []
    for entry in _as_list(value):
        own: dict[str, Any] = {}
        if isinstance(entry, Mapping) and set(entry) & set(VARIANT_RUN_KEYS):
            entry = dict(entry)
            where = f"variants: {entry!r}: "
            if "lr" in entry:
                lr = _parse_lr(entry.pop("lr"), where + "lr")
                if not isinstance(lr, tuple):
                    raise ConfigError(f"{where}lr must be rates (a value, a list or {{centre, factor, count}})")
                own["lr"] = lr
            if "seeds" in entry:
                own["seeds"] = _parse_seeds(entry.pop("seeds"), where + "seeds")
            if not entry:
                raise ConfigError(f"{where}name the variant too, e.g. {{block: [2], seeds: [0]}}")
        out += [dataclasses.replace(spec, **own) for spec in _parse_variant_entry(entry)]
    if not out:
        raise ConfigError(f"variants is empty; choose among {_VARIANT_CHOICES}")
    return tuple(out)


_VARIANT_CHOICES = (
    "baseline, full, block (with N: {block: [2, 4]} or {block: divisors}), or {name: LABEL, model: {...}}"
)


def _parse_variant_entry(entry: Any) -> list[VariantSpec]:
    """The variants of one entry of ``variants:`` (``{block: [2, 4]}`` is two)."""
    if isinstance(entry, Mapping) and "model" in entry:
        return [_parse_model_variant(entry)]
    if isinstance(entry, str):
        text = entry.strip().lower()
        if text == "block":  # N from the grid's default
            return [VariantSpec("block", None)]
        if main := Variant.parse_main(text):
            return [VariantSpec(main.name, main.n_blocks)]
        raise _unknown_variant(entry, text, ["baseline", "full", "block"])
    if isinstance(entry, Mapping) and len(entry) == 1:
        ((key, n_values),) = entry.items()
        if key != "block":
            raise _unknown_variant(key, str(key), ["block"])
        if n_values == "divisors":
            return [VariantSpec("block", "divisors")]
        return [VariantSpec("block", _integer(n, "variants: block N", minimum=-(10**9))) for n in _as_list(n_values)]
    raise ConfigError(f"variants: cannot read {entry!r}; choose {_VARIANT_CHOICES}")


def _unknown_variant(entry: Any, text: str, names: list[str]) -> ConfigError:
    hint = difflib.get_close_matches(text, names, n=1)
    return ConfigError(
        f"variants: unknown variant {entry!r}"
        + (f" (did you mean {hint[0]!r}?)" if hint else "")
        + f"; choose {_VARIANT_CHOICES}"
    )


def _parse_seeds(value: Any, where: str) -> tuple[int, ...]:
    seeds = tuple(_integer(s, where, minimum=0) for s in _as_list(value))
    if not seeds:
        raise ConfigError(f"{where} is empty: give a seed or a list of seeds, e.g. seeds: [0, 1]")
    return seeds


LR_LADDER_KEYS = ("centre", "factor", "count")


def lr_ladder(centre: float, factor: float, count: int) -> tuple[float, ...]:
    """``count`` learning rates a factor ``factor`` apart, centred (geometrically) on ``centre``: 4 rates a factor
    2 apart around c are c x 2^(-1.5, -0.5, 0.5, 1.5)."""
    return tuple(centre * factor ** (i - (count - 1) / 2) for i in range(count))


def _parse_lr(value: Any, where: str = "lr") -> tuple[float, ...] | str | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        _check_keys(value, LR_LADDER_KEYS, where + ".")
        missing = [k for k in LR_LADDER_KEYS if k not in value]
        if missing:
            raise ConfigError(
                f"{where} needs {', '.join(missing)}: {{centre: C, factor: F, count: K}} is K rates a factor F apart "
                "around C"
            )
        factor = _number(value["factor"], f"{where}.factor")
        if not factor > 1:
            raise ConfigError(f"{where}.factor must be > 1 (the ratio of neighbouring rates), got {value['factor']!r}")
        return lr_ladder(
            _number(value["centre"], f"{where}.centre"), factor, _integer(value["count"], f"{where}.count")
        )
    if isinstance(value, str) and value.strip().lower() in TUNED:
        return value.strip().lower()
    if isinstance(value, str) and value.strip().lower().startswith("tuned"):
        raise ConfigError(
            f"lr: {value!r} is not a tuning protocol; choose tuned-baseline (the paper's: every variant at the "
            "baseline's tuned values), tuned-per-variant (every variant tuned on its own, the same trials each) or "
            "tuned (a variant's own values where it was tuned, else the baseline's)"
        )
    values = tuple(_number(v, where) for v in _as_list(value))
    if not values:
        raise ConfigError(f"{where} is empty: give a value, a list, {{centre, factor, count}}, or tuned")
    return values


def _parse_range(value: Any, where: str) -> tuple[float, float] | None:
    if value is None or value is False:
        return None
    values = _as_list(value)
    if len(values) != 2:
        raise ConfigError(f"{where} must be a range [low, high], got {value!r}")
    low, high = (_number(v, where, positive=False) for v in values)
    if not low < high:
        raise ConfigError(f"{where} must be a range [low, high] with low < high, got {value!r}")
    return (low, high)


def _parse_tune(data: Mapping[str, Any]) -> TuneSpec:
    keys = (
        "budget", "trials", "lr", "warmup_frac", "beta2", "pruner", "variants", "eval_interval", "seed", "file",
        "widen", "finalists", "match_schedule", "finalist_spacing",
    )  # fmt: skip
    _check_keys(data, keys, "tune.")
    kwargs: dict[str, Any] = {}
    if "budget" in data:
        budgets = _parse_budgets(data["budget"], "tune.budget")
        if len(budgets) != 1:
            raise ConfigError("tune.budget must be exactly one budget, e.g. {tokens_per_param: 2}")
        kwargs["budget"] = budgets[0]
    if "trials" in data:
        kwargs["trials"] = _integer(data["trials"], "tune.trials")
    if "lr" in data:
        low, high = _parse_range(data["lr"], "tune.lr") or (0, 0)
        if low <= 0:
            raise ConfigError("tune.lr must be a positive range [low, high] (searched on a log scale)")
        kwargs["lr"] = (low, high)
    for key in ("warmup_frac", "beta2"):
        if key in data:
            kwargs[key] = _parse_range(data[key], f"tune.{key}")
    pruner = data.get("pruner", "median")
    if isinstance(pruner, Mapping):
        _check_keys(pruner, ("type", "startup_trials", "warmup_steps", "min_frac"), "tune.pruner.")
        if "min_frac" in pruner:
            frac = _number(pruner["min_frac"], "tune.pruner.min_frac", positive=False)
            if not 0 <= frac <= 1:
                raise ConfigError(f"tune.pruner.min_frac must be a fraction in [0, 1], got {pruner['min_frac']!r}")
            kwargs["min_prune_frac"] = float(frac)
        if "startup_trials" in pruner:
            kwargs["startup_trials"] = _integer(pruner["startup_trials"], "tune.pruner.startup_trials", minimum=0)
        if "warmup_steps" in pruner:
            kwargs["warmup_steps"] = _integer(pruner["warmup_steps"], "tune.pruner.warmup_steps", minimum=0)
        pruner = pruner.get("type", "median")
    pruner = "none" if pruner in (None, False) else str(pruner)
    if pruner not in ("median", "hyperband", "none"):
        raise ConfigError(f"tune.pruner={pruner!r} is not known; choose median, hyperband or none")
    kwargs["pruner"] = pruner
    if "variants" in data:
        kwargs["variants"] = tuple(str(v) for v in _as_list(data["variants"]))
    if data.get("eval_interval") is not None:
        kwargs["eval_interval"] = _integer(data["eval_interval"], "tune.eval_interval")
    if "seed" in data:
        kwargs["seed"] = _integer(data["seed"], "tune.seed", minimum=0)
    if "widen" in data:
        kwargs["widen"] = _integer(data["widen"], "tune.widen", minimum=0)
    if "finalists" in data:
        kwargs["finalists"] = _integer(data["finalists"], "tune.finalists", minimum=0)
    if "finalist_spacing" in data:
        spacing = _number(data["finalist_spacing"], "tune.finalist_spacing")
        if spacing < 1:
            raise ConfigError(f"tune.finalist_spacing must be >= 1 (a factor in learning rate), got {spacing!r}")
        kwargs["finalist_spacing"] = float(spacing)
    if "match_schedule" in data:
        if not isinstance(data["match_schedule"], bool):
            raise ConfigError(f"tune.match_schedule must be true or false, got {data['match_schedule']!r}")
        kwargs["match_schedule"] = data["match_schedule"]
    if data.get("file"):
        kwargs["file"] = str(data["file"])
    return TuneSpec(**kwargs)


# ------------------------------------------------------------------------------------------------------------
# expansion
# ------------------------------------------------------------------------------------------------------------


def size_params(grid: Grid, size: Size) -> int:
    """Non-embedding parameters of the size's baseline model (what tokens per parameter are counted on)."""
    model = {**(grid.defaults.get("model") or {}), **size.model, "residual": "baseline"}
    return count_params(from_dict(ModelConfig, model, "model.")).non_embedding


def _run_data(
    grid: Grid,
    size: Size,
    budget: BudgetSpec,
    residual: str,
    n_blocks: int | None,
    lr: float | None,
    seed: int,
    params: int,
) -> dict[str, Any]:
    data = copy.deepcopy(dict(grid.defaults))
    model = data.setdefault("model", {})
    model.update(size.model)
    model["residual"] = residual
    for name, readers in ONLY_FOR.items():  # a grid-wide default (defaults.model.n_blocks) only where it is read
        if residual not in readers:
            model.pop(name, None)
    if n_blocks is not None:
        model["n_blocks"] = n_blocks
    train = data.setdefault("train", {})
    train.update(copy.deepcopy(dict(size.train)))
    train.update(tokens_for(params, budget))
    if lr is not None:
        train["lr"] = lr
    train["seed"] = seed
    data["sweep"] = grid.name
    return apply_overrides(data, list(grid.overrides))


def _check_n_blocks(grid: Grid, size: Size, spec: VariantSpec) -> None:
    if spec.residual != "block" or spec.n_blocks == "divisors":
        return
    n = spec.n_blocks if spec.n_blocks is not None else _default_n_blocks(grid)
    if not 1 <= n <= 2 * size.n_layer:
        raise ConfigError(
            f"variants: block N={n} is out of range for size {size.name} (n_layer={size.n_layer}): Block AttnRes needs "
            f"1 <= N <= 2 * n_layer = {2 * size.n_layer}; drop N={n} or the size"
        )


def _expand(grid: Grid, tuned: Mapping[str, Any] | None) -> list[PlannedRun]:
    """Every run of the grid. ``tuned``: the tuned-values file's content (None: placeholders, for validation)."""
    from sweeps.slurm import merge_resources
    from sweeps.tuned_values import tuned_values

    runs: list[PlannedRun] = []
    for size in grid.sizes:
        try:
            params = size_params(grid, size)
        except ConfigError as err:
            raise ConfigError(f"size {size.name}: {err}") from None
        for spec in grid.variants:
            _check_n_blocks(grid, size, spec)
        for budget in size.budgets if size.budgets is not None else grid.budgets:
            for spec in grid.variants:
                for label, residual, n_blocks in spec.for_size(size.n_layer, _default_n_blocks(grid)):
                    extra: dict[str, Any] = {}
                    if spec.lr is not None:
                        lrs = spec.lr
                    elif isinstance(grid.lr, str):
                        lrs: tuple[float | None, ...] = (None,)
                        if tuned is not None:
                            extra = tuned_values(
                                tuned,
                                size.name,
                                label,
                                baseline_only=grid.lr == "tuned-baseline",
                                own_only=grid.lr == "tuned-per-variant",
                            )
                    else:
                        lrs = grid.lr or (None,)
                    for lr in lrs:
                        for seed in spec.seeds or grid.seeds:
                            data = _run_data(grid, size, budget, residual, n_blocks, lr, seed, params)
                            data["model"].update(dict(spec.model))
                            data["train"].update(extra)
                            where = f"size {size.name}, variant {label}, budget {budget.label}, seed {seed}"
                            try:
                                cfg = with_data_vocab(from_dict(RunConfig, data))
                            except ConfigError as err:
                                raise ConfigError(f"{where}: {err}") from None
                            _check_flop_budget(cfg, budget, size, where)
                            runs.append(PlannedRun(cfg, size, label, budget, merge_resources(grid.slurm, size.slurm)))
    if grid.branches is not None:
        runs = _as_branches(grid, runs)
    _check_duplicates(runs)
    return runs


def _as_branches(grid: Grid, runs: list[PlannedRun]) -> list[PlannedRun]:
    """``branches:``: the runs of each (size, variant, lr, seed), one per budget, become WSD branches of one trunk.

    Every branch and its trunk share the warm-up: ``warmup_frac`` of the longest branch, in tokens, capped at
    ``max_warmup_frac`` of the shortest (:class:`BranchSpec`). The trunk
    (``schedule: constant``, in ``<sweep>-trunk``) keeps a checkpoint at each branch's decay start and runs first:
    a size's trunks, then its branches."""
    from attnres.training.branches import branch_step, check_branch, trunk_of

    spec = grid.branches
    groups: dict[tuple, list[PlannedRun]] = {}
    for run in runs:
        groups.setdefault((run.size.name, run.variant, run.cfg.train.lr, run.cfg.train.seed), []).append(run)
    trunks: dict[str, list[PlannedRun]] = {}
    branch_of: dict[int, PlannedRun] = {}  # id of the plain run -> its branch (branches keep the grid's order)
    for group in groups.values():
        first = group[0].cfg
        lengths = [run_budget(r.cfg).tokens for r in group]
        warmup = round(first.train.warmup_frac * max(lengths))
        if spec.max_warmup_frac is not None:
            warmup = min(warmup, round(spec.max_warmup_frac * min(lengths)))
        made = []
        for run in group:
            train = dataclasses.replace(
                run.cfg.train, schedule="wsd", wsd_decay_frac=spec.decay_frac, warmup_tokens=warmup
            )
            made.append(dataclasses.replace(run, cfg=dataclasses.replace(run.cfg, train=train), role="branch"))
        starts = sorted({branch_step(r.cfg) for r in made})
        if spec.stable is not None:
            params = size_params(grid, group[0].size)
            stable = dataclasses.replace(
                first, train=dataclasses.replace(first.train, **tokens_for(params, spec.stable))
            )
            trunk_tokens = run_budget(stable).tokens
        else:
            trunk_tokens = starts[-1] * run_budget(first).batch_tokens
        for i, run in enumerate(made):
            train = dataclasses.replace(run.cfg.train, trunk_tokens=trunk_tokens)
            made[i] = dataclasses.replace(run, cfg=dataclasses.replace(run.cfg, train=train))
            try:
                check_branch(made[i].cfg)
            except ConfigError as err:
                raise ConfigError(
                    f"size {run.size.name}, variant {run.variant}, budget {run.budget.label}: {err}"
                ) from None
        trunk = trunk_of(made[0].cfg)
        trunk = dataclasses.replace(trunk, train=dataclasses.replace(trunk.train, save_at_steps=tuple(starts)))
        budget = BudgetSpec("tokens", float(trunk_tokens))
        trunks.setdefault(group[0].size.name, []).append(
            dataclasses.replace(group[0], cfg=trunk, budget=budget, role="trunk")
        )
        branch_of.update((id(r), b) for r, b in zip(group, made))
    ordered = []
    for size in trunks:
        ordered += trunks[size] + [branch_of[id(r)] for r in runs if r.size.name == size]
    return ordered


FLOP_BUDGET_SLACK = 0.1  # whole steps may overshoot a FLOP budget by at most this fraction


def _check_flop_budget(cfg: RunConfig, budget: BudgetSpec, size: Size, where: str) -> None:
    """A FLOP budget (an IsoFLOP grid's) that a size cannot meet: its whole steps would overshoot it by more than
    :data:`FLOP_BUDGET_SLACK` (a budget below a few steps of that size), so the run would sit at another compute."""
    if budget.kind != "flops":
        return
    got = run_budget(cfg)
    if got.flops > (1 + FLOP_BUDGET_SLACK) * budget.value:
        raise ConfigError(
            f"{where}: the budget {budget.value:.3g} FLOPs is less than a few steps of size {size.name} (one step of "
            f"{cfg.train.batch_size} sequences is {got.flops / got.steps:.3g} FLOPs; {got.steps} step(s) would train "
            f"{got.flops:.3g}); raise the budget, or give that size its own budgets (budgets: under the size)"
        )


def _default_n_blocks(grid: Grid) -> int:
    return int((grid.defaults.get("model") or {}).get("n_blocks", ModelConfig.n_blocks))


def _check_duplicates(runs: list[PlannedRun]) -> None:
    counts = Counter(r.run_id for r in runs)
    repeated = [r for r in runs if counts[r.run_id] > 1]
    if repeated:
        first = repeated[0]
        raise ConfigError(
            f"duplicate runs: {first.run_id} appears {counts[first.run_id]} times (size {first.size.name}, variant "
            f"{first.variant}, budget {first.budget.label}, seed {first.cfg.train.seed}); every combination of the "
            "grid must "
            "be a different run: remove the repeated variant / budget / seed / lr"
        )


def expand_runs(grid: Grid, results: str | Path | None = None, untuned_ok: bool = False) -> list[PlannedRun]:
    """Every run of the grid with its origin (size, variant, budget, SLURM resources).

    With ``lr: tuned`` the tuned values are read from :meth:`Grid.tuned_file` under ``results`` (default
    ``./results``); a missing file or value is a :class:`ConfigError` naming the ``attnres tune`` command. With
    ``untuned_ok`` (a plan, which trains nothing) a missing file gives the runs with a stand-in lr, marked
    ``to_be_tuned``.
    """
    tuned = None
    if isinstance(grid.lr, str):
        from sweeps.tuned_values import TunedValuesMissing, read_tuned

        results = results if results is not None else "results"
        try:
            tuned = read_tuned(grid.tuned_file(results), grid.lr, grid.tune_command(results), grid.name, results)
        except TunedValuesMissing:
            if not untuned_ok:
                raise
            return [dataclasses.replace(r, to_be_tuned=True) for r in _expand(grid, None)]
    try:
        return _expand(grid, tuned)
    except ConfigError as err:
        raise ConfigError(f"{grid.label}: {err}") from None


def expand(grid: Grid | str | Path, results: str | Path | None = None) -> list[RunConfig]:
    """The grid's runs as :class:`RunConfig` objects (sizes x budgets x variants x lr x seeds, in that order)."""
    if not isinstance(grid, Grid):
        grid = load_grid(grid)
    return [r.cfg for r in expand_runs(grid, results)]


def variant_labels(grid: Grid, size: Size) -> list[str]:
    """The variant labels of the grid at one size (baseline, full, block<N>), in grid order."""
    labels: list[str] = []
    for spec in grid.variants:
        labels += [label for label, _, _ in spec.for_size(size.n_layer, _default_n_blocks(grid)) if label not in labels]
    return labels


def make_run(
    grid: Grid,
    size: Size,
    variant: str,
    budget: BudgetSpec,
    seed: int,
    sweep: str | None = None,
    train: Mapping[str, Any] | None = None,
) -> RunConfig:
    """One run of the grid outside its cross product (``attnres tune`` builds its trials with it).

    ``variant``: baseline, full or block<N>; ``train``: extra train.* settings, applied last.
    """
    model: dict[str, Any] = {}
    if main := Variant.parse_main(variant):
        residual, n_blocks = main.name, main.n_blocks
    else:
        specs = [s for s in grid.variants if s.name == variant]
        if not specs:
            raise ConfigError(
                f"unknown variant {variant!r}; use baseline, full, block<N> (e.g. block4) or a grid variant's name"
            )
        residual, n_blocks, model = specs[0].residual, specs[0].n_blocks, dict(specs[0].model)
    data = _run_data(grid, size, budget, residual, n_blocks, None, seed, size_params(grid, size))
    data["model"].update(model)
    data["train"].update(dict(train or {}))
    if sweep:
        data["sweep"] = sweep
    try:
        return with_data_vocab(from_dict(RunConfig, data))
    except ConfigError as err:
        raise ConfigError(f"{grid.label}: size {size.name}, variant {variant}: {err}") from None
