"""The SQL of compaction (CMP-5, CMP-6): rotation, compaction in place, the lock, the tip.

Theory of operation
-------------------
Used by both SQLite stores exactly like ``sqlite_ops`` (same transactions, same pending
event hand-over). The tables are migration 7 of ``sqlite_schema`` (``_V7_COMPACTION``):

* ``messages.archived_at``: NULL for a live row; a compaction in place sets it on every
  live row of the session. Archived rows are kept and never loaded again.
* ``compression_locks`` (v1) holds each session's current lock; ``compression_lock_log``
  keeps every ask, refusals included, with the span each grant was live.
* ``compactions``: one row per committed compaction (who, when, from which session to
  which, rows before and after).

``compact_session`` is one ``BEGIN IMMEDIATE`` transaction: the fence, then for a rotation
the flush rows, the old session ended ``compression`` (first reason wins), the child row,
the lease carried to the child (same holder, token and expiry; the old grant ends
``rotated``) with its line of waiters, each in its place, and the compacted rows under the
child; in place the archive and the rows.
A refusal (``sim.store_compaction.compaction_refusal``, shared with the memory store)
rolls everything back. ``tip_of`` walks ``parent_session_id`` forward with a recursive
query, one step per session ended ``compression``, taking the newest child at each step.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

from hermes_ref import lease as lease_rules
from hermes_ref import rotation
from hermes_ref.errors import PersistenceError
from hermes_ref.models import Compacted, Lease, Message, SessionRecord
from hermes_ref.ports import CompactionRow, DurableRecord, LockGrantRow, StoredMessage
from hermes_ref.rotation import ROTATED, compaction_refusal, lock_refusal
from hermes_ref.shell import sqlite_leases
from hermes_ref.shell import sqlite_ops as ops
from hermes_ref.shell import sqlite_routes as lanes
from hermes_ref.shell.sqlite_codec import (
    EventRow,
    decode_message,
    decode_session,
    message_row,
    session_row,
)
from hermes_ref.shell.sqlite_connect import StoreConnection
from hermes_ref.shell.sqlite_leases import check_fence

_TIP = (
    "WITH RECURSIVE chain(id, reason, depth) AS ("
    "SELECT id, end_reason, 0 FROM sessions WHERE id = ? "
    "UNION ALL SELECT c.id, c.end_reason, chain.depth + 1 FROM chain "
    "JOIN sessions c ON c.rowid = (SELECT MAX(rowid) FROM sessions "
    "WHERE parent_session_id = chain.id) WHERE chain.reason = 'compression') "
    "SELECT id FROM chain ORDER BY depth DESC LIMIT 1"
)
_END_REASON = "SELECT end_reason FROM sessions WHERE id = ?"
_SESSION = ("SELECT rowid, id, key, platform, chat_type, parent_session_id, system_prompt, "
            "started_at, ended_at, end_reason FROM sessions WHERE id = ?")
_LIVE_ROWS = "SELECT COUNT(*) FROM messages WHERE session_id = ? AND archived_at IS NULL"
_ARCHIVE = "UPDATE messages SET archived_at = ? WHERE session_id = ? AND archived_at IS NULL"
_END = "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL"
_INSERT_SESSION = (
    "INSERT INTO sessions(id, key, platform, chat_type, parent_session_id, system_prompt, "
    "started_at, ended_at, end_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_LEASE = "SELECT holder, token, acquired_at, expires_at FROM turn_leases WHERE session_id = ?"
_FREE_LEASE = "UPDATE turn_leases SET holder = NULL, expires_at = 0 WHERE session_id = ?"
_CLOSE_GRANT = ("UPDATE lease_grants SET ended_at = ?, end_reason = ? "
                "WHERE session_id = ? AND ended_at IS NULL")
_INSERT_LEASE = ("INSERT INTO turn_leases(session_id, holder, token, acquired_at, expires_at) "
                 "VALUES (?, ?, ?, ?, ?)")
_INSERT_GRANT = ("INSERT INTO lease_grants(session_id, token, holder, acquired_at, expires_at) "
                 "VALUES (?, ?, ?, ?, ?)")
_INSERT_COMPACTION = ("INSERT INTO compactions(session_id, child_id, holder, token, at, "
                      "rows_before, rows_after, first_row_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
_SELECT_COMPACTIONS = ("SELECT session_id, child_id, holder, token, at, rows_before, "
                       "rows_after, first_row_id FROM compactions ORDER BY seq")
_SELECT_ARCHIVED = (
    "SELECT session_id, id, role, content, api_content, tool_calls, tool_call_id, tool_name, "
    "finish_reason, turn_id, hidden, created_at FROM messages "
    "WHERE archived_at IS NOT NULL ORDER BY id"
)
# -- the lock
_LOCK = "SELECT holder, expires_at FROM compression_locks WHERE session_id = ?"
_EXTEND_LOCK = ("UPDATE compression_locks SET expires_at = MAX(expires_at, ?) "
                "WHERE session_id = ? RETURNING expires_at")
_PUT_LOCK = ("INSERT OR REPLACE INTO compression_locks(session_id, holder, acquired_at, "
             "expires_at) VALUES (?, ?, ?, ?)")
_DROP_LOCK = "DELETE FROM compression_locks WHERE session_id = ? AND holder = ?"
_OPEN_LOG = "WHERE session_id = ? AND granted = 1 AND ended_at IS NULL"
_EXTEND_LOG = f"UPDATE compression_lock_log SET expires_at = ? {_OPEN_LOG}"
_CLOSE_LOG = f"UPDATE compression_lock_log SET ended_at = ?, end_reason = ? {_OPEN_LOG}"
_RELEASE_LOG = (
    "UPDATE compression_lock_log SET ended_at = MIN(?, expires_at), end_reason = "
    f"CASE WHEN ? >= expires_at THEN 'expired' ELSE 'released' END {_OPEN_LOG}"
)
_INSERT_LOG = ("INSERT INTO compression_lock_log(session_id, holder, granted, acquired_at, "
               "expires_at, ended_at, end_reason) VALUES (?, ?, ?, ?, ?, ?, ?)")
_SELECT_LOG = ("SELECT session_id, holder, granted, acquired_at, expires_at, ended_at, "
               "end_reason FROM compression_lock_log ORDER BY seq")


# -- the lineage -------------------------------------------------------------------------


def tip_of(conn: sqlite3.Connection, session_id: str) -> str:
    """The id of the lineage's live tip (the session itself when it was not rotated)."""
    row = conn.execute(_TIP, (session_id,)).fetchone()
    return session_id if row is None else str(row[0])


