"""Every figure and table function of ``reports`` on small synthetic results trees: axes labelled with units,
log scales where expected, legends naming the variants, the data actually drawn, and missing data refused
with a reason."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import analysis  # noqa: E402
import reports  # noqa: E402
from attnres.variants import Variant, curve_order  # noqa: E402
from reports.base import style  # noqa: E402
from reports.base.data import MissingData  # noqa: E402
from tests.synthetic_results import write_synthetic_results  # noqa: E402

N_BOOT = 100


@pytest.fixture(scope="module")
def scaling(tmp_path_factory):
    """baseline / Full / Block (N=4) at 4 budgets, 2 seeds, noise; plus a running and a failed run."""
    root = tmp_path_factory.mktemp("scaling")
    write_synthetic_results(
        root, sweep="scaling", budgets=np.geomspace(1e15, 1e17, 4), seeds=2, noise=0.003, unfinished=1, failed=1
    )
    results = analysis.load_results(root)
    return results, analysis.fit_results(results, n_boot=N_BOOT)


@pytest.fixture(scope="module")
def ablation(tmp_path_factory):
    """One size: baseline, Full, Block with N = 1, 2, 4, and two ablation variants; 2 seeds."""
    root = tmp_path_factory.mktemp("ablation")
    kw = dict(sweep="ablation", budgets=[1e16], seeds=2, noise=0.002)
    write_synthetic_results(root, multipliers={"baseline": 1.0, "full": 1.27, "full+sigmoid": 1.2, "mhc4": 1.15}, **kw)
    for n, m in ((1, 1.02), (2, 1.22), (4, 1.25)):
        write_synthetic_results(root, multipliers={"block": m}, n_blocks=n, rng_seed=n, **kw)
    return analysis.load_results(root)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def texts(fig) -> dict[str, list[str]]:
    out = {"xlabel": [], "ylabel": [], "legend": [], "title": [], "text": []}
    for ax in fig.axes:
        out["xlabel"].append(ax.get_xlabel())
        out["ylabel"].append(ax.get_ylabel())
        out["title"].append(ax.get_title())
        legend = ax.get_legend()
        if legend is not None:
            out["legend"] += [t.get_text() for t in legend.get_texts()]
        out["text"] += [t.get_text() for t in ax.texts]
    if fig._suptitle is not None:
        out["title"].append(fig._suptitle.get_text())
    return out


def drawn_points(ax) -> int:
    n = sum(len(line.get_xdata()) for line in ax.get_lines())
    n += sum(len(c.get_offsets()) for c in ax.collections if hasattr(c, "get_offsets"))
    return n


# ---------------------------------------------------------------------------------------------------------
# figure 1: scaling curves
# ---------------------------------------------------------------------------------------------------------


def test_scaling_curves(scaling):
    results, fit = scaling
    fig = reports.plot_scaling_curves(fit, "scaling", runs=results.runs)
    top, bottom = fig.axes[0], fig.axes[1]
    assert top.get_xscale() == "log" and top.get_yscale() == "log"
    assert top.get_ylabel() == "validation loss (nats/token)"
    assert bottom.get_xlabel() == "training FLOPs"
    assert "%" in bottom.get_ylabel()
    legend = texts(fig)["legend"]
    for name in ("baseline", "Full AttnRes", "Block AttnRes (N=4)"):
        assert any(t.startswith(name) for t in legend), (name, legend)
    assert any("individual runs" in t for t in legend)
    box = "\n".join(texts(fig)["text"])
    sw = fit.sweep("scaling")
    assert f"Block N=4: M = {sw.multiplier('block').multiplier.text(3)}" in box
    assert f"Full: M = {sw.multiplier('full').multiplier.text(3)}" in box
    # 3 fitted curves + their points (4 budgets each) + the runs behind them
    assert len(top.get_lines()) == 3
    assert drawn_points(top) >= 3 * 200 + 3 * 4


def test_scaling_curves_in_pflops_days(scaling):
    results, _ = scaling
    fit = analysis.fit_results(results, n_boot=0, compute_unit="pflops_days")
    fig = reports.plot_scaling_curves(fit, "scaling", runs=results.runs)
    assert "PFLOP/s-days" in fig.axes[-1].get_xlabel()
    # points are drawn in the report's unit: the largest is about 1e17 FLOPs = 1.2e-3 PFLOP/s-days
    x = np.concatenate([np.asarray(c.get_offsets())[:, 0] for c in fig.axes[0].collections if len(c.get_offsets())])
    assert x.max() < 1e-2


def test_scaling_curves_without_a_fit_says_why(tmp_path):
    law = analysis.ChinchillaLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)  # sizes at one budget: no law
    write_synthetic_results(tmp_path / "sizes", law=law, budgets=[1e18], sizes_per_budget=3, tables=False)
    fit = analysis.fit_results(tmp_path / "sizes", n_boot=0)
    with pytest.raises(MissingData, match="2 or more distinct budgets"):
        reports.plot_scaling_curves(fit)
    with pytest.raises(MissingData, match="no curve could be fitted"):
        reports.plot_multiplier(fit)
    # one shape and one budget (the block-size and ablation sweeps): that is the reason, not a missing budget
    write_synthetic_results(tmp_path / "one", budgets=[1e16], tables=False)
    fit = analysis.fit_results(tmp_path / "one", n_boot=0)
    for plot in (reports.plot_scaling_curves, reports.plot_multiplier):
        with pytest.raises(MissingData, match="one model shape and one budget: no scaling law"):
            plot(fit)


# ---------------------------------------------------------------------------------------------------------
# figure 2: the multiplier vs compute
# ---------------------------------------------------------------------------------------------------------


def test_multiplier_figure(scaling):
    results, fit = scaling
    fig = reports.plot_multiplier(fit, "scaling", runs=results.runs)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2
    t = texts(fig)
    assert all(x == "training FLOPs" for x in t["xlabel"][:2])
    assert "effective compute multiplier M" in t["ylabel"][0]
    assert [ax.get_title() for ax in panels] == [
        "Full AttnRes (shared exponent)",
        "Block AttnRes (N=4) (shared exponent)",
    ]
    sw = fit.sweep("scaling")
    for ax, variant in zip(panels, ("full", "block")):
        assert ax.get_xscale() == "log"
        labels = [x.get_text() for x in ax.get_legend().get_texts()]
        assert "M = 1 (no gain)" in labels
        assert any(x.startswith("shared exponent: " + sw.multiplier(variant).multiplier_shared.text(3)) for x in labels)
        assert any("paper" in x for x in labels)
        # a horizontal line at M = 1, and one error-bar point per measured budget
        assert any(np.allclose(line.get_ydata(), 1.0) for line in ax.get_lines())
        budgets = [b.compute for b in sw.multiplier(variant).budgets]
        marker_lines = [
            line
            for line in ax.get_lines()
            if line.get_marker() not in ("None", None, "") and len(line.get_xdata()) == len(budgets)
        ]
        assert marker_lines and np.allclose(sorted(marker_lines[0].get_xdata()), sorted(budgets))


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("variants", [("full", "block"), ("full", "block", "mhc4", "denseformer")])
def test_multiplier_legends_cover_no_data(tmp_path, variants):
    """Each panel's legend lies outside every panel (so it covers no point, band or line) and inside the
    figure, with one row of panels and with two."""
    multipliers = {"baseline": 1.0, **dict(zip(variants, (1.27, 1.25, 1.1, 1.05)))}
    write_synthetic_results(tmp_path, multipliers=multipliers, budgets=np.geomspace(1e15, 1e17, 4), tables=False)
    results = analysis.load_results(tmp_path, tables=())
    fig = reports.plot_multiplier(analysis.fit_results(results, n_boot=50), runs=results.runs)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == len(variants)
    figure_box = fig.bbox
    for ax in panels:
        legend = ax.get_legend()
        assert legend is not None
        box = legend.get_window_extent(renderer)
        for other in panels:
            assert not _overlap(box, other.get_window_extent(renderer)), (ax.get_title(), other.get_title())
        assert figure_box.x0 <= box.x0 and box.x1 <= figure_box.x1 and figure_box.y0 <= box.y0, ax.get_title()


def test_multiplier_figure_without_baseline_says_why(tmp_path):
    write_synthetic_results(tmp_path, multipliers={"full": 1.2}, tables=False)
    runs = analysis.load_results(tmp_path, tables=()).runs
    runs = runs[runs["variant"] != "baseline"]
    results = analysis.load_results(tmp_path, tables=())
    fit = analysis.fit_results(
        type(results)(results.root, runs, results.metrics, results.layers, results.depth_attn), n_boot=0
    )
    with pytest.raises(MissingData, match="no fitted baseline"):
        reports.plot_multiplier(fit)


# ---------------------------------------------------------------------------------------------------------
# figure 3: training dynamics
# ---------------------------------------------------------------------------------------------------------


def test_loss_curves(scaling):
    results, _ = scaling
    fig = reports.plot_loss_curves(results.runs, results.metrics, sweep="scaling")
    whole, zoom = fig.axes
    assert whole.get_xscale() == "log"
    for ax in (whole, zoom):
        assert ax.get_xlabel() == "training tokens"
    assert zoom.get_ylabel() == "validation loss (nats/token)"
    assert whole.get_ylabel() == "loss (nats/token)" and "thin lines: training loss" in " ".join(
        whole.get_title().split()
    )
    legend = texts(fig)["legend"]
    assert legend == ["baseline (2 seeds)", "Full AttnRes (2 seeds)", "Block AttnRes (N=4) (2 seeds)"]
    # 3 variants x (2 faint seeds + their bold mean) in validation loss, and 2 training-loss lines each
    assert len(whole.get_lines()) == 15 and len(zoom.get_lines()) == 9
    for line, band in zip([ln for ln in zoom.get_lines() if ln.get_label() in legend], zoom.collections):
        seeds = [ln for ln in zoom.get_lines() if ln.get_color() == line.get_color() and ln is not line]
        ys = np.array([s.get_ydata() for s in seeds])
        assert np.allclose(line.get_ydata(), ys.mean(axis=0))  # the bold line is the seeds' mean
        corners = band.get_paths()[0].vertices[:, 1]
        assert np.isclose(corners.min(), ys.min()) and np.isclose(corners.max(), ys.max())  # the band their range
    assert "n_layer=" in texts(fig)["title"][-1]  # the reference shape is named
    # the reference shape is the largest budget: its tokens are the longest lines
    top_tokens = results.finished["tokens"].max()
    assert max(line.get_xdata().max() for line in whole.get_lines()) == pytest.approx(top_tokens, rel=0.01)


def test_loss_curves_whole_run_starts_at_the_first_logged_step(scaling):
    """Validation is logged every eval_interval steps, the training loss from the first steps: the whole-run
    panel's data start at the reference runs' first logged step, not at their first validation."""
    results, _ = scaling
    fig = reports.plot_loss_curves(results.runs, results.metrics, sweep="scaling")
    whole = fig.axes[0]
    finished = results.finished
    top = finished[finished["tokens"] == finished["tokens"].max()]  # the reference shape: the largest budget
    m = results.metrics[results.metrics["run_id"].isin(top["run_id"]) & (results.metrics["tokens"] > 0)]
    first, first_val = m["tokens"].min(), m.loc[m["split"] == "val", "tokens"].min()
    assert first < first_val
    drawn = np.concatenate([line.get_xdata() for line in whole.get_lines()])
    assert drawn.min() == pytest.approx(first) and whole.get_xlim()[0] <= first
    assert drawn.max() == pytest.approx(m["tokens"].max())


def _panel_data(ax) -> set[tuple]:
    return {(tuple(np.round(ln.get_xdata(), 6)), tuple(np.round(ln.get_ydata(), 9))) for ln in ax.get_lines()}


def test_loss_curves_draw_one_panel_when_the_runs_logged_only_their_second_half(scaling):
    """A WSD branch logs from its decay on: a "whole run" panel would draw what the second-half panel draws."""
    results, _ = scaling
    m = results.metrics
    branch = m[m["tokens"] >= 0.7 * m.groupby("run_id")["tokens"].transform("max")]
    fig = reports.plot_loss_curves(results.runs, branch, sweep="scaling")
    assert len(fig.axes) == 1 and "WSD branch" in fig.axes[0].get_title()
    fig.canvas.draw()
    box, (width, height) = fig.get_tightbbox(fig.canvas.get_renderer()), fig.get_size_inches()
    assert box.x0 >= -0.01 and box.x1 <= width + 0.01 and box.y1 <= height + 0.01  # its title fits the one panel
    full = reports.plot_loss_curves(results.runs, m, sweep="scaling")
    assert len(full.axes) == 2 and _panel_data(full.axes[0]) != _panel_data(full.axes[1])  # no two panels alike


def test_loss_curves_of_an_envelope_point_draw_the_seeds_of_one_rate(scaling):
    """A point read from a learning-rate envelope holds every rate's runs: the figure draws the seeds of the swept
    rate nearest the point's best rate, and says which."""
    results, fit = scaling
    runs = results.runs.copy()
    points = fit.sweep("scaling").points.copy()
    top = points["tokens"] == points["tokens"].max()
    other = runs[runs["run_id"].isin(points.loc[top, "run_ids"].iloc[0])].index[:1]
    runs.loc[other, "lr"] = runs.loc[other, "lr"] * 4  # one baseline seed "at another rate"
    fig = reports.plot_loss_curves(runs, results.metrics, sweep="scaling", points=points)
    legend = texts(fig)["legend"]
    assert legend[0].startswith("baseline") and " at lr " in legend[0] and "(2 seeds" not in legend[0]
    block = runs[runs["run_id"].isin(points.loc[top & (points["curve"] == "block"), "run_ids"].iloc[0])].index[:1]
    runs.loc[block, "lr"] = runs.loc[block, "lr"] * 4
    heat = reports.plot_depth_attention(runs, results.depth_attn, variant="block", sweep="scaling", points=points)
    title = heat._suptitle.get_text()
    assert ", lr " in title and "mean of 2 seeds" not in title  # the heatmap averages one rate's seeds too


