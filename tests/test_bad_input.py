"""Bad input ends every command with one line on stderr naming the field or file and the fix, exit status 2, before
any compute, with nothing written (the issue's tracebacks and silently accepted inputs, one case each)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from attnres.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.seq_len=64", "--no-progress"]


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")}


def refused(argv: list[str], folder: Path, capsys) -> str:
    """Run ``attnres ARGV`` in ``folder``; assert exit 2, one error line, nothing new in ``folder``; the line."""
    before = files_under(folder)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        code = main(argv)
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, err)
    # progress said before the bad input was met (a preparation's finished units) may come first
    assert [line for line in lines if ": error: " in line] == lines[-1:] and "Traceback" not in err, err
    assert files_under(folder) == before, sorted(map(str, files_under(folder) - before))
    return lines[-1]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["sweep", "run", "smoke", "--workers", "0"], "--workers must be at least 1, got 0"),
        (["sweep", "run", "smoke", "--workers", "-1"], "--workers must be at least 1, got -1"),
        (["sweep", "run", "smoke", "--threads", "0"], "--threads must be at least 1"),
        (["demo", "--grid", "smoke", "--workers", "0"], "--workers must be at least 1"),
        (["tune", "smoke", "--trials", "0"], "--trials must be at least 1, got 0"),
        (["sweep", "plan", "smoke", "--flops-per-s", "0"], "--flops-per-s must be a positive number"),
        (["sweep", "plan", "smoke", "--flops-per-s=-1e9"], "--flops-per-s must be a positive number"),
        (["sweep", "plan", "smoke", "--flops-per-s", "nan"], "--flops-per-s must be a positive number"),
        (["train", "--out", "run", "--results", "elsewhere", *TINY], "give one of them"),
        (["train", "train.tokens=1e30", *TINY], "train.tokens=1e+30, more than 1e+15"),
        (["train", "train.flops=1e40", *TINY], "train.flops=1e+40 is"),
        (["data", "prepare", "builtin", "--tokenizer", "bpe:100000000", "--out", "tokens"], "from 260 to 1,048,576"),
    ],
)
def test_a_bad_option_is_one_line_before_anything_is_written(tmp_path, capsys, argv, words):
    line = refused(argv, tmp_path, capsys)
    assert words in line, line
    assert line.startswith(f"attnres {argv[0]}: error: "), line


def test_a_grid_saved_as_utf16_is_named_with_the_fix(tmp_path, capsys):
    grid = tmp_path / "mine.yaml"
    grid.write_bytes((ROOT / "sweeps" / "smoke.yaml").read_text().encode("utf-16"))
    for command in (["sweep", "plan"], ["sweep", "run"], ["sweep", "status"], ["tune"]):
        line = refused([*command, str(grid)], tmp_path, capsys)
        assert f"{str(grid)!r} is UTF-16 text" in line and "save it as UTF-8" in line, line


def test_a_config_file_in_latin1_is_named_too(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_bytes("# r\xe9sum\xe9\nmodel: {n_layer: 2}\n".encode("latin-1"))
    line = refused(["train", str(config), *TINY], tmp_path, capsys)
    assert "is not UTF-8 text (byte 3 cannot be read as UTF-8); save it as UTF-8" in line, line


@pytest.mark.parametrize("name", ["mine-tune", "mine-trunk"])
def test_a_grid_named_like_the_sweeps_tuning_and_trunks_write_is_refused_at_load(tmp_path, capsys, name):
    """`attnres fit` skips <sweep>-tune and <sweep>-trunk: such a grid would train and then vanish from the fit."""
    text = (ROOT / "sweeps" / "smoke.yaml").read_text()
    grid = tmp_path / "grid.yaml"
    grid.write_text("\n".join(f"name: {name}" if line.startswith("name:") else line for line in text.splitlines()))
    for command in (["sweep", "plan"], ["sweep", "run"]):
        line = refused([*command, str(grid)], tmp_path, capsys)
        assert f"{name!r} ends in '-{name.split('-')[1]}'" in line and "rename the grid" in line, line


# ------------------------------------------------------------------------------------------------- data
BUILTIN = ROOT / "attnres" / "data" / "builtin"


def test_a_file_named_gz_that_is_not_gzip_is_refused_before_a_folder_is_made(tmp_path, capsys):
    (tmp_path / "notes.txt.gz").write_text("plain text, not gzip\n" * 100)
    line = refused(["data", "prepare", "notes.txt.gz", "--out", "tokens"], tmp_path, capsys)
    assert "notes.txt.gz: not a gzip file, though it is named .gz" in line, line


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_truncated_gz_is_one_line_and_leaves_no_folder(tmp_path, capsys, workers):
    """Found only by reading to the end: the folder the preparation began is removed with the error."""
    data = (BUILTIN / "kjv.txt.gz").read_bytes()
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("a small first file, whole\n" * 2000)
    (tmp_path / "corpus" / "b.txt.gz").write_bytes(data[: len(data) // 2])
    argv = ["data", "prepare", "corpus", "--out", "out/tokens", "--workers", workers, "--unit-mib", "0.01"]
    line = refused([*argv, "--no-progress"], tmp_path, capsys)
    assert "b.txt.gz: the gzip stream ends early (a truncated file)" in line, line


def test_a_null_row_in_a_parquet_source_is_named(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"document {i}: " + "words and more words\n" * 40 for i in range(300)]
    texts[123] = None
    pq.write_table(pa.table({"text": texts}), tmp_path / "docs.parquet")
    line = refused(["data", "prepare", "docs.parquet", "--out", "tokens", "--no-progress"], tmp_path, capsys)
    assert "docs.parquet: column 'text' is null in 1 row(s) from row 123 on; drop or fill those rows" in line, line


def test_a_tokenizer_written_out_must_match_the_prepared_folder_even_at_its_default(tmp_path, capsys):
    """data.tokenizer=bytes on a BPE folder: bytes is the default, and was taken as 'not given'."""
    (tmp_path / "text.txt").write_text("".join(f"line {i} of some text to learn merges from\n" for i in range(4000)))
    assert (
        main(
            [
                "data",
                "prepare",
                str(tmp_path / "text.txt"),
                "--tokenizer",
                "bpe:300",
                "--out",
                str(tmp_path / "bpe"),
                "--no-progress",
            ]
        )
        == 0
    )
    capsys.readouterr()
    line = refused(["train", "data.corpus=bpe", "data.tokenizer=bytes", *TINY], tmp_path, capsys)
    assert "data.tokenizer='bytes', but" in line and "was prepared with 'bpe:300'" in line, line


# ------------------------------------------------------------------------------------------------- results
@contextlib.contextmanager
def mounted_tmpfs(folder: Path, options: str):
    """A tmpfs at ``folder`` (root only: a read-only or a tiny file system, as a user meets them); skips elsewhere."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def read_only(tmp_path):
    """A read-only folder: chmod for a user (root ignores it), a read-only tmpfs for root."""
    folder = tmp_path / "ro"
    if os.geteuid() != 0:
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    with mounted_tmpfs(folder, "ro,size=1m") as mounted:
        yield mounted


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "run", "smoke", "--results", "ro/new"],
        ["sweep", "run", "smoke", "--results", "ro"],
        ["demo", "--grid", "smoke", "--results", "ro", "--no-progress"],
        ["demo", "--grid", "smoke", "--out", "ro/report", "--no-progress"],
    ],
)
def test_a_read_only_results_folder_is_one_line_before_any_training(tmp_path, capsys, read_only, argv):
    line = refused(argv, tmp_path, capsys)
    assert "ro" in line and ("read-only file system" in line or "no permission" in line), line


