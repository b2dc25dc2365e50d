"""The admission door across a real SIGKILL: a child dies at a door crash point, a new process
recovers from the SQLite file, and nothing admitted is lost or run twice."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_ref.admission import AdmissionStatus, Outcome
from sim.checkers import CHECKERS
from sim.harness import Story
from sim.provider import text

ROOT = Path(__file__).resolve().parents[2]

# The child: bind, admit two inputs, then drain until the planned crash point kills it.
CHILD = """
import os, signal, sys
from pathlib import Path
from sim.harness import Story
from sim.provider import text
s = Story(store_kind="sqlite", workdir=Path(sys.argv[1]))
s.world.on_crash = lambda point: os.kill(os.getpid(), signal.SIGKILL)
s.bind("alice")
s.bind("olga", role="operator", kind="operator")
s.script(text("First answered."))
s.submit("alice", "a-1", {"text": "First."})
s.submit("alice", "a-2", {"text": "Second."})
s.faults(crash=sys.argv[2])
s.drain()
sys.exit(3)  # not reached: the crash point kills the process first
"""


@pytest.mark.realcrash
@pytest.mark.parametrize("point", ["after:claim", "before:settle"])
def test_a_killed_drain_leaves_an_unknown_admission_and_a_live_queue(point: str,
                                                                     tmp_path: Path) -> None:
    """Killed at a claim or settle: unknown, never re-run, the queue lives on, door checks pass."""
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), point], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    s = Story(store_kind="sqlite", workdir=tmp_path)
    s.world._ids = 1000  # a new process mints its own ids, as the real-crash journals do
    s.script(text("Second answered."))
    start = s.recover()
    assert start is not None and [r.request_id for r in start.orphaned] == ["a-1"]
    assert s.drain()[0].paused, "the queue is paused on the unknown admission"
    s.reconcile("olga", start.orphaned[0].admission_id)
    s.drain()
    rows = s.admissions()
    assert [(r.status, r.outcome, r.claims) for r in rows] == [
        (AdmissionStatus.TERMINAL, Outcome.INTERRUPTED, 1),
        (AdmissionStatus.TERMINAL, Outcome.COMPLETED, 1)]
    users = [m.content for m in s.transcript() if m.role == "user"]
    assert users == (["Second."] if point == "after:claim" else ["First.", "Second."])
    s.check()
    # The door's checkers read only the file; the turn checkers would also need the dead
    # child's provider log, which only sim.realcrash journals, so they are not judged here.
    door = {c.name for c in CHECKERS.values() if c.check.__module__ == "sim.checkers.admission"}
    assert len(door) >= 7
    assert [str(v) for v in s.violations if v.checker in door] == []
    s.world.store.close()
