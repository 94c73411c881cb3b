"""How much a busy machine slows the demo's training, with the threads chosen from the free cores and without.

    python benchmarks/bench_load.py                    # the demo's first 4 runs, quiet and beside CPU hogs
    python benchmarks/bench_load.py --runs 2 --hogs 1 --json load.json

Trains the first ``--runs`` runs of a grid (the demo's by default) with the local launcher, as ``attnres demo`` does,
three times into fresh folders:

1. quiet: nothing else running, workers and threads as the demo picks them (:class:`attnres.runtime.CpuShare`);
2. busy, chosen: beside ``--hogs`` CPU-bound processes (default one per core), workers and threads as the demo picks
   them on the busy machine (one one-thread worker per core);
3. busy, as before: the same hogs, with the old rule, ``threads = cores // workers`` whatever else runs.

and prints the wall time of each and the ratios busy / quiet. Run it on a quiet machine (the quiet pass is the
reference; the script says when the load before it starts is not low). The hogs run until the script ends; the busy
passes wait until the load average has seen them, as a machine that has been busy for a while shows it.
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


def timed_pass(runs: list, workers: int, threads: int | None, folder: Path, label: str) -> dict:
    share = CpuShare.now()
    chosen = threads or share.threads(workers)
    start = time.perf_counter()
    summary = run_local(runs, folder, workers=workers, threads=threads, progress=False, log=lambda _: None)
    seconds = time.perf_counter() - start
    assert summary.ok, summary.runs
    print(
        f"{label:<18} {seconds:8.1f} s   {workers} worker(s) x {chosen} thread(s), load {share.load:.1f} on "
        f"{share.cores} core(s) at the start",
        flush=True,
    )
    return {"label": label, "seconds": seconds, "workers": workers, "threads": chosen, "load": share.load}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default="demo", help="grid whose first runs are trained (demo)")
    parser.add_argument("--runs", type=int, default=4, help="how many of its runs (4)")
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
        workers = quiet.workers_for(len(runs))
        rows.append(timed_pass(runs, workers, None, Path(tmp) / "quiet", "quiet"))
        ctx = mp.get_context("spawn")
        hogs = [ctx.Process(target=hog, daemon=True) for _ in range(args.hogs)]
        for h in hogs:
            h.start()
        try:
            deadline = time.monotonic() + args.settle_s
            while os.getloadavg()[0] < args.hogs - 0.5 and time.monotonic() < deadline:
                time.sleep(5)
            busy = CpuShare.now()
            rows.append(timed_pass(runs, busy.workers_for(len(runs)), None, Path(tmp) / "chosen", "busy, chosen"))
            rows.append(timed_pass(runs, workers, max(1, quiet.cores // workers), Path(tmp) / "old", "busy, as before"))
        finally:
            for h in hogs:
                h.terminate()
                h.join()
    base = rows[0]["seconds"]
    for row in rows[1:]:
        row["ratio_to_quiet"] = row["seconds"] / base
        print(f"{row['label']}: {row['ratio_to_quiet']:.2f}x the quiet time")
    if args.json:
        args.json.write_text(
            json.dumps({"grid": args.grid, "runs": len(runs), "hogs": args.hogs, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
