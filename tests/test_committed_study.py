"""The committed CPU studies: `attnres fit` reproduces the numbers their pages state, digit for digit: the tables of
studies/cpu_envelope/ (and the README's findings, which quote them), of studies/cpu_wsd/ (both tuning protocols), and
of the earlier studies/cpu_small/."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the integration tier: pytest -m integration (.ci/run's second step)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "studies" / "cpu_small" / "results"
WSD = ROOT / "studies" / "cpu_wsd" / "results"
ENVELOPE = ROOT / "studies" / "cpu_envelope" / "results"
needs_small = pytest.mark.skipif(not (RESULTS / "cpu_small").is_dir(), reason="studies/cpu_small is not here")
needs_wsd = pytest.mark.skipif(not (WSD / "cpu_wsd_pv").is_dir(), reason="studies/cpu_wsd is not here")
needs_envelope = pytest.mark.skipif(not (ENVELOPE / "cpu_envelope").is_dir(), reason="studies/cpu_envelope is not here")

# the table of cpu_wsd's page: (budget, variant, its label) per row
VARIANTS = (("full", "Full AttnRes"), ("block", "Block AttnRes (N=2)"))
FRONTIER = "all budgets, at the frontier"
WSD_PARTS = tuple(
    (part, variant, label)
    for part in (*(f"{r} tokens/param" for r in (2, 4, 8, 16)), FRONTIER)
    for variant, label in VARIANTS
)


def wsd_cells(report, sweep: str, part: str, variant: str) -> str:
    """One cell of the README's cpu_wsd table: M at the largest budget of a ratio's fit (marked where its
    interval is unreliable), or M between the whole sweep's Chinchilla frontiers at its largest compute."""
    if part == FRONTIER:
        from analysis.estimates.frontier import at_largest_compute

        (top,) = [f for f in at_largest_compute(report.sweep(sweep).frontier_multipliers) if f.variant == variant]
        return top.M.text(3) + " (not calibrated)"
    ratio = part.split()[0]
    m = report.sweep(f"{sweep}@{ratio}tpp").multiplier(variant)
    return m.multiplier.text(3) + ("" if m.reliable else " (unreliable)")


@pytest.fixture(scope="module")
def wsd_report():
    """The per-ratio fits (no Chinchilla surfaces: their bootstrap is most of the fit's minute)."""
    from analysis import fit_results

    return fit_results(WSD, sweeps=["cpu_wsd", "cpu_wsd_pv"], chinchilla=False)


