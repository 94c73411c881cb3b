"""How much a busy machine slows the demo's training: the workers bound to their own cores or not, and the threads
chosen from the free cores or by the old rule.

    python benchmarks/bench_load.py --hogs 1           # the demo's 12 runs, quiet and beside one CPU hog
    python benchmarks/bench_load.py --runs 4 --hogs 1 --json load.json   # its 4 smallest: a quick look

Trains the first ``--runs`` runs of a grid (the demo's by default, all of them) with the local launcher, as ``attnres
demo`` does, up to five times into fresh folders, and prints the wall time of each and the ratios busy / quiet:

1. quiet: nothing else running, workers and threads as the demo picks them (:class:`attnres.runtime.CpuShare`), each
   worker bound to its own core (:mod:`sweeps.worker_devices`);
2. quiet, unbound: the same, the workers' placement left to the scheduler;
3. busy: beside ``--hogs`` CPU-bound processes (default one per core), workers and threads as the demo picks them on
   the busy machine (one one-thread worker per core), bound;
4. busy, unbound: the same, left to the scheduler;
5. busy, as before: the same hogs, unbound, with the old rule, ``threads = cores // workers`` whatever else runs
   (not rerun where that is what the busy passes chose: one one-thread worker per core).

The first run is trained once before them, untimed: it builds the token cache and the native kernels where they are not
built yet, which the first pass would pay alone. Run it on a quiet machine (the quiet pass is the reference; the script
says when the load before it starts is not low). The hogs run until the script ends; the busy passes wait until the load
average has seen them, as a machine that has been busy for a while shows it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnres.runtime import CpuShare, cpu_cores  # noqa: E402
from sweeps import expand, load_grid  # noqa: E402
from sweeps.local_pool import run_local  # noqa: E402


def hog() -> None:
    """A CPU-bound process: what another user's job looks like to the scheduler."""
    x = 0
    while True:
        x = (x * 1103515245 + 12345) % 2**31


def timed_pass(runs: list, workers: int, threads: int | None, folder: Path, label: str, bind: bool = True) -> dict:
    share = CpuShare.now()
    chosen = threads or share.threads(workers)
    start = time.perf_counter()
    summary = run_local(
        runs, folder, workers=workers, threads=threads, progress=False, log=lambda _: None, bind_cores=bind
    )
    seconds = time.perf_counter() - start
    assert summary.ok, summary.runs
    print(
        f"{label:<18} {seconds:8.1f} s   {workers} worker(s) x {chosen} thread(s), load {share.load:.1f} on "
        f"{share.cores} core(s) at the start",
        flush=True,
    )
    return {
        "label": label,
        "seconds": seconds,
        "workers": workers,
        "threads": chosen,
        "bound": bind,
        "load": share.load,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default="demo", help="grid whose first runs are trained (demo)")
    parser.add_argument("--runs", type=int, help="how many of its first runs (all)")
    parser.add_argument("--hogs", type=int, default=cpu_cores(), help="CPU-bound processes beside the busy passes")
    parser.add_argument("--settle-s", type=float, default=180, help="longest wait for the load average (180 s)")
    parser.add_argument("--json", type=Path, help="also write the timings here")
    args = parser.parse_args(argv)

    runs = expand(load_grid(args.grid))[: args.runs]
    quiet = CpuShare.now()
    if quiet.busy:
        print(f"note: the machine is not quiet (load {quiet.load:.1f} on {quiet.cores} cores): the reference is too")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        # the first run of a pass on a fresh machine also builds the token cache and the native kernels: not timed
        run_local(runs[:1], Path(tmp) / "warm-up", workers=1, progress=False, log=lambda _: None)
        workers = quiet.workers_for(len(runs))
        rows.append(timed_pass(runs, workers, None, Path(tmp) / "quiet", "quiet"))
        rows.append(timed_pass(runs, workers, None, Path(tmp) / "quiet-unbound", "quiet, unbound", bind=False))
        ctx = mp.get_context("spawn")
        hogs = [ctx.Process(target=hog, daemon=True) for _ in range(args.hogs)]
        for h in hogs:
            h.start()
        try:
            deadline = time.monotonic() + args.settle_s
            while os.getloadavg()[0] < args.hogs - 0.5 and time.monotonic() < deadline:
                time.sleep(5)
            busy = CpuShare.now()
            chosen = busy.workers_for(len(runs))
            rows.append(timed_pass(runs, chosen, None, Path(tmp) / "busy", "busy"))
            rows.append(timed_pass(runs, chosen, None, Path(tmp) / "busy-unbound", "busy, unbound", bind=False))
            old = max(1, quiet.cores // workers)
            if (workers, old) != (chosen, rows[-1]["threads"]):
                rows.append(timed_pass(runs, workers, old, Path(tmp) / "old", "busy, as before", bind=False))
            else:
                print(f"busy, as before: the same workers and threads as busy, unbound ({workers} x {old}): not rerun")
        finally:
            for h in hogs:
                h.terminate()
                h.join()
    base = rows[0]["seconds"]
    for row in rows[1:]:
        row["ratio_to_quiet"] = row["seconds"] / base
        print(f"{row['label']}: {row['ratio_to_quiet']:.2f}x the quiet time")
    unbound = rows[1]["seconds"]
    for row in rows[3:]:
        print(f"{row['label']}: {row['seconds'] / unbound:.2f}x the quiet, unbound time")
    if args.json:
        args.json.write_text(
            json.dumps({"grid": args.grid, "runs": len(runs), "hogs": args.hogs, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
