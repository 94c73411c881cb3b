"""The README's tour, top to bottom, in an empty folder as on a fresh clone: every command exits 0.

The commands are read from README.md ("A tour"), so the test follows the README as it changes. Where a command
would train for minutes, it runs on tiny settings instead: the demo on the smoke grid (its runs copied from the
session's `smoke_results`, so it fits and reports them), the study's grid (cpu_small) replaced by a grid of the same
shape (lr tuned on the baseline, a tune section) at the smoke grid's size, and `attnres train` with a tiny model
and budget.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration  # the integration tier: pytest -m integration (.ci/run's second step)

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
        # `attnres generate results/demo/<run_id>`: the README's placeholder is one of the demo's runs
        runs = sorted(p.parent.parent.name for p in (work / "results" / "smoke").glob("*/checkpoints/last.ckpt"))
        args = [a.replace("<run_id>", runs[0]) if "<run_id>" in a else a for a in args]
        proc = subprocess.run(
            [sys.executable, "-m", "attnres.cli", *args], cwd=work, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"{command!r} (run as {args}) exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert (work / "results" / "smoke-report" / "report.md").is_file()
    assert_ignored(work)


def assert_ignored(work: Path) -> None:
    """Everything the commands wrote in the clone is ignored by its .gitignore: `git status` stays clean (the tour
    left untracked tokens/ and report/ folders)."""
    for entry in sorted(work.iterdir()):
        name = entry.name + ("/" if entry.is_dir() else "")
        ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", name])
        assert ignored.returncode == 0, f"{name} is written by the tour but not in .gitignore"


# ------------------------------------------------------------------------------------------------- the docs
# Commands in the docs that cannot run here, and why: templates (SOURCE, DIR, [options], ...) and cluster paths.
NOT_HERE = ("SOURCE", "DIR", "[", "...", "/data/", "/shared/", "--launcher slurm")


def docs_commands() -> list[tuple[str, str]]:
    """(doc, command) for every ``attnres`` or ``python -m`` line of the docs' quick starts (indented or ```bash
    blocks), in order, comments dropped; templates and cluster commands left out (NOT_HERE)."""
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text()
        blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
        blocks += [m.group(0) for m in re.finditer(r"(?:^    \S.*\n)+", text, flags=re.M)]  # indented blocks
        for block in blocks:
            for line in block.splitlines():
                command = re.split(r"\s+#\s", line)[0].strip()
                if command.startswith(("attnres ", "python -m ")) and not any(t in command for t in NOT_HERE):
                    found.append((doc.name, command))
    return found


def demo_like_results(folder: Path) -> Path:
    """A results tree with a sweep named demo of the shape `attnres fit` and `report` are shown on (several budgets
    per variant), written from a known law in a second rather than trained; ``folder`` is the clone."""
    from tests.synthetic_results import write_synthetic_results

    write_synthetic_results(
        folder / "results", sweep="demo", multipliers={"baseline": 1.0, "full": 1.1, "block": 1.2}, noise=0.003
    )
    return folder


@pytest.mark.slow  # several minutes of fits and reports at the docs' bootstrap sizes: pytest -m slow
def test_the_docs_commands_run_in_an_empty_folder(tmp_path, smoke_results):
    """fit and report on a demo-like tree; the sweep commands on the smoke grid's runs (as the tour does)."""
    commands = docs_commands()
    names = {doc for doc, _ in commands}
    assert {"analysis.md", "reports.md", "sweeps.md", "training.md"} <= names and len(commands) >= 12, commands
    study = tiny_study_grid(tmp_path)
    work = tmp_path / "clone"
    shutil.copytree(smoke_results, work / "results")
    fits = demo_like_results(tmp_path / "fits")
    for doc, command in commands:
        command = command.replace("python -m analysis ", "attnres ").replace("python -m reports.cli ", "attnres ")
        args = ["100" if a == "2000" else a for a in tiny(command, study)]  # the numbers are not checked here
        if args[:1] in (["fit"], ["report"]) and "--n-boot" not in args:
            args += ["--n-boot", "100"]
        proc = subprocess.run(
            [sys.executable, "-m", "attnres.cli", *args],
            cwd=fits if args[:1] in (["fit"], ["report"]) else work,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, (
            f"{doc}: {command!r} (run as {args}) exited {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    assert_ignored(work)
    assert_ignored(fits)


def python_snippets() -> list[tuple[str, str]]:
    """(where, code) of every ```python block of the README and the docs."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for m in re.finditer(r"```python\n(.*?)```", text, flags=re.S):
            found.append((f"{doc.name}:{text[: m.start()].count(chr(10)) + 1}", m.group(1)))
    return found


# snippets that need what a laptop does not have
NOT_RUN = {"sweeps.md": "a corpus at /data/text.txt and a SLURM cluster (submit_grid)"}


@pytest.mark.slow
def test_the_python_snippets_run_as_written_and_print_what_they_say(tmp_path):
    """Each snippet in a fresh interpreter, in a folder whose results/ holds a demo sweep (demo_like_results); a
    ``print(...)  # "text"`` line must print that text."""
    snippets = [(where, code) for where, code in python_snippets() if where.split(":")[0] not in NOT_RUN]
    assert len(snippets) >= 4, [w for w, _ in snippets]  # README's model snippet and docs' three (2026-12-05)
    work = demo_like_results(tmp_path / "clone")
    for where, code in snippets:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)},
        )
        assert proc.returncode == 0, f"{where} failed:\n{code}\n{proc.stderr[-3000:]}"
        for said in re.findall(r"^print\(.*\)\s+#\s+\"(.*)\"$", code, flags=re.M):
            if "..." not in said and "(" not in said:  # an exact value, not a sketch of one
                assert said in proc.stdout, f"{where}: printed {proc.stdout!r}, the comment says {said!r}"
