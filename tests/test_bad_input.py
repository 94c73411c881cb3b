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


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_disk_that_fills_mid_shard_names_the_shard_and_leaves_no_temporary_files(tmp_path, capsys, workers):
    """A shard's write on a full disk named no file, and left its .tmp shards (as much as the disk took) behind."""
    with mounted_tmpfs(tmp_path / "small", "size=1m"):
        out = tmp_path / "small" / "tokens"
        argv = ["data", "prepare", str(BUILTIN / "kjv.txt.gz"), "--out", str(out), "--workers", workers]
        code = main([*argv, "--unit-mib", "2", "--no-progress"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert f"cannot write or read {out}/train-00000.bin: No space left on device; free some space" in err[0], err
        assert not [p.name for p in out.rglob("*.tmp")], sorted(p.name for p in out.rglob("*"))


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


# ------------------------------------------------------------------------------------------------- issue 54's last ones
def without_slurm(monkeypatch) -> None:
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        monkeypatch.delenv(name)


def test_slurm_variables_outside_a_job_are_one_line_and_leave_no_run_folder(tmp_path, capsys, monkeypatch):
    """SLURM_NTASKS=2 SLURM_JOB_ID=999 outside a job: Lightning's 33-line traceback after 34.6 s, and a run folder."""
    without_slurm(monkeypatch)
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_JOB_ID", "999")
    for argv in (["train", *TINY, "train.tokens=4000"], ["sweep", "run", "smoke"], ["demo", "--grid", "smoke"]):
        line = refused(argv, tmp_path, capsys)
        assert "SLURM_NTASKS=2 says this is one of 2 SLURM tasks, but SLURM_NTASKS_PER_NODE is not set" in line, line
        assert "unset the SLURM variables" in line and "runtime.devices x runtime.num_nodes = 1 x 1" in line, line
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")  # Lightning leaves SLURM alone: so does the check
    from attnres.config import RuntimeConfig
    from attnres.runtime import check_slurm

    check_slurm(RuntimeConfig())


def test_slurm_tasks_that_do_not_match_the_run_are_named():
    from attnres.config import ConfigError, RuntimeConfig
    from attnres.runtime import check_slurm

    job = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    two_nodes = {**job, "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_NNODES": "2"}
    check_slurm(RuntimeConfig(devices=1, num_nodes=2), two_nodes)  # the two-node test's job: as it should be
    check_slurm(RuntimeConfig(), {**job, "SLURM_NTASKS": "1"})  # a tuner's one task
    check_slurm(RuntimeConfig(), {**job, "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "4"})  # a batch script's
    check_slurm(RuntimeConfig(devices=2), {})  # no SLURM: DDP over local processes
    with pytest.raises(ConfigError, match=r"do not match the run \(SLURM_NTASKS=2; SLURM_NTASKS_PER_NODE=2\)"):
        check_slurm(RuntimeConfig(devices=4), {**job, "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2"})
    with pytest.raises(ConfigError, match=r"SLURM_NNODES=1\): the run trains on .* = 1 x 2 = 2 devices"):
        check_slurm(RuntimeConfig(num_nodes=2), {**two_nodes, "SLURM_NNODES": "1"})
    with pytest.raises(ConfigError, match="no SLURM_PROCID/SLURM_LOCALID/SLURM_NODEID"):
        check_slurm(RuntimeConfig(devices=2), {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2"})
    with pytest.raises(ConfigError, match="this is SLURM task 1 of 2 .* every task would train the same run"):
        check_slurm(RuntimeConfig(), {**job, "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2"})


@pytest.mark.parametrize("value", ["banana", "off", "true", ""])
def test_attnres_native_takes_its_documented_values_only(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("ATTNRES_NATIVE", value)
    line = refused(["train", *TINY, "train.tokens=4000"], tmp_path, capsys)
    assert f"ATTNRES_NATIVE={value!r} is not one of 0, 1" in line and "unset ATTNRES_NATIVE" in line, line
    from attnres.runtime import check_environment

    for good in ("0", "1"):
        check_environment({"ATTNRES_NATIVE": good})


@pytest.mark.parametrize(
    "argv",
    [
        ["train", *TINY, "--results", ""],
        ["train", *TINY, "--out", " "],
        ["sweep", "run", "smoke", "--results", ""],
        ["sweep", "status", "smoke", "--results", ""],
        ["demo", "--grid", "smoke", "--results", ""],
        ["data", "prepare", "builtin", "--out", ""],
    ],
)
def test_an_empty_results_or_out_path_is_refused(tmp_path, capsys, argv):
    """`--results ''` was read as no --results (train: ./results) or as the current folder."""
    line = refused(argv, tmp_path, capsys)
    option = "--results" if "--results" in argv else "--out"
    assert f"{option} '{argv[argv.index(option) + 1]}' is an empty path; give one, or leave {option} out" in line, line


def smoke_grid(tmp_path: Path, edit) -> Path:  # noqa: ANN001
    import yaml

    grid = yaml.safe_load((ROOT / "sweeps" / "smoke.yaml").read_text())
    edit(grid)
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    return path


def test_an_empty_grid_name_is_refused(tmp_path, capsys):
    """name: "" fell back to the file's name without a word."""
    grid = smoke_grid(tmp_path, lambda g: g.update(name=""))
    for command in (["sweep", "plan"], ["sweep", "run"], ["sweep", "status"]):
        line = refused([*command, str(grid)], tmp_path, capsys)
        assert "name: '' is empty; give the sweep a name" in line and "the file's name (mine)" in line, line


def test_numbers_written_as_quoted_text_in_a_grid_are_refused(tmp_path, capsys):
    """depths: "2" was read as [2]; seeds: "0" as [0]."""
    text = (ROOT / "sweeps" / "smoke.yaml").read_text()
    grid = tmp_path / "mine.yaml"
    grid.write_text(text.replace("depths: [2]", 'depths: "2"'))
    assert 'depths: "2"' in grid.read_text()
    line = refused(["sweep", "plan", str(grid)], tmp_path, capsys)
    assert "ladder.depths must be integers, not the text '2': write it without quotes" in line, line
    grid.write_text(text.replace("seeds: [0]", "seeds: '0'"))
    assert "seeds: '0'" in grid.read_text()
    line = refused(["sweep", "plan", str(grid)], tmp_path, capsys)
    assert "seeds must be integers, not the text '0'" in line, line
    # an unquoted 2e6 is text to YAML too, and stays the number it spells
    grid.write_text(text.replace("tokens_per_param: [1, 2]", "tokens: [2e6]"))
    assert "tokens: [2e6]" in grid.read_text()
    assert main(["sweep", "plan", str(grid)]) == 0
    assert "2M" in capsys.readouterr().out


def test_a_key_given_twice_in_a_yaml_file_is_refused_with_the_key_and_lines(tmp_path, capsys):
    """YAML keeps the last of two equal keys without a word."""
    text = (ROOT / "sweeps" / "smoke.yaml").read_text()
    grid = tmp_path / "mine.yaml"
    grid.write_text(text + "seeds: [5]\n")
    first = 1 + next(i for i, line in enumerate(text.splitlines()) if line.startswith("seeds:"))
    for command in (["sweep", "plan"], ["sweep", "run"], ["tune"]):
        line = refused([*command, str(grid)], tmp_path, capsys)
        assert f"key 'seeds' is given twice in one mapping (lines {first} and {len(text.splitlines()) + 1})" in line
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  n_layer: 2\ntrain: {lr: 1.0e-3, lr: 3.0e-3}\n")
    line = refused(["train", str(config), *TINY], tmp_path, capsys)
    assert "key 'lr' is given twice in one mapping (both on line 3)" in line and "remove one of them" in line, line
    from attnres.config import load_yaml

    merged = tmp_path / "merge.yaml"  # a merge key may repeat what it merges: that is not a duplicate
    merged.write_text("base: &b {n_layer: 2, d_model: 32}\nmodel:\n  <<: *b\n  n_layer: 3\n")
    assert load_yaml(merged)["model"] == {"n_layer": 3, "d_model": 32}


def test_a_grid_path_that_is_a_folder_or_a_device_is_called_what_it_is(tmp_path, capsys):
    (tmp_path / "grids").mkdir()
    (tmp_path / "grids" / "a.yaml").write_text("name: a\n")
    line = refused(["sweep", "plan", "grids"], tmp_path, capsys)
    assert "grid file 'grids' is a folder, not a grid file; give a YAML file (it holds a.yaml)" in line, line
    line = refused(["sweep", "run", "/dev/null"], tmp_path, capsys)
    assert "grid file '/dev/null' is a character device, not a grid file" in line, line
    line = refused(["train", "grids", *TINY], tmp_path, capsys)
    assert "config file 'grids' is a folder, not a file" in line, line


def test_a_data_source_that_is_a_device_is_called_one(tmp_path, capsys):
    """/dev/zero was called 'a folder with no .txt ... files in it'."""
    line = refused(["data", "prepare", "/dev/zero", "--out", "tokens"], tmp_path, capsys)
    assert "SOURCE='/dev/zero' is a character device, not a file or a folder" in line, line
    os.mkfifo(tmp_path / "pipe")
    line = refused(["train", "data.corpus=pipe", *TINY], tmp_path, capsys)
    assert "data.corpus='pipe' is a FIFO (named pipe), not a file or a folder" in line, line


def test_sweep_status_on_a_results_path_that_is_a_file_is_refused(tmp_path, capsys):
    """results/smoke as a file was read as an empty sweep folder: every run shown queued."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "smoke").write_text("not a folder\n")
    line = refused(["sweep", "status", "smoke"], tmp_path, capsys)
    assert "results/smoke is a file, not a folder" in line and "give another --results" in line, line
    (tmp_path / "flat").write_text("")
    for argv in (["sweep", "status", "--results", "flat"], ["sweep", "status", "smoke", "--results", "flat"]):
        line = refused(argv, tmp_path, capsys)
        assert "flat is a file, not a folder: the results folder holds run folders" in line, line


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["train.tokens=10"], "train.tokens=10, less than one batch (train.batch_size 16 x model.seq_len 64 = 1,024"),
        (["train.flops=1e6"], "tokens, less than one batch (train.batch_size 16 x model.seq_len 64 = 1,024 tokens)"),
        (["train.tokens=1023", "train.eval_tokens=8192"], "in one step and then evaluate 8,192; give a budget of at"),
    ],
)
def test_a_budget_below_one_batch_is_refused_with_the_numbers(tmp_path, capsys, argv, words):
    """train.tokens=10: one step of 1,024 tokens, then 138 s of evaluation."""
    line = refused(["train", *TINY, *argv], tmp_path, capsys)
    assert words in line, line
    from attnres.config import resolve_run_config
    from attnres.costs import run_budget

    assert run_budget(resolve_run_config(None, [*TINY[:-1], "train.tokens=1024"])).steps == 1  # one batch: fine


def test_a_run_parquet_whose_schema_version_column_disagrees_with_its_metadata_is_refused(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from attnres.storage import schema
    from tests.synthetic_results import write_synthetic_results

    tree = write_synthetic_results(tmp_path / "results", multipliers={"baseline": 1.0, "block": 1.2}, tables=False)
    victim = sorted(tree.root.rglob("run.parquet"))[0]
    table = pq.read_table(victim)
    index = table.schema.get_field_index("schema_version")
    table = table.set_column(index, table.schema.field(index), pa.array([1] * table.num_rows, pa.int32()))
    pq.write_table(table, victim)  # metadata still says 2
    with pytest.raises(schema.SchemaError, match="its schema_version column says 1, its file metadata says 2"):
        schema.read_table(victim)
    assert schema.read_run_row(victim.parent) is None
    code = main(["fit", str(tree.root), "--n-boot", "20"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in err, err
    assert "schema_version column says 1, its file metadata says 2" in out and "INCOMPLETE" in out, out


def test_a_ladder_beyond_this_machines_memory_is_named_by_the_plan(tmp_path, capsys, monkeypatch):
    """ladder: {depths: [2000]} planned 24.6T parameters and a time in years, with no word on memory."""
    import sweeps.plan

    monkeypatch.setattr(sweeps.plan, "available_memory_gib", lambda: 16.0)
    ladder = {"depths": [2000], "width_per_layer": 16, "head_dim": 16}
    grid = smoke_grid(tmp_path, lambda g: g.update(ladder=ladder, variants=["baseline"], budgets=[{"tokens": 1e9}]))
    assert main(["sweep", "plan", str(grid)]) == 0
    out = capsys.readouterr().out
    assert "warning: 1 run(s) will not fit in this machine's memory, and `attnres sweep run`" in out, out
    assert "baseline-L2000-d32000-s0-" in out and "for its weights, gradients and AdamW state alone" in out, out
    assert "more than 90% of the 16.0 GiB this machine has available" in out, out
    line = refused(["sweep", "run", str(grid)], tmp_path, capsys)  # and sweep run refuses it, as the plan says
    assert "will not fit in memory: baseline-L2000-d32000-s0-" in line, line
    small = smoke_grid(tmp_path, lambda g: None)
    assert main(["sweep", "plan", str(small)]) == 0
    assert "will not fit" not in capsys.readouterr().out