def test_loss_curves_fall_back_to_training_loss(scaling):
    results, _ = scaling
    few = results.metrics[
        (results.metrics["split"] == "train")
        | (results.metrics["step"] == results.metrics.groupby("run_id")["step"].transform("max"))
    ]
    fig = reports.plot_loss_curves(results.runs, few, sweep="scaling")
    assert fig.axes[0].get_ylabel() == "training loss (nats/token)"


@pytest.mark.parametrize(
    "name, label",
    [
        ("plot_block_output_rms", "RMS of block output"),
        ("plot_block_grad_norm", "L2 norm of block parameter gradients (before clipping)"),
    ],
)
def test_block_profiles(scaling, name, label):
    results, _ = scaling
    fig = getattr(reports, name)(results.runs, results.layers, sweep="scaling")
    (ax,) = fig.axes
    assert ax.get_ylabel() == label
    assert ax.get_xlabel().startswith("transformer block")
    legend = texts(fig)["legend"]
    assert [x.split(" (mean")[0] for x in legend] == ["baseline", "Full AttnRes", "Block AttnRes (N=4)"]
    baseline = ax.get_lines()[0]
    x, y = baseline.get_xdata(), baseline.get_ydata()
    n_layer = int(results.finished["n_layer"].max())
    assert list(x) == list(range(1, n_layer + 1))
    # the synthetic baseline's magnitude grows with depth and its gradients are largest early
    assert (y[-1] > y[0]) if name == "plot_block_output_rms" else (y[0] > y[-1])
    # the values are the layers table's, at the last step, mean over the seeds
    lay = results.layers
    col = "output_rms" if name == "plot_block_output_rms" else "grad_norm"
    ids = results.finished[(results.finished["variant"] == "baseline") & (results.finished["n_layer"] == n_layer)][
        "run_id"
    ]
    rows = lay[lay["run_id"].isin(ids) & (lay["kind"] == "block")]
    rows = rows[rows["step"] == rows.groupby("run_id")["step"].transform("max")]
    assert np.allclose(y, rows.groupby("layer")[col].mean().to_numpy())


