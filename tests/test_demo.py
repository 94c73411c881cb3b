"""The main job end to end: `attnres demo` on a grid (the smoke grid here, to keep the suite fast)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # the integration tier: pytest -m integration (.ci/run's second step)


def test_demo_trains_fits_reports_and_reuses_what_is_done(tmp_path):
    cmd = [sys.executable, "-m", "attnres.cli", "demo", "--grid", "smoke", "--results", str(tmp_path), "--no-progress"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert first.returncode == 0, first.stderr[-3000:]
    report = tmp_path / "smoke-report" / "report.md"
    assert report.is_file() and (tmp_path / "smoke-report" / "report.html").is_file()
    assert f"report: {report}" in first.stdout
    assert "effective compute multiplier" in first.stdout
    assert "Full AttnRes: M =" in first.stdout and "Block AttnRes (N=2): M =" in first.stdout
    verdicts = first.stdout.split("what it says:")[1]  # plain words for each interval, and where to read more
    assert verdicts.count("AttnRes") >= 2 and "studies/cpu_envelope/README.md" in verdicts
    assert any(w in verdicts for w in ("too few runs to tell", "worth less", "worth more", "point estimate"))
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert second.returncode == 0, second.stderr[-3000:]
    assert "nothing trained, reusing them" in second.stdout


@pytest.mark.slow
def test_the_shipped_demo_finishes_with_a_report(tmp_path):
    """The README's main job itself (about 5 minutes on 2 cores)."""
    cmd = [sys.executable, "-m", "attnres.cli", "demo", "--results", str(tmp_path), "--no-progress"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=os.environ.copy())
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "demo-report" / "report.md").is_file()
