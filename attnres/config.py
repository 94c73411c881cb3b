"""Typed, frozen configuration of one run: the model, the data, the training recipe and the runtime.

This module imports no torch, so the CLI, the sweeps and the analysis start fast. Every field carries a
one-line docstring; ``attnres train --help`` prints them. Cross-field rules are checked in ``__post_init__``
with an error that names the field, the allowed values and the fix, so bad input fails before any compute.

Precedence when a run is configured: dataclass defaults < YAML file < ``key=value`` overrides
(see :func:`resolve_run_config`).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import hashlib
import inspect
import json
import math
import textwrap
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from attnres.variants import Variant

RESIDUALS = ("baseline", "full", "block", "denseformer", "hc", "mhc")
Residual = Literal["baseline", "full", "block", "denseformer", "hc", "mhc"]
ATTNRES = ("full", "block")
# the model settings only some residuals read (besides the AttnRes ablation switches, checked on their own)
ONLY_FOR = {"n_blocks": ("block",), "hc_streams": ("hc", "mhc"), "key_norm_gain": ATTNRES}


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and how to fix it."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        _require(value > 0, f"{type(obj).__name__}.{name} must be positive, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only language model and its depth mixing (the residual variant)."""

    vocab_size: int = 256
    """Vocabulary size. In a run it comes from the data (256 for bytes): leave it at 256 and the data's vocabulary is
    used; any other value must equal the data's."""
    n_layer: int = 4
    """Transformer blocks; the model has L = 2 * n_layer sublayers (attention and MLP each count as one)."""
    d_model: int = 128
    """Width of the residual stream and of every sublayer's input and output."""
    n_head: int = 4
    """Attention heads; d_model must be divisible by n_head."""
    seq_len: int = 256
    """Context length in tokens."""
    residual: Residual = "block"
    """Depth mixing: baseline (PreNorm residual sum), full (Full AttnRes), block (Block AttnRes); ablation
    baselines denseformer, hc (Hyper-Connections), mhc (manifold-constrained HC)."""
    n_blocks: int = 4
    """Block AttnRes: number of depth blocks N, from 1 to 2 * n_layer (used only when residual is block)."""
    d_ff: int | None = None
    """SwiGLU hidden width; None means 8/3 * d_model rounded up to a multiple of 32."""
    rope_base: float = 10000.0
    """RoPE base frequency."""
    norm_eps: float = 1e-6
    """Epsilon of every RMSNorm (PreNorms, final norm and the depth-attention key norms)."""
    tie_embeddings: bool = False
    """Share the token embedding matrix with the LM head."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of embeddings and linear weights."""
    key_norm_gain: bool = True
    """Depth-attention key RMSNorm with a learnable gain (the paper's pseudocode); False: parameter-free."""
    key_norm: bool = True
    """AttnRes ablation: RMS-normalise the depth-attention keys (the paper); False: the raw sources are the keys."""
    depth_score: Literal["softmax", "sigmoid"] = "softmax"
    """AttnRes ablation: softmax over the sources (the paper), or an independent sigmoid per source."""
    depth_query: Literal["static", "input"] = "static"
    """AttnRes ablation: static pseudo-query (the paper), or input: a zero-initialised d x d projection of the
    previous sublayer's input."""
    depth_mixing: Literal["attention", "scalar"] = "attention"
    """AttnRes ablation: attention (the paper), or scalar: learned input-independent logits per (query, source), no
    query or key."""
    depth_heads: int = 1
    """AttnRes ablation: depth-attention heads; each of H channel groups gets its own softmax."""
    depth_window: int = 0
    """Full AttnRes ablation: attend to the embedding and the last W sublayer outputs only (0: all sources)."""
    hc_streams: int = 4
    """hc / mhc: the expansion rate n (number of residual streams)."""

    def __post_init__(self) -> None:
        _positive(self, "vocab_size", "n_layer", "d_model", "n_head", "seq_len", "rope_base", "norm_eps")
        _require(self.init_std > 0, f"ModelConfig.init_std must be positive, got {self.init_std!r}")
        _require(
            self.residual in RESIDUALS,
            f"ModelConfig.residual={self.residual!r} is not a known depth mixing; allowed: {', '.join(RESIDUALS)}",
        )
        _require(
            self.d_model % self.n_head == 0,
            f"ModelConfig.d_model={self.d_model} is not divisible by n_head={self.n_head}; "
            f"pick n_head among the divisors of d_model, e.g. {_divisors_near(self.d_model, self.n_head)}",
        )
        _require(
            (self.d_model // self.n_head) % 2 == 0,
            f"ModelConfig: head dimension d_model / n_head = {self.d_model // self.n_head} must be even for RoPE",
        )
        if self.residual == "block":
            _require(
                1 <= self.n_blocks <= self.n_sublayers,
                f"ModelConfig.n_blocks={self.n_blocks} is out of range for n_layer={self.n_layer}: Block AttnRes "
                f"needs 1 <= n_blocks <= 2 * n_layer = {self.n_sublayers} (the paper recommends about 8)",
            )
        if self.d_ff is not None:
            _require(self.d_ff > 0, f"ModelConfig.d_ff must be positive or None, got {self.d_ff!r}")
        switches = self.ablation_switches
        if switches and self.residual not in ATTNRES:
            _require(
                False,
                f"ModelConfig: {', '.join(switches)} only apply to AttnRes (residual full or block), "
                f"not residual={self.residual!r}; remove them or pick full / block",
            )
        # one rule for every setting a residual does not read: it must stay at its default (a value set there would
        # be silently ignored, and the run would not be what its config says)
        for name, readers in ONLY_FOR.items():
            value, default = getattr(self, name), ModelConfig.__dataclass_fields__[name].default
            _require(
                self.residual in readers or value == default,
                f"ModelConfig.{name}={value!r} applies to residual {' / '.join(readers)} only, not "
                f"residual={self.residual!r}; remove it (default {default!r}) or pick {' / '.join(readers)}",
            )
        _require(
            self.depth_heads >= 1 and self.d_model % self.depth_heads == 0,
            f"ModelConfig.depth_heads={self.depth_heads} must be >= 1 and divide d_model={self.d_model}",
        )
        _require(
            self.depth_window >= 0, f"ModelConfig.depth_window must be >= 0 (0: all sources), got {self.depth_window}"
        )
        _require(
            self.depth_window == 0 or self.residual == "full",
            f"ModelConfig.depth_window={self.depth_window} applies to Full AttnRes only (residual=full)",
        )
        _require(
            self.depth_mixing == "attention" or (self.depth_heads == 1 and self.depth_query == "static"),
            "ModelConfig: depth_mixing=scalar has no query or key, so depth_heads and depth_query do not apply",
        )
        _require(self.hc_streams >= 1, f"ModelConfig.hc_streams must be >= 1, got {self.hc_streams}")

    @property
    def ablation_switches(self) -> list[str]:
        """The AttnRes ablation switches set away from the paper's method, as ``name=value``."""
        paper = {
            "key_norm": True,
            "depth_score": "softmax",
            "depth_query": "static",
            "depth_mixing": "attention",
            "depth_heads": 1,
            "depth_window": 0,
        }
        return [f"{k}={getattr(self, k)}" for k, v in paper.items() if getattr(self, k) != v]

    @property
    def variant(self) -> str:
        """The results' ``variant`` column: the residual kind plus any ablation (see :mod:`attnres.variants`)."""
        return Variant.of(self).name

    @property
    def n_sublayers(self) -> int:
        """L: every attention and every MLP sublayer counts as one AttnRes layer."""
        return 2 * self.n_layer

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def hidden_dim(self) -> int:
        """SwiGLU hidden width."""
        if self.d_ff is not None:
            return self.d_ff
        return 32 * math.ceil(8 * self.d_model / 3 / 32)

    @property
    def effective_n_blocks(self) -> int | None:
        """Depth blocks actually used: L for Full AttnRes, n_blocks for Block, None for the baseline."""
        return {"full": self.n_sublayers, "block": self.n_blocks}.get(self.residual)

    @property
    def block_starts(self) -> tuple[int, ...]:
        """0-based index of the first sublayer of every depth block (AttnRes variants).

        N blocks split the L sublayers as evenly as possible, longer blocks first, so every block is
        non-empty and, when N does not divide L, the last block(s) are one sublayer shorter; with N | L
        this is the paper's S = L / N. Full AttnRes is N = L (one sublayer per block).
        """
        n = self.effective_n_blocks
        if n is None:
            return ()
        size, extra = divmod(self.n_sublayers, n)
        starts, at = [], 0
        for k in range(n):
            starts.append(at)
            at += size + (1 if k < extra else 0)
        return tuple(starts)

    @property
    def block_size(self) -> int | None:
        """S: sublayers in the longest depth block (1 for Full, L for a single block)."""
        n = self.effective_n_blocks
        return None if n is None else math.ceil(self.n_sublayers / n)


def _divisors_near(n: int, target: int) -> list[int]:
    divisors = [d for d in range(1, n + 1) if n % d == 0 and (n // d) % 2 == 0]
    return sorted(divisors, key=lambda d: abs(d - target))[:3]


@dataclass(frozen=True)
class DataConfig:
    """Where the training tokens come from: raw text (prepared into token shards once, cached) or a prepared folder."""

    corpus: str = "builtin"
    """builtin (KJV Bible + Shakespeare, shipped with the package); raw text: a file, folder or glob of .txt,
    .txt.gz, .jsonl(.gz) or .parquet; or a folder made by `attnres data prepare` (its tokenizer and split are its
    own)."""
    tokenizer: str = "bytes"
    """For raw text: bytes (vocabulary 256), bpe:<vocab> (a BPE trained on a sample of the corpus, e.g. bpe:4096),
    or the path of a tokenizer.json."""
    text_field: str = "text"
    """The jsonl field or parquet column holding each document's text."""
    val_fraction: float = 0.02
    """Fraction of the pieces (documents, or chunks of long ones) held out for validation."""
    chunk_bytes: int = 8192
    """Size in bytes of the chunks long documents are cut into for the train/validation split."""
    split_seed: int = 1234
    """Seed of the split's starting points (fixed, so every run sees the same split)."""
    eval_sets: tuple[str, ...] = ()
    """Extra evaluation sets, NAME=FOLDER each: folders made by `attnres data prepare` with the training data's
    tokenizer, whose validation split is evaluated beside the run's own at every evaluation (loss and bits per byte
    per set in metrics.parquet and run.parquet; `attnres fit --metric NAME` fits them). They change nothing the run
    trains on, so they are not part of the run id."""

    def __post_init__(self) -> None:
        _require(
            0.0 < self.val_fraction < 0.5,
            f"DataConfig.val_fraction must be in (0, 0.5), got {self.val_fraction!r}",
        )
        _require(self.chunk_bytes >= 64, f"DataConfig.chunk_bytes must be at least 64, got {self.chunk_bytes!r}")
        _require(str(self.corpus).strip() != "", "DataConfig.corpus is empty; use 'builtin' or a path to text")
        _require(str(self.text_field).strip() != "", "DataConfig.text_field is empty; name the field holding text")
        names = [str(item).partition("=")[0] for item in self.eval_sets]
        for item, name in zip(self.eval_sets, names):
            folder = str(item).partition("=")[2]
            _require(
                bool(name) and all(c.isalnum() or c in "-_." for c in name) and folder.strip() != "",
                f"data.eval_sets: {item!r} is not NAME=FOLDER (a name of letters, digits, '-', '_' or '.', then the "
                "folder `attnres data prepare` made)",
            )
            _require(
                name not in ("train", "val"),
                f"data.eval_sets: the name {name!r} is the run's own split's; call the set something else",
            )
        _require(
            len(set(names)) == len(names),
            f"data.eval_sets names {sorted(n for n in set(names) if names.count(n) > 1)} more than one folder; "
            "give each set its own name",
        )


@dataclass(frozen=True)
class TrainConfig:
    """The training recipe. Everything here changes the result, so it is part of the run id."""

    tokens: int | None = None
    """Token budget; exactly one of tokens and flops may be set (neither: 2,000,000 tokens)."""
    flops: float | None = None
    """Training-FLOP budget, converted to tokens with the model's FLOP counter."""
    batch_size: int = 16
    """Sequences per optimizer step (global, across devices)."""
    micro_batch_size: int | None = None
    """Sequences per forward/backward on each device; gradients accumulate over batch_size / (devices x this)
    micro-batches per step (None: the whole per-device batch at once). Exact, so not part of the run id."""
    optimizer: Literal["adamw", "muon"] = "adamw"
    """adamw: AdamW on every parameter; muon: Muon (momentum, Nesterov, Newton-Schulz orthogonalised updates scaled
    to AdamW's RMS, so one learning rate serves both) on the attention and MLP weight matrices, AdamW on the
    embedding, the head, norms, pseudo-queries and every other vector (docs/training.md, "Optimizers")."""
    muon_momentum: float = 0.95
    """Muon's momentum (optimizer muon only)."""
    sampler: Literal["replacement", "epoch"] = "replacement"
    """The training data order. replacement: each step draws its windows at random starts, independently (a run as
    long as the corpus reads about 63 % of it); epoch: the training split cut into window slots, each read once per
    epoch in a seeded order. Both are a pure function of (seed, step), whatever the number of devices."""
    lr: float = 3e-3
    """Peak learning rate (AdamW's, and Muon's after its RMS matching)."""
    depth_lr_scale: float = 1.0
    """The depth mixer's parameters (pseudo-queries, key gains; an ablation's mixing weights) train at this multiple
    of the learning rate, through the whole schedule (0 freezes them at their initial values)."""
    schedule: Literal["cosine", "wsd", "constant"] = "cosine"
    """cosine: linear warm-up then cosine decay to min_lr_ratio * lr (the paper's); wsd: warm-up, stable, decay;
    constant: warm-up, then the peak rate to the end (the stable trunk that WSD branches start from)."""
    warmup_frac: float = 0.05
    """Fraction of the steps spent in linear warm-up."""
    warmup_tokens: int | None = None
    """Warm-up length in tokens, replacing warmup_frac (None: warmup_frac of the run's steps). A WSD trunk and its
    branches share it, so their schedules agree up to each branch's decay."""
    trunk_tokens: int | None = None
    """WSD branch (schedule wsd): the length of its stable trunk, the same run with schedule constant and this many
    tokens, in the sweep <sweep>-trunk. The branch starts from the trunk's checkpoint at its decay's first step;
    without one it trains the same schedule from step 0 (the same run, more compute). A pointer to where its first
    steps may come from, so not part of the run id (docs/training.md, "WSD branches")."""
    save_at_steps: tuple[int, ...] = ()
    """Keep a checkpoint at each of these steps (a trunk: its branches' decay starts). Not part of the run id."""
    min_lr_ratio: float = 0.1
    """Floor of the schedule as a fraction of the peak learning rate."""
    wsd_decay_frac: float = 0.2
    """WSD: fraction of the steps spent in the final linear decay."""
    weight_decay: float = 0.1
    """Decoupled AdamW weight decay on linear weights (never on norms, gains, pseudo-queries or embeddings)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables clipping)."""
    eval_interval: int = 100
    """Evaluate on the validation set every this many steps (and always at the end)."""
    eval_tokens: int = 65536
    """Validation tokens per evaluation: windows spread evenly over the whole validation split."""
    log_interval: int = 10
    """Write a training-loss row to metrics.parquet every this many steps."""
    seed: int = 0
    """Seed of the initialisation and of the training data order."""

    def __post_init__(self) -> None:
        _require(
            self.tokens is None or self.flops is None,
            f"TrainConfig: set either tokens ({self.tokens}) or flops ({self.flops}), not both",
        )
        if self.tokens is not None:
            _require(self.tokens > 0, f"TrainConfig.tokens must be positive, got {self.tokens!r}")
        if self.flops is not None:
            _require(self.flops > 0, f"TrainConfig.flops must be positive, got {self.flops!r}")
        _positive(self, "batch_size", "lr", "eval_interval", "eval_tokens", "log_interval", "eps")
        if self.micro_batch_size is not None:
            _require(
                0 < self.micro_batch_size <= self.batch_size and self.batch_size % self.micro_batch_size == 0,
                f"TrainConfig.micro_batch_size={self.micro_batch_size} must divide train.batch_size={self.batch_size} "
                "(per device: batch_size / devices must be a multiple of it)",
            )
        _require(0.0 <= self.warmup_frac < 1.0, f"TrainConfig.warmup_frac must be in [0, 1), got {self.warmup_frac}")
        _require(
            0.0 <= self.min_lr_ratio <= 1.0, f"TrainConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}"
        )
        _require(
            0.0 < self.wsd_decay_frac <= 1.0 - self.warmup_frac,
            f"TrainConfig.wsd_decay_frac must be in (0, 1 - warmup_frac], got {self.wsd_decay_frac}",
        )
        if self.warmup_tokens is not None:
            _require(self.warmup_tokens >= 0, f"TrainConfig.warmup_tokens must be >= 0, got {self.warmup_tokens}")
        _require(
            self.trunk_tokens is None or (self.schedule == "wsd" and self.trunk_tokens > 0),
            f"TrainConfig.trunk_tokens={self.trunk_tokens} applies to a WSD branch: set train.schedule=wsd (and a "
            "positive length), or remove it",
        )
        _require(
            all(s > 0 for s in self.save_at_steps) and list(self.save_at_steps) == sorted(set(self.save_at_steps)),
            f"TrainConfig.save_at_steps={list(self.save_at_steps)} must be positive steps in increasing order",
        )
        _require(self.weight_decay >= 0, f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay}")
        _require(self.depth_lr_scale >= 0, f"TrainConfig.depth_lr_scale must be >= 0, got {self.depth_lr_scale}")
        _require(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "TrainConfig.beta1 and beta2 must be in [0, 1)")
        _require(self.grad_clip >= 0, f"TrainConfig.grad_clip must be >= 0 (0 disables), got {self.grad_clip}")
        _require(self.seed >= 0, f"TrainConfig.seed must be >= 0, got {self.seed}")
        _require(0 <= self.muon_momentum < 1, f"TrainConfig.muon_momentum must be in [0, 1), got {self.muon_momentum}")


DEFAULT_TOKENS = 2_000_000


@dataclass(frozen=True)
class RuntimeConfig:
    """How and where a run executes. None of it changes the result by design, so it is not in the run id."""

    accelerator: Literal["auto", "cpu", "gpu"] = "auto"
    """Lightning accelerator: auto picks a GPU when one is visible."""
    devices: int = 1
    """Devices per node; more than one trains data-parallel (runtime.strategy)."""
    num_nodes: int = 1
    """Nodes; more than one trains data-parallel across nodes (SLURM sets the ranks)."""
    precision: Literal["auto", "32-true", "bf16-mixed"] = "auto"
    """auto: bf16 autocast on a GPU that supports bf16 (else fp32, with a warning), fp32 on CPU; bf16-mixed on a GPU
    without bf16 is refused before compute."""
    threads: int = 0
    """CPU threads for torch (0: leave torch's default)."""
    progress_bar: bool = True
    """Show Lightning's progress bar."""
    compile: bool = False
    """torch.compile the whole model (Full / Block AttnRes with their depth attention traced; on GPU Full / Block
    compile each sublayer instead, with the fused depth kernels)."""
    checkpointing: Literal["none", "sublayer"] = "none"
    """Activation checkpointing: sublayer recomputes each attention / MLP sublayer in backward instead of keeping
    its activations (the same gradients; the depth attention's own saved tensors are small and kept, or compiled on
    CPU, what Inductor chooses to keep)."""
    logger: Literal["none", "csv", "tensorboard", "wandb", "mlflow"] = "none"
    """An experiment tracker beside the parquet files (which stay the record the analysis reads): csv and tensorboard
    write into RUN_DIR/<logger>/; wandb runs offline unless WANDB_MODE says otherwise; mlflow logs to
    $MLFLOW_TRACKING_URI or RUN_DIR/mlruns."""
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """With several devices: ddp (a full copy of the model per device) or fsdp (FSDP2: parameters, gradients and
    optimizer state sharded over the devices, one unit per attention / MLP sublayer; CPU (gloo) or GPU)."""
    fsdp_mixed_precision: bool = True
    """runtime.strategy=fsdp under bf16 precision: gather each attention / MLP sublayer's parameters in bf16 and
    reduce-scatter its gradients in fp32 (FSDP2's MixedPrecisionPolicy), half the all-gather traffic and memory; the
    root unit (embedding, depth mixer, final norm, head) stays fp32. false: gather in fp32 (docs/training.md)."""
    process_group_timeout_s: int = 1800
    """Several devices: how long a collective may wait for the other ranks before the run fails, in seconds (a rank
    that died or hangs then ends the run instead of holding every GPU; with NCCL it needs
    TORCH_NCCL_ASYNC_ERROR_HANDLING, docs/training.md)."""
    checkpoint_interval_steps: int | None = None
    """Also write last.ckpt every this many steps (it is always written at every evaluation). None: evaluations only."""
    checkpoint_interval_min: float | None = None
    """Also write last.ckpt when this many minutes have passed since the last checkpoint, at the end of a step (the
    ranks agree on it). None: no time-based checkpoints."""
    device_memory_gb: float | None = None
    """Memory of one device in GiB (80 for an 80 GB GPU). When set, `attnres sweep plan` shows each run's estimated
    peak per device and the setting that would make a run fit, and a run that will not fit is refused before it
    starts (the estimate simulates the training step: attnres.training.memory, docs/training.md)."""

    def __post_init__(self) -> None:
        _positive(self, "devices", "num_nodes")
        _require(self.threads >= 0, f"RuntimeConfig.threads must be >= 0, got {self.threads}")
        _require(
            self.device_memory_gb is None or self.device_memory_gb > 0,
            f"RuntimeConfig.device_memory_gb must be positive (GiB per device), got {self.device_memory_gb}",
        )
        _require(
            self.strategy != "fsdp" or self.devices * self.num_nodes > 1,
            "runtime.strategy=fsdp shards over several devices, and this run has one; use runtime.devices=N "
            "(or leave the strategy at ddp)",
        )
        _require(
            self.process_group_timeout_s > 0,
            f"RuntimeConfig.process_group_timeout_s must be positive (seconds), got {self.process_group_timeout_s}",
        )
        _require(
            self.checkpoint_interval_steps is None or self.checkpoint_interval_steps > 0,
            f"RuntimeConfig.checkpoint_interval_steps must be positive or None, got {self.checkpoint_interval_steps}",
        )
        _require(
            self.checkpoint_interval_min is None or self.checkpoint_interval_min > 0,
            f"RuntimeConfig.checkpoint_interval_min must be positive or None, got {self.checkpoint_interval_min}",
        )


@dataclass(frozen=True)
class RunConfig:
    """One training run: the unit a sweep is made of and a run folder holds."""

    sweep: str = "adhoc"
    """Name of the sweep the run belongs to (the results sub-folder)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model (see the model.* fields)."""
    data: DataConfig = field(default_factory=DataConfig)
    """The data (see the data.* fields)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The training recipe (see the train.* fields)."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Execution settings (see the runtime.* fields)."""

    def __post_init__(self) -> None:
        _require(
            self.sweep and all(c.isalnum() or c in "-_." for c in self.sweep),
            f"RunConfig.sweep={self.sweep!r} must be a non-empty name of letters, digits, '-', '_' or '.'",
        )
        _require(
            self.train.optimizer != "muon" or self.runtime.strategy != "fsdp",
            "train.optimizer=muon orthogonalises whole weight matrices, and runtime.strategy=fsdp shards them; use "
            "runtime.strategy=ddp with Muon, or train.optimizer=adamw under FSDP",
        )

    @property
    def identity(self) -> dict[str, Any]:
        """What makes the run: model, data and recipe (not the runtime, not the sweep name, not the micro-batch).

        ``n_blocks`` only counts for Block AttnRes: a baseline or Full run is the same run whatever it says.
        """
        model = to_dict(self.model)
        if self.model.residual != "block":
            model["n_blocks"] = _defaults(ModelConfig)["n_blocks"]
        data = to_dict(self.data)
        del data["eval_sets"]  # evaluated beside the run, not trained on
        train = to_dict(self.train)
        del train["micro_batch_size"]  # how a step's batch is split changes nothing but memory (and rounding)
        del train["trunk_tokens"], train["save_at_steps"]  # where a branch's first steps come from, what is kept
        return {"model": model, "data": data, "train": train}

    @property
    def run_id(self) -> str:
        """A stable, readable function of the run's identity: ``<variant>-L<n_layer>-d<d_model>-s<seed>-<hash>``.

        The hash covers the identity fields that differ from their defaults, so adding a new field whose
        default reproduces the old behaviour keeps every existing run id (and results tree) valid.
        """
        m = self.model
        changed = {
            section: {k: v for k, v in values.items() if v != _defaults(type(getattr(self, section)))[k]}
            for section, values in self.identity.items()
        }
        digest = hashlib.sha256(json.dumps(changed, sort_keys=True).encode()).hexdigest()[:10]
        return f"{Variant.of(m).label}-L{m.n_layer}-d{m.d_model}-s{self.train.seed}-{digest}"


@cache
def _defaults(cls: type) -> dict[str, Any]:
    return to_dict(cls())


# ---------------------------------------------------------------------------------------------------------
# dict <-> dataclass: OmegaConf structured configs and dotlist overrides, with errors that name the field
# ---------------------------------------------------------------------------------------------------------

SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "runtime": RuntimeConfig}


def to_dict(obj: Any) -> dict[str, Any]:
    """A plain, YAML-friendly dict of a (nested) config dataclass."""
    return dataclasses.asdict(obj)


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstring under every field of a dataclass (what ``--help`` prints)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _kind(tp: Any) -> str:
    """How an error names what a field takes."""
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_kind(a) if a is not type(None) else "null" for a in get_args(tp))
    return names.get(tp, _type_name(tp))


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def as_number(value: Any) -> float | None:
    """A number written as YAML or the command line write them (``2e6``, ``1_000``, ``3e-3``), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def unknown_key(section: str, key: str, allowed: list[str] | tuple[str, ...]) -> ConfigError:
    """The one message for a key that is not a field: the closest field, and every field allowed there."""
    hint = difflib.get_close_matches(str(key), list(allowed), n=1)
    return ConfigError(
        f"unknown config key {section}{key!r}"
        + (f"; did you mean {section}{hint[0]!r}?" if hint else "")
        + f" Allowed here: {', '.join(allowed)}. See `attnres train --help` and docs/sweeps.md."
    )


def _prepare(cls: type, data: Any, where: str) -> dict[str, Any]:
    """``data`` with the spellings OmegaConf's types do not take turned into the ones they do: integers written as
    floats (``tokens: 2e6``, which YAML reads as a string) and ``none`` for null. Non-finite numbers are refused
    here (OmegaConf takes ``inf`` and ``nan`` as floats). Unknown keys and wrong types are left to OmegaConf."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where.rstrip('.') or cls.__name__} must be a mapping of fields, got {data!r}")
    out = {}
    for key, value in data.items():
        tp = _hints(cls).get(key)
        if dataclasses.is_dataclass(tp):
            value = _prepare(tp, value or {}, f"{where}{key}.")
        elif tp is not None:
            args = get_args(tp) if get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
            number = as_number(value)
            if type(None) in args and isinstance(value, str) and value.strip().lower() in ("null", "none", "~"):
                value = None
            elif number is not None and (int in args or float in args) and not math.isfinite(number):
                raise ConfigError(f"{where}{key} must be a finite number, got {value!r}")
            elif number is not None and int in args and float not in args and number.is_integer():
                value = int(number)
        out[key] = value
    return out