def test_block_grad_norm_figure_says_which_runs_logged_their_norms_after_clipping(scaling):
    """Runs written before schema version 2 logged the per-layer norms after clipping: the title counts them."""
    results, _ = scaling
    title = lambda runs: reports.plot_block_grad_norm(runs, results.layers, sweep="scaling").axes[0].get_title()  # noqa: E731
    assert "after clipping" not in title(results.runs)
    line = title(results.runs.assign(schema_version=1)).split("\n")[-1]
    older, drawn = line.removesuffix(" runs (schema version 1): norms after clipping").split(" of ")
    assert older == drawn and int(drawn) >= 3  # every drawn run (3 variants, their seeds) counted once


def test_dynamics_without_tables_say_why(tmp_path):
    write_synthetic_results(tmp_path, budgets=[1e15, 1e16], tables=False)
    results = analysis.load_results(tmp_path)
    with pytest.raises(MissingData, match="no metrics.parquet"):
        reports.plot_loss_curves(results.runs, results.metrics)
    with pytest.raises(MissingData, match="no layers.parquet"):
        reports.plot_block_output_rms(results.runs, results.layers)
    with pytest.raises(MissingData, match="no depth_attn.parquet"):
        reports.plot_depth_attention(results.runs, results.depth_attn, variant="full")


