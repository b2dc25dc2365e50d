"""The auditor on this project's own database, and its strict read-only promise."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_ref.shell.runtime import open_runtime
from hermes_ref.shell.sqlite_connect import open_connection
from sim.audit.cli import audit
from sim.cli import main
from sim.serve import script as script_file
from sim.serve.server import Simulator, start

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


async def test_a_real_turn_over_the_served_simulator_audits_clean(tmp_path: Path) -> None:
    """An engine turn through the served simulator leaves a database the auditor passes."""
    (tmp_path / "notes.txt").write_text("buy milk")
    simulator = Simulator(script_file.load(FIXTURES / "scripts" / "one_tool_round.json"))
    server = start(simulator)
    try:
        async with await open_runtime(str(tmp_path / "agent.db"), base_url=server.url,
                                      workspace=str(tmp_path)) as runtime:
            result = await runtime.run_turn("session-1", "What is in notes.txt?")
    finally:
        server.stop()
    assert result.final_response == "Your notes say: buy milk."
    assert simulator.cursor.report().exact
    checked = audit(tmp_path / "agent.db")
    assert (checked.schema, checked.messages, checked.findings) == ("ref", 4, [])


def ref_db(path: Path) -> None:
    conn = open_connection(path)
    conn.execute("BEGIN")
    conn.execute("INSERT INTO sessions (id, key, platform, chat_type, system_prompt, started_at)"
                 " VALUES ('s', 'k', 'cli', 'dm', 'p', 0)")
    conn.execute("INSERT INTO messages (session_id, role, content, tool_calls) VALUES "
                 "('s', 'user', 'hi', NULL), ('s', 'assistant', '', "
                 "'[{\"id\": \"c1\", \"name\": \"f\", \"arguments\": \"{}\"}]')")
    for seq, status in ((1, "started"), (2, "started"), (3, "terminal")):
        conn.execute(
            "INSERT INTO admissions (admission_id, seq, principal_id, session_id, request_id, "
            "payload_json, payload_digest, intent, status, outcome, created_at, updated_at) "
            "VALUES (?, ?, 'p', 's', ?, '{}', 'd', 'turn', ?, NULL, 0, 0)",
            (f"a{seq}", seq, f"r{seq}", status))
    conn.execute("INSERT INTO turn_leases (session_id, holder, token, acquired_at, expires_at) "
                 "VALUES ('s', 'h', 1, 10, 5)")
    conn.execute("COMMIT")
    conn.close()


def test_admissions_leases_and_an_open_turn_on_the_ref_schema(tmp_path: Path) -> None:
    """ADM-4, ADM-5 and LEASE-2 are judged where the schema has them; the tail is open."""
    path = tmp_path / "ref.db"
    ref_db(path)
    found = sorted((f.kind, f.invariant) for f in audit(path).findings)
    assert found == [("open", "FIN-4"), ("violation", "ADM-4"), ("violation", "ADM-5"),
                     ("violation", "LEASE-2")]


WRITER = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint=0")
conn.execute("BEGIN")
for i in range(50):
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) "
                 "VALUES ('s', 'user', 'late', 0)")
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) "
                 "VALUES ('s', 'assistant', 'ok', 0)")
conn.execute("COMMIT")
os.kill(os.getpid(), signal.SIGKILL)
"""


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_reads_a_wal_left_by_a_killed_writer_without_touching_a_byte(tmp_path: Path) -> None:
    """Commits only in the -wal of a SIGKILLed writer are read; no file changes at all."""
    from sim.audit.hermes_v22 import HermesDb

    path = tmp_path / "state.db"
    db = HermesDb(path)
    db.session("s")
    db.close()
    proc = subprocess.run([sys.executable, "-c", WRITER, str(path)], check=False)
    assert proc.returncode == -9
    assert os.path.getsize(str(path) + "-wal") > 0
    before = snapshot(tmp_path)
    out = io.StringIO()
    assert main(["audit", str(path)], out=out) == 0
    assert "100 message(s)" in out.getvalue()
    assert snapshot(tmp_path) == before


REF_CASES = {
    # rows (role, answered id, call ids), then the findings expected of the ended session
    "clean": ([("user", None, ()), ("assistant", None, ("c1",)), ("tool", "c1", ()),
               ("assistant", None, ())], []),
    "orphan-result": ([("user", None, ()), ("tool", "c9", ()), ("assistant", None, ())],
                      ["TOOL-3"]),
    "out-of-order": ([("user", None, ()), ("assistant", None, ("c1", "c2")), ("tool", "c2", ()),
                      ("tool", "c1", ()), ("assistant", None, ())], ["TOOL-5"]),
    "user-after-tool": ([("user", None, ()), ("assistant", None, ("c1",)), ("tool", "c1", ()),
                         ("user", None, ()), ("assistant", None, ())], ["FIN-5"]),
    "ended-on-call": ([("user", None, ()), ("assistant", None, ("c1",))], ["FIN-4"]),
}


@pytest.mark.parametrize("name", list(REF_CASES))
def test_the_ref_reader_feeds_the_same_judges(tmp_path: Path, name: str) -> None:
    """Rows of this project's schema are judged exactly as a Hermes database's are."""
    spec, expected = REF_CASES[name]
    path = tmp_path / "ref.db"
    conn = open_connection(path)
    conn.execute("BEGIN")
    conn.execute("INSERT INTO sessions (id, key, platform, chat_type, system_prompt, started_at,"
                 " ended_at, end_reason) VALUES ('s', 'k', 'cli', 'dm', 'p', 0, 1, 'done')")
    for role, answered, calls in spec:
        stored = json.dumps([{"id": c, "name": "f", "arguments": "{}"} for c in calls]) or None
        conn.execute("INSERT INTO messages (session_id, role, content, tool_calls, tool_call_id)"
                     " VALUES ('s', ?, 'x', ?, ?)", (role, stored if calls else None, answered))
    conn.execute("COMMIT")
    conn.close()
    assert [f.invariant for f in audit(path).findings] == expected
