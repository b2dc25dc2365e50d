"""The reader of this project's own database (``hermes_ref.shell.sqlite_schema``).

Theory of operation
-------------------
Sessions come from ``sessions``; message rows from ``messages`` in id order (the order
they were written), with ``tool_calls`` decoded to its ids; admissions and leases from
``admissions`` and ``turn_leases``. Columns are asked for by name and only where the
table has them, so a database of an older or newer schema version is read as far as it
goes. A row is *scaffolding* when it is a user or system row whose text is one of the
engine's synthetic retry messages (``hermes_ref.scaffolding``): the engine never stores
one, so finding one is a breach of SCAF-1.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from hermes_ref import scaffolding
from sim.audit.record import Admission, Lease, Record, Row, Session
from sim.audit.source import columns
from sim.audit.tool_ids import call_ids

SCAFFOLDING_TEXTS = (scaffolding.DROPPED_TOOLCALL_NUDGE, scaffolding.EMPTY_AFTER_TOOLS_NUDGE,
                     scaffolding.GRACE_SUMMARY_PROMPT)


def read(conn: sqlite3.Connection, version: int | None) -> Record:
    sessions = {sid: Session(sid, parent, ended is not None, reason)
                for sid, parent, ended, reason in conn.execute(
                    "SELECT id, parent_session_id, ended_at, end_reason FROM sessions")}
    record = Record("ref", version, sessions, _rows(conn))
    if {"admission_id", "session_id", "seq", "status", "outcome"} <= columns(conn, "admissions"):
        record.admissions = [Admission(*r) for r in conn.execute(
            "SELECT admission_id, session_id, seq, status, outcome FROM admissions ORDER BY seq")]
    if {"session_id", "holder", "acquired_at", "expires_at"} <= columns(conn, "turn_leases"):
        record.leases = [Lease(*r) for r in conn.execute(
            "SELECT session_id, holder, acquired_at, expires_at FROM turn_leases")]
    return record


def _rows(conn: sqlite3.Connection) -> Iterator[Row]:
    marks = ", ".join("?" for _ in SCAFFOLDING_TEXTS)
    cursor = conn.execute(
        "SELECT session_id, id, role, tool_calls, tool_call_id, "
        f"(role IN ('user', 'system') AND content IN ({marks})) FROM messages ORDER BY id",
        SCAFFOLDING_TEXTS)
    cursor.arraysize = 4096
    while batch := cursor.fetchmany():
        for sid, rid, role, calls, answered, scaf in batch:
            yield (sid, rid, role, call_ids(calls) if calls else (), answered, bool(scaf))