# ---------------------------------------------------------------------------------------------------------
# figure 4: block-size ablation
# ---------------------------------------------------------------------------------------------------------


def test_block_size_ablation(ablation):
    fig = reports.plot_block_size_ablation(ablation.runs, sweep="ablation")
    (ax,) = fig.axes
    assert ax.get_xlabel() == "block size S (sublayers per block)"
    assert ax.get_ylabel() == "validation loss (nats/token)"
    assert ax.get_xscale() == "log"
    legend = texts(fig)["legend"]
    assert legend[0].startswith("baseline") and "Full AttnRes (S = 1)" in legend and "Block AttnRes" in legend
    shape, table = reports.block_size_points(ablation.runs, sweep="ablation")
    n_sub = 2 * shape.n_layer
    blocks = table[table["variant"] == "block"].sort_values("S")
    assert sorted(blocks["n_blocks"]) == [1, 2, 4]
    assert list(blocks["S"]) == sorted(math.ceil(n_sub / n) for n in (1, 2, 4))
    assert table[table["variant"] == "full"]["S"].tolist() == [1]
    # the points are the fits' points (mean over seeds)
    points = analysis.select_points(ablation.runs)
    for r in blocks.itertuples():
        assert r.loss == pytest.approx(points[points["curve"] == f"block-N{r.n_blocks}"]["loss"].iloc[0])
    annotations = texts(fig)["text"]
    assert {"N=1", "N=2", "N=4"} <= set(annotations)
    base_line = [
        line
        for line in ax.get_lines()
        if np.allclose(line.get_ydata(), table[table["variant"] == "baseline"]["loss"].iloc[0])
    ]
    assert base_line