def _field_at(cls: type, data: Any, path: list[str]) -> tuple[Any, Any]:
    """The annotation of the field at ``path`` under ``cls`` and the value ``data`` gives it."""
    tp: Any = cls
    for part in path:
        tp = _hints(tp).get(part) if dataclasses.is_dataclass(tp) else None
        data = data.get(part) if isinstance(data, Mapping) else None
    return tp, data


def _explain(err: Exception, cls: type, data: Mapping[str, Any], where: str) -> ConfigError:
    """One line that names the field and what it takes, from an OmegaConf error."""
    from omegaconf.errors import ConfigKeyError

    path = [p for p in str(getattr(err, "full_key", None) or "").split(".") if p]
    key = where + ".".join(path)
    if isinstance(err, ConfigKeyError) and path:
        parent, _ = _field_at(cls, data, path[:-1])
        allowed = [f.name for f in dataclasses.fields(parent)] if dataclasses.is_dataclass(parent) else []
        return unknown_key(where + "".join(f"{p}." for p in path[:-1]), path[-1], allowed)
    tp, value = _field_at(cls, data, path)
    if tp is None or not path:
        return ConfigError(f"{key or cls.__name__}: {str(err).splitlines()[0]}")
    if dataclasses.is_dataclass(tp):
        return ConfigError(f"{key} must be a mapping of fields, got {value!r}")
    if get_origin(tp) is Literal:
        hint = difflib.get_close_matches(str(value), [str(a) for a in get_args(tp)], n=1)
        return ConfigError(
            f"{key}={value!r} is not allowed; choose {_kind(tp)}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
        )
    return ConfigError(f"{key} must be {_kind(tp)}, got {value!r}")


