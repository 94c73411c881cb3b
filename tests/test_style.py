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


# results carry Variants end to end (issue 49): analysis/ and reports/ ask the Variant a result or a point table hands
# them (SweepFit.curve_variants, a result's curve_variant, analysis.data.select.curve_variants) and never read a curve
# name back into one; only the file readers build Variants from what a file holds
NAME_READERS = ("analysis/data/load.py", "analysis/data/select.py")
PARSERS = ("parse", "of_curve")


def name_parsing(tree: ast.AST) -> list[str]:
    """The calls in ``tree`` that read a name back into a variant: ``Variant.parse(...)``, ``Variant.of_curve(...)``,
    and ``curve_order(...)`` without the variants to sort by."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in PARSERS:
            if isinstance(func.value, ast.Name) and func.value.id == "Variant":
                found.append(f"{node.lineno}: Variant.{func.attr}(...)")
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name == "curve_order" and len(node.args) + len(node.keywords) < 2:
            found.append(f"{node.lineno}: curve_order(...) without the curves' variants")
    return found


def test_no_curve_name_is_parsed_outside_the_readers():
    found = {}
    for path in sorted(p for pkg in ("analysis", "reports") for p in (ROOT / pkg).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in NAME_READERS and (calls := name_parsing(ast.parse(path.read_text()))):
            found[rel] = calls
    assert not found, f"curve names read back into variants (ask the Variant the results carry instead): {found}"


def test_the_name_parsing_check_sees_a_violation():
    source = "Variant.of_curve(c)\nVariant.parse(c)\ncurve_order(cs)\ncurve_order(cs, variants)\nast.parse(s)\n"
    assert name_parsing(ast.parse(source)) == [
        "1: Variant.of_curve(...)",
        "2: Variant.parse(...)",
        "3: curve_order(...) without the curves' variants",
    ]
