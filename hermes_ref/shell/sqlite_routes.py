"""The SQL of session lanes (SES), as plain synchronous functions over one connection.

Theory of operation
-------------------
Used by both SQLite stores exactly like ``sqlite_ops`` (same transactions, same pending
event hand-over: every write function takes the encoded events second and inserts them in
its own transaction). The tables are migration 3 of ``sqlite_schema``:

* ``session_routes``: one row per route revision, primary key (key, revision). A revision
  is inserted only if it is the key's next one; the check and the insert run under the
  write lock (``BEGIN IMMEDIATE``), and the primary key refuses a duplicate revision even
  so. The same transaction ends the session row the write names (``ended_at IS NULL``
  rows only: the first reason wins), so a reset and its ending are one commit, and
  creates the row of the incarnation a revision begins, so no route names an
  incarnation without one.
* ``lane_markers``: name -> value; ``write_lane`` upserts and deletes them and appends
  ``lane_log`` entries in one transaction.

Nothing here ever deletes a route revision or a session row.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from hermes_ref.errors import BadInput
from hermes_ref.lane_restart import LaneEntry
from hermes_ref.models import SessionRecord
from hermes_ref.ports import DurableRecord
from hermes_ref.session import Route, SessionSource
from hermes_ref.shell import sqlite_ops as ops
from hermes_ref.shell.sqlite_codec import EventRow, session_row
from hermes_ref.shell.sqlite_connect import StoreConnection
from hermes_ref.shell.sqlite_ops import _INSERT_SESSION_OR_IGNORE, _insert_events, _read, _write

_COLUMNS = (
    "key, revision, session_id, cause, at, platform, chat_type, chat_id, thread_id, "
    "participant, created_at, updated_at, suspended, resume_pending, resume_reason, "
    "resume_marked_at, was_auto_reset, auto_reset_reason, is_fresh_reset, expiry_finalized, "
    "retired, notice_delivered, resolution_order"
)
_INSERT_ROUTE = f"INSERT INTO session_routes({_COLUMNS}) VALUES ({', '.join('?' * 23)})"
_HEAD_REVISION = "SELECT COALESCE(MAX(revision), 0) FROM session_routes WHERE key = ?"
_SELECT_HEAD = (f"SELECT rowid, {_COLUMNS} FROM session_routes WHERE key = ? "
                "ORDER BY revision DESC LIMIT 1")
_SELECT_HEADS = (
    f"SELECT r.rowid, {', '.join('r.' + c.strip() for c in _COLUMNS.split(','))} "
    "FROM session_routes r JOIN (SELECT key, MAX(revision) AS top FROM session_routes "
    "GROUP BY key) h ON r.key = h.key AND r.revision = h.top ORDER BY r.key"
)
_SELECT_ROUTES = f"SELECT rowid, {_COLUMNS} FROM session_routes ORDER BY rowid"
_END_SESSION = (
    "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL"
)
_SELECT_MARKERS = "SELECT name, value FROM lane_markers ORDER BY name"
_UPSERT_MARKER = (
    "INSERT INTO lane_markers(name, value) VALUES (?, ?) "
    "ON CONFLICT(name) DO UPDATE SET value = excluded.value"
)
_DELETE_MARKER = "DELETE FROM lane_markers WHERE name = ?"
_INSERT_LOG = "INSERT INTO lane_log(at, kind, key) VALUES (?, ?, ?)"
_SELECT_LOG = "SELECT at, kind, key FROM lane_log ORDER BY seq"
_LIVE_BACKGROUND = (
    "SELECT key FROM lane_log l WHERE kind = 'background_started' AND NOT EXISTS ("
    "SELECT 1 FROM lane_log e WHERE e.key = l.key AND e.seq > l.seq "
    "AND e.kind = 'background_ended')"
)


def route_row(route: Route) -> tuple[Any, ...]:
    source = route.source
    return (route.key, route.revision, route.session_id, route.cause.value, route.at,
            source.platform, source.chat_type, source.chat_id, source.thread_id,
            source.participant, route.created_at, route.updated_at, int(route.suspended),
            int(route.resume_pending), route.resume_reason, route.resume_marked_at,
            int(route.was_auto_reset), route.auto_reset_reason, int(route.is_fresh_reset),
            int(route.expiry_finalized), int(route.retired), int(route.notice_delivered),
            route.order)


def decode_route(row: Sequence[Any]) -> Route:
    """A stored revision (``rowid`` first) back as the exact ``Route``; BadInput if not."""
    (rowid, key, revision, session_id, cause, at, platform, chat_type, chat_id, thread_id,
     participant, created_at, updated_at, suspended, resume_pending, resume_reason,
     resume_marked_at, auto, auto_reason, fresh, finalized, retired, delivered, order) = row
    try:
        source = SessionSource(platform=platform, chat_type=chat_type, chat_id=chat_id,
                               thread_id=thread_id, participant=participant)
        return Route(key=key, revision=revision, session_id=session_id, cause=cause, at=at,
                     source=source, created_at=created_at, updated_at=updated_at,
                     suspended=bool(suspended), resume_pending=bool(resume_pending),
                     resume_reason=resume_reason, resume_marked_at=resume_marked_at,
                     was_auto_reset=bool(auto), auto_reset_reason=auto_reason,
                     is_fresh_reset=bool(fresh), expiry_finalized=bool(finalized),
                     retired=bool(retired),
                     notice_delivered=bool(delivered), order=order)
    except (ValidationError, BadInput) as error:
        raise BadInput(f"stored row does not decode: session_routes rowid {rowid}: "
                       f"{error}".splitlines()[0]) from error


def put_route(conn: StoreConnection, events: Sequence[EventRow], route: Route,
              end_session_id: str | None = None, end_reason: str | None = None,
              start: SessionRecord | None = None) -> bool:
    """Insert ``route`` if it is its key's next revision, end the session row it names and
    create the row of the incarnation it begins (``start``, unless it exists); False, with
    nothing written, when another writer has taken that revision. The pending events
    commit either way (as with every write that runs, so the stores agree)."""
    row = route_row(route)
    with _write(conn):
        head: int = conn.execute(_HEAD_REVISION, (route.key,)).fetchone()[0]
        taken = route.revision == head + 1
        if taken:
            conn.execute(_INSERT_ROUTE, row)
            if end_session_id is not None and end_reason is not None:
                conn.execute(_END_SESSION, (route.at, end_reason, end_session_id))
            if start is not None:
                conn.execute(_INSERT_SESSION_OR_IGNORE, session_row(start))
        _insert_events(conn, events)
    return taken


def get_route(conn: sqlite3.Connection, key: str) -> Route | None:
    with _read(conn):
        row = conn.execute(_SELECT_HEAD, (key,)).fetchone()
    return None if row is None else decode_route(row)


def latest_routes(conn: sqlite3.Connection) -> tuple[Route, ...]:
    with _read(conn):
        rows = conn.execute(_SELECT_HEADS).fetchall()
    return tuple(decode_route(row) for row in rows)


def read_markers(conn: sqlite3.Connection) -> dict[str, float]:
    with _read(conn):
        rows = conn.execute(_SELECT_MARKERS).fetchall()
    return {name: value for name, value in rows}


def write_lane(conn: StoreConnection, events: Sequence[EventRow],
               markers: tuple[tuple[str, float | None], ...],
               log: tuple[LaneEntry, ...] = ()) -> None:
    with _write(conn):
        for name, value in markers:
            if value is None:
                conn.execute(_DELETE_MARKER, (name,))
            else:
                conn.execute(_UPSERT_MARKER, (name, value))
        if log:
            conn.executemany(_INSERT_LOG, [(e.at, e.kind, e.key) for e in log])
        _insert_events(conn, events)


def live_background(conn: sqlite3.Connection) -> frozenset[str]:
    with _read(conn):
        rows = conn.execute(_LIVE_BACKGROUND).fetchall()
    return frozenset(key for (key,) in rows)


def snapshot(conn: sqlite3.Connection) -> DurableRecord:
    """``sqlite_ops.snapshot`` with the lanes' tables added."""
    record = ops.snapshot(conn)
    with _read(conn, consistent=True):
        routes = conn.execute(_SELECT_ROUTES).fetchall()
        markers = conn.execute(_SELECT_MARKERS).fetchall()
        log = conn.execute(_SELECT_LOG).fetchall()
    return record.model_copy(update={
        "routes": tuple(decode_route(row) for row in routes),
        "markers": tuple((name, value) for name, value in markers),
        "lane_log": tuple(LaneEntry(at=at, kind=kind, key=key) for at, kind, key in log),
    })