def from_dict(cls: type, data: Mapping[str, Any], where: str = "") -> Any:
    """Build a (nested) config dataclass from a plain dict: types and unknown keys are checked by OmegaConf's
    structured configs, the cross-field rules by each dataclass's ``__post_init__``; every error is a
    :class:`ConfigError` naming the field (``where`` prefixes its name, for a grid's sections)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    prepared = _prepare(cls, data, where)
    try:
        return OmegaConf.to_object(OmegaConf.merge(_structured(cls), prepared))
    except OmegaConfBaseException as err:
        raise _explain(err, cls, prepared, where) from None


@cache
def _structured(cls: type) -> Any:
    """``cls``'s OmegaConf schema, built once: building it is most of a config's cost (a grid builds hundreds), and
    ``OmegaConf.merge`` copies it rather than changing it."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(cls)


def apply_overrides(data: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``key=value`` overrides (``model.n_layer=4``, OmegaConf's dotlist) set into a copy of a nested dict; values
    are typed against their fields later, by :func:`from_dict`, which also catches unknown keys."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for text in overrides:
        if "=" not in text or not text.split("=", 1)[0].strip(".").strip():
            raise ConfigError(f"override {text!r} is not of the form key=value (e.g. model.n_layer=4)")
    try:
        merged = OmegaConf.merge(OmegaConf.create(dict(data)), OmegaConf.from_dotlist(list(overrides)))
        return OmegaConf.to_container(merged)
    except OmegaConfBaseException as err:
        raise ConfigError(f"overrides {' '.join(overrides)}: {str(err).splitlines()[0]}") from None


def path_kind(path: str | Path) -> str:
    """What ``path`` is, in words, for a message that says why it cannot be read as a file: "a folder", "a character
    device" (``/dev/zero``), "a FIFO (named pipe)", ...; "missing" when there is nothing there."""
    import stat

    try:
        mode = Path(path).stat().st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as err:
        return f"unreadable ({err.strerror})"
    kinds = [
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISREG, "a file"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((words for test, words in kinds if test(mode)), "not a regular file")


def _yaml_loader() -> type:
    """PyYAML's safe loader, refusing a key written twice in one mapping: YAML keeps the last value without a word
    (``lr: 1e-3`` on line 4 silently replaced by ``lr: 3e-3`` on line 9)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges, which may repeat keys
                        continue
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        if key in seen:
                            raise DuplicateKey(key, seen[key], line)
                        seen[key] = line
                    except TypeError:  # an unhashable key: PyYAML's own error says so
                        continue
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


class DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, again: int) -> None:
        super().__init__(key, first, again)
        self.key, self.first, self.again = key, first, again


def load_yaml(path: str | Path) -> dict[str, Any]:
    import yaml

    path = Path(path)
    if not path.is_file():
        kind = path_kind(path)
        if kind == "missing":
            raise ConfigError(f"config file {str(path)!r} does not exist")
        raise ConfigError(f"config file {str(path)!r} is {kind}, not a file; give the YAML file itself")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        # an editor's "Unicode" is often UTF-16 (it starts with a byte-order mark); YAML files here are UTF-8
        saved_as = "UTF-16" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else "not UTF-8"
        raise ConfigError(
            f"config file {str(path)!r} is {saved_as} text (byte {err.start:,} cannot be read as UTF-8); save it as "
            "UTF-8"
        ) from None
    try:
        data = yaml.load(text, Loader=_yaml_loader()) or {}  # noqa: S506 (a SafeLoader)
    except DuplicateKey as dup:
        raise ConfigError(
            f"config file {str(path)!r}: key {dup.key!r} is given twice in one mapping ("
            + (f"lines {dup.first} and {dup.again}" if dup.first != dup.again else f"both on line {dup.first}")
            + "), and YAML would keep the second without a word; remove one of them"
        ) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping (sections model:, data:, train:, ...)")
    return data


def resolve_run_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Defaults < YAML file < ``key=value`` overrides, validated into a :class:`RunConfig`."""
    data = load_yaml(path) if path is not None else {}
    return from_dict(RunConfig, apply_overrides(data, list(overrides)))


def dump_yaml(cfg: RunConfig) -> str:
    import yaml

    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def help_text() -> str:
    """Every field of a run config with its type, default and meaning (for ``attnres train --help``)."""
    lines = []
    top_docs = field_docs(RunConfig)
    lines.append(f"  sweep: str = 'adhoc'\n      {top_docs['sweep']}")
    for section, cls in SECTIONS.items():
        lines.append(f"\n{section}.*  ({(cls.__doc__ or '').strip()})")
        docs = field_docs(cls)
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            lines.append(
                f"  {section}.{f.name}: {_type_name(hints[f.name])} = {f.default!r}\n      {docs.get(f.name, '')}"
            )
    return "\n".join(lines)
