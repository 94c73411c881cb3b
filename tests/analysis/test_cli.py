"""`attnres fit`: the sub-command, its JSON output, and the rule that analysis never imports torch."""

from __future__ import annotations

import argparse
import json
import os
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
    """Finished runs, an unfinished one, and a folder whose run.parquet cannot be read (so `fit` exits 1:
    incomplete)."""
    root = tmp_path_factory.mktemp("fit")
    write_synthetic_results(root, seeds=2, noise=0.003, unfinished=1, broken=1, tables=False)
    return root


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Finished runs only."""
    root = tmp_path_factory.mktemp("clean")
    write_synthetic_results(root, seeds=2, noise=0.003, tables=False)
    return root


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="attnres")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    return parser.parse_args(argv)


def test_fit_prints_the_table_and_writes_the_same_numbers_as_json(tree, capsys):
    args = parse(["fit", str(tree), "--n-boot", "200", "--seed", "3"])
    assert args.func is run
    assert run(args) == 1  # written, but incomplete: broken-0 could not be read
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


def test_fit_writes_where_asked_with_every_option(clean, tmp_path):
    out = tmp_path / "sub" / "fit.json"
    args = parse(
        [
            "fit",
            str(clean),
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


def one_error_line(err: str) -> str:
    """The single line `attnres fit` prints on stderr for an error (no traceback)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_fit_refuses_an_unknown_baseline_with_a_suggestion_before_fitting(clean, tmp_path, capsys, monkeypatch):
    import analysis.fitting.curve_fits

    monkeypatch.setattr(
        analysis.fitting.curve_fits, "run_study", lambda *a, **k: pytest.fail("fitted before the check")
    )
    out = tmp_path / "fit.json"
    assert run(parse(["fit", str(clean), "--baseline", "basline", "--out", str(out)])) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("attnres fit: error: baseline 'basline'") and "did you mean 'baseline'?" in line
    assert "variants found: baseline, block, full" in line
    assert not out.exists()


def test_fit_without_bootstrap_shows_no_interval(clean, tmp_path, capsys):
    assert run(parse(["fit", str(clean), "--n-boot", "0", "--out", str(tmp_path / "fit.json")])) == 0
    out = capsys.readouterr().out
    assert "CI" not in out and "[" not in out  # no "[90% CI]" header, no bracketed value
    assert "no interval (--n-boot 0)" in out
    assert "M  " in out and "wall-clock M  " in out  # the headers, plain
    assert " nan " not in out  # the exponent test's p-value needs a bootstrap: a dash, not nan


def test_fit_on_an_empty_folder_says_no_runs_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "demo").mkdir()  # a sweep folder with no run folder in it
    assert run(parse(["fit", str(tmp_path / "results")])) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert f"no runs found under {tmp_path / 'results'}" in line and "<sweep>/<run_id>/" in line
    assert "run.parquet" in line and "see the notes" not in line
    assert captured.out == ""
    assert sorted(p.name for p in (tmp_path / "results").rglob("*")) == ["demo"]  # nothing written


@pytest.mark.parametrize("where", ["file in the way", "folder at the path", "not writable"])
def test_fit_refuses_an_unwritable_output_before_fitting(clean, tmp_path, capsys, monkeypatch, where):
    import analysis.fitting.curve_fits
    import attnres.storage.writable

    monkeypatch.setattr(
        analysis.fitting.curve_fits, "run_study", lambda *a, **k: pytest.fail("fitted before the check")
    )
    if where == "file in the way":
        (tmp_path / "a-file").write_text("x")
        out, expected = tmp_path / "a-file" / "fit.json", "is a file, not a folder"
    elif where == "folder at the path":
        (tmp_path / "a-folder").mkdir()
        out, expected = tmp_path / "a-folder", "it is a folder"
    else:

        def refused(*args, **kwargs):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(attnres.storage.writable.tempfile, "mkstemp", refused)
        out, expected = tmp_path / "ro" / "fit.json", "no permission to write there"
    assert run(parse(["fit", str(clean), "--out", str(out)])) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("attnres fit: error: cannot write fit.json") and str(out) in line and expected in line


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only folders")
def test_fit_into_a_read_only_results_folder(tmp_path, capsys):
    write_synthetic_results(tmp_path / "r", multipliers={"baseline": 1.0, "block": 1.2}, tables=False)
    (tmp_path / "r").chmod(0o555)
    try:
        assert run(parse(["fit", str(tmp_path / "r"), "--n-boot", "0"])) == 2
    finally:
        (tmp_path / "r").chmod(0o755)
    line = one_error_line(capsys.readouterr().err)
    assert "cannot write fit.json" in line and "not writable" in line


def test_fit_of_a_tree_with_an_unreadable_run_is_marked_incomplete(tmp_path, capsys):
    """A truncated run.parquet of the largest budget: the block headline would silently move to a smaller
    budget. The unreadable run is listed first, the headline and fit.json say incomplete, the exit code is 1."""
    tree = write_synthetic_results(tmp_path / "r", multipliers={"baseline": 1.0, "block": 1.25}, tables=False)
    ok = tree.runs[(tree.runs["variant"] == "block")]
    victim = ok.loc[ok["flops"].idxmax(), "path"]
    path = tmp_path / "r" / victim / "run.parquet"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert run(parse(["fit", str(tmp_path / "r"), "--n-boot", "50"])) == 1
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[1].strip().startswith("INCOMPLETE: 1 unreadable run(s) left out")  # first, after the command
    assert any(line.strip().startswith(f"{victim}: run.parquet is unreadable") for line in lines[1:6])
    title = next(line for line in lines if "effective compute multiplier over" in line)
    assert title.strip().startswith("INCOMPLETE: 1 unreadable run(s) left out")
    assert "INCOMPLETE" in captured.err and "exit code 1" in captured.err
    saved = json.loads((tmp_path / "r" / "fit.json").read_text())
    assert saved["complete"] is False and [p["path"] for p in saved["unreadable"]] == [victim]
    assert saved["sweeps"][0]["complete"] is False and saved["sweeps"][0]["unreadable"] == [victim]
    assert saved["problems"][0]["path"] == victim and saved["problems"][0]["unreadable"] is True
    block = next(m for m in saved["sweeps"][0]["multipliers"] if m["variant"] == "block")
    assert block["largest_budget"]["compute"] < ok["flops"].max() * 0.9  # what the mark is there for


def test_fit_with_nothing_to_fit_exits_1(tmp_path, capsys):
    write_synthetic_results(tmp_path, multipliers={"baseline": 1.0}, budgets=[1e16], tables=False)
    assert run(parse(["fit", str(tmp_path), "--n-boot", "0"])) == 1
    assert "no curve could be fitted" in capsys.readouterr().err


def test_python_m_analysis_fit(clean, tmp_path):
    out = tmp_path / "m.json"
    proc = subprocess.run(
        [sys.executable, "-m", "analysis", "fit", str(clean), "--n-boot", "20", "--out", str(out)],
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
        "import analysis.base.bootstrap, analysis.cli, analysis.base.errors, analysis.laws.fit, analysis.data.load\n"
        "import analysis.estimates.multiplier, analysis.data.select, analysis.fitting.sweep_fits\n"
        "import analysis.tables.tables, tests.synthetic_results, analysis.base._threads\n"
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
