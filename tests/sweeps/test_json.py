"""Machine-readable plans and statuses (`attnres sweep plan|status --json`, docs/sweeps.md) and `attnres --version`."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from attnres.cli import main
from sweeps.plan import PlanRow
from sweeps.status import RunState

ROOT = Path(__file__).resolve().parents[2]


def _records(capsys) -> list[dict]:
    out = capsys.readouterr().out
    return [json.loads(line) for line in out.splitlines()]  # every line is one JSON object, nothing else


def test_version_is_the_packages(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert capsys.readouterr().out.strip() == f"attnres {version}"


def test_plan_json_is_one_object_per_run_with_the_documented_fields(tmp_path, capsys):
    assert main(["sweep", "plan", "smoke", "--results", str(tmp_path), "--json"]) == 0
    records = _records(capsys)
    from sweeps import expand, load_grid

    planned = expand(load_grid("smoke"))
    assert sorted(r["run_id"] for r in records) == sorted(cfg.run_id for cfg in planned)
    fields = {"sweep"} | {f.name for f in dataclasses.fields(PlanRow)}
    assert all(set(r) == fields and r["sweep"] == "smoke" and r["status"] is None for r in records)
    assert all(r["flops"] > 0 and r["params"] > 0 and r["steps"] > 0 for r in records)
    documented = (ROOT / "docs" / "sweeps.md").read_text()
    assert all(f"`{name}`" in documented for name in fields)


def test_status_json_reads_what_the_runs_are(smoke_results, capsys):
    assert main(["sweep", "status", "smoke", "--results", str(smoke_results), "--json"]) == 0
    records = _records(capsys)
    fields = {"sweep"} | {f.name for f in dataclasses.fields(RunState)}
    assert records and all(set(r) == fields for r in records)
    assert {r["state"] for r in records} == {"done"} and all(r["val_loss"] > 0 for r in records)
    assert all(Path(r["run_dir"]).parent.name == r["sweep"] for r in records)
    assert main(["sweep", "status", "--results", str(smoke_results), "--json"]) == 0  # every sweep, no grid
    assert sorted(r["run_id"] for r in _records(capsys)) == sorted(r["run_id"] for r in records)
    documented = (ROOT / "docs" / "sweeps.md").read_text()
    assert all(f"`{name}`" in documented for name in fields)
