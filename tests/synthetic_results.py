"""Synthetic results trees that follow the run-folder contract exactly, from a known scaling law per variant.

For tests and examples of :mod:`analysis` and ``reports`` (no torch, no training). Every run folder gets
``config.yaml``, ``run.parquet`` (every RUN_SCHEMA column), ``metrics.parquet`` (a plausible loss curve
ending at the run's loss), ``layers.parquet`` and, for AttnRes variants, ``depth_attn.parquet``; optional
extra folders stand for unfinished, failed and broken runs.

The truth: a baseline law (:class:`analysis.PowerLaw` in compute, or :class:`analysis.ChinchillaLaw` in
(N, D)) and a constant compute multiplier M per variant, exact on each run's own FLOPs (the variant pays
its FLOP overhead, as in the project's counter):

* ``PowerLaw``: one model size per budget; a variant run with FLOPs C has loss L_base(M * C).
* ``ChinchillaLaw``: ``sizes_per_budget`` sizes per budget around the baseline's optimum (an IsoFLOP grid);
  a variant run of (N, D) has loss L_base(k N, k D) with k^2 = M * (1 + overhead), so its compute-optimal
  frontier is the baseline's at M times its own FLOPs.

Noise is Gaussian in log loss (``noise=0.003`` is 0.3 %), independent per run.

    from tests.synthetic_results import write_synthetic_results
    tree = write_synthetic_results(tmp_path, multipliers={"baseline": 1.0, "block": 1.25}, seeds=2, noise=0.003)
    results = analysis.load_results(tree.root)
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from analysis.laws.laws import PFLOP_S_DAY, ChinchillaLaw, PowerLaw
from attnres.storage.schema import (
    CONFIG_FILE,
    DEPTH_ATTN_FILE,
    DEPTH_ATTN_SCHEMA,
    LAYERS_FILE,
    LAYERS_SCHEMA,
    METRICS_FILE,
    METRICS_SCHEMA,
    RUN_FILE,
    RUN_SCHEMA,
    SCHEMA_VERSION,
    atomic_write_bytes,
    read_table,
    to_table,
    write_table,
)

PAPER_BASELINE = PowerLaw(A=1.891, alpha=0.057).in_units(1.0 / PFLOP_S_DAY)  # the paper's fit, C in FLOPs
DEFAULT_MULTIPLIERS = {"baseline": 1.0, "full": 1.27, "block": 1.25}
DEFAULT_OVERHEAD = {"full": 0.02, "block": 0.01}  # extra training FLOPs per token of the depth attention
DEFAULT_THROUGHPUT = {"full": 0.85, "block": 0.95}  # tokens/s relative to the baseline at the same size
FLOPS_CONVENTION = "synthetic: 6 * params * tokens * (1 + variant overhead)"
BASELINE_FLOPS_PER_S = 1e10
SEQ_LEN = 128
BATCH_TOKENS = 16 * SEQ_LEN
VOCAB = 256


@dataclass(frozen=True)
class SyntheticResults:
    """What :func:`write_synthetic_results` wrote: the tree's root, and the truth behind every run folder.

    ``runs`` has one row per folder: run_id, path, kind (ok | unfinished | failed | nan_loss | broken |
    wrong_schema | no_run_file), variant, n_blocks, n_layer, d_model, n_head, params, tokens, flops, lr, seed,
    status, true_loss (noise-free), val_loss (as written).
    """

    root: Path
    sweep: str
    law: PowerLaw | ChinchillaLaw
    multipliers: Mapping[str, float]
    runs: pd.DataFrame = field(repr=False)


def _shape(params: float, width: int | None = None) -> tuple[int, int, int]:
    """(n_layer, d_model, n_head) of a model of about ``params`` non-embedding parameters (d_model ~ 64 n_layer, or
    d_model = ``width`` and only the depth following ``params``)."""
    if width is not None:
        return max(1, round(params / (12 * width * width))), width, width // 16
    n_layer = max(1, round((params / (12 * 64 * 64)) ** (1 / 3)))
    d_model = max(16, 16 * round(math.sqrt(params / (12 * n_layer)) / 16))
    return n_layer, d_model, d_model // 16


def _block_starts(n_sublayers: int, n_blocks: int) -> list[int]:
    size, extra = divmod(n_sublayers, n_blocks)
    starts, at = [], 0
    for k in range(n_blocks):
        starts.append(at)
        at += size + (1 if k < extra else 0)
    return starts


def _effective_blocks(variant: str, n_layer: int, n_blocks: int) -> int | None:
    if variant == "baseline":
        return None
    if variant == "block":
        return min(n_blocks, 2 * n_layer)
    return 2 * n_layer  # full, and any other AttnRes-like variant: one block per sublayer


def _config_yaml(
    sweep: str,
    variant: str,
    n_layer: int,
    d_model: int,
    n_head: int,
    n_blocks: int | None,
    tokens: int,
    lr: float,
    seed: int,
) -> tuple[str, str | None]:
    """(config.yaml text, the config's run_id when attnres.config can resolve it)."""
    import yaml

    data: dict[str, Any] = {
        "sweep": sweep,
        "model": {
            "vocab_size": VOCAB,
            "n_layer": n_layer,
            "d_model": d_model,
            "n_head": n_head,
            "seq_len": SEQ_LEN,
            "residual": variant,
        },
        "train": {"tokens": tokens, "batch_size": BATCH_TOKENS // SEQ_LEN, "lr": lr, "seed": seed},
    }
    if variant == "block":
        data["model"]["n_blocks"] = n_blocks
    try:  # the fully resolved config, as a real run writes it
        from attnres.config import RunConfig, dump_yaml, from_dict

        cfg = from_dict(RunConfig, data)
        return dump_yaml(cfg), cfg.run_id
    except (ImportError, AttributeError, TypeError, ValueError):
        # a variant name attnres.config does not know (an ablation): write what we have
        return yaml.safe_dump(data, sort_keys=False), None


def _loss_curve(final: float, steps: np.ndarray, max_steps: int) -> np.ndarray:
    start = max(math.log(VOCAB), 1.5 * final)
    frac = steps / max(max_steps, 1)
    shape = (np.exp(-5.0 * frac) - math.exp(-5.0)) / (1.0 - math.exp(-5.0))
    return final + (start - final) * shape


def _metrics(
    final: float, max_steps: int, fpt: float, tps: float, lr: float, rng: np.random.Generator, lag: float = 0.0
) -> pa.Table:
    rows = []
    for split, n in (("train", 21), ("val", 11)):
        steps = np.unique(np.linspace(0, max_steps, n).round().astype(int))
        if split == "train":
            steps = steps[steps > 0]
        loss = _loss_curve(final, steps.astype(float), max_steps)
        if split == "train":
            loss = loss * (1.0 + 0.01 * rng.standard_normal(loss.size))
            loss = loss * np.where(steps <= max_steps / 2, 1.0 + lag, 1.0)  # a stalled run lags early
        for s, value in zip(steps, loss):
            tokens = int(s) * BATCH_TOKENS
            progress = s / max(max_steps, 1)
            rows.append(
                {
                    "step": int(s),
                    "split": split,
                    "tokens": tokens,
                    "flops": tokens * fpt,
                    "loss": float(value),
                    "bpb": float(value) / math.log(2.0),
                    "lr": lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress))) if split == "train" else None,
                    "grad_norm": float(0.3 + 2.0 * math.exp(-5.0 * progress)) if split == "train" else None,
                    "tokens_per_s": tps if split == "train" else None,
                    "wall_s": tokens / tps,
                }
            )
    return to_table(rows, METRICS_SCHEMA)


