"""tests/ci_slurm.py: under CI=true a skipped SLURM test fails with its skip's reason; elsewhere it skips."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SUITE = {
    "conftest.py": "from tests.ci_slurm import pytest_runtest_makereport, pytest_terminal_summary  # noqa: F401\n",
    "pytest.ini": "[pytest]\nmarkers =\n    slurm: a SLURM test\n",
    "test_module_mark.py": (
        "import pytest\n"
        "pytestmark = [pytest.mark.slurm, pytest.mark.skip(reason='SLURM binaries absent (munged, slurmctld)')]\n"
        "def test_cluster():\n    pass\n"
    ),
    "test_cases.py": (
        "import pytest\n"
        "@pytest.mark.slurm\n"
        "def test_skips_itself():\n    pytest.skip('two SLURM nodes need network namespaces, which need root')\n"
        "@pytest.mark.slurm\n"
        "def test_runs():\n    pass\n"
        "@pytest.mark.skip(reason='not a SLURM test')\n"
        "def test_other_skip():\n    pass\n"
        "@pytest.mark.slurm\n"
        "@pytest.mark.xfail(reason='expected to fail')\n"
        "def test_expected_failure():\n    assert False\n"
    ),
}


def run_suite(folder: Path, ci: str | None, workers: int) -> tuple[dict[str, str], str, int]:
    for name, text in SUITE.items():
        (folder / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if ci is not None:
        env["CI"] = ci
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "-n", str(workers), str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    outcomes = dict(
        (m.group(2).split("::")[-1], m.group(1))
        for m in re.finditer(r"^(PASSED|FAILED|SKIPPED|XFAIL|ERROR) (\S+)", proc.stdout, re.MULTILINE)
    )
    for m in re.finditer(r"^SKIPPED \[\d+\] (\S+?):\d+: ", proc.stdout, re.MULTILINE):  # -rA names skips by place
        outcomes.setdefault(Path(m.group(1)).name, "SKIPPED")
    return outcomes, proc.stdout, proc.returncode


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "xdist"])
def test_under_ci_a_skipped_slurm_test_fails_with_the_reason(tmp_path, workers):
    outcomes, out, returncode = run_suite(tmp_path, "true", workers)
    assert returncode == 1, out
    # a skip in setup (the mark) fails as an error, one in the test's body as a failure
    assert outcomes["test_cluster"] == "ERROR" and outcomes["test_skips_itself"] == "FAILED", out
    assert outcomes["test_runs"] == "PASSED" and outcomes["test_expected_failure"] == "XFAIL", out
    assert "SLURM tests skipped under CI=true" in out
    assert "test_module_mark.py::test_cluster: SLURM binaries absent (munged, slurmctld)" in out
    assert "test_cases.py::test_skips_itself: two SLURM nodes need network namespaces, which need root" in out
    assert re.search(r"\b1 failed, 1 passed, 1 skipped, 1 xfailed, 1 error\b", out), out


@pytest.mark.parametrize("ci", [None, "false"], ids=["unset", "false"])
def test_outside_ci_a_slurm_test_may_skip(tmp_path, ci):
    outcomes, out, returncode = run_suite(tmp_path, ci, 0)
    assert returncode == 0 and "SLURM tests skipped under CI" not in out, out
    assert re.search(r"\b1 passed, 3 skipped, 1 xfailed\b", out), out  # both SLURM skips and the other one


def test_the_ci_script_runs_its_tiers_under_ci_true():
    """.ci/run sets CI=true unless the environment says otherwise, before either tier runs."""
    script = (ROOT / ".ci" / "run").read_text()
    assert script.index("export CI=${CI:-true}") < script.index("-m pytest")
