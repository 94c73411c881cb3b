"""A grid file's sections: the frozen schema of each (what it may hold) and the reader that turns it into the specs a
:class:`~sweeps.specs.Grid` holds. :mod:`sweeps.grid` reads the file's top level and calls these in turn.

Every section is read by the parser run configs use, :func:`attnres.config.from_dict` (OmegaConf structured configs,
with errors that name the field): :func:`read_section`. Where a section's spelling is a union OmegaConf cannot type,
a small normaliser turns it into what the schema takes: one value or a list (:func:`_listed`: depths, seeds, rates,
budgets); ``lr:`` as rates, :class:`LrLadder` or a tuning protocol; a variant as a name, ``{block: N}`` or
:class:`AblationVariant`; ``ladder:`` as a list of sizes; ``branches: true``; ``tune.pruner`` as a name. No torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from attnres.config import (
    SECTIONS,
    ConfigError,
    ModelConfig,
    RunConfig,
    TrainConfig,
    apply_overrides,
    as_number,
    from_dict,
    unknown_key,
)
from attnres.variants import Variant
from sweeps.ladder import BudgetSpec, Size, model_of_size
from sweeps.slurm import check_resources
from sweeps.specs import BranchSpec, TuneSpec, VariantSpec

TUNED = ("tuned", "tuned-baseline", "tuned-per-variant")  # the tuning protocols (sweeps/tuned_values.py)
# the bounds a schema field declares, checked with the field's full name (a section read in several places, as a
# budget or an lr ladder, has no fixed name for __post_init__ to give)
AT_LEAST_0, AT_LEAST_1, POSITIVE = {"at_least": 0}, {"at_least": 1}, {"positive": True}


# ------------------------------------------------------------------------------------------------------------
# the schemas
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LadderSection:
    """``ladder:``: depths, with width tied to depth (:func:`~sweeps.ladder.model_of_size`), or explicit sizes."""

    depths: tuple[int, ...] = field(default=(), metadata=AT_LEAST_1)
    """Transformer blocks of each size (a value or a list)."""
    width_per_layer: int | None = field(default=None, metadata=AT_LEAST_1)
    """d_model = width_per_layer * n_layer, rounded to a multiple of head_dim."""
    head_dim: int | None = field(default=None, metadata=AT_LEAST_1)
    """n_head = d_model / head_dim."""
    sizes: Any = None
    """A list of :class:`SizeEntry`, each read on its own (its slurm: is not OmegaConf's)."""


@dataclass(frozen=True)
class SizeEntry:
    """One entry of ``ladder.sizes``: a model shape, and settings that belong to this size only."""

    n_layer: int = field(metadata=AT_LEAST_1)
    d_model: int = field(metadata=AT_LEAST_1)
    n_head: int | None = field(default=None, metadata=AT_LEAST_1)
    """Attention heads (neither this nor head_dim: the grid's defaults.model.n_head)."""
    head_dim: int | None = field(default=None, metadata=AT_LEAST_1)
    """n_head = d_model // head_dim."""
    train: Any = None
    """train.* settings of this size's runs, over the grid's defaults (read by :class:`attnres.config.TrainConfig`)."""
    budgets: Any = None
    """This size's budgets, replacing the grid's (as ``budgets:``)."""
    slurm: Any = None
    """This size's SLURM resources, over the grid's (as ``slurm:``)."""


@dataclass(frozen=True)
class BudgetEntry:
    """One entry of ``budgets:`` (and of a size's ``budgets:``, ``tune.budget``, ``branches.stable``): exactly one
    of these, a value or a list."""

    tokens_per_param: tuple[float, ...] = field(default=(), metadata=POSITIVE)
    """Tokens per non-embedding parameter of the size's baseline model."""
    tokens: tuple[float, ...] = field(default=(), metadata=POSITIVE)
    flops: tuple[float, ...] = field(default=(), metadata=POSITIVE)
    """Training FLOPs (each variant converts them to tokens with its own FLOP count)."""


@dataclass(frozen=True)
class LrLadder:
    """``lr: {centre: C, factor: F, count: K}``: K rates a factor F apart, centred (geometrically) on C."""

    centre: float = field(metadata=POSITIVE)
    factor: float = field(metadata=POSITIVE)
    count: int = field(metadata=AT_LEAST_1)


@dataclass(frozen=True)
class AblationVariant:
    """A variant with its own model.* settings, e.g. an AttnRes ablation: ``{name: LABEL, model: {...}}``."""

    name: str | None = None
    """Its label in the results (default: the variant's own, e.g. block2+no_key_norm)."""
    model: Any = None
    """Any :class:`attnres.config.ModelConfig` fields, residual among them (read by ModelConfig)."""
    lr: Any = None
    """As :class:`VariantRuns`."""
    seeds: Any = None
    """As :class:`VariantRuns`."""


@dataclass(frozen=True)
class VariantRuns:
    """What a mapping entry of ``variants:`` may add to its variant: its own runs' settings, replacing the grid's
    (e.g. fewer rates and one seed for an arm that costs more)."""

    lr: Any = None
    """Rates: a value, a list, or :class:`LrLadder`."""
    seeds: tuple[int, ...] = field(default=(), metadata=AT_LEAST_0)


@dataclass(frozen=True)
class PrunerSection:
    """``tune.pruner`` as a mapping (a name alone is its ``type``)."""

    type: Any = TuneSpec.pruner
    """median, hyperband or none (null or false: none)."""
    startup_trials: int = field(default=TuneSpec.startup_trials, metadata=AT_LEAST_0)
    warmup_steps: int = field(default=TuneSpec.warmup_steps, metadata=AT_LEAST_0)
    min_frac: float = TuneSpec.min_prune_frac
    """No trial is pruned before this fraction of its steps."""

    def __post_init__(self) -> None:
        if not 0 <= self.min_frac <= 1:
            raise ConfigError(f"tune.pruner.min_frac must be a fraction in [0, 1], got {self.min_frac!r}")


@dataclass(frozen=True)
class TuneSection:
    """``tune:``: what ``attnres tune`` searches and on which budget (:class:`~sweeps.specs.TuneSpec` says what each
    setting does)."""

    budget: Any = None
    """Exactly one :class:`BudgetEntry`."""
    trials: int = field(default=TuneSpec.trials, metadata=AT_LEAST_1)
    lr: tuple[float, ...] = TuneSpec.lr
    """A range [low, high], searched on a log scale."""
    warmup_frac: tuple[float, ...] | None = TuneSpec.warmup_frac
    beta2: tuple[float, ...] | None = TuneSpec.beta2
    pruner: Any = TuneSpec.pruner
    """A name, or :class:`PrunerSection`."""
    variants: tuple[str, ...] = TuneSpec.variants
    eval_interval: int | None = field(default=TuneSpec.eval_interval, metadata=AT_LEAST_1)
    seed: int = field(default=TuneSpec.seed, metadata=AT_LEAST_0)
    file: str | None = TuneSpec.file
    widen: int = field(default=TuneSpec.widen, metadata=AT_LEAST_0)
    finalists: int = field(default=TuneSpec.finalists, metadata=AT_LEAST_0)
    match_schedule: bool = TuneSpec.match_schedule
    finalist_spacing: float = field(default=TuneSpec.finalist_spacing, metadata=POSITIVE)

    def __post_init__(self) -> None:
        for key in ("lr", "warmup_frac", "beta2"):
            value = getattr(self, key)
            if value is not None and len(value) != 2:
                raise ConfigError(f"tune.{key} must be a range [low, high], got {list(value)!r}")
            if value is not None and not value[0] < value[1]:
                raise ConfigError(f"tune.{key} must be a range [low, high] with low < high, got {list(value)!r}")
        if self.lr[0] <= 0:
            raise ConfigError("tune.lr must be a positive range [low, high] (searched on a log scale)")
        if self.finalist_spacing < 1:
            raise ConfigError(
                f"tune.finalist_spacing must be >= 1 (a factor in learning rate), got {self.finalist_spacing!r}"
            )


@dataclass(frozen=True)
class BranchSection:
    """``branches:`` as a mapping (:class:`~sweeps.specs.BranchSpec` says what each setting does)."""

    decay_frac: float = BranchSpec.decay_frac
    stable: Any = None
    """The trunk's length: one :class:`BudgetEntry`."""
    max_warmup_frac: float | None = BranchSpec.max_warmup_frac

    def __post_init__(self) -> None:
        if not 0 < self.decay_frac < 1:
            raise ConfigError(f"branches.decay_frac must be a fraction in (0, 1), got {self.decay_frac!r}")
        cap = self.max_warmup_frac
        if cap is not None and not 0 <= cap < 1:
            raise ConfigError(
                f"branches.max_warmup_frac must be a fraction in [0, 1) of the shortest branch, or null (no cap), got "
                f"{cap!r}"
            )


# ------------------------------------------------------------------------------------------------------------
# the reader every section goes through, and the one union every list is: one value or a list of them
# ------------------------------------------------------------------------------------------------------------


def read_section(cls: type, data: Any, where: str, own: tuple[str, ...] = ()) -> Any:
    """``data`` read as the schema ``cls`` by the run configs' parser, :func:`attnres.config.from_dict`: OmegaConf
    checks its keys and types, ``__post_init__`` the rules between fields, each error a :class:`ConfigError` naming
    ``where`` + the field. Around it, what OmegaConf's types cannot say: a ``tuple[X, ...]`` field takes one value
    or a list, each element checked here (:func:`_listed`); the bound a field declares in its metadata (``>= N``,
    positive) is checked after; and the fields in ``own`` are left to the caller, which reads them itself."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where.rstrip('.') or 'the grid'} must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    prepared = {}
    for key, value in data.items():
        if key in own:
            continue
        tp = _hints(cls).get(key)
        if _element(tp) is not None and not (value is None and _optional(tp)):
            value = _listed([] if value is None else value, _element(tp), where + key, fields[key].metadata)
        prepared[key] = value
    read = from_dict(cls, prepared, where)
    for key, value in prepared.items():
        if key in fields and _element(_hints(cls)[key]) is None and getattr(read, key) is not None:
            _check_bound(getattr(read, key), fields[key].metadata, where + key, value)
    return read


def _values(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _listed(value: Any, kind: type, where: str, bound: Mapping[str, Any] | None = None) -> tuple:
    """One value or a list of them as a tuple of ``kind`` (int, float or str), each element named by ``where`` when it
    is not one: numbers as YAML writes them (``2e6``), finite, within ``bound``."""
    out = []
    for given in _values(value):
        if kind is str:
            out.append(str(given))
            continue
        if _quoted_number(given):
            raise ConfigError(
                f"{where} must be {'integers' if kind is int else 'numbers'}, not the text {given!r}: write it "
                f"without quotes ({where.rsplit('.', 1)[-1]}: {given.strip()}, or a list: [{given.strip()}, ...])"
            )
        number = as_number(given)
        if number is None or (kind is int and math.isfinite(number) and not number.is_integer()):
            raise ConfigError(f"{where} must be {'an integer' if kind is int else 'a number'}, got {given!r}")
        if not math.isfinite(number):
            raise ConfigError(f"{where} must be a finite number, got {given!r}")
        out.append(kind(number))
        _check_bound(out[-1], bound or {}, where, given)
    return tuple(out)


def _quoted_number(given: Any) -> bool:
    """A text that YAML, unquoted, would have read as a number (``depths: "2"``): quoted, so meant as text, or a
    list written as one string. (An unquoted ``2e6`` is text to YAML too, and is taken as the number it spells.)"""
    import yaml

    if not isinstance(given, str):
        return False
    try:
        read = yaml.safe_load(given)
    except yaml.YAMLError:
        return False
    return isinstance(read, (int, float)) and not isinstance(read, bool)


def _check_bound(value: float, bound: Mapping[str, Any], where: str, given: Any) -> None:
    if "at_least" in bound and value < bound["at_least"]:
        raise ConfigError(f"{where} must be an integer >= {bound['at_least']}, got {given!r}")
    if bound.get("positive") and not value > 0:
        raise ConfigError(f"{where} must be a positive number, got {given!r}")


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _element(tp: Any) -> type | None:
    """X of a ``tuple[X, ...]`` field (or ``tuple[X, ...] | None``); None for any other."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else None
    args = typing.get_args(tp)
    return args[0] if typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis else None


# ------------------------------------------------------------------------------------------------------------
# the sections
# ------------------------------------------------------------------------------------------------------------


def read_defaults(defaults: Any, name: str, overrides: tuple[str, ...]) -> Mapping[str, Any]:
    """``defaults:``, checked as the run config they start (with the overrides, as every run gets them)."""
    if not isinstance(defaults, Mapping):
        raise ConfigError(f"defaults must be a mapping, got {defaults!r}")
    for key in defaults:
        if key not in SECTIONS:
            raise unknown_key("defaults.", key, tuple(SECTIONS))
    defaults = {key: {} if value is None else value for key, value in defaults.items()}  # `train:` left empty
    try:
        from_dict(RunConfig, apply_overrides({**defaults, "sweep": name}, list(overrides)))
    except ConfigError as err:
        raise ConfigError(f"defaults: {err}") from None
    return defaults


def read_ladder(value: Any, model_defaults: Mapping[str, Any]) -> tuple[Size, ...]:
    """``ladder:`` (:class:`LadderSection`, or a bare list of sizes) as the grid's sizes, each once."""
    if isinstance(value, list):
        value = {"sizes": value}
    ladder = read_section(LadderSection, value, "ladder.", own=("sizes",))
    if "sizes" in value and "depths" in value:
        raise ConfigError("ladder: give either depths (with width_per_layer and head_dim) or sizes, not both")
    if "depths" in value:
        for key in ("width_per_layer", "head_dim"):
            if getattr(ladder, key) is None:
                raise ConfigError(
                    f"ladder.depths needs ladder.{key} (d_model = width_per_layer * n_layer, n_head = d_model / "
                    "head_dim)"
                )
        sizes = [Size(**model_of_size(d, ladder.width_per_layer, ladder.head_dim)) for d in ladder.depths]
    else:
        entries = enumerate(_values(value.get("sizes") or []))
        sizes = [_size(entry, f"ladder.sizes[{i}].", model_defaults) for i, entry in entries]
    if not sizes:
        raise ConfigError("the ladder is empty: ladder.depths (or ladder.sizes) must list at least one size")
    names = Counter(s.name for s in sizes)
    repeated = [n for n, c in names.items() if c > 1]
    if repeated:
        raise ConfigError(f"ladder: size {repeated[0]} appears {names[repeated[0]]} times; list every size once")
    return tuple(sizes)


def _size(entry: Any, where: str, model_defaults: Mapping[str, Any]) -> Size:
    """One entry of ``ladder.sizes`` (:class:`SizeEntry`)."""
    for key in ("n_layer", "d_model"):
        if isinstance(entry, Mapping) and key not in entry:
            raise ConfigError(f"{where}{key} is missing (each size needs n_layer and d_model, and n_head or head_dim)")
    read = read_section(SizeEntry, entry, where, own=("train", "budgets", "slurm"))
    if read.n_head is not None:
        n_head = read.n_head
    elif read.head_dim is not None:
        n_head = max(1, read.d_model // read.head_dim)
    else:
        n_head = int(model_defaults.get("n_head", ModelConfig.n_head))
    train = entry.get("train") or {}
    from_dict(TrainConfig, train, where + "train.")  # typed and checked here, applied per run
    budgets = read_budgets(entry["budgets"], where + "budgets") if "budgets" in entry else None
    slurm = entry.get("slurm") or {}
    check_resources(slurm, where + "slurm.")
    return Size(read.n_layer, read.d_model, n_head, train=train, budgets=budgets, slurm=slurm)


def read_budgets(value: Any, where: str) -> tuple[BudgetSpec, ...]:
    """A :class:`BudgetEntry` or a list of them (at ``where``) as budgets, one per value."""
    if value is None:
        return ()
    out: list[BudgetSpec] = []
    for i, entry in enumerate(_values(value)):
        at = f"{where}[{i}]"
        if not isinstance(entry, Mapping) or len(entry) != 1:
            raise ConfigError(
                f"{at} must be one of {{tokens_per_param: X}}, {{tokens: N}} or {{flops: F}} (a value or a list), "
                f"got {entry!r}"
            )
        ((kind, _),) = entry.items()
        out += [BudgetSpec(kind, v) for v in getattr(read_section(BudgetEntry, entry, at + "."), kind)]
    return tuple(out)


_VARIANT_CHOICES = (
    "baseline, full, block (with N: {block: [2, 4]} or {block: divisors}), or {name: LABEL, model: {...}}"
)


def read_variants(value: Any) -> tuple[VariantSpec, ...]:
    """Every variant entry; a mapping entry may carry its own ``lr:`` and ``seeds:`` (:class:`VariantRuns`)."""
    out: list[VariantSpec] = []
    runs = {f.name for f in dataclasses.fields(VariantRuns)}
    for entry in _values(value):
        own: dict[str, Any] = {}
        if isinstance(entry, Mapping) and set(entry) & runs:
            entry = dict(entry)
            where = f"variants: {entry!r}: "
            if "lr" in entry:
                lr = read_lr(entry.pop("lr"), where + "lr")
                if not isinstance(lr, tuple):
                    raise ConfigError(f"{where}lr must be rates (a value, a list or {{centre, factor, count}})")
                own["lr"] = lr
            if "seeds" in entry:
                own["seeds"] = read_seeds(entry.pop("seeds"), where + "seeds")
            if not entry:
                raise ConfigError(f"{where}name the variant too, e.g. {{block: [2], seeds: [0]}}")
        out += [dataclasses.replace(spec, **own) for spec in _variant(entry)]
    if not out:
        raise ConfigError(f"variants is empty; choose among {_VARIANT_CHOICES}")
    return tuple(out)


def _variant(entry: Any) -> list[VariantSpec]:
    """The variants of one entry of ``variants:`` (``{block: [2, 4]}`` is two)."""
    if isinstance(entry, Mapping) and "model" in entry:
        return [_ablation(entry)]
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
        return [VariantSpec("block", n) for n in _listed(n_values, int, "variants: block N")]
    raise ConfigError(f"variants: cannot read {entry!r}; choose {_VARIANT_CHOICES}")


def _ablation(entry: Mapping[str, Any]) -> VariantSpec:
    """``{name: LABEL, model: {residual: ..., ...}}``: a variant with its own model.* settings (an ablation)."""
    read = read_section(AblationVariant, entry, "variants: ", own=("model",))
    model = entry.get("model")
    if not isinstance(model, Mapping) or "residual" not in model:
        raise ConfigError(f"variants: {dict(entry)!r} needs model: {{residual: ..., ...}} (any model.* fields)")
    cfg = from_dict(ModelConfig, dict(model), "variants: model.")
    name = read.name.strip() if read.name is not None else Variant.of(cfg).label
    if not name or any(c.isspace() or c == "/" for c in name):
        raise ConfigError(f"variants: name {entry.get('name')!r} must be a non-empty label without spaces or '/'")
    n_blocks = cfg.n_blocks if cfg.residual == "block" else None
    return VariantSpec(cfg.residual, n_blocks, model=tuple(sorted(dict(model).items())), name=name)


def _unknown_variant(entry: Any, text: str, names: list[str]) -> ConfigError:
    hint = difflib.get_close_matches(text, names, n=1)
    return ConfigError(
        f"variants: unknown variant {entry!r}"
        + (f" (did you mean {hint[0]!r}?)" if hint else "")
        + f"; choose {_VARIANT_CHOICES}"
    )


def read_seeds(value: Any, where: str) -> tuple[int, ...]:
    """A seed or a list of seeds (at least one)."""
    seeds = _listed(value, int, where, AT_LEAST_0)
    if not seeds:
        raise ConfigError(f"{where} is empty: give a seed or a list of seeds, e.g. seeds: [0, 1]")
    return seeds


def lr_ladder(centre: float, factor: float, count: int) -> tuple[float, ...]:
    """``count`` learning rates a factor ``factor`` apart, centred (geometrically) on ``centre``: 4 rates a factor
    2 apart around c are c x 2^(-1.5, -0.5, 0.5, 1.5)."""
    return tuple(centre * factor ** (i - (count - 1) / 2) for i in range(count))


def read_lr(value: Any, where: str = "lr") -> tuple[float, ...] | str | None:
    """``lr:``: rates (a value, a list or :class:`LrLadder`), a tuning protocol, or None (the runs' own)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        missing = [f.name for f in dataclasses.fields(LrLadder) if f.name not in value]
        if missing:
            raise ConfigError(
                f"{where} needs {', '.join(missing)}: {{centre: C, factor: F, count: K}} is K rates a factor F apart "
                "around C"
            )
        ladder = read_section(LrLadder, value, where + ".")
        if not ladder.factor > 1:
            raise ConfigError(f"{where}.factor must be > 1 (the ratio of neighbouring rates), got {value['factor']!r}")
        return lr_ladder(ladder.centre, ladder.factor, ladder.count)
    if isinstance(value, str) and value.strip().lower() in TUNED:
        return value.strip().lower()
    if isinstance(value, str) and value.strip().lower().startswith("tuned"):
        raise ConfigError(
            f"lr: {value!r} is not a tuning protocol; choose tuned-baseline (the paper's: every variant at the "
            "baseline's tuned values), tuned-per-variant (every variant tuned on its own, the same trials each) or "
            "tuned (a variant's own values where it was tuned, else the baseline's)"
        )
    values = _listed(value, float, where, POSITIVE)
    if not values:
        raise ConfigError(f"{where} is empty: give a value, a list, {{centre, factor, count}}, or tuned")
    return values


def read_tune(data: Any) -> TuneSpec:
    """``tune:`` (:class:`TuneSection`, its pruner a name or :class:`PrunerSection`)."""
    if isinstance(data, Mapping):
        if "match_schedule" in data and not isinstance(data["match_schedule"], bool):
            raise ConfigError(f"tune.match_schedule must be true or false, got {data['match_schedule']!r}")
        data = {k: None if k in ("warmup_frac", "beta2") and v is False else v for k, v in data.items()}
    tune = read_section(TuneSection, data, "tune.", own=("budget", "pruner"))
    budget = None
    if "budget" in data:
        budgets = read_budgets(data["budget"], "tune.budget")
        if len(budgets) != 1:
            raise ConfigError("tune.budget must be exactly one budget, e.g. {tokens_per_param: 2}")
        budget = budgets[0]
    given = data.get("pruner", TuneSpec.pruner)
    pruner = read_section(PrunerSection, given, "tune.pruner.") if isinstance(given, Mapping) else PrunerSection(given)
    kind = "none" if pruner.type in (None, False) else str(pruner.type)
    if kind not in ("median", "hyperband", "none"):
        raise ConfigError(f"tune.pruner={kind!r} is not known; choose median, hyperband or none")
    return TuneSpec(
        budget=budget,
        trials=tune.trials,
        lr=tune.lr,
        warmup_frac=tune.warmup_frac,
        beta2=tune.beta2,
        pruner=kind,
        startup_trials=pruner.startup_trials,
        warmup_steps=pruner.warmup_steps,
        eval_interval=tune.eval_interval,
        variants=tune.variants,
        seed=tune.seed,
        file=tune.file or None,
        widen=tune.widen,
        finalists=tune.finalists,
        match_schedule=tune.match_schedule,
        min_prune_frac=float(pruner.min_frac),
        finalist_spacing=float(tune.finalist_spacing),
    )


def read_branches(value: Any) -> BranchSpec | None:
    """``branches:``: true (the defaults), :class:`BranchSection`, or none."""
    if value is None or value is False:
        return None
    if value is True:
        return BranchSpec()
    if not isinstance(value, Mapping):
        raise ConfigError(f"branches must be a mapping like {{decay_frac: 0.2}}, got {value!r}")
    branches = read_section(BranchSection, value, "branches.", own=("stable",))
    stable = None
    if value.get("stable") is not None:
        (stable,) = read_budgets([value["stable"]], "branches.stable")
    return BranchSpec(float(branches.decay_frac), stable, branches.max_warmup_frac)


def read_reuse(value: Any, name: str) -> tuple[str, ...]:
    """``reuse: [sweep, ...]``: other sweeps of the same results folder whose finished runs this grid takes."""
    if value is None:
        return ()
    names = _listed(value, str, "reuse")
    for other in names:
        if not other or not all(c.isalnum() or c in "-_." for c in other):
            raise ConfigError(f"reuse: {other!r} is not a sweep name (letters, digits, '-', '_' or '.')")
        if other == name:
            raise ConfigError(f"reuse: {other!r} is this grid's own sweep; name other sweeps, e.g. reuse: [cpu_wsd]")
    return names