def _layers(variant: str, n_layer: int, max_steps: int) -> pa.Table:
    rows = []
    for step in (0, max_steps):
        grow = step / max(max_steps, 1)
        for layer in range(n_layer):
            for j, kind in enumerate(("attn", "mlp", "block")):
                depth = 2 * layer + min(j, 1)
                if variant == "baseline":  # PreNorm: the hidden state grows with depth, early gradients are large
                    rms = math.sqrt(1.0 + grow * depth)
                    grad = 1.0 + grow * 2.0 / (1.0 + depth)
                else:  # AttnRes: bounded magnitudes, even gradients
                    rms = 1.0 + 0.1 * grow * math.log1p(depth)
                    grad = 1.0 + 0.2 * grow
                rows.append(
                    {
                        "step": step,
                        "tokens": step * BATCH_TOKENS,
                        "layer": layer,
                        "sublayer": None if kind == "block" else depth,
                        "kind": kind,
                        "input_rms": rms,
                        "output_rms": rms * (1.1 if kind == "block" else 0.5),
                        "grad_norm": grad,
                    }
                )
    return to_table(rows, LAYERS_SCHEMA)


def _depth_attn(n_layer: int, n_blocks: int, max_steps: int, rng: np.random.Generator) -> pa.Table:
    n_sub = 2 * n_layer
    starts = _block_starts(n_sub, n_blocks)
    full = n_blocks == n_sub
    rows = []
    for step in (0, max_steps):
        for query in range(n_sub + 1):
            if query == n_sub:
                kind = "final"
                sources = [(0, "embedding")] + [
                    (i + 1, "sublayer" if full else "block") for i in range(n_sub if full else n_blocks)
                ]
            else:
                kind = "attn" if query % 2 == 0 else "mlp"
                if full:
                    sources = [(0, "embedding")] + [(i + 1, "sublayer") for i in range(query)]
                else:
                    block = max(k for k, s in enumerate(starts) if s <= query)
                    sources = [(0, "embedding")] + [(i + 1, "block") for i in range(block)]
                    if query > starts[block]:
                        sources.append((block + 1, "partial"))
            # zero pseudo-queries at step 0 give the uniform mean of the sources
            w = np.full(len(sources), 1.0 / len(sources)) if step == 0 else rng.dirichlet(np.ones(len(sources)) * 2.0)
            for (source, source_kind), weight in zip(sources, w):
                rows.append(
                    {
                        "step": step,
                        "tokens": step * BATCH_TOKENS,
                        "query": query,
                        "kind": kind,
                        "source": source,
                        "source_kind": source_kind,
                        "weight": float(weight),
                    }
                )
    return to_table(rows, DEPTH_ATTN_SCHEMA)


