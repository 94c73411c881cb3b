"""A multi-process `attnres train` recording the collectives of every micro-batch (tests/attnres/test_parallel.py).

    python -m tests.attnres.collectives RUN_DIR [--sync-every-micro-batch] [key=value ...]

Run from the repository root. Lightning starts the other ranks by running this same command again (its subprocess
launcher), so every rank counts. Each rank writes ``RUN_DIR/collectives-rank<r>.json``:

* ``micro_batches``: one entry per training micro-batch, ``{"step", "micro", "ops"}``, ``ops`` counting the
  collective operations the profiler saw from ``on_train_batch_start`` to ``on_train_batch_end`` (the forward, the
  backward, and on a step's last micro-batch the optimizer step and its hooks): the c10d dispatcher's operations
  (``c10d::allreduce_``, ``c10d::_allgather_base_``, ``c10d::_reduce_scatter_base_``, ``c10d::broadcast_``, ...;
  DDP's C++ reducer calls them too) and the functional collectives DTensor uses (``_c10d_functional::all_reduce``);
* ``units`` (FSDP): per FSDP unit, the dtype and bytes of its own parameters as its first training forward sees
  them, that is as FSDP2 gathered them.

``--sync-every-micro-batch``: the behaviour before one gradient reduction per step, for comparison: no strategy
skips the gradient synchronisation of a non-final micro-batch (DDP all-reduces, FSDP2 reduce-scatters, every one).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections import Counter
from pathlib import Path

import lightning as L
from torch import nn
from torch.profiler import ProfilerActivity, profile

COLLECTIVE_PREFIXES = ("c10d::", "_c10d_functional::")
NOT_COLLECTIVES = ("wait_tensor", "wait", "_wrap_tensor_autograd")


def is_collective(name: str) -> bool:
    return name.startswith(COLLECTIVE_PREFIXES) and name.split("::", 1)[1] not in NOT_COLLECTIVES


def collective_counts(prof: profile) -> dict[str, int]:
    """The collectives the code called, by name: not those a collective runs inside itself (a functional
    ``all_reduce`` runs ``c10d::allreduce_``)."""

    def top_level(event) -> bool:  # noqa: ANN001
        parent = event.cpu_parent
        while parent is not None:
            if is_collective(parent.name):
                return False
            parent = parent.cpu_parent
        return True

    names = Counter(e.name for e in prof.events() if is_collective(e.name) and top_level(e))
    return dict(sorted(names.items()))


def own_parameters(unit: nn.Module) -> list[nn.Parameter]:
    """The parameters an FSDP unit gathers: its modules' down to (not into) the FSDP units inside it."""
    from torch.distributed.fsdp import FSDPModule

    params = list(unit.parameters(recurse=False))
    for child in unit.children():
        if not isinstance(child, FSDPModule):
            params += own_parameters(child)
    return params


class CountCollectives(L.Callback):
    def __init__(self) -> None:
        self.micro_batches: list[dict] = []
        self.units: dict[str, dict] = {}
        self._prof: profile | None = None
        self._micro = 0

    def on_train_start(self, trainer, pl_module) -> None:
        from torch.distributed.fsdp import FSDPModule

        for name, module in pl_module.model.named_modules():
            if isinstance(module, FSDPModule):
                module.register_forward_pre_hook(self._record_unit(name or "root"))

    def _record_unit(self, name: str):
        def hook(module: nn.Module, args) -> None:
            if name not in self.units and module.training:
                params = own_parameters(module)
                self.units[name] = {
                    "dtypes": sorted({str(p.dtype) for p in params}),
                    "bytes": sum(p.numel() * p.element_size() for p in params),
                    "numel": sum(p.numel() for p in params),
                }

        return hook

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._prof = profile(activities=[ProfilerActivity.CPU])
        self._prof.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._prof.__exit__(None, None, None)
        ops = collective_counts(self._prof)
        self._prof = None
        # trainer.global_step is already the next step's after a step's last micro-batch
        last = (batch_idx + 1) % trainer.accumulate_grad_batches == 0
        step = trainer.global_step if last else trainer.global_step + 1
        self.micro_batches.append({"step": step, "micro": self._micro, "last": last, "ops": ops})
        self._micro = 0 if last else self._micro + 1


@contextlib.contextmanager
def _sync_always(self):  # noqa: ANN001, ANN202
    yield None


def main(argv: list[str]) -> None:
    from attnres.config import resolve_run_config
    from attnres.training.run import train

    out, args = Path(argv[0]), argv[1:]
    if "--sync-every-micro-batch" in args:
        args = [a for a in args if a != "--sync-every-micro-batch"]
        from lightning.pytorch.strategies import DDPStrategy

        from attnres.training.parallel import ShardedStrategy

        DDPStrategy.block_backward_sync = _sync_always
        ShardedStrategy.block_backward_sync = _sync_always
    counter = CountCollectives()
    result = train(resolve_run_config(None, args), out, progress=False, callbacks=[counter])
    rank = int(os.environ.get("LOCAL_RANK", 0))
    record = {"status": result.status, "micro_batches": counter.micro_batches, "units": counter.units}
    (out / f"collectives-rank{rank}.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
