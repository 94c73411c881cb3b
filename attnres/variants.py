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

:meth:`Variant.parse` reads a label or a curve name back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

_CURVE_N = re.compile(r"^(?P<name>.+)-N(?P<n>\d+)$")
_LABEL_N = re.compile(r"^block(?P<n>\d+)(?P<tags>(\+.*)?)$")


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
    for a curve that does not say N)."""

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
    def label(self) -> str:
        """``block4`` (N after the residual kind, before any tags); other variants by their name."""
        if self.is_block and self.n_blocks is not None:
            return self.name.replace("block", f"block{self.n_blocks}", 1)
        return self.name

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
