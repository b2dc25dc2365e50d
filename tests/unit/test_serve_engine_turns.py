"""Whole engine turns over HTTP against the served simulator, each fault, each audited after.

The engine's own runtime (httpx client, asyncio driver, aiosqlite store) meets each fault
on a real socket (its requests are whole, not streamed: stream faults are met by its
client in ``test_serve_faults.py``); the database it leaves is then judged by the auditor, and the script
must be consumed exactly: the turn asked for what the fault called for, no more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hermes_ref.limits import Limits
from hermes_ref.shell.runtime import open_runtime
from sim.audit.cli import audit
from sim.serve import script as script_file
from sim.serve.server import Simulator, start

READ = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}
ANSWER = {"text": "Your notes say: buy milk."}
FAST = Limits(backoff_base_s=0.01, backoff_max_s=0.05)

CASES: dict[str, list[dict[str, Any]]] = {
    "plain": [READ, ANSWER],
    "rate-limited": [{"error": "rate_limited", "retry_after_s": 0.05}, READ, ANSWER],
    "server-error-then-529": [{"error": "server_error"}, {"error": "overloaded"}, READ, ANSWER],
    "cut-call": [{**READ, "cut_after": 1}, READ, ANSWER],
    "cut-answer": [READ, {"text": "Your", "cut_after": 1}, ANSWER],
    "delayed": [{**READ, "delay_s": 0.05}, ANSWER],
    # held 0.3 s, then closed unanswered: a transient failure the turn retries
    "stall-then-close": [{"error": "timeout", "stall_s": 0.3}, READ, ANSWER],
    "empty-then-answer": [READ, {"content": None}, ANSWER],
    "split-pair": [READ, {"text": "Your notes say: buy milk", "fault": "split_pair"}],
}


@pytest.mark.parametrize("name", list(CASES))
async def test_a_turn_meets_the_fault_and_leaves_a_clean_record(tmp_path: Path, name: str) -> None:
    """The turn answers, the script is consumed exactly, and the audit finds nothing."""
    (tmp_path / "notes.txt").write_text("buy milk")
    simulator = Simulator(script_file.parse(CASES[name]))
    server = start(simulator)
    try:
        async with await open_runtime(str(tmp_path / "agent.db"), base_url=server.url,
                                      workspace=str(tmp_path), limits=FAST) as runtime:
            result = await runtime.run_turn("session-1", "What is in notes.txt?")
    finally:
        server.stop()
    assert result.final_response is not None
    assert result.final_response.startswith("Your notes say: buy milk")
    assert simulator.cursor.report().exact, simulator.cursor.report()
    checked = audit(tmp_path / "agent.db")
    assert checked.findings == []


async def test_a_terminal_rejection_leaves_no_open_tail(tmp_path: Path) -> None:
    """A 400 ends the turn; the engine closes the tail, so the audit finds no open turn."""
    simulator = Simulator(script_file.parse([{"error": "rejected"}]))
    server = start(simulator)
    try:
        async with await open_runtime(str(tmp_path / "agent.db"), base_url=server.url,
                                      workspace=str(tmp_path), limits=FAST) as runtime:
            await runtime.run_turn("session-1", "hello")
    finally:
        server.stop()
    assert [f.invariant for f in audit(tmp_path / "agent.db").findings] == []
