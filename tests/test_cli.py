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
