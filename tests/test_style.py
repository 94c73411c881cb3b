"""The tree is ruff-clean, lint and format (settings in pyproject.toml), so CI fails on a violation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_ruff(command):
    proc = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, (
        f"ruff {' '.join(command)}: fix with `ruff check --fix .` / `ruff format .`\n"
        + (proc.stdout + proc.stderr)[-4000:]
    )
