"""The auditor on state.db files recorded from real Hermes Agent 0.19.0 runs (fixtures/hermes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.audit.cli import audit

FOLDER = Path(__file__).resolve().parents[2] / "fixtures" / "hermes"
EXPECTED = {
    "happy": [],
    "rate_limited": [],
    "empty_replies": [],
    "stream_cut": [("violation", "SCAF-1", 3)],
    "context_overflow": [("violation", "FIN-5", 1)],
    "rejected": [("violation", "FIN-5", 1)],
    "chat_rejected": [("open", "FIN-5", 1)],  # 'hermes chat -q' never ends its session
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_hermes_runs_audit_as_expected(name: str) -> None:
    """Each recorded run gives exactly its findings, and its file keeps every byte."""
    path = FOLDER / f"{name}.db"
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    result = audit(path)
    assert (result.schema, result.version) == ("hermes", 22)
    assert [(f.kind, f.invariant, f.message_id) for f in result.findings] == EXPECTED[name]
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert not list(FOLDER.glob("*-wal")) and not list(FOLDER.glob("*-shm"))