def write_synthetic_results(
    root: str | Path,
    *,
    sweep: str = "synthetic",
    law: PowerLaw | ChinchillaLaw = PAPER_BASELINE,
    multipliers: Mapping[str, float] | None = None,
    budgets: Sequence[float] | None = None,
    seeds: int = 1,
    lrs: Sequence[float] = (3e-3,),
    best_lr: Mapping[str, float] | None = None,
    lr_curvature: float = 0.01 / math.log(2) ** 2,
    noise: float = 0.0,
    seed_noise: float = 0.0,
    stalled: Sequence[tuple[str, int]] = (),
    sizes_per_budget: int = 1,
    size_spread: float = 8.0,
    flops_overhead: Mapping[str, float] | None = None,
    throughput: Mapping[str, float] | None = None,
    n_blocks: int = 4,
    unfinished: int = 0,
    failed: int = 0,
    nan_loss: int = 0,
    broken: int = 0,
    wrong_schema: int = 0,
    no_run_file: int = 0,
    tables: bool = True,
    rng_seed: int = 0,
    width: int | None = None,
    depth_slope: Mapping[str, float] | None = None,
    shapes: Sequence[tuple[int, int, int]] = (),
    best_depth: Mapping[str, int] | None = None,
) -> SyntheticResults:
    """Write ``root/<sweep>/<run_id>/`` run folders from a known law; returns the truth per folder.

    Args:
        root: the results directory (created if missing).
        sweep: the sweep name (sub-folder and ``sweep`` column).
        law: the baseline's law, compute in FLOPs: a :class:`PowerLaw` (one size per budget) or a
            :class:`ChinchillaLaw` (needed for ``sizes_per_budget > 1``). Default: the paper's baseline fit
            1.891 C^-0.057 (C in PFLOP/s-days) converted to FLOPs.
        multipliers: variant name -> true compute multiplier over the baseline (the baseline is 1.0).
            Default ``{"baseline": 1.0, "full": 1.27, "block": 1.25}``.
        budgets: nominal training FLOPs per budget. Default: 7 budgets from 1e15 to 1e18.
        seeds: runs per (variant, size, budget, lr), seeds 0..seeds-1, with independent noise.
        lrs: learning rates per point; the loss is penalised by exp(lr_curvature * ln(lr / best)^2), ``best`` being
            the variant's ``best_lr`` or else the geometric middle of ``lrs``.
        best_lr: variant -> its best learning rate (default: the middle of ``lrs`` for every variant).
        lr_curvature: k of the penalty exp(k ln(lr / best)^2) (default 0.01 per log2^2, about 0.021).
        noise: standard deviation of the Gaussian noise added to log loss (0.003 = 0.3 %), per run.
        seed_noise: standard deviation of a log-loss shift per (size, budget, seed), shared by every variant and
            learning rate of that seed (its init and batches), which paired differences cancel.
        stalled: (variant, seed) pairs whose training loss lags by 10 % over the first half of training (the
            stall detector's case; their final loss is not changed).
        sizes_per_budget: model sizes per budget (an IsoFLOP grid when > 1; ChinchillaLaw only), spread
            evenly in log N over a factor ``size_spread`` around the baseline's optimum.
        flops_overhead: variant -> extra FLOPs per token (default full 2 %, block 1 %, others 0).
        throughput: variant -> tokens/s relative to the baseline at the same size (default full 0.85,
            block 0.95, others 1); the baseline runs at 1e10 FLOP/s.
        n_blocks: N of the ``block`` variant (capped at 2 * n_layer).
        unfinished, failed, nan_loss: extra baseline runs at the largest budget with status running,
            failed, or done without a val_loss.
        broken, wrong_schema, no_run_file: extra folders with a corrupt run.parquet, a run.parquet of
            another schema_version, or only a config.yaml.
        tables: write metrics / layers / depth_attn (False: run.parquet and config.yaml only, faster).
        rng_seed: seed of the noise and of the synthetic diagnostics.
        width: every size at this d_model, only n_layer following the size (a fixed-width depth ladder; PowerLaw:
            give budgets of 120 (12 width^2 n_layer)^2 FLOPs for n_layer exactly).
        depth_slope: variant -> g, its multiplier growing as M exp(g (2 n_layer - 8)) with depth (in sublayers,
            from 4 layers), so that its true paired gap changes by 100 alpha g per sublayer on a power law.
        shapes: an architecture sweep instead of a ladder: every (n_layer, d_model, n_head) at the first budget,
            each at 12 n_layer d_model^2 parameters; a variant's loss is 0.4 % higher per (n_layer - its
            ``best_depth``)^2 and 0.1 % per (n_head - 2)^2, so its best cell is known.
        best_depth: variant -> the depth of its best cell in ``shapes`` (default 3).
    """
    multipliers = dict(DEFAULT_MULTIPLIERS if multipliers is None else multipliers)
    if "baseline" not in multipliers:
        multipliers = {"baseline": 1.0, **multipliers}
    budgets = list(np.geomspace(1e15, 1e18, 7) if budgets is None else budgets)
    if sizes_per_budget > 1 and not isinstance(law, ChinchillaLaw):
        raise ValueError("sizes_per_budget > 1 needs a ChinchillaLaw (a loss that depends on N and D), not a PowerLaw")
    if seeds < 1 or sizes_per_budget < 1 or not budgets or not lrs:
        raise ValueError("seeds, sizes_per_budget, budgets and lrs must each be at least one")
    writer = _Writer(
        root=Path(root),
        sweep=sweep,
        law=law,
        multipliers=multipliers,
        overhead={**DEFAULT_OVERHEAD, **(flops_overhead or {})},
        speed={**DEFAULT_THROUGHPUT, **(throughput or {})},
        n_blocks=n_blocks,
        noise=noise,
        tables=tables,
        lr_mid=math.exp(np.mean(np.log(lrs))),
        rng=np.random.default_rng(rng_seed),
        best_lr=dict(best_lr or {}),
        lr_curvature=lr_curvature,
        seed_noise=seed_noise,
        stalled=frozenset(stalled),
        width=width,
        depth_slope=dict(depth_slope or {}),
        best_depth=dict(best_depth or {}),
    )
    if shapes:
        writer.architecture(budgets[0], shapes, lrs, seeds)
    else:
        writer.grid(budgets, sizes_per_budget, size_spread, lrs, seeds)
    writer.extras(max(budgets), lrs[0], unfinished, failed, nan_loss, broken, wrong_schema, no_run_file)
    return SyntheticResults(
        root=writer.root, sweep=sweep, law=law, multipliers=multipliers, runs=pd.DataFrame(writer.records)
    )


