"""`attnres fit`: the sub-command, its JSON output, and the rule that analysis never imports torch."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import fit_results, format_report
from analysis.cli import register, run
from tests.synthetic_results import write_synthetic_results

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("fit")
    write_synthetic_results(root, seeds=2, noise=0.003, unfinished=1, broken=1, tables=False)
    return root


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="attnres")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    return parser.parse_args(argv)


def test_fit_prints_the_table_and_writes_the_same_numbers_as_json(tree, capsys):
    args = parse(["fit", str(tree), "--n-boot", "200", "--seed", "3"])
    assert args.func is run
    assert run(args) == 0
    out = capsys.readouterr().out
    saved = json.loads((tree / "fit.json").read_text())
    report = fit_results(tree, n_boot=200, seed=3)
    assert saved == report.to_dict()  # the JSON holds the returned object's numbers, at full precision
    assert out.startswith(format_report(report))
    assert saved["inputs_hash"] == report.inputs_hash and len(saved["inputs_hash"]) == 64
    sweep = saved["sweeps"][0]
    assert sweep["flops_convention"] == ["synthetic: 6 * params * tokens * (1 + variant overhead)"]
    block = next(m for m in sweep["multipliers"] if m["variant"] == "block")
    assert set(block["largest_budget"]["multiplier"]) == {"value", "low", "high"}
    assert block["exponent"] in ("shared", "unshared") and block["n_runs_variant"] == 14
    assert len(block["budgets"]) == 7 and block["budgets"][0]["n_runs_variant"] == 2
    assert "unfinished" in out and "broken-0" in out
    # the table shows M at the largest budget as "M [low, high]"
    assert f"{block['largest_budget']['multiplier']['value']:.4g} [" in out


def test_fit_writes_where_asked_with_every_option(tree, tmp_path):
    out = tmp_path / "sub" / "fit.json"
    args = parse(
        [
            "fit",
            str(tree),
            "--form",
            "E+A*C^-alpha",
            "--select",
            "best",
            "--level",
            "0.8",
            "--n-boot",
            "50",
            "--exponent",
            "unshared",
            "--frontier",
            "off",
            "--units",
            "pflops_days",
            "--sweep",
            "synthetic",
            "--no-chinchilla",
            "--out",
            str(out),
        ]
    )
    assert run(args) == 0
    saved = json.loads(out.read_text())
    assert saved["settings"]["form"] == "E+A*C^-alpha" and saved["settings"]["level"] == 0.8
    assert saved["compute_unit"].startswith("PFLOP/s-days")
    assert all(m["exponent"] == "unshared" for m in saved["sweeps"][0]["multipliers"])


def test_fit_reports_a_missing_directory_with_exit_code_2(tmp_path, capsys):
    assert run(parse(["fit", str(tmp_path / "missing")])) == 2
    assert "does not exist" in capsys.readouterr().err


def test_fit_with_nothing_to_fit_exits_1(tmp_path, capsys):
    write_synthetic_results(tmp_path, multipliers={"baseline": 1.0}, budgets=[1e16], tables=False)
    assert run(parse(["fit", str(tmp_path), "--n-boot", "0"])) == 1
    assert "no curve could be fitted" in capsys.readouterr().err


def test_python_m_analysis_fit(tree, tmp_path):
    out = tmp_path / "m.json"
    proc = subprocess.run(
        [sys.executable, "-m", "analysis", "fit", str(tree), "--n-boot", "20", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "effective compute multiplier" in proc.stdout and json.loads(out.read_text())["format"] == "attnres-fit/1"


def test_attnres_cli_has_the_fit_command():
    cli = pytest.importorskip("attnres.cli")
    try:
        parser = cli.build_parser()
    except Exception as err:  # another part of the CLI failing to import is not this package's test
        pytest.skip(f"attnres CLI not buildable here: {err}")
    args = parser.parse_args(["fit", "somewhere"])
    assert args.func is run


def test_analysis_never_imports_torch():
    code = (
        "import sys, analysis\n"
        "assert 'torch' not in sys.modules, 'import analysis imported torch'\n"
        "import analysis.bootstrap, analysis.cli, analysis.errors, analysis.fit, analysis.load, analysis.multiplier\n"
        "import analysis.select, analysis.sweep_fits, analysis.tables, tests.synthetic_results, analysis._threads\n"
        "for name in analysis.__all__: getattr(analysis, name)\n"
        "import tempfile\n"
        "root = tempfile.mkdtemp()\n"
        "tests.synthetic_results.write_synthetic_results(\n"
        "    root, multipliers={'baseline': 1.0, 'block': 1.2}, budgets=[1e15, 1e16, 1e17]\n"
        ")\n"
        "analysis.fit_results(root, n_boot=10)\n"
        "assert 'torch' not in sys.modules, 'an analysis module imported torch'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_cli_module_import_is_light():
    code = (
        "import sys, analysis.cli\n"
        "heavy = {'numpy', 'scipy', 'pandas', 'torch'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
