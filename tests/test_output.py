"""What the commands print: progress bars on a terminal only (plain lines in a log), warnings as one line of text."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.cli_helpers import attnres
from tests.synthetic_results import write_synthetic_results

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def terminal(columns: int, rows: int = 24) -> Iterator[TextIO]:
    """A real terminal (a pseudo-terminal's end) that reports ``columns`` x ``rows``, as a text stream."""
    import fcntl
    import pty
    import struct
    import termios

    main, end = pty.openpty()
    fcntl.ioctl(end, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    stream = os.fdopen(end, "w")
    try:
        yield stream
    finally:
        stream.close()
        os.close(main)


def test_the_sweep_bar_is_drawn_on_a_terminal_only(monkeypatch):
    """Redirected, a bar is thousands of carriage-return updates in the log (4,106 in one demo's)."""
    import sweeps.local_pool as pool

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert pool._progress(100, 0, "demo", enabled=True) is None
    with terminal(80) as tty:
        monkeypatch.setattr(sys, "stderr", tty)
        bar = pool._progress(100, 0, "demo", enabled=True)
        assert bar is not None and bar.total == 100
        bar.close()
        assert pool._progress(100, 0, "demo", enabled=False) is None


def test_a_runs_bar_is_drawn_on_a_terminal_only(monkeypatch):
    from attnres.training.run import progress_bar

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert progress_bar(True) is False  # the run then writes a plain line per log_interval
    with terminal(80) as tty:
        monkeypatch.setattr(sys, "stderr", tty)
        assert progress_bar(True) is True and progress_bar(False) is False


def test_a_terminal_that_reports_0_columns_gets_plain_lines(monkeypatch):
    """tqdm on a TTY of 0 columns (an unsized pseudo-terminal) draws nothing for the whole run: the width it takes is
    the columns less one, and every line beyond the rows is hidden. Such a terminal gets a log's plain lines."""
    import sweeps.local_pool as pool
    from attnres.data.progress import PrepareProgress
    from attnres.runtime import terminal_ok
    from attnres.training.run import progress_bar

    for columns, rows in ((0, 0), (0, 24), (80, 0)):
        with terminal(columns, rows) as tty:
            assert tty.isatty() and not terminal_ok(tty)
            monkeypatch.setattr(sys, "stderr", tty)
            assert progress_bar(True) is False  # Lightning's bar: off, the run's plain lines instead
            assert pool._progress(100, 0, "demo", enabled=True) is None  # a sweep: one line per finished run
            assert PrepareProgress(100, 1, 0).bar is None  # a preparation: one line per finished unit
    with terminal(80) as tty:
        assert terminal_ok(tty)
    assert not terminal_ok(io.StringIO())


def test_train_redirected_writes_plain_lines_and_no_bar(tmp_path):
    tiny = ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.seq_len=64", "model.residual=baseline"]
    proc = attnres("train", *tiny, "train.tokens=20000", "--out", tmp_path / "run")  # stdout and stderr: not a tty
    assert proc.returncode == 0, proc.stderr
    both = proc.stdout + proc.stderr
    assert "\r" not in both and "it/s" not in both, both[-2000:]
    assert "step 10/20  tokens" in proc.stdout, proc.stdout


def test_a_warning_is_one_line_of_text_without_the_source_line(tmp_path):
    """`analysis/data/select.py:76: UserWarning: ...` and the source line under it: one line, what is wrong."""
    tree = write_synthetic_results(tmp_path / "results", multipliers={"baseline": 1.0, "block": 1.2}, tables=False)
    victim = sorted(tree.root.rglob("run.parquet"))[0]
    table = pq.read_table(victim)
    index = table.schema.get_field_index("val_loss")
    table = table.set_column(index, table.schema.field(index), pa.array([None], pa.float64()))
    pq.write_table(table, victim)
    proc = attnres("fit", tree.root, "--n-boot", "20")
    warned = [line for line in proc.stderr.splitlines() if "dropped 1 finished run(s)" in line]
    # once: the fit chooses the sweep's points for each of its analyses, and said it 4 times
    assert len(warned) == 1 and warned[0].startswith("attnres fit: warning: dropped 1 finished run(s)"), proc.stderr
    assert ".py:" not in proc.stderr and "warnings.warn" not in proc.stderr, proc.stderr


def test_warnings_print_as_one_line(capsys):
    import warnings

    from attnres.runtime import one_line_warnings

    saved = warnings.showwarning
    try:
        one_line_warnings("attnres x")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("two\n  lines", stacklevel=1)
            warnings.warn("numbers went wrong", RuntimeWarning, stacklevel=1)
    finally:
        warnings.showwarning = saved
    assert capsys.readouterr().err.splitlines() == [
        "attnres x: warning: two lines",
        "attnres x: warning: numbers went wrong (RuntimeWarning)",
    ]


def test_a_warning_said_again_is_printed_once(capsys):
    import warnings

    from attnres.runtime import one_line_warnings

    saved = warnings.showwarning
    try:
        one_line_warnings("attnres fit")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            for _ in range(4):
                warnings.warn("dropped 1 finished run(s) with a missing or invalid val_loss: r", stacklevel=1)
                warnings.warn("dropped 1 finished run(s) with a missing or invalid val_loss: r", RuntimeWarning, 1)
            warnings.warn("dropped 2 finished run(s)", stacklevel=1)
    finally:
        warnings.showwarning = saved
    assert capsys.readouterr().err.splitlines() == [
        "attnres fit: warning: dropped 1 finished run(s) with a missing or invalid val_loss: r",
        "attnres fit: warning: dropped 1 finished run(s) with a missing or invalid val_loss: r (RuntimeWarning)",
        "attnres fit: warning: dropped 2 finished run(s)",
    ]


def test_an_unreliable_interval_is_never_shown_without_its_mark(tmp_path):
    """Four budgets: the bootstrap over budgets is not calibrated (analysis.estimates.multiplier.MIN_BUDGETS), and the
    scaling figure's box and the report's headline table showed "1.02 [1, 1.03]" bare."""
    import numpy as np

    import analysis
    import reports

    tree = write_synthetic_results(
        tmp_path / "results",
        sweep="few",
        multipliers={"baseline": 1.0, "block": 1.2},
        budgets=np.geomspace(1e15, 1e18, 4),
        noise=0.002,
        tables=False,
    )
    results = analysis.load_results(tree.root, tables=())
    fit = analysis.fit_results(results, n_boot=50)
    (m,) = fit.sweep("few").multipliers
    assert not m.reliable, m.why
    fig = reports.plot_scaling_curves(fit, "few", runs=results.runs)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    line = next(line for text in texts for line in text.splitlines() if ": M = " in line)
    assert line.endswith("(unreliable)"), texts
    summary = reports.build_report(results, tmp_path / "report", formats=("png",), html=False, n_boot=50)
    table = [row for row in summary.report_md.read_text().splitlines() if row.startswith("| few |")]
    assert table and "(unreliable)" in table[0], table


class StoppedAfterAWrite(io.StringIO):
    """A stream whose first write lands and is followed by SIGTERM's :class:`Terminated`: Python runs a signal's
    handler after each write that reaches a file, so a stop lands between two writes of one ``print``."""

    def write(self, text: str) -> int:
        super().write(text)
        import signal

        from attnres.runtime import Terminated

        raise Terminated(signal.SIGTERM)


def test_a_line_printed_while_work_runs_is_whole_when_a_stop_lands_after_its_write(monkeypatch):
    """The CLI's "stopped by SIGTERM" line once continued a half-printed progress line ("... 126.35M tok/sattnres
    data: stopped by SIGTERM ...", CI 2026-12-07): print() writes the text and its newline apart."""
    from attnres.data.progress import PrepareProgress
    from attnres.runtime import Terminated, say

    stream = StoppedAfterAWrite()
    with pytest.raises(Terminated):
        print("a progress line", file=stream)
    assert stream.getvalue() == "a progress line"  # the failure this guards against: print's newline is lost

    shows = {
        "say": lambda: say("a progress line"),
        "a unit's line": lambda: PrepareProgress(2**20, 2, 0, bar=False).unit_done({"unit": 0}),
    }
    for name, show in shows.items():
        stream = StoppedAfterAWrite()
        monkeypatch.setattr(sys, "stderr", stream)
        with pytest.raises(Terminated):
            show()
        monkeypatch.undo()
        assert stream.getvalue().count("\n") == 1 and stream.getvalue().endswith("\n"), (name, stream.getvalue())


def test_the_requeue_signal_holds_when_its_line_cannot_be_printed(monkeypatch):
    """SIGUSR1's handler prints a line; arriving in the middle of a write to stdout, that print raises "reentrant
    call". The request to checkpoint and requeue must hold all the same (it was set after the print)."""
    import signal

    from sweeps.requeue import requeue_callback

    class MidWrite(io.StringIO):
        def write(self, text: str) -> int:
            raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stdout>'>")

    saved = signal.getsignal(signal.SIGUSR1)
    try:
        callback = requeue_callback()
        assert callback is not None  # pytest runs tests in the main thread
        monkeypatch.setattr(sys, "stdout", MidWrite())
        callback.on_signal(signal.SIGUSR1, None)
        assert callback.requested
    finally:
        signal.signal(signal.SIGUSR1, saved)
