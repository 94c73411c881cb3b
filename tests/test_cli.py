"""The ``attnres`` command as a shell user meets it: pipes, help."""

from __future__ import annotations

import subprocess
import sys

from tests.synthetic_results import write_synthetic_results


def test_a_closed_pipe_ends_the_command_quietly(tmp_path):
    """`attnres fit ... | head -1`: no BrokenPipeError traceback, the exit status of a command killed by SIGPIPE."""
    tree = write_synthetic_results(tmp_path / "results", multipliers={"baseline": 1.0, "block": 1.2}, tables=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnres.cli", "fit", str(tree.root), "--n-boot", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    first = proc.stdout.readline()
    proc.stdout.close()  # what head does after its line
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, stderr
    assert first.startswith("attnres fit") and "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def process_state() -> tuple:
    """What tests.cli_helpers.attnres promises to leave as it found it."""
    import logging
    import os
    import signal
    import warnings

    torch = sys.modules.get("torch")
    return (
        {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)},
        warnings.showwarning,
        list(warnings.filters),
        dict(os.environ),
        os.getcwd(),
        list(logging.getLogger().handlers),
        logging.getLogger("lightning.pytorch").level,
        torch.get_num_threads() if torch is not None else None,
    )


def test_the_in_process_command_returns_what_the_process_would(tmp_path, monkeypatch):
    """tests.cli_helpers.attnres, which the tests of a command's output use instead of a fresh process: argparse's
    exit status and usage, --version's, a command's own status and output (and its one-line warnings), and an
    uncaught exception as Python ends a process with it: status 1 and the traceback on stderr."""
    import analysis.cli
    from tests.cli_helpers import attnres

    missing = attnres("fit")
    assert missing.returncode == 2 and "usage: attnres fit" in missing.stderr and not missing.stdout
    version = attnres("--version")
    assert version.returncode == 0 and version.stdout.startswith("attnres "), version
    tree = write_synthetic_results(tmp_path / "results", multipliers={"baseline": 1.0, "block": 1.2}, tables=False)
    fit = attnres("fit", "results", "--n-boot", "20", cwd=tmp_path)  # a path relative to cwd
    assert fit.returncode == 0, fit.stderr
    assert fit.stdout.startswith("attnres fit") and (tree.root / "fit.json").is_file()
    empty = attnres("fit", tmp_path / "nothing-here")
    assert empty.returncode == 2 and empty.stderr.startswith("attnres fit: error:"), empty.stderr

    def broken(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(analysis.cli, "run", broken)
    crashed = attnres("fit", tree.root)
    assert crashed.returncode == 1 and "Traceback" in crashed.stderr and "RuntimeError: a bug" in crashed.stderr


def test_the_in_process_command_leaves_the_process_as_it_found_it(tmp_path):
    """A command takes over SIGTERM and SIGHUP and the warnings printer, a run sets warnings filters, Lightning's log
    level and torch's threads: none of it may reach the next test on the same worker."""
    import logging
    import os
    import signal
    import warnings

    import torch

    from tests.cli_helpers import attnres, process_state_restored

    before = process_state()
    tree = write_synthetic_results(tmp_path / "r", multipliers={"baseline": 1.0, "block": 1.2}, tables=False)
    fit = attnres("fit", tree.root, "--n-boot", "20")
    assert fit.returncode == 0, fit.stderr  # ran: it installed its signal handlers and its warnings printer
    assert process_state() == before
    with process_state_restored():
        signal.signal(signal.SIGTERM, lambda *_: None)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        warnings.showwarning = lambda *args, **kwargs: None
        warnings.simplefilter("error")
        os.environ["ATTNRES_HELPER_TEST"] = "1"
        os.environ.pop("ATTNRES_CACHE_DIR")  # set for the session by tests/conftest.py
        os.chdir(tmp_path)
        logging.getLogger().addHandler(logging.NullHandler())
        logging.getLogger("lightning.pytorch").setLevel(logging.CRITICAL)
        torch.set_num_threads(torch.get_num_threads() + 1)
        assert process_state() != before
    assert process_state() == before
