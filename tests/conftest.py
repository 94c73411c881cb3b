"""Shared fixtures: a private token cache for the whole session, tiny run configs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import attnres  # noqa: F401  (first: it asks MKL for its strict mode before any test module calls torch; attnres.blas)
from tests.ci_slurm import pytest_runtest_makereport, pytest_terminal_summary  # noqa: F401 (CI=true: no SLURM skips)

# torch.compile on CPU builds C++ kernels; a laptop without a compiler skips those tests (CI has gcc).
HAS_CXX = any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "clang++"))
needs_cxx = pytest.mark.skipif(
    not HAS_CXX,
    reason="torch.compile on CPU needs a C++ compiler (g++ or clang++, or $CXX)",
)
# Tests that check the native CPU kernels ran (attnres.kernels.cpu and the token attention's, built with that compiler):
# ATTNRES_NATIVE=0 turns them off (attnres.kernels.cpu.enabled, read here without importing torch), and they skip
_NATIVE_OFF = (
    "ATTNRES_NATIVE=0 turns the native kernels off"
    if os.environ.get("ATTNRES_NATIVE", "1") == "0"
    else ""
    if HAS_CXX
    else "the native kernels need a C++ compiler (g++ or clang++, or $CXX)"
)
needs_native = pytest.mark.skipif(bool(_NATIVE_OFF), reason=_NATIVE_OFF)
# Tests that torch.compile the fused depth kernels (or a whole model) for the CPU: Inductor spends about 40 s a session
# compiling what CPU training never runs (runtime.compile is for GPUs; CPU training uses the native kernels, tested in
# the default tier), so they run in the integration tier, which CI runs too.
compiles_for_cpu = (needs_cxx, pytest.mark.integration)


def _selects(config: pytest.Config, marker: str) -> bool:
    """Whether the -m expression can select tests marked ``marker`` (the default one excludes it)."""
    return f"not {marker}" not in (config.getoption("markexpr") or "")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Workers for ``-n auto`` (the default, in pyproject's addopts): one per core this process may use, at most 4,
    as a sweep picks its workers (attnres.runtime.CpuShare.workers_for). The default tier's tests are small: one at a
    time they leave a 2-core machine's second core mostly idle (22 minutes one at a time, 10 to 15 on two workers,
    the same tests on the same machine). One process where there is one core, and for the integration and slow tiers:
    their SLURM clusters, kill-and-resume timings and whole commands each want the machine to themselves."""
    from attnres.runtime import cpu_cores

    if _selects(config, "integration") or _selects(config, "slow") or _selects(config, "gpu"):
        return 0
    workers = min(cpu_cores(), 4)
    return workers if workers > 1 else 0


def pytest_configure(config: pytest.Config) -> None:
    """The default suite is a CPU suite: with a GPU visible, runs with runtime.accelerator=auto would train on it
    (other numbers, bf16) and several test processes would share it. So every GPU is hidden, from this process and the
    runs it starts, unless the GPU tests are selected (`pytest -m gpu`). Before anything initialises CUDA."""
    selection = (config.getoption("markexpr") or "").replace("not gpu", "")
    if "gpu" not in selection:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