def lease_target(conn: sqlite3.Connection, session_id: str) -> str:
    """The session a lease or a turn acts on: the tip when this one was rotated away."""
    row = conn.execute(_END_REASON, (session_id,)).fetchone()
    if row is None or not rotation.lease_follows_tip(row[0]):
        return session_id
    return tip_of(conn, session_id)


def compression_tip(conn: sqlite3.Connection, session_id: str) -> SessionRecord | None:
    with ops._read(conn):
        row = conn.execute(_SESSION, (tip_of(conn, session_id),)).fetchone()
    return None if row is None else decode_session(row)


# -- the lock ----------------------------------------------------------------------------


def take_compression_lock(conn: StoreConnection, events: Sequence[EventRow], session_id: str,
                          holder: str, now: float, ttl_s: float,
                          holder_alive: Callable[[str], bool] | None = None) -> bool:
    """Free, expired, a dead holder's or ours: taken (ours extended); else refused. Every
    ask is a row of the lock log."""
    refused = lock_refusal(session_id, holder, ttl_s)
    if refused is not None:
        raise PersistenceError(refused, cause="bad_input")
    with ops._write(conn):
        if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
            raise PersistenceError(f"no session {session_id!r}", cause="not_found")
        current = conn.execute(_LOCK, (session_id,)).fetchone()
        taken = _take(conn, session_id, holder, now, ttl_s, holder_alive, current)
        ops._insert_events(conn, events)
    return taken


def _take(conn: sqlite3.Connection, session_id: str, holder: str, now: float, ttl_s: float,
          holder_alive: Callable[[str], bool] | None, current: tuple[str, float] | None) -> bool:
    if current is not None and current[1] > now:
        incumbent = str(current[0])
        if incumbent == holder:
            expires = conn.execute(_EXTEND_LOCK, (now + ttl_s, session_id)).fetchone()[0]
            conn.execute(_EXTEND_LOG, (expires, session_id))
            return True
        dead = holder_alive is not None and lease_rules.reclaimable(
            current[1], now, lambda: not holder_alive(incumbent))
        if not dead:
            conn.execute(_INSERT_LOG, (session_id, holder, 0, now, now, now, "refused"))
            return False
        conn.execute(_CLOSE_LOG, (now, "holder_dead", session_id))
    elif current is not None:
        conn.execute(_CLOSE_LOG, (min(now, current[1]), "expired", session_id))
    conn.execute(_PUT_LOCK, (session_id, holder, now, now + ttl_s))
    conn.execute(_INSERT_LOG, (session_id, holder, 1, now, now + ttl_s, None, None))
    return True