@dataclass
class _Writer:
    """Writes the run folders of one synthetic sweep and keeps the truth behind each (``records``)."""

    root: Path
    sweep: str
    law: PowerLaw | ChinchillaLaw
    multipliers: Mapping[str, float]
    overhead: Mapping[str, float]
    speed: Mapping[str, float]
    n_blocks: int
    noise: float
    tables: bool
    lr_mid: float
    rng: np.random.Generator
    best_lr: Mapping[str, float] = field(default_factory=dict)
    lr_curvature: float = 0.01 / math.log(2) ** 2
    seed_noise: float = 0.0
    stalled: frozenset[tuple[str, int]] = frozenset()
    width: int | None = None
    depth_slope: Mapping[str, float] = field(default_factory=dict)
    best_depth: Mapping[str, int] = field(default_factory=dict)
    shape: tuple[int, int, int] | None = None  # the shape of the run being written (an architecture sweep)
    records: list[dict[str, Any]] = field(default_factory=list)
    seed_shift: dict[tuple[float, int], float] = field(default_factory=dict)

    def folder(self, run_id: str) -> Path:
        return self.root / self.sweep / run_id

    def grid(
        self, budgets: Sequence[float], sizes_per_budget: int, size_spread: float, lrs: Sequence[float], seeds: int
    ) -> None:
        """Every finished run of the study: each budget, size, variant, learning rate and seed."""
        for c in budgets:
            for params in self.sizes(c, sizes_per_budget, size_spread):
                for variant in self.multipliers:
                    for lr in lrs:
                        for seed in range(seeds):
                            self.run(variant, float(params), c / (6.0 * params), lr, seed, "done", "ok")

    def architecture(
        self, budget: float, shapes: Sequence[tuple[int, int, int]], lrs: Sequence[float], seeds: int
    ) -> None:
        """Every cell of an architecture sweep at one budget: each shape, variant, learning rate and seed."""
        for shape in shapes:
            self.shape = shape
            params = 12.0 * shape[0] * shape[1] ** 2
            for variant in self.multipliers:
                for lr in lrs:
                    for seed in range(seeds):
                        self.run(variant, params, budget / (6.0 * params), lr, seed, "done", "ok")
        self.shape = None

    def sizes(self, budget: float, sizes_per_budget: int, size_spread: float) -> np.ndarray:
        """The model sizes run at one budget: around the baseline's optimum (ChinchillaLaw), or one size at
        about 20 tokens per parameter (PowerLaw)."""
        if isinstance(self.law, ChinchillaLaw):
            n_opt, _ = self.law.compute_optimal(budget)
            offsets = np.linspace(-0.5, 0.5, sizes_per_budget) if sizes_per_budget > 1 else np.zeros(1)
            return float(n_opt) * size_spread**offsets
        return np.array([math.sqrt(budget / 120.0)])  # about 20 tokens per parameter

    def true_loss(self, variant: str, params: float, tokens: int, flops: float, lr: float) -> float:
        """The noise-free loss of a run: the baseline's law at the variant's multiplied compute, penalised
        away from the middle learning rate."""
        multiplier = self.multipliers[variant]
        if variant in self.depth_slope:
            multiplier *= math.exp(self.depth_slope[variant] * (2 * _shape(params, self.width)[0] - 8))
        if isinstance(self.law, ChinchillaLaw):
            k = math.sqrt(multiplier * (1.0 + self.overhead.get(variant, 0.0)))
            truth = float(self.law.loss(k * params, k * tokens))
        else:
            truth = float(self.law.loss(multiplier * flops))
        best = self.best_lr.get(variant, self.lr_mid)
        if self.shape is not None:
            depth_miss = self.shape[0] - self.best_depth.get(variant, 3)
            truth *= math.exp(0.004 * depth_miss**2 + 0.001 * (self.shape[2] - 2) ** 2)
        return truth * math.exp(self.lr_curvature * math.log(lr / best) ** 2)

    def run(
        self, variant: str, params: float, tokens_target: float, lr: float, seed: int, status: str, kind: str
    ) -> dict[str, Any]:
        """Write one run folder (config.yaml, run.parquet and, with ``tables``, its per-run tables); returns
        and records the truth behind it."""
        n_layer, d_model, n_head = self.shape or _shape(params, self.width)
        nb = _effective_blocks(variant, n_layer, self.n_blocks)
        max_steps = max(1, round(tokens_target / BATCH_TOKENS))
        tokens = max_steps * BATCH_TOKENS
        fpt = 6.0 * params * (1.0 + self.overhead.get(variant, 0.0))
        flops = tokens * fpt
        tps = BASELINE_FLOPS_PER_S / (6.0 * params) * self.speed.get(variant, 1.0)
        truth = self.true_loss(variant, params, tokens, flops, lr)
        observed = truth * math.exp(self.noise * self.rng.standard_normal()) if self.noise else truth
        if self.seed_noise:
            key = (round(params), seed)
            if key not in self.seed_shift:
                self.seed_shift[key] = self.seed_noise * float(self.rng.standard_normal())
            observed *= math.exp(self.seed_shift[key])
        yaml_text, cfg_id = _config_yaml(self.sweep, variant, n_layer, d_model, n_head, nb, tokens, lr, seed)
        digest = hashlib.sha256(
            json.dumps([self.sweep, variant, nb, n_layer, d_model, tokens, lr, seed, kind]).encode()
        ).hexdigest()[:10]
        run_id = cfg_id if (cfg_id and kind == "ok") else f"{variant}-L{n_layer}-d{d_model}-s{seed}-{digest}"
        path = self.folder(run_id)
        step = max_steps if status == "done" else max_steps // 2
        val_loss = (
            observed
            if status == "done"
            else (None if status == "failed" else float(_loss_curve(observed, np.array([step]), max_steps)[0]))
        )
        if kind == "nan_loss":
            val_loss = None
        shape = {"n_layer": n_layer, "d_model": d_model, "n_head": n_head, "n_blocks": nb}
        row = _run_row(self.sweep, run_id, variant, shape, params, tokens, fpt, lr, seed, status, step, max_steps)
        row.update(_outcome(val_loss, step, tps, status))
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path / CONFIG_FILE, yaml_text.encode())
        write_table(path / RUN_FILE, to_table([row], RUN_SCHEMA))
        if self.tables and status != "failed":
            lag = 0.10 if (variant, seed) in self.stalled else 0.0
            write_table(path / METRICS_FILE, _metrics(observed, step, fpt, tps, lr, self.rng, lag))
            write_table(path / LAYERS_FILE, _layers(variant, n_layer, step))
            if nb is not None:
                write_table(path / DEPTH_ATTN_FILE, _depth_attn(n_layer, nb, step, self.rng))
        record = {
            "run_id": run_id,
            "path": f"{self.sweep}/{run_id}",
            "kind": kind,
            "variant": variant,
            "n_blocks": nb,
            "n_layer": n_layer,
            "d_model": d_model,
            "n_head": n_head,
            "params": int(round(params)),
            "tokens": tokens,
            "flops": flops,
            "lr": lr,
            "seed": seed,
            "status": status,
            "true_loss": truth,
            "val_loss": val_loss,
        }
        self.records.append(record)
        return record

    def extras(
        self,
        top: float,
        lr: float,
        unfinished: int,
        failed: int,
        nan_loss: int,
        broken: int,
        wrong_schema: int,
        no_run_file: int,
    ) -> None:
        """The extra baseline runs at the largest budget ``top`` (unfinished, failed, done without a loss)
        and the extra folders that are not runs of this version (broken, another schema, no run.parquet)."""
        law = self.law
        top_params = float(law.compute_optimal(top)[0]) if isinstance(law, ChinchillaLaw) else math.sqrt(top / 120.0)
        top_tokens = top / (6 * top_params)
        for i in range(unfinished):
            self.run("baseline", top_params, top_tokens, lr, 1000 + i, "running", "unfinished")
        for i in range(failed):
            self.run("baseline", top_params, top_tokens, lr, 2000 + i, "failed", "failed")
        for i in range(nan_loss):
            self.run("baseline", top_params, top_tokens, lr, 3000 + i, "done", "nan_loss")
        for i in range(broken):
            self.folder_only(f"broken-{i}", RUN_FILE, b"this is not a parquet file", "broken")
        for i in range(wrong_schema):
            good = self.run("baseline", top_params, top_tokens, lr, 4000 + i, "done", "wrong_schema")
            _rewrite_schema_version(self.root / good["path"] / RUN_FILE, 99)  # no attnres wrote it
            self.records[-1]["kind"] = "wrong_schema"
        for i in range(no_run_file):
            self.folder_only(f"no-run-file-{i}", CONFIG_FILE, f"sweep: {self.sweep}\n".encode(), "no_run_file")

    def folder_only(self, run_id: str, name: str, content: bytes, kind: str) -> None:
        """A folder holding one file ``name`` and no run, recorded by its ``kind``."""
        self.folder(run_id).mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.folder(run_id) / name, content)
        self.records.append({"run_id": run_id, "path": f"{self.sweep}/{run_id}", "kind": kind})