def readme_wsd_rows() -> dict[tuple[str, str], list[str]]:
    """The cpu_wsd table of its page: (budget, variant label) -> [paper's protocol, per-variant tuning]."""
    rows = {}
    for line in (ROOT / "studies" / "cpu_wsd" / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and any(cells[0] == p and cells[1] == lab for p, _, lab in WSD_PARTS):
            rows[(cells[0], cells[1])] = cells[2:]
    assert len(rows) == len(WSD_PARTS)
    return rows


def check_rows(report, parts) -> None:
    rows = readme_wsd_rows()
    for part, variant, label in parts:
        expected = [wsd_cells(report, sweep, part, variant) for sweep in ("cpu_wsd", "cpu_wsd_pv")]
        assert rows[(part, label)] == expected, (part, label)


@needs_wsd
def test_fit_reproduces_the_readme_table_of_both_protocols_per_ratio(wsd_report):
    check_rows(wsd_report, [p for p in WSD_PARTS if p[0] != FRONTIER])


@needs_wsd
@pytest.mark.slow
def test_fit_reproduces_the_readme_table_at_the_frontier():
    """The table's last rows: M between the Chinchilla surfaces' frontiers (a minute of bootstrap refits, so
    `pytest -m slow`; run it when the analysis changes)."""
    from analysis import fit_results

    check_rows(fit_results(WSD, sweeps=["cpu_wsd", "cpu_wsd_pv"]), [p for p in WSD_PARTS if p[0] == FRONTIER])


@needs_wsd
def test_the_protocols_differ_in_learning_rates_and_share_the_baseline(wsd_report):
    """The paper's protocol trains every variant at the baseline's rate; per-variant tuning at each variant's own;
    both have the same baseline runs (reuse: copied them), so the two differ only where the protocols do."""
    runs = wsd_report_runs()
    for sweep, shared in (("cpu_wsd", True), ("cpu_wsd_pv", False)):
        mine = runs[runs["sweep"] == sweep]
        per_size = mine.groupby(["n_layer", "d_model"])["lr"].nunique()
        assert (per_size == 1).all() == shared, sweep
    studies = runs[runs["sweep"].isin(["cpu_wsd", "cpu_wsd_pv"]) & (runs["variant"] == "baseline")]
    base = studies.pivot_table(index="run_id", columns="sweep", values="val_loss")
    assert len(base) == 60  # 5 sizes x 4 budgets x 3 seeds
    assert base[["cpu_wsd", "cpu_wsd_pv"]].notna().all().all()
    assert (base["cpu_wsd"] == base["cpu_wsd_pv"]).all()


def wsd_report_runs():
    from analysis import load_results

    runs = load_results(WSD, tables=()).runs
    return runs[runs["status"] == "done"]


def readme_rows() -> dict[str, list[str]]:
    """The table of studies/cpu_small/README.md: variant -> its cells (M in the paper's form, M with an offset E,
    wall-clock M, runs)."""
    rows = {}
    for line in (ROOT / "studies" / "cpu_small" / "README.md").read_text().splitlines():
        if re.match(r"\| (full|block-N\d+) \|", line):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


@needs_small
@pytest.mark.parametrize("form,column", [("A*C^-alpha", 0), ("E+A*C^-alpha", 1)])
def test_fit_reproduces_the_cpu_small_multipliers(form, column):
    from analysis import fit_results

    sweep = fit_results(RESULTS, sweeps=["cpu_small"], form=form).sweep("cpu_small")
    rows = readme_rows()
    assert {m.variant for m in sweep.multipliers} == set(rows)
    for m in sweep.multipliers:
        assert rows[m.variant][column] == m.multiplier.text(3), (form, m.variant)
        assert rows[m.variant][3] == f"{m.n_runs_variant} + {m.n_runs_baseline}" == "10 + 10"
        if column == 0:
            assert rows[m.variant][2] == m.wall_clock.text(3), m.variant


@needs_small
def test_fit_with_the_seeds_bootstrap_reproduces_the_cpu_small_column_and_marks_it_unreliable():
    """The last column: the paper's form with --interval seeds. The baseline's law misses its points by more than
    the seed noise explains; the seeds-only interval is marked unreliable where a law's lack-of-fit test rejects at
    1 % (Block N = 4's here), and is narrower than the default interval (budgets) for every variant."""
    from analysis import fit_results

    sweep = fit_results(RESULTS, sweeps=["cpu_small"], interval="seeds").sweep("cpu_small")
    default = fit_results(RESULTS, sweeps=["cpu_small"]).sweep("cpu_small")
    rows = readme_rows()
    for m in sweep.multipliers:
        assert rows[m.variant][4] == m.multiplier.text(3) + ("" if m.reliable else " (unreliable)"), m.variant
        misfit = [t for t in m.lack_of_fit.values() if t.significant]
        assert m.reliable == (not misfit) and (m.reliable or "lack-of-fit" in m.why), m.variant
        assert m.lack_of_fit["baseline"].rms > 2 * m.lack_of_fit["baseline"].seed_se, m.variant
        budgets = default.multiplier(m.variant).multiplier
        assert m.multiplier.high - m.multiplier.low < budgets.high - budgets.low, m.variant
    assert [m.variant for m in sweep.multipliers if not m.reliable] == ["block-N4"]
    assert all(m.interval == "budgets" and m.reliable for m in default.multipliers)


@pytest.mark.parametrize(
    "study", ["cpu_small", "cpu_wsd", "cpu_envelope", "cpu_muon", "cpu_depth", "cpu_architecture", "cpu_ablations"]
)
def test_the_committed_report_is_the_report_of_the_committed_results(study):
    import json

    from analysis import load_results

    folder = ROOT / "studies" / study
    if not (folder / "report" / "report.json").is_file():
        pytest.skip(f"studies/{study} has no report here")
    saved = json.loads((folder / "report" / "report.json").read_text())
    assert saved["fit"]["inputs_hash"] == load_results(folder / "results", tables=()).inputs_hash


@needs_wsd
def test_the_stall_detector_flags_the_stalled_baseline_seed_at_l3_and_l5_and_nothing_at_l6_or_l8(wsd_report):
    """The baseline's seed 2 stalls early at L3-d32 and L5-d32 (it ends 10-11 % above its siblings); the detector
    flags it there, in every ratio's fit of the paper's protocol, and no run of the larger sizes."""
    for ratio in (2, 4, 8, 16):
        stalls = wsd_report.sweep(f"cpu_wsd@{ratio}tpp").stalls
        assert {(s.curve, s.size, s.seed) for s in stalls} == {("baseline", "L3-d32", 2), ("baseline", "L5-d32", 2)}
    for sweep in wsd_report.sweeps:
        assert not [s for s in sweep.stalls if s.size in ("L6-d48", "L8-d64")], sweep.sweep


def table_rows(text: str, first: str) -> list[list[str]]:
    """The cells of the rows of the markdown tables in ``text`` whose first cell matches ``first`` (a regex)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.strip().startswith("|") and re.fullmatch(first, cells[0]):
            rows.append(cells)
    return rows


@pytest.fixture(scope="module")
def envelope_report():
    from analysis import fit_results

    return fit_results(ENVELOPE, sweeps=["cpu_envelope"], lr="envelope", chinchilla=False)


@needs_envelope
def test_fit_reproduces_the_cpu_envelope_tables_of_m_and_of_the_best_rates(envelope_report):
    from analysis.tables.robust_tables import protocol_table

    page = (ROOT / "studies" / "cpu_envelope" / "README.md").read_text()
    expected = [
        [f"{tpp} tokens/param", *map(str, row)]
        for tpp in (8, 16)
        for row in protocol_table(
            envelope_report.sweep(f"cpu_envelope@{tpp}tpp"), envelope_report.settings, ["block", "full"]
        ).rows
    ]
    assert table_rows(page, r"\d+ tokens/param") == expected
    best = {}
    for tpp in (8, 16):
        for c in envelope_report.sweep(f"cpu_envelope@{tpp}tpp").envelope.cells:
            best.setdefault(c.size, []).append((tpp, c.curve, f"{c.best_lr:.3g}" + (" EDGE" if c.edge else "")))
    rates = table_rows(page, r"L\d+-d\d+")
    assert len(rates) == len(best) == 5
    for size, *cells in rates:
        order = [(t, v) for t in (8, 16) for v in ("baseline", "block", "full")]
        assert cells == [dict(((t, v), r) for t, v, r in best[size])[k] for k in order], size
    assert not envelope_report.sweep("cpu_envelope@16tpp").stalls  # "no stalled run"


@needs_envelope
def test_the_readme_findings_quote_the_cpu_envelope_fit(envelope_report):
    """The top-level README's few lines of findings: Block's and Full's M at 16 tokens per parameter and Block's paired
    M, as the fit prints them."""
    readme = (ROOT / "README.md").read_text()
    findings = readme[readme.index("## What it found") : readme.index("## A tour")]
    sweep = envelope_report.sweep("cpu_envelope@16tpp")
    for quoted in (
        sweep.multiplier("block").multiplier.text(3),
        sweep.multiplier("block").paired.mean.text(3),
        sweep.multiplier("full").multiplier.text(3),
    ):
        assert quoted in findings, quoted
    assert len(findings.strip().splitlines()) <= 12  # the heading, at most 10 lines, one figure


MUON = ROOT / "studies" / "cpu_muon"
needs_muon = pytest.mark.skipif(not (MUON / "results" / "cpu_muon").is_dir(), reason="studies/cpu_muon is not here")


@needs_muon
def test_fit_reproduces_the_cpu_muon_table_and_its_comparison():
    """The page's table (both arms, both ratios) as `attnres fit --lr envelope` prints it, and the ratios of M it
    quotes as studies/cpu_muon/compare.py computes them."""
    from analysis import fit_results
    from analysis.tables.robust_tables import protocol_table

    report = fit_results(MUON / "results", lr="envelope", chinchilla=False)
    page = (MUON / "README.md").read_text()
    expected = [
        [f"{arm}, {tpp} tokens/param", *map(str, row)]
        for arm, sweep in (("Muon", "cpu_muon"), ("AdamW", "cpu_muon_adamw"))
        for tpp in (8, 16)
        for row in protocol_table(report.sweep(f"{sweep}@{tpp}tpp"), report.settings, ["block"]).rows
    ]
    assert table_rows(page, r"(Muon|AdamW), \d+ tokens/param") == expected
    spec = importlib.util.spec_from_file_location("compare", MUON / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        compare.main()
    assert printed.getvalue() == (MUON / "compare.txt").read_text()
    for line in printed.getvalue().splitlines():
        if "mean over" in line:
            assert line.split(": ", 1)[1].split(" (")[0] in page, line  # "0.984 [0.874, 1.107]" quoted on the page


DEPTH = ROOT / "studies" / "cpu_depth"
# a study is committed with its report: until then (its runs in progress) there is nothing to hold its page to
needs_depth = pytest.mark.skipif(
    not (DEPTH / "report" / "report.json").is_file(), reason="studies/cpu_depth is not here"
)


def depth_rows(report) -> list[list[str]]:
    """The rows of cpu_depth's depth table per training length as `attnres fit` prints them, as a page holds them:
    both cpu_depth's page and cpu_depth_deep's (the same sweep name, pooled)."""
    from analysis.tables.shape_tables import depth_table

    return [
        [f"{tpp} tokens/param", *map(str, row[1:])]
        for tpp in (8, 16)
        for row in depth_table(report.sweep(f"cpu_depth@{tpp}tpp"), report.settings).rows
    ]


@needs_depth
def test_fit_reproduces_the_cpu_depth_trend_table():
    """The page's table of the paired gap per depth and its trend, per training length, as `attnres fit --lr
    envelope` prints it, and the trends its first lines quote."""
    from analysis import fit_results

    report = fit_results(DEPTH / "results", lr="envelope", chinchilla=False)
    page = (DEPTH / "README.md").read_text()
    assert table_rows(page, r"\d+ tokens/param") == depth_rows(report)
    head = page[: page.index("## Why this design")]
    for tpp in (8, 16):
        block = report.sweep(f"cpu_depth@{tpp}tpp").multiplier("block")
        assert block.depth is not None and block.depth.span == (8, 24)
        assert block.depth.gap_change.text(3) in head, tpp
        assert block.multiplier.text(3) in page and block.paired.mean.text(3) in page, tpp  # "The headline M"
    edges = [c for tpp in (8, 16) for c in report.sweep(f"cpu_depth@{tpp}tpp").envelope.cells if c.edge]
    assert len(edges) == 6 and "6 of the 20" in head


DEEP = ROOT / "studies" / "cpu_depth_deep"
needs_deep = pytest.mark.skipif(
    not (DEEP / "report" / "report.json").is_file(), reason="studies/cpu_depth_deep is not here"
)


@needs_deep
@needs_depth
def test_fit_reproduces_the_cpu_depth_deep_ladder_and_its_profiles():
    """cpu_depth_deep pooled with cpu_depth (`attnres fit ... --pool studies/cpu_depth/results --lr envelope`): the
    page's table of the gap per depth, its trend and where the line crosses 0, per training length; the first lines
    quote the deepest gap and the crossing; the committed report is the report of these runs; profiles.txt is what
    profiles.py prints."""
    import json

    from analysis import fit_results, load_results

    results = load_results(DEEP / "results", tables=(), pool=[DEPTH / "results"])
    report = fit_results(results, lr="envelope", chinchilla=False)
    page = (DEEP / "README.md").read_text()
    assert table_rows(page, r"\d+ tokens/param") == depth_rows(report)
    head = page[: page.index("## Design")]
    for tpp in (8, 16):
        trend = report.sweep(f"cpu_depth@{tpp}tpp").multiplier("block").depth
        assert trend is not None and trend.span == (8, 48)
        assert f"{trend.points[-1].gap:+.2f} %" in head, tpp
    trend16 = report.sweep("cpu_depth@16tpp").multiplier("block").depth
    assert trend16.crossing_text().split(" (")[0] in head
    saved = json.loads((DEEP / "report" / "report.json").read_text())
    assert saved["fit"]["inputs_hash"] == results.inputs_hash
    spec = importlib.util.spec_from_file_location("profiles", DEEP / "profiles.py")
    profiles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(profiles)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        profiles.main()
    assert printed.getvalue() == (DEEP / "profiles.txt").read_text()


ARCH = ROOT / "studies" / "cpu_architecture"
needs_arch = pytest.mark.skipif(
    not (ARCH / "report" / "report.json").is_file(), reason="studies/cpu_architecture is not here"
)


@needs_arch
def test_fit_reproduces_the_cpu_architecture_cells():
    """The page's table of the cells (both curves' losses, the best cells, the gaps and Block's gap trend) as
    `attnres fit` prints it."""
    from analysis import fit_results
    from analysis.tables.shape_tables import architecture_table

    report = fit_results(ARCH / "results", chinchilla=False)
    grid = report.sweep("cpu_architecture").architecture
    assert grid is not None and len(grid.cells) == 32
    page = (ARCH / "README.md").read_text()
    expected = [list(map(str, row)) for row in architecture_table(grid).rows]
    assert table_rows(page, r"\d|change .*") == expected
    head = page[: page.index("## Why this design")]
    assert grid.best("baseline").name in head and grid.best("block").name in head
    assert grid.gap_change["block"].change.text(3) in head


ABLATIONS = ROOT / "studies" / "cpu_ablations"
needs_ablations = pytest.mark.skipif(
    not (ABLATIONS / "report" / "report.json").is_file(), reason="studies/cpu_ablations is not here"
)


@needs_ablations
def test_fit_reproduces_the_cpu_ablations_gaps():
    """The page's table of every curve's loss and gap to the baseline at L6-d48 (the paper's block-size figure and
    Table 4 at CPU scale) as `attnres fit --lr envelope` prints it, and the gaps its first lines quote."""
    from analysis import fit_results
    from analysis.tables.shape_tables import one_shape_table
    from attnres.variants import curve_order

    report = fit_results(ABLATIONS / "results", lr="envelope", chinchilla=False)
    one = report.sweep("cpu_ablations").one_shape
    assert one is not None and one.shape == "L6-d48" and len(one.gaps) == 15
    bounds = [g.curve for g in one.gaps if g.edge]  # a curve at an edge of its rates is out of the pools
    assert bounds == ["full+input_query"] and one.df == (16 - len(bounds) - 1) * (2 - 1)
    page = (ABLATIONS / "README.md").read_text()
    sw = report.sweep("cpu_ablations")
    table = one_shape_table(one, report.settings, curve_order([g.curve for g in one.gaps], sw.curve_variants))
    expected = [list(map(str, row)) for row in table.rows]
    assert table_rows(page, r"baseline|block.*|full.*|denseformer|mhc4") == expected
    head = page[: page.index("## Why this design")]
    for curve in ("full", "block-N3"):
        assert one.gap(curve).gap.text(3) in head, curve
    assert f"on {one.df} df" in page and f"{one.seed_sd:.2f} points per seed" in page


def test_the_committed_reports_open_with_the_verdict_and_count_a_slices_runs():
    """The re-made reports (2026-12-05): the verdict first, provenance last, and a per-ratio slice's section counts
    the runs at its ratio (it said "0 runs" when it looked the slice's name up among the runs' sweeps)."""
    report = ROOT / "studies" / "cpu_envelope" / "report" / "report.md"
    if not report.is_file():
        pytest.skip("studies/cpu_envelope has no report here")
    md = report.read_text()
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Verdict" and sections[-1] == "## Provenance"
    for part in ("cpu_envelope@8tpp", "cpu_envelope@16tpp"):
        summary = md.split(f"## Sweep `{part}`\n\n")[1].splitlines()[0]
        assert summary.startswith("110 runs (110 finished)"), summary
