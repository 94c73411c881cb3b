"""The report builder and ``attnres report``: files written, numbers equal to ``attnres fit``'s, deterministic
output, partial results trees reported with reasons instead of crashing, and no torch import."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import analysis  # noqa: E402
import reports  # noqa: E402
from tests.cli_helpers import attnres  # noqa: E402
from tests.synthetic_results import write_synthetic_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
N_BOOT = 100
FIGURES = [
    "scaling_curves",
    "multiplier",
    "loss_curves",
    "block_output_rms",
    "block_grad_norm",
    "depth_attention_full",
    "depth_attention_block",
]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    write_synthetic_results(
        root,
        sweep="scaling",
        budgets=np.geomspace(1e15, 1e17, 4),
        seeds=2,
        noise=0.003,
        unfinished=1,
        failed=1,
        broken=1,
    )
    return root


@pytest.fixture(scope="module")
def built(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return reports.build_report(tree, out, pdf=True, n_boot=N_BOOT, strict=True)


def skipped_names(summary) -> dict[str, str]:
    return {s.name: s.reason for s in summary.skipped}


def test_builder_writes_every_file(built):
    out = built.out_dir
    for name in FIGURES:
        for fmt in ("png", "svg", "pdf"):
            path = out / "figures" / "scaling" / f"{name}.{fmt}"
            assert path.is_file() and path.stat().st_size > 1000, path
    assert (out / "figures" / "reference" / "paper_fits.png").is_file()
    assert (out / "tables" / "scaling" / "table2_sizes.csv").is_file()
    for path in (built.report_md, built.report_html, built.report_json, built.fit_json):
        assert path.is_file() and path.stat().st_size > 0
    assert {f.name for f in built.figures} == set(FIGURES) | {"paper_fits"}
    assert set(skipped_names(built)) == {"block_size_ablation", "table4_ablations"}
    assert all(p.exists() for p in built.files)
    assert built.report_md.read_bytes().startswith(b"# AttnRes report")


def test_report_md_embeds_every_figure_and_says_what_was_skipped(built):
    md = built.report_md.read_text()
    for record in built.figures:
        png = next(p for p in record.files if p.suffix == ".png")
        assert f"]({png.relative_to(built.out_dir).as_posix()})" in md
        assert record.caption in md
    for s in built.skipped:
        assert f"- {s}" in md
    for heading in (
        "## Provenance",
        "## Headline",
        "### Fits",
        "### Effective compute multiplier",
        "## Skipped",
        "## Runs left out",
    ):
        assert heading in md
    # provenance: inputs hash, git sha, runs and their status, FLOP convention, fit settings
    assert built.results.inputs_hash in md
    assert "`synthetic` (" in md  # the git_sha column of the synthetic runs
    assert "1 running" in md and "1 failed" in md
    assert "FLOP convention: synthetic" in md
    assert f"from {N_BOOT} resamples (seed 0)" in md
    # every problem run is listed
    for p in built.results.problems:
        assert p.path in md


def test_report_numbers_equal_the_fit(built, tree):
    fit = analysis.fit_results(analysis.load_results(tree, tables=()), n_boot=N_BOOT)
    record = json.loads(built.report_json.read_text())
    assert record["fit"] == fit.to_dict()
    assert json.loads(built.fit_json.read_text()) == fit.to_dict()
    md = built.report_md.read_text()
    sw = fit.sweep("scaling")
    for m in sw.multipliers:
        assert f"| {m.multiplier.text(3)} |" in md  # the headline
        assert f"| {m.multiplier.text()} |" in md  # the multiplier table
        for b in m.budgets:
            assert b.multiplier.text() in md
    for c in sw.curves:
        assert f"| {c.curve} | {c.fit.status} |" in md and c.fit.A.text() in md and c.fit.alpha.text() in md
    heads = {h["variant"]: h for h in record["headline"]}
    assert heads["block"]["multiplier"] == sw.multiplier("block").multiplier.to_dict()
    assert heads["block"]["label"] == "Block AttnRes (N=4)"
    assert record["provenance"]["inputs_hash"] == fit.inputs_hash
    assert record["provenance"]["n_runs"] == fit.n_runs


def test_report_numbers_equal_attnres_fit_cli(built, tree, tmp_path):
    out = tmp_path / "fit.json"
    proc = attnres("fit", tree, "--n-boot", N_BOOT, "--out", out)
    assert proc.returncode == 1, proc.stderr  # the tree has an unreadable run.parquet: the fit is incomplete
    assert "INCOMPLETE: 1 unreadable run(s)" in proc.stdout
    assert json.loads(out.read_text()) == json.loads(built.report_json.read_text())["fit"]


def test_html_is_self_contained(built):
    html = built.report_html.read_text()
    assert html.count("data:image/png;base64,") == len(built.figures)
    assert 'src="figures/' not in html and "<link" not in html and "<script" not in html
    assert "<table>" in html and "Provenance" in html


def test_html_wide_tables_fit_the_page(built):
    """The multiplier table (11 columns, the wall-clock one among the last) is set to fit the page: smaller
    font, cells that wrap, the table as wide as the page; a narrow table keeps one line per cell."""
    import re

    html = built.report_html.read_text()
    css = html[html.index("<style>") : html.index("</style>")]
    rules = {k.strip(): v for k, v in re.findall(r"([^{}]+?)\s*\{([^}]*)\}", css.removeprefix("<style>"))}
    wide_table = rules["table.wide"]
    assert "width: 100%" in wide_table and "font-size" in wide_table
    assert "white-space: normal" in rules["table.wide th, table.wide td"]
    assert "overflow-wrap" in rules["table.wide th, table.wide td"]
    assert "display: block" not in rules["table"]  # a table is no longer its own horizontal scroll box
    tables = re.findall(r"<table[^>]*>.*?</table>", html, flags=re.S)
    multiplier = next(t for t in tables if "wall-clock M" in t and "separate exponents" in t)
    assert multiplier.startswith('<table class="wide">')
    assert any(t.startswith("<table>") for t in tables)  # the narrow ones are left as they were


def test_building_twice_gives_identical_files(built, tree, tmp_path):
    again = reports.build_report(tree, tmp_path / "again", pdf=True, n_boot=N_BOOT, strict=True)
    for path in built.files:
        rel = path.relative_to(built.out_dir)
        assert (again.out_dir / rel).read_bytes() == path.read_bytes(), rel


def test_rebuilding_removes_figures_the_report_no_longer_has(tree, tmp_path, monkeypatch):
    import reports.figures.scaling

    out = tmp_path / "out"
    first = reports.build_report(tree, out, formats=("png",), n_boot=0, strict=True)
    assert (out / "figures" / "scaling" / "multiplier.png").exists()
    stray = out / "notes.txt"
    stray.write_text("mine")
    (out / "figures" / "scaling" / "mine.txt").write_text("mine too")

    def not_this_time(*args, **kwargs):
        raise reports.MissingData("not this time")

    monkeypatch.setattr(reports.figures.scaling, "plot_multiplier", not_this_time)
    second = reports.build_report(tree, out, formats=("png",), n_boot=0, strict=True)
    assert skipped_names(second)["multiplier"] == "not this time"
    assert not (out / "figures" / "scaling" / "multiplier.png").exists()
    # files the builder did not write are kept where they were
    assert stray.read_text() == "mine" and (out / "figures" / "scaling" / "mine.txt").read_text() == "mine too"
    assert first.report_md == second.report_md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left next to it


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) by relative path, with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_build_that_fails_midway_leaves_the_previous_report_whole(tree, tmp_path, monkeypatch):
    import reports.figures.dynamics
    import reports.sections.section

    out = tmp_path / "report"
    reports.build_report(tree, out, formats=("png",), n_boot=20, strict=True)
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    assert "report.md" in before and "figures/scaling/multiplier.png" in before

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    # other options (a different report.md) and one figure raising after the first figures were written
    monkeypatch.setattr(reports.figures.dynamics, "plot_block_output_rms", boom)
    with pytest.raises(RuntimeError, match="boom"):
        reports.build_report(tree, out, formats=("png", "svg"), n_boot=10, strict=True)
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # the temporary folder is gone too

    # an interruption that no figure error handling catches, while figures are being saved
    calls = []

    def interrupted(fig, stem, formats):
        calls.append(stem)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_save(fig, stem, formats)

    real_save = reports.sections.section.save_figure
    monkeypatch.undo()
    monkeypatch.setattr(reports.sections.section, "save_figure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        reports.build_report(tree, out, formats=("png", "svg"), n_boot=10)
    assert len(calls) == 3 and snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


@pytest.mark.integration  # kill -9 and the next build (a subprocess): pytest -m integration
def test_a_killed_build_leaves_the_previous_report_whole_and_the_next_build_cleans_up(tree, tmp_path):
    """kill -9 in the middle of a rebuild: the folder is still exactly the first report; the next build removes
    the killed build's temporary folder."""
    import signal
    import time

    out = tmp_path / "report"
    reports.build_report(tree, out, formats=("png",), n_boot=20, strict=True)
    before = snapshot(out)
    started = tmp_path / "started"
    code = (
        "import time, reports, reports.figures.dynamics\n"
        "def slow(*args, **kwargs):\n"
        f"    open({str(started)!r}, 'w').close()\n"
        "    time.sleep(120)\n"
        "reports.figures.dynamics.plot_block_output_rms = slow\n"
        f"reports.build_report({str(tree)!r}, {str(out)!r}, formats=('png', 'svg'), n_boot=10)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not started.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the build did not reach its slow figure"
            time.sleep(0.1)
        building = [p for p in tmp_path.iterdir() if p.name.startswith(".report.building-")]
        assert building and any((building[0] / "figures").rglob("*.png"))  # figures of the new build exist
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stderr.close()
    assert snapshot(out) == before
    again = reports.build_report(tree, out, formats=("png",), n_boot=20, strict=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report", "started"]
    assert snapshot(out) == before and again.report_md == out / "report.md"


def test_a_build_killed_between_its_two_renames_is_recovered(tree, tmp_path):
    out = tmp_path / "report"
    reports.build_report(tree, out, formats=("png",), n_boot=0, strict=True)
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    aside = tmp_path / ".report.replaced-999999999-dead"
    out.rename(aside)  # what a build killed after moving the old report aside leaves
    reports.build_report(tree, out, formats=("png",), n_boot=0, strict=True)
    assert snapshot(out) == before and not aside.exists()


def test_a_report_never_replaces_a_folder_of_other_files(tree, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("mine")
    with pytest.raises(analysis.OutputError, match="not a report"):
        reports.build_report(tree, mine, formats=("png",), n_boot=0)
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"]
    with pytest.raises(analysis.OutputError, match="holds the results"):
        reports.build_report(tree, tree.parent, formats=("png",), n_boot=0)


def test_pflops_days_and_shared_exponent_options(tree, tmp_path):
    summary = reports.build_report(
        tree, tmp_path, formats=("png",), n_boot=20, compute_unit="pflops_days", exponent="unshared", strict=True
    )
    md = summary.report_md.read_text()
    assert "compute in PFLOP/s-days" in md
    assert all(h.exponent == "unshared" for h in summary.headline)
    assert summary.fit.settings.compute_unit == "pflops_days"


def test_a_report_under_the_curved_law_names_its_form_and_draws_its_curves(tree, tmp_path):
    # a form is asked, not named: the report's tables, legend and provenance come from the law (analysis.laws.forms)
    summary = reports.build_report(tree, tmp_path, formats=("png",), n_boot=20, form="curved", strict=True)
    md = summary.report_md.read_text()
    assert summary.fit.settings.form == "A*C^-(alpha+beta*lnC)" and "(alpha+beta*lnC)" in json_form(summary)
    assert "beta" in md and "L = A * (C/C0)^-(alpha + beta * ln(C/C0))" in md
    assert "scaling_curves" in {f.name for f in summary.figures}


def json_form(summary) -> str:
    return json.loads(summary.fit_json.read_text())["settings"]["form"]


# ---------------------------------------------------------------------------------------------------------
# partial trees: never crash, say why
# ---------------------------------------------------------------------------------------------------------


def build(root, tmp_path, **kw):
    return reports.build_report(root, tmp_path / "out", formats=("png",), n_boot=20, strict=True, **kw)


def test_empty_results_dir(tmp_path):
    (tmp_path / "results").mkdir()
    summary = build(tmp_path / "results", tmp_path)
    md = summary.report_md.read_text()
    assert "No runs were found" in md
    assert summary.headline == ()
    assert [f.name for f in summary.figures] == ["paper_fits"]
    assert summary.report_html.is_file()


def test_missing_results_dir_raises_a_clear_error(tmp_path):
    with pytest.raises(analysis.ResultsError, match="does not exist"):
        build(tmp_path / "nowhere", tmp_path)


def test_only_baselines(tmp_path):
    write_synthetic_results(tmp_path / "r", multipliers={"baseline": 1.0}, budgets=[1e15, 1e16, 1e17])
    summary = build(tmp_path / "r", tmp_path)
    reasons = skipped_names(summary)
    assert "only the baseline was fitted" in reasons["multiplier"]
    assert "no finished Full or Block AttnRes runs" in reasons["depth_attention"]
    assert {"scaling_curves", "loss_curves", "block_output_rms", "block_grad_norm"} <= {f.name for f in summary.figures}
    assert "No multiplier could be computed" in summary.report_md.read_text()


def test_one_budget_only(tmp_path):
    write_synthetic_results(tmp_path / "r", budgets=[1e16])
    summary = build(tmp_path / "r", tmp_path)
    reasons = skipped_names(summary)
    # every curve at one shape and one budget: that is the reason given (a one-shape sweep:
    # analysis.estimates.one_shape)
    assert "one model shape and one budget: no scaling law" in reasons["scaling_curves"]
    assert "one model shape and one budget: no scaling law" in reasons["multiplier"]
    # the rest of the report still has its figures and Table 2
    assert {"loss_curves", "block_output_rms", "depth_attention_full", "depth_attention_block"} <= {
        f.name for f in summary.figures
    }
    assert (summary.out_dir / "tables" / "synthetic" / "table2_sizes.csv").exists()


def test_running_failed_and_broken_runs(tmp_path):
    write_synthetic_results(
        tmp_path / "r",
        budgets=[1e15, 1e16, 1e17],
        unfinished=2,
        failed=1,
        nan_loss=1,
        broken=1,
        wrong_schema=1,
        no_run_file=1,
    )
    summary = build(tmp_path / "r", tmp_path)
    md = summary.report_md.read_text()
    assert len(summary.results.problems) >= 7
    for p in summary.results.problems:
        assert p.path in md
    assert summary.headline  # the finished runs are still fitted


def test_a_tuning_search_is_named_but_its_pruned_trials_are_not_problems(tmp_path):
    write_synthetic_results(tmp_path / "r", sweep="study", budgets=[1e15, 1e16])
    write_synthetic_results(
        tmp_path / "r", sweep="study-tune", multipliers={"baseline": 1.0}, budgets=[1e15], unfinished=2
    )
    summary = build(tmp_path / "r", tmp_path)
    md = summary.report_md.read_text()
    assert "`study-tune` (the learning-rate search of `attnres tune`" in md
    assert summary.results.problems and "study-tune/" not in md.split("## Runs left out")[1]
    assert json.loads(summary.report_json.read_text())["problems"] == []


def test_a_sweep_where_everything_is_still_running(tmp_path):
    write_synthetic_results(tmp_path / "r", sweep="done", budgets=[1e15, 1e16])
    busy = write_synthetic_results(
        tmp_path / "r", sweep="busy", multipliers={"baseline": 1.0}, budgets=[1e15], unfinished=2
    )
    for rel in busy.runs.loc[busy.runs["kind"] == "ok", "path"]:
        shutil.rmtree(tmp_path / "r" / rel)  # leave only the running runs in this sweep
    summary = build(tmp_path / "r", tmp_path)
    assert {"done", "busy"} <= set(summary.results.sweeps)
    reasons = {s.name: s.reason for s in summary.skipped if s.sweep == "busy"}
    assert {"scaling_curves", "loss_curves", "block_output_rms", "depth_attention"} <= set(reasons)
    assert "no finished runs" in reasons["loss_curves"]
    assert "Sweep `busy`" in summary.report_md.read_text()
    assert {f.name for f in summary.figures if f.sweep == "done"} >= {"scaling_curves", "multiplier"}


def test_missing_layers_and_depth_attn_tables(tmp_path):
    write_synthetic_results(tmp_path / "r", budgets=[1e15, 1e16, 1e17], tables=False)
    summary = build(tmp_path / "r", tmp_path)
    reasons = skipped_names(summary)
    assert "no metrics.parquet" in reasons["loss_curves"]
    assert "no layers.parquet" in reasons["block_output_rms"]
    assert "no layers.parquet" in reasons["block_grad_norm"]
    assert "no depth_attn.parquet" in reasons["depth_attention_full"]
    assert {"scaling_curves", "multiplier"} <= {f.name for f in summary.figures}


def test_ablation_sweep_gets_block_size_figure_and_table4(tmp_path):
    kw = dict(sweep="ablation", budgets=[1e16], seeds=1)
    write_synthetic_results(tmp_path / "r", multipliers={"baseline": 1.0, "full": 1.27, "block+no_key_norm": 1.1}, **kw)
    for n in (2, 4):
        write_synthetic_results(tmp_path / "r", multipliers={"block": 1.2}, n_blocks=n, **kw)
    summary = build(tmp_path / "r", tmp_path)
    names = {f.name for f in summary.figures}
    assert {"block_size_ablation", "depth_attention_block-N2", "depth_attention_block-N4"} <= names
    md = summary.report_md.read_text()
    assert "like the paper's Table 4" in md and "block+no_key_norm" in md
    assert (summary.out_dir / "tables" / "ablation" / "table4_ablations.csv").exists()


def test_one_broken_figure_does_not_stop_the_report(tree, tmp_path, monkeypatch):
    import reports.figures.dynamics

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(reports.figures.dynamics, "plot_loss_curves", broken)
    summary = reports.build_report(tree, tmp_path, formats=("png",), n_boot=0)
    assert skipped_names(summary)["loss_curves"] == "failed with RuntimeError: boom"
    assert "scaling_curves" in {f.name for f in summary.figures}
    with pytest.raises(RuntimeError, match="boom"):
        reports.build_report(tree, tmp_path, formats=("png",), n_boot=0, strict=True)


# ---------------------------------------------------------------------------------------------------------
# the CLI, and what reports must not import
# ---------------------------------------------------------------------------------------------------------


def test_cli_register_and_run(tree, tmp_path, capsys):
    import argparse

    from reports.cli import register, run

    parser = argparse.ArgumentParser(prog="attnres")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["report", str(tree), "--out", str(tmp_path / "out"), "--n-boot", "20", "--no-svg", "--no-html"]
    )
    assert args.func is run
    assert run(args) == 1  # written, but the tree has an unreadable run.parquet: incomplete
    captured = capsys.readouterr()
    printed = captured.out
    assert "report.md" in printed and "INCOMPLETE: 1 unreadable run(s) left out: Block AttnRes (N=4): M = " in printed
    assert "scaling/broken-0" in captured.err and "incomplete" in captured.err
    assert (tmp_path / "out" / "report.md").is_file()
    assert not (tmp_path / "out" / "report.html").exists()
    assert not list((tmp_path / "out").rglob("*.svg"))
    args = parser.parse_args(["report", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")])
    assert run(args) == 2


def report_cli(argv: list[str]):
    import argparse

    from reports.cli import register, run

    parser = argparse.ArgumentParser(prog="attnres")
    register(parser.add_subparsers(dest="command"))
    return run(parser.parse_args(["report", *argv]))


def test_cli_refuses_an_unknown_baseline_before_building(tree, tmp_path, capsys):
    assert report_cli([str(tree), "--out", str(tmp_path / "out"), "--baseline", "basline"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "did you mean 'baseline'?" in err and "variants found: baseline, block, full" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["file in the way", "file above", "not writable"])
def test_cli_refuses_an_unwritable_report_folder_before_any_work(tree, tmp_path, capsys, monkeypatch, where):
    import attnres.storage.writable

    monkeypatch.setattr(analysis, "fit_results", lambda *a, **k: pytest.fail("fitted before the check"))
    (tmp_path / "a-file").write_text("x")
    if where == "file in the way":
        out, expected = tmp_path / "a-file", "a file is in the way"
    elif where == "file above":
        out, expected = tmp_path / "a-file" / "report", "is a file, not a folder"
    else:

        def refused(*args, **kwargs):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(attnres.storage.writable.tempfile, "mkstemp", refused)
        out, expected = tmp_path / "ro" / "report", "no permission to write there"
    assert report_cli([str(tree), "--out", str(out), "--n-boot", "0", "--no-svg"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("attnres report: error: cannot write the report folder") and str(out) in err
    assert expected in err
    assert (tmp_path / "a-file").read_text() == "x"


def test_cli_reports_a_failed_write_in_one_line(tree, tmp_path, capsys, monkeypatch):
    import reports.document.files

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "out" / "report.md"))

    monkeypatch.setattr(reports.document.files, "to_markdown", full)
    assert report_cli([str(tree), "--out", str(tmp_path / "out"), "--n-boot", "0", "--no-svg"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1].startswith("attnres report: error: cannot write the report")
    assert "No space left on device" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no half-built folder left


def test_report_without_bootstrap_says_there_is_no_interval(tree, tmp_path):
    summary = reports.build_report(tree, tmp_path / "out", formats=("png",), n_boot=0, strict=True)
    md = summary.report_md.read_text()
    assert "% CI" not in md and "90% bootstrap" not in md and "90% interval" not in md
    assert "no interval (--n-boot 0)" in md
    assert all("(no interval (--n-boot 0))" in h.text() and "[" not in h.text() for h in summary.headline)
    assert "| M at the largest budget |" in md  # the headline table's column, plain


def test_report_of_a_tree_with_an_unreadable_run_marks_its_headline(tree, built):
    md = built.report_md.read_text()
    headline = md.split("## Headline")[1].split("\n## ")[0]
    assert "**INCOMPLETE: 1 unreadable run(s) left out.**" in headline and "`scaling/broken-0`" in headline
    assert all(h.text().startswith("INCOMPLETE: 1 unreadable run(s) left out: ") for h in built.headline)
    record = json.loads(built.report_json.read_text())
    assert record["fit"]["complete"] is False and all(h["complete"] is False for h in record["headline"])
    problems = md.split("## Runs left out")[1]
    assert problems.index("scaling/broken-0") < problems.index("unfinished")  # the unreadable one first


def test_attnres_report_command(tree, tmp_path):
    cli = pytest.importorskip("attnres.cli")
    try:
        cli.build_parser()
    except Exception as err:  # another part of the CLI failing to import is not this package's test
        pytest.skip(f"attnres CLI not buildable here: {err}")
    out = tmp_path / "out"
    proc = attnres("report", tree, "--out", out, "--n-boot", "20", "--no-svg")
    assert proc.returncode == 1, proc.stderr  # written; incomplete (the tree has an unreadable run.parquet)
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    assert "headline" in proc.stdout


def test_reports_never_import_torch(tree, tmp_path):
    code = (
        "import sys, reports\n"
        "assert 'torch' not in sys.modules, 'import reports imported torch'\n"
        "import reports.figures.ablation, reports.build, reports.cli, reports.base.data, reports.document.document\n"
        "import reports.figures.dynamics, reports.figures.heatmaps, reports.figures.scaling, reports.base.style\n"
        "import reports.sections.tables\n"
        "for name in reports.__all__: getattr(reports, name)\n"
        f"reports.build_report({str(tree)!r}, {str(tmp_path / 'out')!r}, formats=('png',), n_boot=10)\n"
        "assert 'torch' not in sys.modules, 'a reports module imported torch'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_cli_module_import_is_light():
    code = (
        "import sys, reports.cli\n"
        "heavy = {'numpy', 'scipy', 'pandas', 'matplotlib', 'torch'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_headline_says_when_its_interval_is_unreliable(tmp_path):
    """Three budgets cannot calibrate the budget bootstrap: the headline carries the mark and the reason."""
    import analysis
    from reports.build import build_report
    from tests.synthetic_results import write_synthetic_results

    tree = write_synthetic_results(
        tmp_path / "r", multipliers={"baseline": 1.0, "full": 1.2}, budgets=[1e15, 1e16, 1e17], tables=False
    )
    fit = analysis.fit_results(analysis.load_results(tree.root, tables=()), n_boot=50, interval="budgets")
    (m,) = fit.sweeps[0].multipliers
    assert not m.reliable
    summary = build_report(tree.root, tmp_path / "out", formats=("png",), n_boot=50, interval="budgets")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Intervals marked unreliable" in text and m.why in text
    assert summary is not None
    # and in the sweep's own tables, not only the headline
    sweep_part = text[text.index("### Effective compute multiplier") :]
    assert "| budgets, UNRELIABLE |" in sweep_part and f"`full`: {m.why}" in sweep_part


def test_the_report_says_which_seeds_are_missing_at_which_budget(tmp_path):
    tree = write_synthetic_results(tmp_path / "r", budgets=[1e15, 1e16, 1e17], seeds=2, noise=0.003, tables=False)
    gone = tree.runs[(tree.runs["variant"] == "block") & (tree.runs["seed"] == 1)].iloc[0]
    shutil.rmtree(tree.root / gone["path"])
    summary = build(tree.root, tmp_path)
    text = summary.report_md.read_text()
    (missing,) = summary.fit.sweeps[0].missing_seeds
    assert "Seeds missing at some budgets" in text and missing.text() in text


def test_the_report_shows_how_the_headline_moves_under_other_analysis_choices(built):
    md = built.report_md.read_text()
    assert "under other analysis choices, one changed at a time" in md and "point estimates, no bootstrap" in md
    saved = json.loads(built.report_json.read_text())
    for h, m in zip(saved["headline"], [built.fit.sweeps[0].multiplier(h.variant) for h in built.headline]):
        s = m.sensitivity
        assert h["choice"] == s.headline and h["other_choices"] == {"low": s.low, "high": s.high, "n": len(s.rows)}
        assert f"{s.low:.3g} to {s.high:.3g} ({len(s.rows)} choices)" in md
        assert f"`{m.variant}`: headline M = " in md


def test_the_report_states_the_regime_next_to_m_and_shows_the_paired_gaps(built):
    from reports.base.paper import PAPER_ALPHA

    md = built.report_md.read_text()
    sw = built.fit.sweeps[0]
    assert "M from that gap at alpha 0.057" in md and "the paper: Block AttnRes, its fits and data" in md
    assert "The paper's 1.25x comes at alpha 0.057" in md
    assert "paired over the seeds both ran (no fitted law)" in md
    saved = {h["variant"]: h["regime"] for h in json.loads(built.report_json.read_text())["headline"]}
    for m in sw.multipliers:
        r = saved[m.variant]
        top = m.gaps[-1]
        assert r["gap_pct"] == top.gap_pct.to_dict() and r["alpha"] == sw.joint.alpha.to_dict()
        points = sw.curve(m.variant).points
        assert r["tokens_per_param"] == [
            min(p.tokens / p.params for p in points),
            max(p.tokens / p.params for p in points),
        ]
        expected = top.baseline_compute / top.compute * (1 + top.gap_pct.value / 100) ** (-1 / PAPER_ALPHA)
        assert np.isclose(r["multiplier_at_paper_alpha"], expected, rtol=1e-12)
        assert f"{top.gap_pct.text(3)} |" in md  # the gap table of the sweep
        assert f"| {m.interval}, {'calibrated' if m.reliable else 'UNRELIABLE'} |" in md


@pytest.mark.parametrize(
    "low, high, unreliable, words",
    [
        (0.8, 1.1, "", "contains 1"),
        (0.6, 0.9, "", "worth less"),
        (1.1, 1.4, "", "worth more"),
        (0.6, 0.9, "3 budgets", "marked unreliable (3 budgets)"),
        (math.nan, math.nan, "", "point estimate"),
    ],
)
def test_the_headline_says_in_plain_words_what_its_interval_means(low, high, unreliable, words):
    from analysis.base.bootstrap import Estimate
    from reports.sections.headline import Headline

    h = Headline("s", "block2", "Block", 1e15, "FLOPs", Estimate(0.8, low, high), 0.9, "shared", 3, 3, "converged")
    h = dataclasses.replace(h, unreliable=unreliable)
    assert words in h.verdict


def test_the_report_opens_with_the_verdict_then_the_headline_and_a_figure_and_ends_with_provenance(built):
    md = built.report_md.read_text()
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[:2] == ["## Verdict", "## Headline"] and sections[-1] == "## Provenance"
    verdict = md.split("## Verdict")[1].split("\n## ")[0]
    for h in built.headline:  # the demo's sentence, from the same property
        assert f"**{h.label}** (`{h.sweep}`): M = {h.multiplier.text(3)}: {h.verdict}" in verdict
    first_image, first_fits = md.index("!["), md.index("### Fits")
    headline_table = md.index("| M at the largest budget")
    assert md.index("## Headline") < headline_table < first_image < first_fits


def test_the_html_has_a_table_of_contents_linking_every_section(built):
    import re

    page = built.report_html.read_text()
    nav = re.search(r'<nav class="toc">(.*?)</nav>', page, flags=re.S)
    assert nav and page.index("<h1") < nav.start() < page.index("<h2")
    links = re.findall(r'href="#([^"]+)"', nav.group(1))
    ids = re.findall(r'<h[23] id="([^"]+)"', page)
    assert links == ids and len(set(ids)) == len(ids)  # every section and part, once, in order
    assert links[:2] == ["verdict", "headline"] and "provenance" in links


def test_every_figure_draws_inside_its_own_bounds(tree, tmp_path, monkeypatch):
    """Nothing a figure draws (titles, labels, legends, notes) runs past the figure's edges: the depth-attention
    heatmap's subtitle did, by a sweep name and shape wider than the figure."""
    import reports.sections.section

    outside = []
    save = reports.sections.section.save_figure

    def checked(fig, stem, formats):
        fig.canvas.draw()
        box = fig.get_tightbbox(fig.canvas.get_renderer())
        width, height = fig.get_size_inches()
        if box.x0 < -0.01 or box.y0 < -0.01 or box.x1 > width + 0.01 or box.y1 > height + 0.01:
            outside.append((stem.name, [round(v, 2) for v in (box.x0, box.y0, box.x1, box.y1)], (width, height)))
        return save(fig, stem, formats)

    monkeypatch.setattr(reports.sections.section, "save_figure", checked)
    summary = reports.build_report(tree, tmp_path / "report", n_boot=20, strict=True)
    assert len(summary.figures) >= len(FIGURES) and not outside, outside