def _run_row(
    sweep: str,
    run_id: str,
    variant: str,
    shape: Mapping[str, Any],
    params: float,
    tokens: int,
    fpt: float,
    lr: float,
    seed: int,
    status: str,
    step: int,
    max_steps: int,
) -> dict[str, Any]:
    """The run.parquet row of a synthetic run, up to its outcome (:func:`_outcome`)."""
    n_layer, d_model, nb = shape["n_layer"], shape["d_model"], shape["n_blocks"]
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "sweep": sweep,
        "variant": variant,
        "n_blocks": nb,
        "block_size": None if nb is None else math.ceil(2 * n_layer / nb),
        "n_layer": n_layer,
        "d_model": d_model,
        "n_head": shape["n_head"],
        "seq_len": SEQ_LEN,
        "vocab_size": VOCAB,
        "params": int(round(params)),
        "params_total": int(round(params)) + 2 * VOCAB * d_model,
        "tokens": tokens,
        "flops": tokens * fpt,
        "flops_per_token": fpt,
        "flops_convention": FLOPS_CONVENTION,
        "lr": lr,
        "batch_tokens": BATCH_TOKENS,
        "seed": seed,
        "status": status,
        "step": step,
        "max_steps": max_steps,
        "tokens_seen": step * BATCH_TOKENS,
    }