def release_compression_lock(conn: StoreConnection, events: Sequence[EventRow],
                             session_id: str, holder: str, now: float) -> None:
    """Release only ``holder``'s own lock; anyone else's stays."""
    with ops._write(conn):
        if conn.execute(_DROP_LOCK, (session_id, holder)).rowcount:
            conn.execute(_RELEASE_LOG, (now, now, session_id))
        ops._insert_events(conn, events)


# -- the compaction ----------------------------------------------------------------------


def compact_session(conn: StoreConnection, events: Sequence[EventRow], session_id: str,
                    lease_token: int, messages: tuple[Message, ...],
                    child: SessionRecord | None, at: float, flush: tuple[Message, ...] = (),
                    now: float | None = None) -> Compacted:
    """A rotation (``child``) or a compaction in place, in one fenced transaction."""
    with ops._write(conn):
        found = conn.execute(_SESSION, (session_id,)).fetchone()
        if found is None:
            raise PersistenceError(f"no session {session_id!r}", cause="not_found")
        check_fence(conn, session_id, lease_token, now, session_required=True)
        old = decode_session(found)
        exists = child is not None and conn.execute(
            "SELECT 1 FROM sessions WHERE id = ?", (child.id,)).fetchone() is not None
        refusal = compaction_refusal(old, messages, flush, child, exists)
        if refusal is not None:
            raise PersistenceError(refusal[1], cause=refusal[0])
        if flush:
            ops._insert_messages(conn, [message_row(session_id, m) for m in flush])
        before: int = conn.execute(_LIVE_ROWS, (session_id,)).fetchone()[0]
        holder, token, acquired_at, expires_at = conn.execute(_LEASE, (session_id,)).fetchone()
        target = session_id if child is None else child.id
        if child is None:
            conn.execute(_ARCHIVE, (at, session_id))
        else:
            ended = rotation.ended_by_rotation(old, at)
            if ended.ended_at is not None:
                conn.execute(_END, (ended.ended_at, ended.end_reason, session_id))
            conn.execute(_INSERT_SESSION, session_row(child))
            conn.execute(_FREE_LEASE, (session_id,))
            conn.execute(_CLOSE_GRANT, (at, ROTATED, session_id))
            conn.execute(_INSERT_LEASE, (child.id, holder, token, at, expires_at))
            conn.execute(_INSERT_GRANT, (child.id, token, holder, at, expires_at))
            sqlite_leases.carry_line(conn, session_id, child.id)
            acquired_at = at
        first = ops._insert_messages(conn, [message_row(target, m) for m in messages])
        conn.execute(_INSERT_COMPACTION, (session_id, None if child is None else child.id,
                                          holder, token, at, before, len(messages), first))
        stored = conn.execute(_SESSION, (target,)).fetchone()
        ops._insert_events(conn, events)
    rows = tuple(m.model_copy(update={"row_id": first + i}) for i, m in enumerate(messages))
    return Compacted(session=decode_session(stored), rows=rows,
                     lease=Lease(session_id=target, holder=str(holder), token=int(token),
                                 acquired_at=float(acquired_at), expires_at=float(expires_at)))


# -- the record --------------------------------------------------------------------------


def snapshot(conn: sqlite3.Connection) -> DurableRecord:
    """``sqlite_routes.snapshot`` (live rows only) with the archive, the lock log and the
    compactions added."""
    record = lanes.snapshot(conn)
    with ops._read(conn, consistent=True):
        archived = conn.execute(_SELECT_ARCHIVED).fetchall()
        log = conn.execute(_SELECT_LOG).fetchall()
        done = conn.execute(_SELECT_COMPACTIONS).fetchall()
    return record.model_copy(update={
        "archived": tuple(StoredMessage(session_id=row[0], message=decode_message(row[1:]))
                          for row in archived),
        "compression_locks": tuple(
            LockGrantRow(session_id=s, holder=h, granted=bool(g), acquired_at=a,
                         expires_at=e, ended_at=ended, end_reason=reason)
            for s, h, g, a, e, ended, reason in log),
        "compactions": tuple(
            CompactionRow(session_id=s, child_id=c, holder=h, token=t, at=a, rows_before=b,
                          rows_after=n, first_row_id=f) for s, c, h, t, a, b, n, f in done),
    })