def test_block_size_ablation_counts_the_baselines_seeds_not_an_envelopes_runs(ablation):
    """An envelope's point holds every rate's runs (2 seeds x 3 rates: n_runs 6): the legend counts its 2 seeds."""
    points = analysis.select_points(ablation.runs).copy()
    base = points.index[points["curve"] == "baseline"][0]
    points.at[base, "n_runs"] = 6
    points.at[base, "run_seeds"] = [0, 1]
    points.at[base, "run_losses"] = [points.at[base, "loss"] - 0.01, points.at[base, "loss"] + 0.01]
    fig = reports.plot_block_size_ablation(ablation.runs, sweep="ablation", points=points)
    assert texts(fig)["legend"][0] == "baseline (no depth attention, 2 seeds)"


def test_block_size_ablation_needs_two_block_sizes(scaling):
    results, _ = scaling
    with pytest.raises(MissingData, match="at least two block sizes at one model size"):
        reports.plot_block_size_ablation(results.runs, sweep="scaling")


# ---------------------------------------------------------------------------------------------------------
# figure 5: depth-attention heatmaps
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["full", "block"])
def test_depth_attention_heatmaps(scaling, variant):
    results, _ = scaling
    fig = reports.plot_depth_attention(results.runs, results.depth_attn, variant=variant, sweep="scaling")
    left, right, bar = fig.axes
    assert "pre-attention" in left.get_title() and "pre-MLP" in right.get_title()
    assert left.get_ylabel().startswith("reading sublayer l")
    assert left.get_xlabel().startswith("source")
    assert bar.get_ylabel() == "mean depth-attention weight α (over tokens)"
    name = "Full AttnRes" if variant == "full" else "Block AttnRes (N=4)"
    assert name in texts(fig)["title"][-1]
    images = left.get_images() + right.get_images()
    assert len(images) == 2
    n_layer = int(results.finished["n_layer"].max())
    assert images[0].get_array().shape[0] == n_layer  # one row per attention sublayer
    assert images[1].get_array().shape[0] == n_layer + 1  # MLP sublayers + the final aggregation
    for img in images:  # every row is a softmax over the sources it sees
        data = np.ma.filled(img.get_array().astype(float), 0.0)
        assert np.allclose(data.sum(axis=1), 1.0)
    ylabels = [t.get_text() for t in right.get_yticklabels()]
    assert ylabels[-1] == "final"
    if variant == "block":
        assert right.patches  # the partial blocks are outlined
        assert "depth block" in left.get_xlabel()