def _outcome(val_loss: float | None, step: int, tps: float, status: str) -> dict[str, Any]:
    """The rest of a synthetic run.parquet row: its losses, throughput, error and provenance."""
    return {
        "val_loss": val_loss,
        "val_bpb": None if val_loss is None else val_loss / math.log(2.0),
        "train_loss": None if val_loss is None else val_loss * 0.98,
        "tokens_per_s": tps,
        "wall_s": step * BATCH_TOKENS / tps,
        "error": "synthetic failure: out of memory" if status == "failed" else None,
        "device": "synthetic",
        "precision": "32-true",
        "git_sha": "synthetic",
        "versions": json.dumps({"attnres": "synthetic"}),
        "updated_at": "2026-01-01T00:00:00+00:00",
    }


def _rewrite_schema_version(path: Path, version: int) -> None:
    """Rewrite a run.parquet with another ``schema_version`` in its schema metadata."""
    table = pa.Table.from_batches(
        to_table([{**{n: None for n in RUN_SCHEMA.names}, **read_table(path).to_pylist()[0]}], RUN_SCHEMA).to_batches(),
        schema=RUN_SCHEMA.with_metadata(
            {**{k.decode(): v.decode() for k, v in RUN_SCHEMA.metadata.items()}, "schema_version": str(version)}
        ),
    )
    write_table(path, table)
