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

In a bf16 run the sublayer units gather their parameters in bf16 and reduce their gradients in fp32
(:func:`sublayer_policy`, ``runtime.fsdp_mixed_precision``), and under gradient accumulation every unit reduces its
gradients once per optimizer step (:meth:`ShardedStrategy.block_backward_sync`).

Checkpoints are full (unsharded) state dicts in the single-device format: the model's parameter names and the
optimizer's state keyed by parameter index in optimizer order, as ``torch.optim.Optimizer.state_dict`` writes them.
So a run resumes under DDP, FSDP or one device, on any world size. Lightning's ModelParallelStrategy would key the
optimizer state by ``model.parameters()`` order instead, which is not the optimizer's order here (decayed weights
first), so :class:`ShardedStrategy` converts it both ways.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
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
        # no buffer broadcast: the model's only buffers are the rotary tables, constants every rank computes alike;
        # DDP's default broadcast them from rank 0 at the first forward of every step (one collective per step)
        return DDPStrategy(timeout=timeout, broadcast_buffers=False)
    world = cfg.runtime.devices * cfg.runtime.num_nodes
    return ShardedStrategy(
        data_parallel_size=world, tensor_parallel_size=1, save_distributed_checkpoint=False, timeout=timeout
    )


def shard_model(model: nn.Module, mesh: Any, bf16_params: bool = False) -> None:
    """FSDP2 in place: one unit per attention / MLP sublayer (what the forward calls), the rest in the root unit.

    The root holds the embedding, the depth mixer's pseudo-queries and key gains (read by every sublayer's depth
    attention, before and after the sublayers) and the final norm and head; FSDP2 keeps it gathered from the forward
    to the end of the backward. Each sublayer is gathered for its forward (and again for its backward) and freed
    after, so the peak holds one sublayer's full parameters beside the shards (two with the prefetched next one).

    ``bf16_params`` (a bf16 run with ``runtime.fsdp_mixed_precision``): :func:`sublayer_policy`, the sublayers
    gathered in bf16 and their gradients reduce-scattered in fp32. The root keeps fp32 (:func:`sublayer_policy`).
    """
    from torch.distributed.fsdp import fully_shard

    policy = sublayer_policy(bf16_params)
    for sublayer in model.sublayers:
        fully_shard(sublayer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh)


def sublayer_policy(bf16_params: bool) -> Any:
    """FSDP2's MixedPrecisionPolicy of every attention / MLP sublayer unit.

    bf16: parameters all-gathered (and used) in bf16, the unit's inputs cast to bf16, gradients reduce-scattered and
    accumulated in fp32 (``reduce_dtype``), the sharded parameters and optimizer state fp32. Under bf16 autocast a
    sublayer's matrix products run in bf16 anyway, so this halves the gathers' traffic and memory and changes the
    numbers by bf16 rounding only (the norm's gain and input rounded before, not after, the norm). The root unit
    gets no policy: the embedding's output starts the residual stream, which stays fp32 (its sums are fp32, as the
    baseline's ``h + f(h)`` is), and the depth mixer's pseudo-queries and key gains feed the fp32 depth softmax;
    casting them would change what the run computes, not only what it sends. Otherwise: no casting (fp32 gathers).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if bf16_params:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


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
    """ModelParallelStrategy (FSDP2) whose checkpoints are single-device checkpoints (module docstring), and which
    reduce-scatters gradients once per optimizer step under gradient accumulation (:meth:`block_backward_sync`)."""

    @contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """The backward of a micro-batch that is not a step's last: no reduce-scatter. Lightning enters this around
        such micro-batches (DDPStrategy's is DDP's ``no_sync``; ModelParallelStrategy's did nothing, so FSDP2
        reduce-scattered every micro-batch). FSDP2 then accumulates each unit's unsharded gradient (in the reduce
        dtype, fp32) and reduce-scatters the sum in the step's last backward: one gradient reduction per step, at
        the cost of holding the whole model's unsharded gradients between micro-batches, as DDP does (the memory
        estimate counts them)."""
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in self.lightning_module.modules() if isinstance(m, FSDPModule)]
        for unit in units:
            unit.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for unit in units:
                unit.set_requires_gradient_sync(True, recurse=False)

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
