"""The README's tour, top to bottom, in an empty folder as on a fresh clone: every command exits 0.

The commands are read from README.md ("A tour"), so the test follows the README as it changes. Where a command
would train for minutes, it runs on tiny settings instead: the demo on the smoke grid (its runs copied from the
session's `smoke_results`, so it fits and reports them), the study's grid (cpu_small) replaced by a grid of the same
shape (lr tuned on the baseline, a tune section) at the smoke grid's size, and `attnres train` with a tiny model
and budget.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TINY_TRAIN = ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.seq_len=64", "train.tokens=4000"]


def tour_commands() -> list[str]:
    """The ``attnres`` lines of the code blocks in the README's "A tour" section, in order, comments dropped."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## A tour\n(.*?)^## ", text, flags=re.S | re.M)
    assert section, "README.md has no '## A tour' section"
    blocks = re.findall(r"```bash\n(.*?)```", section.group(1), flags=re.S)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("attnres ")]


def tiny_study_grid(folder: Path) -> Path:
    """cpu_small's shape (lr tuned on the baseline, several budgets, Block) at the smoke grid's size."""
    grid = yaml.safe_load((ROOT / "sweeps" / "smoke.yaml").read_text())
    grid.update(name="cpu_small", lr="tuned-baseline", seeds=[0], budgets=[{"tokens_per_param": [0.5, 1]}])
    grid["variants"] = ["baseline", {"block": [2]}]
    grid["tune"].update(trials=2, budget={"tokens_per_param": 0.5})
    path = folder / "tiny_cpu_small.yaml"  # named cpu_small inside, so results/cpu_small as in the README
    path.write_text(yaml.safe_dump(grid))
    return path


def tiny(command: str, study: Path) -> list[str]:
    args = shlex.split(command)[1:]
    args = [str(study) if a == "cpu_small" else a for a in args]
    if args[:1] == ["demo"]:
        args += ["--grid", "smoke", "--no-progress"]
    if args[:1] == ["train"] and "--help" not in args:
        args = [a for a in args if not a.startswith(("train.tokens", "model.n_layer", "model.d_model"))] + TINY_TRAIN
        args += ["runtime.progress_bar=false"]
    if args[:2] == ["sweep", "run"]:
        args += ["--no-progress"]
    if args[:1] in (["fit"], ["report"]):
        args += ["--n-boot", "100"]  # the tour's numbers are not checked here, only that the commands work
    return args


def test_the_readme_tour_runs_top_to_bottom_in_an_empty_folder(tmp_path, smoke_results):
    commands = tour_commands()
    assert len(commands) >= 10 and commands[0].startswith("attnres demo"), commands
    study = tiny_study_grid(tmp_path)
    work = tmp_path / "clone"
    # the demo's runs: the smoke grid's, trained once for the session (tests/test_demo.py trains its own), so the
    # demo here fits and reports what is done, as its second run does
    shutil.copytree(smoke_results, work / "results")
    for command in commands:
        # the demo on the smoke grid writes results/smoke, not results/demo: the tour's later commands name demo
        args = [a.replace("results/demo", "results/smoke") if "results/demo" in a else a for a in tiny(command, study)]
        args = ["smoke" if (a == "demo" and i > 0) else a for i, a in enumerate(args)]
        proc = subprocess.run(
            [sys.executable, "-m", "attnres.cli", *args], cwd=work, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"{command!r} (run as {args}) exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert (work / "results" / "smoke-report" / "report.md").is_file()