def test_depth_attention_matrices_rows_sum_to_one(scaling):
    results, _ = scaling
    run = results.finished[results.finished["variant"] == "block"]["run_id"].iloc[0]
    d = results.depth_attn[(results.depth_attn["run_id"] == run)]
    d = d[d["step"] == d["step"].max()]
    mats = reports.depth_attention_matrices(d)
    assert set(mats) == {"attn", "mlp", "final"}
    for mat, _queries, partial in mats.values():
        assert np.allclose(np.nansum(mat, axis=1), 1.0)
        assert partial.shape == mat.shape


def test_depth_attention_of_runs_still_in_training(scaling):
    """Explicit run_ids of a curve with no finished run (a sweep in progress): drawn, named from the runs' own rows
    (it used to raise MissingData: the title took the curve's variant from the finished runs' points)."""
    results, _ = scaling
    block = results.runs["variant"] == "block"
    runs = results.runs.assign(status=results.runs["status"].where(~block, "running"))
    run_id = str(runs[block]["run_id"].iloc[0])
    fig = reports.plot_depth_attention(runs, results.depth_attn, variant="block", sweep="scaling", run_ids=[run_id])
    assert "Block AttnRes (N=4)" in texts(fig)["title"][-1]
    assert len(fig.axes[0].get_images()) == 1


def test_depth_attention_of_a_missing_variant(scaling):
    results, _ = scaling
    with pytest.raises(MissingData):
        reports.plot_depth_attention(results.runs, results.depth_attn, variant="block-N8", sweep="scaling")


def test_paper_curves():
    fig = reports.plot_paper_curves()
    (ax,) = fig.axes
    assert "PFLOP/s-days" in ax.get_xlabel() and "nats/token" in ax.get_ylabel()
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    legend = texts(fig)["legend"]
    assert len(legend) == 3 and all(t.startswith("paper, ") for t in legend)
    assert "their data" in ax.get_title()
    assert "M = 1.25" in "\n".join(texts(fig)["text"])


# ---------------------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------------------


