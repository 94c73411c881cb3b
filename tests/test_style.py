"""The tree is ruff-clean, lint and format (settings in pyproject.toml), so CI fails on a violation."""

from __future__ import annotations

import ast
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


# the sizes a reader can hold in mind (issue 49): a module holds one concern in at most MAX_MODULE_LINES lines, a
# function one step in at most MAX_FUNCTION_LINES (decorators, docstring and body counted)
SIZED_PACKAGES = ("analysis", "reports", "sweeps")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _sized_modules() -> list[Path]:
    return sorted(p for pkg in SIZED_PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_no_module_is_over_the_size_limit():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _sized_modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {long}"


def test_no_function_is_over_the_size_limit():
    long = {}
    for path in _sized_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if (n := node.end_lineno - start + 1) > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into steps): {long}"
