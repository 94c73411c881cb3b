"""Under ``CI=true`` a skipped SLURM test is a failure (pytest hooks; tests/conftest.py imports them).

The SLURM tests (marked ``slurm``) skip themselves, with the reason, where the SLURM binaries are absent or a
two-node cluster cannot be made (no root, no network namespaces). On a laptop that is what should happen; in CI it
would let the integration tier pass without having run them (``.ci/run`` installs the daemons, and a failed install
only printed a note). So where the environment says ``CI=true`` (GitHub Actions, GitLab and most CI services set
it; ``.ci/run`` sets it unless it is set) such a skip is reported as a failure carrying the skip's reason, and the
run's summary lists them. Deselected tests (the default tier's ``-m 'not integration'``) are not skips and are not
affected; nor are expected failures (``xfail``) or skips of tests without the ``slurm`` mark.
"""

from __future__ import annotations

import os

import pytest

SKIPPED_IN_CI = "slurm test skipped under CI"  # a report's user property: the skip's reason (xdist sends it on)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201 (a hook wrapper)
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker("slurm") and in_ci():
        reason = skip_reason(report)
        report.outcome = "failed"  # an error where the skip came in setup (a skip mark), a failure in the test
        report.longrepr = (
            f"CI=true, and this SLURM test was skipped: {reason}\n"
            "CI must run the SLURM tests: install slurmctld slurmd slurm-client munge (.ci/run does, as root or "
            "with sudo), or unset CI to let them skip"
        )
        report.user_properties.append((SKIPPED_IN_CI, reason))
    return report


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    skipped = [
        (report.nodeid, value)
        for report in [*terminalreporter.stats.get("error", []), *terminalreporter.stats.get("failed", [])]
        for key, value in getattr(report, "user_properties", ())
        if key == SKIPPED_IN_CI
    ]
    if skipped:
        terminalreporter.section("SLURM tests skipped under CI=true (each counted as a failure)", red=True)
        for nodeid, reason in skipped:
            terminalreporter.line(f"{nodeid}: {reason}")
