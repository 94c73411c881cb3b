"""The optimizer of a run: AdamW (the default), or Muon on the hidden weight matrices with AdamW on the rest.

``train.optimizer=muon`` follows the recipe the paper's models come from (Kimi's Moonlight: Muon with its update
scaled to AdamW's RMS, so the learning rate and weight decay tuned for AdamW serve both). Muon orthogonalises each
weight matrix's momentum as a whole, so it takes only the 2-D weights of the sublayers (attention ``qkv`` and
``proj``, the MLP's ``gate_up`` and ``down``); the embedding, the head, the norms, the pseudo-queries, an
ablation's mixing weights and every other vector or scalar stay on AdamW, as in every public Muon recipe.

Both optimizers sit behind one :class:`torch.optim.Optimizer` (:class:`MuonAdamW`) whose parameter groups are the
two inner optimizers' own group dicts: the one learning-rate scheduler, the depth mixer's ``lr_scale``
(:meth:`LitLM.scale_lrs`), gradient clipping and Lightning's checkpointing see a single optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from attnres.config import TrainConfig

MUON_ADJUST_LR = "match_rms_adamw"  # Moonlight's scaling: 0.2 * sqrt(max(A, B)), AdamW's update RMS


def parameter_groups(
    model: nn.Module, weight_decay: float, depth_lr_scale: float = 1.0, exclude: frozenset[int] = frozenset()
) -> list[dict]:
    """Decay linear weights only: never norms, gains, pseudo-queries or embeddings. With a ``depth_lr_scale`` other
    than 1 the depth mixer's parameters get groups of their own, marked ``lr_scale`` (:meth:`LitLM.scale_lrs`);
    with 1 the groups are the same two as always, so older checkpoints still load. ``exclude``: ids of parameters
    another optimizer takes (Muon's matrices)."""
    decay = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    params = [p for p in dict.fromkeys(model.parameters()) if id(p) not in exclude]  # a tied weight once
    depth = {id(p) for p in model.depth.parameters()} if depth_lr_scale != 1.0 else set()
    groups = []
    for in_depth in (False, True):
        for decayed in (True, False):
            chosen = [p for p in params if (id(p) in decay) == decayed and (id(p) in depth) == in_depth]
            if chosen or not in_depth:
                group = {"params": chosen, "weight_decay": weight_decay if decayed else 0.0}
                groups.append(group | ({"lr_scale": depth_lr_scale} if in_depth else {}))
    return groups


def muon_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The hidden weight matrices Muon takes: every 2-D parameter of the attention and MLP sublayers."""
    return [p for sub in model.sublayers for p in sub.parameters() if p.ndim == 2]


class _States(Mapping):
    """The inner optimizers' states as one read-only mapping. Not a ``ChainMap``: a look-up there falls through
    to the first map, a ``defaultdict``, which would answer an AdamW parameter with an empty state and keep it."""

    def __init__(self, *states: Mapping) -> None:
        self.maps = states

    def __getitem__(self, param: Any) -> Any:
        for states in self.maps:
            if param in states:
                return states[param]
        raise KeyError(param)

    def __iter__(self) -> Iterator:
        return (param for states in self.maps for param in states)

    def __len__(self) -> int:
        return sum(len(states) for states in self.maps)


class MuonAdamW(torch.optim.Optimizer):
    """Muon on ``muon_params``, AdamW on ``adamw_groups``, stepped together as one optimizer.

    ``param_groups`` is the list of the inner optimizers' group dicts themselves (Muon's first), so a scheduler or
    a hook that sets ``group["lr"]`` sets it for the optimizer that steps that group. ``state_dict`` holds both
    inner optimizers' states, under ``muon`` and ``adamw``.
    """

    def __init__(self, muon_params: list[nn.Parameter], adamw_groups: list[dict], t: TrainConfig, foreach: bool | None):
        self.muon = torch.optim.Muon(
            muon_params,
            lr=t.lr,
            weight_decay=t.weight_decay,
            momentum=t.muon_momentum,
            adjust_lr_fn=MUON_ADJUST_LR,
        )
        self.adamw = torch.optim.AdamW(adamw_groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, foreach=foreach)
        super().__init__([{"params": g["params"]} for g in self._groups()], {})
        self.param_groups = self._groups()  # the inner optimizers' own dicts, not the copies the base class made
        self.state = _States(self.muon.state, self.adamw.state)  # type: ignore[assignment]

    def _groups(self) -> list[dict[str, Any]]:
        return [*self.muon.param_groups, *self.adamw.param_groups]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:  # Lightning's closure runs the forward, the backward and the pre-step hooks
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) != {"muon", "adamw"}:
            raise ValueError(
                "this checkpoint's optimizer state is not Muon + AdamW (train.optimizer=muon): it was saved by "
                "another optimizer; resume with the optimizer the run was started with"
            )
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self.param_groups = self._groups()  # load_state_dict replaces the inner group dicts
        self.state = _States(self.muon.state, self.adamw.state)  # type: ignore[assignment]


def saved_param_groups(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The parameter groups of a saved optimizer state, in the order the optimizer's ``param_groups`` has them (the
    dicts themselves: changing one changes the state): a torch optimizer's, or :class:`MuonAdamW`'s two inner ones."""
    if "param_groups" in state:
        return state["param_groups"]
    return [*state["muon"]["param_groups"], *state["adamw"]["param_groups"]]


def build_optimizer(model: nn.Module, t: TrainConfig, foreach: bool | None = None) -> torch.optim.Optimizer:
    """The run's optimizer over :func:`parameter_groups` (AdamW) or Muon + AdamW (:class:`MuonAdamW`). ``foreach``
    None: torch's choice (multi-tensor on GPU); the memory estimate (:mod:`attnres.training.memory`) sets it to
    simulate a GPU's step on CPU tensors."""
    if t.optimizer == "muon":
        matrices = muon_parameters(model)
        rest = parameter_groups(model, t.weight_decay, t.depth_lr_scale, exclude=frozenset(map(id, matrices)))
        return MuonAdamW(matrices, rest, t, foreach)
    groups = parameter_groups(model, t.weight_decay, t.depth_lr_scale)
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, foreach=foreach)
