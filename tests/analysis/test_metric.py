"""``attnres fit --metric NAME``: fits read an extra evaluation set's loss instead of the validation split's."""

from __future__ import annotations

import json

import pytest

from analysis import fit_results, load_results
from analysis.base.errors import FitInputError
from analysis.cli import main
from attnres.storage import schema
from tests.synthetic_results import write_synthetic_results

TRUTH = {"baseline": 1.0, "block": 1.25}
SCALE = 1.1  # the evaluation set is 10 % harder: the same law, A times 1.1


def add_eval_set(root, name: str = "other", skip: int = 0) -> None:
    """Record in every run.parquet (but the first ``skip``) a set ``name`` whose loss is SCALE x its val_loss."""
    for i, path in enumerate(sorted(root.rglob(schema.RUN_FILE))):
        if i < skip:
            continue
        row = schema.read_table(path).to_pylist()[0]
        row["eval_sets"] = json.dumps({name: {"loss": SCALE * row["val_loss"], "bpb": SCALE * row["val_bpb"]}})
        schema.write_table(path, schema.to_table([row], schema.RUN_SCHEMA))


@pytest.fixture
def results(tmp_path):
    write_synthetic_results(tmp_path, multipliers=TRUTH, tables=False)
    return tmp_path


def test_a_fit_of_an_evaluation_set_reads_its_losses(results):
    add_eval_set(results)
    val = fit_results(results, n_boot=0)
    other = fit_results(results, n_boot=0, metric="other")
    for name in TRUTH:
        a, b = val.sweeps[0].curve(name).fit, other.sweeps[0].curve(name).fit
        assert b.law.A == pytest.approx(SCALE * a.law.A, rel=1e-6) and b.law.alpha == pytest.approx(a.law.alpha)
    assert other.settings.metric == "other" and other.to_dict()["settings"]["metric"] == "other"
    assert "metric" not in val.to_dict()["settings"]  # a validation fit writes fit.json as before


def test_runs_without_the_set_are_named_before_any_fit(results):
    add_eval_set(results, skip=2)
    with pytest.raises(FitInputError) as err:
        fit_results(results, n_boot=0, metric="other")
    message = str(err.value)
    assert message.startswith("--metric other: 2 finished run(s) have no loss on an evaluation set of that name")
    assert "the sets they were evaluated on: other" in message and "fit --metric val" in message
    with pytest.raises(FitInputError, match="did you mean 'other'"):
        fit_results(results, n_boot=0, metric="othr")


def test_runs_written_before_evaluation_sets_keep_their_inputs_hash(results):
    """The new run.parquet column is left out of the hash where a run has none: committed fits keep theirs."""
    before = load_results(results, tables=()).inputs_hash
    for path in sorted(results.rglob(schema.RUN_FILE)):  # as written before the column existed
        table = schema.read_table(path)
        schema.write_table(path, table.drop(["eval_sets"]))
    assert load_results(results, tables=()).inputs_hash == before
    add_eval_set(results)
    assert load_results(results, tables=()).inputs_hash != before


def test_the_command_line_offers_the_metric(results, capsys):
    add_eval_set(results)
    args = ["fit", str(results), "--n-boot", "0", "--no-chinchilla"]
    assert main([*args, "--metric", "other"]) == 0
    assert json.loads((results / "fit.json").read_text())["settings"]["metric"] == "other"
    capsys.readouterr()
    assert main([*args, "--metric", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attnres fit: error: --metric nope: ")
