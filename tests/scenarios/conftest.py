"""Snapshot updates never rewrite or delete the snapshot of a failing scenario.

syrupy deletes a snapshot whose test failed before asserting it when ``--snapshot-update``
is given, and would rewrite it with the failing run if the test asserted first. So a
scenario that fails during an update is *skipped* (which keeps its stored snapshot
untouched), recorded here, and the session is then made to fail with the list.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

FAILURES = pytest.StashKey[list[str]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[FAILURES] = []


def updating_snapshots(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "update_snapshots", False))


def fail_keeping_snapshot(config: pytest.Config, message: str) -> None:
    """Fail the scenario; while updating snapshots, keep its stored snapshot as it is."""
    if updating_snapshots(config):
        config.stash[FAILURES].append(message)
        pytest.skip(f"scenario fails, its snapshot is kept unchanged: {message}")
    pytest.fail(message, pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Generator[None, None, None]:
    yield
    failures = session.config.stash.get(FAILURES, [])
    if failures:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("scenarios failing during --snapshot-update (snapshots kept):",
                                red=True)
            for failure in failures:
                reporter.write_line(f"  {failure}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
