"""`attnres sweep status` between two writes of a run's run.parquet: the step comes from the run's log."""

from __future__ import annotations

from attnres.storage import schema
from sweeps.status import folder_state, logged_step

LOG = """step 1300/4162  tokens 2,662,400  loss 1.6093  lr 7.07e-03  tok/s 4,898  eta 20m
step 1325/4162  tokens 2,713,600  loss 1.7506  lr 7.07e-03  tok/s 4,898  eta 20m
"""


def write_row(run_dir, status: str, step: int) -> None:
    """The run.parquet row of a d48 x 24 trunk (the fields the contract requires), at ``step``."""
    row = {"schema_version": schema.SCHEMA_VERSION, "run_id": run_dir.name, "sweep": "cpu_depth-trunk"}
    row |= {"variant": "baseline", "n_layer": 24, "d_model": 48, "n_head": 3, "seq_len": 128, "vocab_size": 256}
    row |= {"params": 666_000, "params_total": 690_000, "tokens": 8_523_776, "flops": 5.1e13, "flops_per_token": 6e6}
    row |= {"flops_convention": "6N+attn", "lr": 7.07e-3, "batch_tokens": 2048, "seed": 0, "status": status}
    row |= {"step": step, "max_steps": 4162, "tokens_seen": step * 2048}
    schema.write_table(run_dir / schema.RUN_FILE, schema.to_table([row], schema.RUN_SCHEMA))


def test_an_interrupted_trunk_reports_the_step_its_log_reached_not_its_first_row(tmp_path):
    """A WSD trunk writes run.parquet at its start (step 0) and next at its end; stopped at step 1325 its status
    said "at step 0/4162". The log's last plain line says where it was; a run.parquet further on wins over an old
    log, and a done run keeps its row's step."""
    run = tmp_path / "baseline-L24-d48-s0-abc"
    run.mkdir()
    write_row(run, "running", 0)
    assert logged_step(run) is None  # no log yet
    state = folder_state(run, "L24-d48", "baseline", None)
    assert state.state == "interrupted" and state.step == 0 and "at step 0/4162" in state.detail
    (run / "train.log").write_text("attnres: building the CPU kernels\n" + LOG + "Traceback (most recent call last):\n")
    assert logged_step(run) == 1325
    state = folder_state(run, "L24-d48", "baseline", None)
    assert state.step == 1325 and "at step 1325/4162" in state.detail, state
    write_row(run, "running", 2000)  # a checkpoint's row after the log's last line
    assert folder_state(run, "L24-d48", "baseline", None).step == 2000
    write_row(run, "done", 4162)
    (run / "train.log").write_text(LOG)
    assert folder_state(run, "L24-d48", "baseline", None).step == 4162
