"""Training on several devices: the Lightning strategy of ``runtime.strategy``, FSDP2 sharding of the model, and the
few collectives the module needs so that every logged number is the global one.

``ddp``: Lightning's DDPStrategy (a full copy of the model per device, gradients all-reduced).

``fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard``) through Lightning's ModelParallelStrategy, chosen over
Lightning's FSDPStrategy (FSDP1) for three reasons (docs/training.md, "Several devices"):

* the units are the modules the forward calls. :class:`~attnres.model.AttnResLM` calls every attention and MLP
  sublayer itself (the depth mixer sits between them), never ``Block.forward``; FSDP2 gathers a unit's parameters
  in a forward pre-hook on that module, so each sublayer is one unit and the root (embedding, depth mixer, final
  norm, head) another. FSDP1 with a ``{Block}`` policy never gathered them;
* parameters stay ``nn.Parameter`` objects with their own names (sharded DTensors), so the weight-decay groups,
  the depth mixer's learning-rate groups and ``torch.nn.utils.clip_grad_norm_`` (a global norm over DTensors) work
  unchanged;
* it runs on CPU over gloo, so the tests train the very path a GPU cluster runs (Lightning refuses FSDP1 on CPU).

Checkpoints are full (unsharded) state dicts in the single-device format: the model's parameter names and the
optimizer's state keyed by parameter index in optimizer order, as ``torch.optim.Optimizer.state_dict`` writes them.
So a run resumes under DDP, FSDP or one device, on any world size. Lightning's ModelParallelStrategy would key the
optimizer state by ``model.parameters()`` order instead, which is not the optimizer's order here (decayed weights
first), so :class:`ShardedStrategy` converts it both ways.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch import Tensor, nn

from attnres.config import RunConfig
from attnres.training.state_names import eager_names


def build_strategy(cfg: RunConfig) -> Any:
    """The Lightning strategy of a multi-device run (``runtime.strategy``), with the process-group timeout."""
    timeout = timedelta(seconds=cfg.runtime.process_group_timeout_s)
    if cfg.runtime.strategy == "ddp":
        return DDPStrategy(timeout=timeout)
    world = cfg.runtime.devices * cfg.runtime.num_nodes
    return ShardedStrategy(
        data_parallel_size=world, tensor_parallel_size=1, save_distributed_checkpoint=False, timeout=timeout
    )


def shard_model(model: nn.Module, mesh: Any) -> None:
    """FSDP2 in place: one unit per attention / MLP sublayer (what the forward calls), the rest in the root unit.

    The root holds the embedding, the depth mixer's pseudo-queries and key gains (read by every sublayer's depth
    attention, before and after the sublayers) and the final norm and head; FSDP2 keeps it gathered from the forward
    to the end of the backward. Each sublayer is gathered for its forward (and again for its backward) and freed
    after, so the peak holds one sublayer's full parameters beside the shards.
    """
    from torch.distributed.fsdp import fully_shard

    for sublayer in model.sublayers:
        fully_shard(sublayer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def is_sharded(tensor: Tensor | None) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full_value(tensor: Tensor) -> Tensor:
    """A DTensor's global value (a collective: every rank must call it); a plain tensor as it is."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor


def local_part(tensor: Tensor) -> Tensor:
    """This rank's shard of a DTensor; a plain tensor as it is."""
    return tensor.to_local() if is_sharded(tensor) else tensor


class ShardedStrategy(ModelParallelStrategy):
    """ModelParallelStrategy (FSDP2) whose checkpoints are single-device checkpoints (module docstring)."""

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        optimizer = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        by_name = get_optimizer_state_dict(self.model, optimizer, options=options)  # empty but on rank 0
        if not by_name:
            return by_name
        index = {name: i for i, name in enumerate(_names_in_optimizer_order(self.model, optimizer))}
        return {
            "state": {index[name]: state for name, state in by_name["state"].items()},
            "param_groups": [{**g, "params": [index[name] for name in g["params"]]} for g in by_name["param_groups"]],
        }

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        from lightning.fabric.strategies.model_parallel import _load_raw_module_state
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        path = self.broadcast(checkpoint_path)
        checkpoint = torch.load(path, mmap=True, map_location="cpu", weights_only=weights_only)
        weights = eager_names(checkpoint.pop("state_dict"))
        _load_raw_module_state(weights, self.model, strict=self.lightning_module.strict_loading)
        for optimizer, state in zip(self.optimizers, checkpoint.get("optimizer_states", [])):
            optimizer = getattr(optimizer, "_optimizer", optimizer)
            names = _names_in_optimizer_order(self.model, optimizer)
            by_name = {
                "state": {names[i]: s for i, s in state["state"].items()},
                "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]],
            }
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_optimizer_state_dict(self.model, optimizer, optim_state_dict=by_name, options=options)
        return checkpoint


def _names_in_optimizer_order(module: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The parameter names of ``module`` in the order ``Optimizer.state_dict`` numbers them (group by group)."""
    name_of = {id(p): name for name, p in module.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]
