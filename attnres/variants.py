"""A depth-mixing variant, and the one place that parses and prints its names (no torch, no config import).

A variant is the results' ``variant`` column (the residual kind plus any ablation tags: ``baseline``, ``full``,
``block``, ``full+sigmoid``, ``block+heads16``, ``hc4``, ...) and, for Block AttnRes, its number of depth blocks N.
It has one name per place it is shown in, all made here:

=================  ======================  ====================================================================
``label``          ``block4``              grids, ``attnres tune``, the benchmarks, run ids
``curve(split)``   ``block-N4``            the analysis's curve names, when one sweep has several N of a variant
``title``          ``Block AttnRes (N=4)``  figure legends and report tables
``short``          ``Block N=4``           annotations
=================  ======================  ====================================================================

:meth:`Variant.parse` reads a label or a curve name back (``parse_main`` the labels a grid or a benchmark may
name by themselves). What a variant is (its place in the figures' order, whether it is AttnRes in the paper's form,
its one-line ``description``) is decided here too. A curve's variant is made once, from its point table's columns
(:func:`analysis.data.select.curve_variants`), never by reading its name back: the analysis's results carry their
curves' variants, and the reports ask those (:func:`curve_order` sorts curves by the variants it is handed).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

_CURVE_N = re.compile(r"^(?P<name>.+)-N(?P<n>\d+)$")
_LABEL_N = re.compile(r"^block(?P<n>\d+)(?P<tags>(\+.*)?)$")
_HC = re.compile(r"(m?hc)(\d+)")

_TAG_TEXT = {
    "no_key_norm": "without key RMSNorm",
    "sigmoid": "sigmoid instead of softmax",
    "input_query": "input-dependent query",
    "scalar": "input-independent scalar mixing (no query/key)",
}


class _Model(Protocol):
    """What :meth:`Variant.of` reads of a :class:`~attnres.config.ModelConfig` (which imports this module)."""

    residual: str
    n_blocks: int
    hc_streams: int
    key_norm: bool
    depth_score: str
    depth_query: str
    depth_mixing: str
    depth_heads: int
    depth_window: int


@dataclass(frozen=True)
class Variant:
    """``name``: the results' ``variant`` column; ``n_blocks``: Block AttnRes's N (None for other variants, or
    where N is not known)."""

    name: str
    n_blocks: int | None = None

    @classmethod
    def of(cls, model: _Model) -> Variant:
        """The variant a model config trains: its residual kind plus the ablation switches it sets."""
        if model.residual in ("hc", "mhc"):
            return cls(f"{model.residual}{model.hc_streams}")
        tags = []
        if not model.key_norm:
            tags.append("no_key_norm")
        if model.depth_score != "softmax":
            tags.append(model.depth_score)
        if model.depth_query != "static":
            tags.append("input_query")
        if model.depth_mixing != "attention":
            tags.append(model.depth_mixing)
        if model.depth_heads != 1:
            tags.append(f"heads{model.depth_heads}")
        if model.depth_window:
            tags.append(f"window{model.depth_window}")
        n_blocks = model.n_blocks if model.residual == "block" else None
        return cls("+".join([model.residual, *tags]), n_blocks)

    @classmethod
    def parse(cls, text: str) -> Variant:
        """A label (``block4``, ``block4+heads16``) or a curve name (``block-N4``); any other text is a variant
        name as it is (``baseline``, ``full``, ``block`` without N, ``full+sigmoid``, ...)."""
        if m := _CURVE_N.match(text):
            return cls(m.group("name"), int(m.group("n")))
        if m := _LABEL_N.match(text):
            return cls("block" + m.group("tags"), int(m.group("n")))
        return cls(text)

    @classmethod
    def parse_main(cls, label: str) -> Variant | None:
        """``baseline``, ``full`` or ``block<N>`` (the labels a grid or a benchmark may name by themselves); None
        for any other label, so the caller can name its own alternatives."""
        if label in ("baseline", "full"):
            return cls(label)
        if label.startswith("block") and label[5:].isdigit():
            return cls("block", int(label[5:]))
        return None

    @property
    def residual(self) -> str:
        """The residual kind: ``baseline``, ``full``, ``block``, ``denseformer``, ``hc<n>``, ``mhc<n>``."""
        return self.name.split("+")[0]

    @property
    def is_block(self) -> bool:
        return self.residual == "block"

    @property
    def is_main(self) -> bool:
        """Baseline, Full AttnRes and Block AttnRes (any N): the variants the dynamics figures show by default."""
        return self.name in ("baseline", "full", "block")

    @property
    def is_attnres(self) -> bool:
        """Full or Block AttnRes (any N) without an ablation: runs that write depth_attn.parquet in the paper's
        form."""
        return self.name in ("full", "block")

    @property
    def order(self) -> tuple[int, int]:
        """The figures' order (:func:`curve_order`): baseline, other baselines (DenseFormer, HC, mHC), Full and
        its ablations, Block (by N) and its ablations, anything else."""
        name, base = self.name, self.residual
        if name == "baseline":
            group = 0
        elif base in ("denseformer",) or re.fullmatch(r"m?hc\d*", base):
            group = 1
        elif name == "full":
            group = 2
        elif base == "full":
            group = 3
        elif name == "block":
            group = 4
        elif base == "block":
            group = 5
        else:
            group = 6
        return group, self.n_blocks if self.n_blocks is not None else 0

    @property
    def label(self) -> str:
        """``block4`` (N after the residual kind, before any tags); other variants by their name."""
        if self.is_block and self.n_blocks is not None:
            return self.name.replace("block", f"block{self.n_blocks}", 1)
        return self.name

    def as_named(self, curve: str) -> Variant:
        """This variant as the curve ``curve`` names it: with N when the curve is one N of a split variant (its name
        is :meth:`curve`, ``block-N4``), without when the name is the variant's alone (``block``: a Block curve of
        one N per size stands for every N, and the figures draw it in the Block colour without an N). ``curve`` is
        compared with this variant's names, not parsed."""
        return self if curve == self.curve() else Variant(self.name)

    def curve(self, split: bool = True) -> str:
        """The analysis's curve name: ``<name>-N<n_blocks>`` when ``split`` (several N of this variant in one
        sweep) and N is known, else the name."""
        return f"{self.name}-N{self.n_blocks}" if split and self.n_blocks is not None else self.name

    @property
    def title(self) -> str:
        """The legend name: ``baseline``, ``Full AttnRes``, ``Block AttnRes (N=4)``; other names as they are (an
        ablation with N given by its curve name keeps it: ``block+heads16 (N=4)``)."""
        if self.name == "baseline":
            return "baseline"
        if self.name == "full":
            return "Full AttnRes"
        if self.name == "block":
            return f"Block AttnRes (N={self.n_blocks})" if self.n_blocks is not None else "Block AttnRes"
        return f"{self.name} (N={self.n_blocks})" if self.n_blocks is not None else self.name

    @property
    def short(self) -> str:
        """A short name for annotations: ``Full``, ``Block N=4``; other variants by their curve name."""
        if self.name == "full":
            return "Full"
        if self.name == "block":
            return f"Block N={self.n_blocks}" if self.n_blocks is not None else "Block"
        return self.curve()

    @property
    def description(self) -> str:
        """One line: the residual kind, then each ablation tag's meaning (``full+sigmoid``: "Full AttnRes, sigmoid
        instead of softmax"; Block with its N when known: "Block AttnRes, N = 4")."""
        base, tags = self.residual, self.name.split("+")[1:]
        m = _HC.fullmatch(base)
        if base == "baseline":
            head = "PreNorm residual stream (baseline)"
        elif base == "denseformer":
            head = "DenseFormer (learned scalar weights over all earlier outputs)"
        elif m:
            head = (
                "manifold-constrained Hyper-Connections (mHC)" if m.group(1) == "mhc" else "Hyper-Connections (HC)"
            ) + f", {m.group(2)} streams"
        elif base == "full":
            head = "Full AttnRes"
        elif base == "block":
            head = "Block AttnRes" + (f", N = {self.n_blocks}" if self.n_blocks is not None else "")
        else:
            head = base
        return ", ".join([head, *map(_tag_text, tags)])


def _tag_text(tag: str) -> str:
    if tag in _TAG_TEXT:
        return _TAG_TEXT[tag]
    if tag.startswith("heads") and tag[5:].isdigit():
        return f"{tag[5:]}-head depth attention"
    if tag.startswith("window") and tag[6:].isdigit():
        return f"sliding window over the last {tag[6:]} outputs + embedding"
    return tag


def curve_order(curves: Iterable[str], variants: Mapping[str, Variant]) -> list[str]:
    """The distinct ``curves`` in the figures' order: by the :attr:`Variant.order` of each one's variant in
    ``variants`` (a sweep's :attr:`~analysis.SweepFit.curve_variants`, or
    :func:`analysis.data.select.curve_variants` of a point table), then alphabetically."""
    return sorted(set(curves), key=lambda curve: (*variants[curve].order, curve))
