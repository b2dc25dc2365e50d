"""The crash stories with real processes: SIGKILL at a crash point, restart on the same file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from hermes_ref.closure import RECOVERED_BOUNDARY_TEXT, RECOVERED_CALL_TEXT
from hermes_ref.models import Message, Role
from hermes_ref.ports import DurableRecord, LeaseRow, LedgerEntry
from sim.realcrash import SESSION_ID, check, load_files, load_ledger
from sim.sqlite_store import SqliteStore

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60


@dataclass
class Run:
    workdir: Path
    db: Path
    dead_lease: LeaseRow  # the lease row as the killed process left it
    record: DurableRecord  # the durable record after the second process
    ledger: list[LedgerEntry]
    files: dict[str, str]

    @property
    def rows(self) -> list[Message]:
        return self.record.transcript(SESSION_ID)


def _spawn(phase: str, tmp: Path, story: str, crash: str | None = None) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "sim.realcrash", phase, "--db", str(tmp / "hermes-ref.db"),
           "--workdir", str(tmp), "--story", story]
    if crash:
        cmd += ["--crash", crash]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _lease(db: Path) -> LeaseRow:
    store = SqliteStore(db)
    try:
        (lease,) = store.snapshot().leases
    finally:
        store.close()
    return lease


def _record(db: Path) -> DurableRecord:
    store = SqliteStore(db)
    try:
        return store.snapshot()
    finally:
        store.close()


def crash_and_recover(tmp: Path, story: str, crash: str) -> Run:
    """Kill a first process at ``crash``, run a second one, check the file and journals."""
    first = _spawn("first", tmp, story, crash)
    out, err = first.communicate(timeout=TIMEOUT_S)
    assert first.returncode == -signal.SIGKILL, (first.returncode, out, err)
    db = tmp / "hermes-ref.db"
    dead = _lease(db)
    assert dead.holder is not None and dead.holder.startswith(f"pid={first.pid}:"), dead

    second = _spawn("second", tmp, story)
    out, err = second.communicate(timeout=TIMEOUT_S)
    assert second.returncode == 0, (second.returncode, out, err)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["final_response"] == "I am here.", summary

    assert check(db, tmp) == []
    run = Run(tmp, db, dead, _record(db), load_ledger(tmp), load_files(tmp))
    (lease,) = run.record.leases
    # Reclaimed because the holder's pid is dead, long before the dead lease expired.
    assert lease.holder is None and lease.token == dead.token + 1, lease
    assert lease.acquired_at < dead.expires_at, (lease, dead)
    assert run.rows[-1].role is Role.ASSISTANT and run.rows[-1].content == "I am here."
    return run


@pytest.mark.realcrash
def test_sigkill_before_tool_call_row(tmp_path: Path) -> None:
    """Killed before the tool-call row commits: no tool ran, the user row gets a boundary."""
    run = crash_and_recover(tmp_path, "crash_before_tool_call_row", "before:tool_calls")
    assert run.ledger == []
    assert run.files["notes.txt"] == "draft"
    assert run.rows[1].role is Role.ASSISTANT and run.rows[1].content == RECOVERED_BOUNDARY_TEXT


@pytest.mark.realcrash
def test_sigkill_after_tool_call_row(tmp_path: Path) -> None:
    """Killed after the tool-call row commits: the call is reported unknown, never run."""
    run = crash_and_recover(tmp_path, "crash_after_tool_call_row", "after:tool_calls")
    assert run.ledger == []
    tool_rows = [r for r in run.rows if r.role is Role.TOOL]
    assert len(tool_rows) == 1 and tool_rows[0].content == RECOVERED_CALL_TEXT
    assert run.files["notes.txt"] == "draft"


@pytest.mark.realcrash
def test_sigkill_after_tool_ran(tmp_path: Path) -> None:
    """Killed after the tool ran: one ledger entry, its write stays, the result is unknown."""
    run = crash_and_recover(tmp_path, "crash_after_tool_ran", "after:tools")
    assert len(run.ledger) == 1 and run.ledger[0].outcome == "applied"
    assert run.files["notes.txt"] == "final"
    tool_rows = [r for r in run.rows if r.role is Role.TOOL]
    assert len(tool_rows) == 1 and tool_rows[0].content == RECOVERED_CALL_TEXT


@pytest.mark.realcrash
def test_sigkill_before_final_row(tmp_path: Path) -> None:
    """Killed before the final row: the tool ran once and the next turn closes the tail."""
    run = crash_and_recover(tmp_path, "crash_before_final_row", "before:final")
    assert len(run.ledger) == 1
    roles = [r.role for r in run.rows]
    assert roles[:4] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    assert run.rows[3].content == RECOVERED_BOUNDARY_TEXT