def test_a_full_disk_is_one_line_naming_the_file_and_the_fix(tmp_path, capsys):
    """ENOSPC names no file; the line says which write it stopped and what to do."""
    with mounted_tmpfs(tmp_path / "small", "size=64k"):
        (tmp_path / "small" / "filler").write_bytes(b"\0" * 60_000)
        argv = ["data", "prepare", str(BUILTIN / "kjv.txt.gz"), "--out", str(tmp_path / "small" / "tokens")]
        code = main([*argv, "--no-progress"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert "No space left on device; free some space and run the same command again" in err[0], err
        assert str(tmp_path / "small" / "tokens") in err[0], err


def test_a_run_parquet_column_of_another_type_is_a_problem_not_a_traceback(tmp_path, capsys):
    """flops saved as text: the run is listed as unreadable by fit and report, never summed as a string."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.synthetic_results import write_synthetic_results

    tree = write_synthetic_results(tmp_path / "results", multipliers={"baseline": 1.0, "block": 1.2}, tables=False)
    victim = sorted(tree.root.rglob("run.parquet"))[0]
    table = pq.read_table(victim)
    index = table.schema.get_field_index("flops")
    table = table.set_column(
        index, pa.field("flops", pa.string()), pa.array([str(v) for v in table["flops"].to_pylist()])
    )
    pq.write_table(table, victim)
    code = main(["fit", str(tree.root), "--n-boot", "20"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in err, err
    assert "flops is string, not double" in out and "INCOMPLETE" in out, out


def test_one_run_in_two_folders_is_named_before_the_fit(tmp_path, capsys):
    """A sweep folder copied under another name: every run would be fitted twice."""
    from tests.synthetic_results import write_synthetic_results

    tree = write_synthetic_results(tmp_path / "results", multipliers={"baseline": 1.0, "block": 1.2}, tables=False)
    sweep = next(p for p in tree.root.iterdir() if p.is_dir())
    shutil.copytree(sweep, tree.root / "copy")
    for command in (["fit", str(tree.root)], ["report", str(tree.root), "--out", str(tmp_path / "report")]):
        line = refused([*command, "--n-boot", "20"], tmp_path, capsys)
        assert f"of sweep {sweep.name} is in 2 folders (copy/" in line, line
        assert "more run(s) are too: it would count more than once; move the copies out" in line, line


# ------------------------------------------------------------------------------------------------- the machine
@pytest.mark.parametrize("name", ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "LOCAL_RANK"])
def test_a_junk_rank_or_slurm_variable_is_named_before_lightning_reads_it(tmp_path, capsys, monkeypatch, name):
    monkeypatch.setenv(name, "foo")
    monkeypatch.setenv("SLURM_JOB_NAME", "job")
    for argv in (["train", *TINY, "train.tokens=4000"], ["sweep", "run", "smoke"], ["demo", "--grid", "smoke"]):
        line = refused(argv, tmp_path, capsys)
        assert f"environment variable {name}='foo' is not a non-negative integer" in line, line
        assert f"unset {name}" in line, line


def test_a_model_too_large_for_this_machine_is_refused_before_it_starts(tmp_path, capsys):
    """No runtime.device_memory_gb on CPU: the machine's available memory is the limit (it was a 12 GB allocation
    failing after the run had started)."""
    line = refused(
        ["train", "model.n_layer=2", "model.d_model=32768", "model.n_head=2", "--no-progress"], tmp_path, capsys
    )
    assert "for its weights, gradients and AdamW state alone" in line, line
    assert "GiB this machine has available (set runtime.device_memory_gb to check another)" in line, line


def test_activations_beyond_the_machine_are_simulated_and_the_fitting_setting_named(monkeypatch):
    """A run whose weights fit but whose activations do not: the simulation finds the micro-batch that fits."""
    from attnres.config import resolve_run_config
    from attnres.training import memory

    cfg = resolve_run_config(None, ["model.n_layer=2", "model.d_model=64", "model.n_head=2", "model.seq_len=512"])
    peak = memory.estimate(cfg, gpu=False).peak
    monkeypatch.setattr(memory, "available_memory_gib", lambda: 0.6 * peak / memory.GIB)
    problem = memory.fit_problem(cfg, gpu=False, devices=1)
    assert problem and "this machine has available" in problem and "set train.micro_batch_size=" in problem, problem
    monkeypatch.setattr(memory, "available_memory_gib", lambda: 1000.0)
    assert memory.fit_problem(cfg, gpu=False, devices=1) is None


def test_overrides_after_an_option_are_read_as_overrides(tmp_path, capsys):
    """argparse ends a positional list at the first option: `train --no-progress key=value` was 'unrecognized'."""
    line = refused(["train", "--no-progress", "train.tokens=1e30", "model.n_layer=2"], tmp_path, capsys)
    assert "train.tokens=1e+30, more than 1e+15" in line, line
    line = refused(["sweep", "plan", "smoke", "--launcher", "local", "train.tokens=-3"], tmp_path, capsys)
    assert "TrainConfig.tokens must be positive, got -3" in line, line


def test_a_tokenizer_written_out_for_a_sweep_must_match_the_prepared_folder(tmp_path, capsys):
    (tmp_path / "text.txt").write_text("".join(f"line {i} of some text to learn merges from\n" for i in range(4000)))
    argv = ["data", "prepare", str(tmp_path / "text.txt"), "--tokenizer", "bpe:300", "--out", str(tmp_path / "bpe")]
    assert main([*argv, "--no-progress"]) == 0
    capsys.readouterr()
    for command in (["sweep", "plan"], ["sweep", "run"]):
        line = refused([*command, "smoke", "data.corpus=bpe", "data.tokenizer=bytes"], tmp_path, capsys)
        assert "data.tokenizer='bytes', but" in line and "was prepared with 'bpe:300'" in line, line