@pytest.fixture(scope="session", autouse=True)
def token_cache(tmp_path_factory):
    """Keep the tests' token cache out of the user's ~/.cache (and shared by every test of the session). The native
    kernels' build stays in the user's cache (it is keyed by its source, flags, torch and CPU), so a session does not
    spend 20 s to minutes rebuilding it; test_signals builds into a fresh one on purpose."""
    path = tmp_path_factory.mktemp("attnres-cache")
    old = os.environ.get("ATTNRES_CACHE_DIR")
    from attnres.data.corpus import cache_dir

    os.environ.setdefault("ATTNRES_NATIVE_DIR", str(cache_dir() / "native"))
    os.environ["ATTNRES_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("ATTNRES_CACHE_DIR", None)
    else:
        os.environ["ATTNRES_CACHE_DIR"] = old


@pytest.fixture(scope="session", autouse=True)
def native_kernels_build_beside_the_first_tests(token_cache):
    """On a fresh machine the native kernels' first build (20-35 s of g++) would stall the first test that trains.
    It starts in a second process when the session does, on the other core, while the first tests (the analysis
    package's: no torch) run; a process that needs the kernels before it is done waits for the build's lock
    (attnres.kernels.cpu.ops), and one that comes after loads the build. Nothing starts where the build exists."""
    import subprocess
    import sys

    from attnres.kernels import cpu as cpu_kernels

    builder = None
    built = (cpu_kernels.build_dir() / "attnres_depth_native.so").exists()  # then each process loads it, quickly
    if HAS_CXX and cpu_kernels.enabled and not built:
        builder = subprocess.Popen(
            [sys.executable, "-c", "from attnres.kernels import cpu; cpu.ops()"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    yield
    if builder is not None and builder.poll() is None:
        builder.terminate()
        builder.wait(timeout=60)


TINY = [
    "model.n_layer=2",
    "model.d_model=32",
    "model.n_head=2",
    "model.seq_len=64",
    "train.batch_size=16",
    "train.tokens=50000",
    "train.eval_interval=20",
    "train.eval_tokens=16384",
    "runtime.threads=2",
]


def schedule_rates(cfg, steps: int) -> list[float]:
    """The learning rate of each of ``steps`` optimizer steps (0-based) under ``cfg``'s schedule, read from a stand-in
    optimizer stepped as training steps it."""
    import torch

    from attnres.training.module import build_scheduler

    stand_in = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.train.lr)
    schedule = build_scheduler(stand_in, cfg, steps)
    rates = []
    for _ in range(steps):
        rates.append(stand_in.param_groups[0]["lr"])
        stand_in.step()
        schedule.step()
    return rates


@pytest.fixture
def native_calls(monkeypatch) -> list[str]:
    """Names of the native kernels (attnres.kernels.cpu and the token attention's) that ran, in order, filled as the
    test runs; empty when the kernels are off (ATTNRES_NATIVE=0) or did not build."""
    from attnres.kernels import cpu as cpu_kernels

    calls: list[str] = []
    real = cpu_kernels.ops() if cpu_kernels.enabled else None

    class Spy:
        def __getattr__(self, name):
            def run(*args, _fn=getattr(real, name)):  # noqa: B008 - bound now, on purpose
                calls.append(name)
                return _fn(*args)

            return run

    if real is not None:
        monkeypatch.setattr(cpu_kernels, "ops", Spy)
    return calls


@pytest.fixture
def tiny_overrides() -> list[str]:
    return list(TINY)


@pytest.fixture(scope="session")
def smoke_results(tmp_path_factory):
    """The smoke grid (sweeps/smoke.yaml) trained once per test run (:func:`once_per_run`) by the local launcher with 2
    workers, for the tests that only read its results (a test that writes there copies it first)."""
    from sweeps import run_grid

    def train_smoke(folder: Path) -> None:
        grid = Path(__file__).resolve().parents[1] / "sweeps" / "smoke.yaml"
        summary = run_grid(str(grid), str(folder / "results"), workers=2, progress=False, log=lambda message: None)
        assert summary.ok, summary.runs

    return once_per_run(tmp_path_factory, "smoke", train_smoke) / "results"


def once_per_run(tmp_path_factory, name: str, make) -> Path:
    """A folder that ``make(folder)`` fills once for the whole test run: with several workers (xdist), the first
    that needs it makes it in the run's common temporary folder, under a lock, and the others wait and share it."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        folder = tmp_path_factory.mktemp(name)
        make(folder)
        return folder
    from filelock import FileLock

    folder = tmp_path_factory.getbasetemp().parent / name
    with FileLock(f"{folder}.lock"):
        if not (folder / ".made").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / ".made").touch()
    return folder