def test_size_table(scaling):
    results, _ = scaling
    table = reports.size_table(results.runs, sweep="scaling")
    assert len(table) == 4  # one row per budget (one size each)
    assert table.attrs["loss_columns"] == ["baseline", "Full AttnRes", "Block AttnRes (N=4)"]
    assert {"n_layer", "d_model", "params (non-embedding)", "tokens", "training FLOPs", "lr", "seeds"} <= set(
        table.columns
    )
    points = analysis.select_points(results.runs)
    base = points[points["curve"] == "baseline"].sort_values("flops")
    assert np.allclose(table["baseline"], base["loss"])
    assert table["training FLOPs"].is_monotonic_increasing


def test_ablation_table(ablation):
    table = reports.ablation_table(ablation.runs, sweep="ablation")
    assert table["variant"].tolist() == ["baseline", "mhc4", "full", "full+sigmoid", "block-N1", "block-N2", "block-N4"]
    base = table.set_index("variant").loc["baseline", "loss"]
    assert np.allclose(table["Δ loss vs baseline"], table["loss"] - base)
    assert table.set_index("variant").loc["full+sigmoid", "paper Δ (436M, their data)"] == pytest.approx(1.741 - 1.766)
    assert table.set_index("variant").loc["full+sigmoid", "description"] == "Full AttnRes, sigmoid instead of softmax"
    assert table.set_index("variant").loc["block-N4", "S"] == math.ceil(2 * int(ablation.runs["n_layer"].iloc[0]) / 4)


def test_ablation_table_needs_ablations(scaling):
    results, _ = scaling
    with pytest.raises(MissingData, match="no ablation variants"):
        reports.ablation_table(results.runs, sweep="scaling")


def test_fit_and_multiplier_tables_match_the_fit(scaling):
    _, fit = scaling
    sw = fit.sweep("scaling")
    ft = reports.fit_table(fit, "scaling").set_index("curve")
    for c in sw.curves:
        assert ft.loc[c.curve, "A [90% CI]"] == c.fit.A.text()
        assert ft.loc[c.curve, "alpha [90% CI]"] == c.fit.alpha.text()
        assert ft.loc[c.curve, "status"] == c.fit.status
    mt = reports.multiplier_table(fit, "scaling").set_index("variant")
    for m in sw.multipliers:
        assert mt.loc[m.variant, "M [90% CI]"] == m.multiplier.text()
    bt = reports.budget_table(fit, "scaling")
    assert len(bt) == sum(len(m.budgets) for m in sw.multipliers)


# ---------------------------------------------------------------------------------------------------------
# looks
# ---------------------------------------------------------------------------------------------------------


def test_variant_colors_are_fixed_by_name():
    assert style.variant_color(Variant("baseline")) == style.BASELINE_COLOR
    assert style.variant_color(Variant("full")) == style.FULL_COLOR
    assert style.variant_color(Variant("block")) == style.BLOCK_COLOR
    main = {style.variant_color(Variant(v)) for v in ("baseline", "full", "block")}
    assert len(main) == 3
    shades = [style.variant_color(Variant("block", n)) for n in (1, 2, 4, 8, 16)]
    assert len(set(shades)) == 5
    assert style.variant_color(Variant("some+new_variant")) == style.variant_color(Variant("some+new_variant"))
    # a Block curve of one N per size is every N's: drawn as its name shows it, in the Block colour
    assert style.variant_color(Variant("block", 4).as_named("block")) == style.BLOCK_COLOR
    curves = ["block-N8", "full+sigmoid", "block", "baseline", "full", "mhc4", "block-N2"]
    of = {c: Variant(c) for c in curves} | {"block-N8": Variant("block", 8), "block-N2": Variant("block", 2)}
    assert curve_order(curves, of) == [
        "baseline",
        "mhc4",
        "full",
        "full+sigmoid",
        "block",
        "block-N2",
        "block-N8",
    ]
    assert style.variant_label(Variant("block", 4)) == "Block AttnRes (N=4)"
    assert style.variant_label(Variant("block", 4).as_named("block")) == "Block AttnRes"


