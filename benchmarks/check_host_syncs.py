"""Host syncs of training under gradient accumulation: none in a micro-batch, one read per optimizer step.

    python benchmarks/check_host_syncs.py [--device cuda|cpu] [--micro-batches 4] [--json OUT] [key=value ...]

Trains a small run through `attnres train`'s own code (LitLM, Lightning) with each step's batch split into
``--micro-batches`` micro-batches, and counts, per call of ``training_step`` (one micro-batch's forward and loss)
and of ``on_before_optimizer_step`` (a step's end: its loss, finite check, gradient norm and clipping):

* ``reads``: tensor methods that read a value to the host (``item``, ``tolist``, ``float()``, ``bool()``, ...), on
  any device (a TorchFunctionMode); on a GPU each one waits for the device;
* ``syncs`` (CUDA only): every synchronising CUDA call torch reports under ``torch.cuda.set_sync_debug_mode("warn")``,
  reads and host-to-device copies of Python numbers alike (Lightning's ``self.log`` of a float is one).

Expected (docs/training.md, "Several devices"): no read and no sync in any ``training_step``; one read per step
(the loss and the gradient norm together, ``tolist``) and, on CUDA, that read's sync plus one per float the step
logs (``loss``, ``tok_s``), made after it, when the GPU has nothing queued. Evaluation steps read the per-layer
gradient norms too. The first step is left out of the verdict (lazy CUDA initialisation). Exit status 1 when a
micro-batch read or synced. Part of ``benchmarks/gpu_check.sh`` (stage ``host-syncs``); on CPU it checks reads only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch

HOST_READS = {"__bool__", "__float__", "__int__", "__index__", "__format__", "item", "tolist", "numpy", "cpu"}


class HostReads(torch.overrides.TorchFunctionMode):
    """Records the tensor methods that read a value to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's signature)
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def counted(method, cuda: bool, calls: list[dict]):  # noqa: ANN001, ANN201
    """``method`` of LitLM, recording each call's host reads (and CUDA syncs) with the step it belongs to."""

    def wrapper(self, *args, **kwargs):  # noqa: ANN001, ANN202
        step = self.global_step + 1
        with warnings.catch_warnings(record=True) as caught, HostReads() as mode:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                out = method(self, *args, **kwargs)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
        syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
        calls.append({"step": step, "reads": mode.reads, "syncs": len(syncs)})
        return out

    return wrapper


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args, overrides = parser.parse_known_args(argv)

    from attnres.config import resolve_run_config
    from attnres.training.module import LitLM
    from attnres.training.run import train

    cuda = args.device == "cuda"
    base = [
        "model.n_layer=4",
        "model.d_model=128",
        "model.n_head=4",
        "model.seq_len=256",
        "model.n_blocks=4",
        "train.batch_size=16",
        f"train.micro_batch_size={16 // args.micro_batches}",
        "train.tokens=40960",  # 10 steps
        "train.eval_interval=5",
        "train.log_interval=1",
        f"runtime.accelerator={'gpu' if cuda else 'cpu'}",
    ]
    cfg = resolve_run_config(None, [*base, *overrides])
    steps_of: dict[str, list[dict]] = {"training_step": [], "on_before_optimizer_step": []}
    originals = {name: getattr(LitLM, name) for name in steps_of}
    try:
        for name, calls in steps_of.items():
            setattr(LitLM, name, counted(originals[name], cuda, calls))
        with tempfile.TemporaryDirectory() as folder:
            result = train(cfg, Path(folder) / "run", progress=False)
    finally:
        for name, method in originals.items():
            setattr(LitLM, name, method)
    micro, ends = steps_of["training_step"], steps_of["on_before_optimizer_step"]
    steady = [c for c in micro if c["step"] > 1]
    bad = [c for c in steady if c["reads"] or c["syncs"]]
    summary = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "status": result.status,
        "micro_batches_per_step": len(micro) // max(1, len(ends)),
        "training_step": {"calls": len(micro), "with_reads_or_syncs_after_step_1": len(bad)},
        "on_before_optimizer_step": [f"step {c['step']}: reads {c['reads']}, syncs {c['syncs']}" for c in ends],
        "micro_batches_that_read_or_synced": bad[:10],
    }
    text = json.dumps(summary, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    ok = result.status == "done" and not bad and all(c["reads"].count("tolist") >= 1 for c in ends)
    print("host syncs: " + ("ok: none in a micro-batch, one read per step" if ok else "FAILED (see above)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
