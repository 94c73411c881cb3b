"""Threads from the cores that are free: a busy machine gets one thread a worker and one line saying so."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import yaml

from attnres.runtime import CpuShare, busy_cores, cpu_cores
from sweeps import expand, load_grid


def test_threads_share_out_the_free_cores():
    idle = CpuShare(cores=2, load=0.3)  # background noise keeps both cores free
    assert idle.free == 2 and not idle.busy and idle.threads(1) == 2 and idle.note(1, 2) is None
    busy = CpuShare(cores=2, load=1.8)  # another 2-process job: the demo beside a study
    assert busy.free == 0 and busy.busy and busy.threads(1) == 1 and busy.threads(2) == 1
    note = busy.note(1, 1)
    assert note.startswith("this machine is busy (load 1.8 on 2 core(s), 0 free): 1 worker(s) x 1 thread(s)"), note
    assert "--threads" in note
    big = CpuShare(cores=16, load=4.2)
    assert big.free == 12 and big.threads(4) == 3 and big.workers_for(100) == 4 and big.workers_for(2) == 2
    # one one-thread worker per core however busy: a waiting one-thread worker only waits, and fewer workers would
    # get a smaller share of the machine
    busiest = CpuShare(cores=2, load=9.0)
    assert busiest.workers_for(10) == 2 and busiest.threads(2) == 1 and CpuShare(cores=2, load=0.0).workers_for(10) == 2
    assert CpuShare(cores=2, load=9.0).workers_for(1) == 1


def spin() -> None:
    while True:
        pass


def test_a_cpu_bound_process_is_seen_at_once_not_a_minute_later():
    """The load average lags a minute behind; the sample of the cores' time counters does not."""
    ctx = mp.get_context("spawn")
    hogs = [ctx.Process(target=spin, daemon=True) for _ in range(cpu_cores())]
    for h in hogs:
        h.start()
    try:
        import time

        time.sleep(1.0)  # the hogs' interpreters start
        assert busy_cores(0.5) >= cpu_cores() - 0.5
        assert CpuShare.now().free == 0
    finally:
        for h in hogs:
            h.terminate()
            h.join()


def test_a_sweep_on_a_busy_machine_says_so_and_gives_each_worker_one_thread(tmp_path, monkeypatch):
    import sweeps.local_pool as pool

    grid = yaml.safe_load((Path(__file__).resolve().parents[2] / "sweeps" / "smoke.yaml").read_text())
    grid.update(variants=["baseline"], budgets=[{"tokens": 3000}])
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    runs = expand(load_grid(tmp_path / "g.yaml"))
    monkeypatch.setattr(pool.CpuShare, "now", classmethod(lambda cls: CpuShare(cores=2, load=1.9)))
    said = []
    summary = pool.run_local(runs, tmp_path / "results", workers=1, progress=False, log=said.append)
    assert summary.ok, summary.runs
    assert any(line.startswith("attnres sweep: this machine is busy (load 1.9 on 2 core(s), 0 free)") for line in said)
    config = yaml.safe_load((tmp_path / "results" / "smoke" / runs[0].run_id / "config.yaml").read_text())
    assert config["runtime"]["threads"] == 1
    said.clear()
    monkeypatch.setattr(pool.CpuShare, "now", classmethod(lambda cls: CpuShare(cores=2, load=0.0)))
    pool.run_local(runs, tmp_path / "again", workers=1, progress=False, log=said.append)
    assert not any("busy" in line for line in said), said
    config = yaml.safe_load((tmp_path / "again" / "smoke" / runs[0].run_id / "config.yaml").read_text())
    assert config["runtime"]["threads"] == 2


def test_a_load_average_left_by_work_that_has_ended_is_not_busy(monkeypatch):
    """Right after the README's `pip install` the 1-minute load average was near 1 on two idle cores, and the demo's
    first line said "this machine is busy". The sample of the cores decides; the load average only asks for a second,
    longer one, and work that stays is seen in it."""
    import attnres.runtime as runtime

    monkeypatch.setattr(runtime, "cpu_cores", lambda: 2)
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (1.3, 0.6, 0.3))  # an install that just finished
    asked = []

    def sampled(*loads: float):
        def busy(seconds: float = 0.3) -> float:
            asked.append(seconds)
            return loads[min(len(asked), len(loads)) - 1]

        return busy

    monkeypatch.setattr(runtime, "busy_cores", sampled(0.02, 0.05))  # both cores idle now, and still idle a second on
    share = runtime.CpuShare.now()
    assert not share.busy and share.free == 2 and share.note(2, 1) is None, share
    assert asked == [0.3, runtime.LONGER_SAMPLE_S]  # the load average asked for a second look
    asked.clear()
    monkeypatch.setattr(runtime, "busy_cores", sampled(0.1, 1.0))  # a job between its bursts: the longer look sees it
    share = runtime.CpuShare.now()
    assert share.busy and share.free == 1 and "this machine is busy (load 1.0 on 2 core(s), 1 free)" in share.note(2, 1)
    asked.clear()
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    monkeypatch.setattr(runtime, "busy_cores", sampled(1.9))  # a job that has just started: seen at once
    assert runtime.CpuShare.now().free == 0 and asked == [0.3]
    monkeypatch.setattr(runtime, "busy_cores", lambda seconds=0.3: None)  # no counters (not Linux): the average
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (1.9, 1.0, 1.0))
    assert runtime.CpuShare.now().free == 0