def test_figure_functions_do_not_read_files(scaling, monkeypatch):
    """Figures take DataFrames: with file reading disabled they still draw."""
    import builtins

    results, fit = scaling

    def refuse(*args, **kwargs):
        raise AssertionError(f"a figure function opened a file: {args[:1]}")

    monkeypatch.setattr(builtins, "open", refuse)
    monkeypatch.setattr(pd, "read_parquet", refuse)
    reports.plot_scaling_curves(fit, "scaling", runs=results.runs)
    reports.plot_block_output_rms(results.runs, results.layers, sweep="scaling")


def test_lr_table_lists_every_variant_at_every_learning_rate(tmp_path):
    import analysis
    from reports import lr_table
    from tests.synthetic_results import write_synthetic_results

    write_synthetic_results(
        tmp_path, sweep="lrs", budgets=[1e12], seeds=2, lrs=(1e-3, 3e-3), multipliers={"block": 1.2}
    )
    runs = analysis.load_results(tmp_path, tables=()).runs
    table = lr_table(runs, sweep="lrs")
    assert sorted(table["lr"].unique()) == [1e-3, 3e-3]
    assert table.attrs["loss_columns"] and all(table[c].notna().all() for c in table.attrs["loss_columns"])
    assert (table["seeds"] == 2).all()
    write_synthetic_results(tmp_path / "one", sweep="one", budgets=[1e12], seeds=1)
    one = analysis.load_results(tmp_path / "one", tables=()).runs
    with pytest.raises(reports.MissingData, match="one learning rate"):
        lr_table(one, sweep="one")
    assert reports.sections.tables.has_lr_sweep(runs, sweep="lrs") and not reports.sections.tables.has_lr_sweep(
        one, sweep="one"
    )


def test_the_papers_multiplier_is_drawn_wherever_the_final_axis_reaches_it():
    """Block's 1.25 near the data widens the shared axis to about 1.28; Full's 1.27 then lies on the scale and is drawn
    as a line, not listed as "off this scale" (it was, decided before the axis widened)."""
    from reports.figures.scaling import _paper_references

    fig, axes = plt.subplots(1, 2, sharey=True, squeeze=False)
    _paper_references(axes, [(axes[0, 0], 1.25), (axes[0, 1], 1.27)], highs=[1.0, 1.05], lows=[1.0, 0.85])
    low, high = axes[0, 0].get_ylim()
    assert low < 1.27 < high
    for ax, ref in ((axes[0, 0], 1.25), (axes[0, 1], 1.27)):
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert not any("off this scale" in x for x in labels), labels
        assert any(np.allclose(line.get_ydata(), ref) for line in ax.get_lines())
    fig, axes = plt.subplots(1, 1, squeeze=False)
    _paper_references(axes, [(axes[0, 0], 1.27)], highs=[0.95], lows=[0.8])  # far above the data: a note
    assert axes[0, 0].get_ylim()[1] < 1.27
    assert any("off this scale" in t.get_text() for t in axes[0, 0].get_legend().get_texts())


def test_block_curves_name_their_n_in_a_slice_sweeps_figures(scaling):
    """A sweep fitted per tokens-per-parameter ratio (``scaling@8tpp``) names no runs: N comes from its points."""
    import dataclasses

    results, fit = scaling
    sliced = dataclasses.replace(fit.sweep("scaling"), sweep="scaling@8tpp")
    report = dataclasses.replace(fit, sweeps=[sliced])
    titles = [ax.get_title() for ax in reports.plot_multiplier(report, "scaling@8tpp", runs=results.runs).axes]
    assert "Block AttnRes (N=4) (shared exponent)" in titles
    curves = reports.plot_scaling_curves(report, "scaling@8tpp", runs=results.runs)
    labels = [t for ax in curves.axes if ax.get_legend() for t in (x.get_text() for x in ax.get_legend().get_texts())]
    blocks = [x for x in labels if x.startswith("Block AttnRes")]
    assert blocks and all("(N=4)" in x for x in blocks), labels
