"""The reader of a Hermes Agent ``state.db`` (schema version 22, and later as far as it goes).

Theory of operation
-------------------
Sessions come from ``sessions`` (``parent_session_id`` is the compression or branch
lineage). Message rows come from ``messages`` in id order; the system prompt is no
message row (it lives in ``sessions.system_prompt``). Only *live* rows are judged: a row
with ``active = 0`` or ``compacted = 1`` was compacted away and is no longer part of the
transcript the next call replays, so it is counted but not paired. ``tool_calls`` holds
the wire objects plus ``call_id`` and ``response_item_id``; ``tool_call_ids`` reads them.

Scaffolding leaves no flag in this schema (flags are dictionary keys that are never
columns), so a row is judged scaffolding by its text: one of the synthetic retry
messages this project knows (as in ``read_ref``), or a user row that opens with
``[System:``, the prefix Hermes Agent gives the messages it writes in the user's place
(0.19.0 stores one after a stream is cut, asking the model to continue). Newer schemas carry durable leases
(``session_turn_leases``); where that table exists it is read too.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from sim.audit.read_ref import SCAFFOLDING_TEXTS
from sim.audit.record import Lease, Record, Row, Session
from sim.audit.source import columns
from sim.audit.tool_ids import call_ids

SCHEMA_VERSION = 22


def read(conn: sqlite3.Connection, version: int | None) -> Record:
    sessions = {sid: Session(sid, parent, ended is not None, reason)
                for sid, parent, ended, reason in conn.execute(
                    "SELECT id, parent_session_id, ended_at, end_reason FROM sessions")}
    record = Record("hermes", version, sessions, _rows(conn))
    if version != SCHEMA_VERSION:
        record.notes.append(f"schema version {version}: read with the columns of version "
                            f"{SCHEMA_VERSION} that it has")
    leases = columns(conn, "session_turn_leases")
    if {"conversation_id", "holder", "acquired_at", "expires_at"} <= leases:
        record.leases = [Lease(*r) for r in conn.execute(
            "SELECT conversation_id, holder, acquired_at, expires_at FROM session_turn_leases")]
    return record


def _rows(conn: sqlite3.Connection) -> Iterator[Row]:
    have = columns(conn, "messages")
    live = [c for c in ("active = 1", "compacted = 0") if c.split()[0] in have]
    where = f"WHERE {' AND '.join(live)}" if live else ""
    marks = ", ".join("?" for _ in SCAFFOLDING_TEXTS)
    cursor = conn.execute(
        "SELECT session_id, id, role, tool_calls, tool_call_id, "
        f"(role IN ('user', 'system') AND (content IN ({marks}) OR substr(content, 1, 8) = "
        f"'[System:')) FROM messages {where} "
        "ORDER BY id", SCAFFOLDING_TEXTS)
    cursor.arraysize = 4096
    while batch := cursor.fetchmany():
        for sid, rid, role, calls, answered, scaf in batch:
            yield (sid, rid, role, call_ids(calls) if calls else (), answered, bool(scaf))
