"""The SQL of the durable store, as plain synchronous functions over one connection.

Theory of operation
-------------------
Both SQLite stores (``sim.sqlite_store.SqliteStore`` over stdlib sqlite3 and
``hermes_ref.shell.sqlite_store.AsyncSqliteStore`` over aiosqlite) call these
functions; the async store runs each one whole on aiosqlite's worker thread, so a store
method is one thread hop and one transaction. The connection comes from
``sqlite_connect`` (opened, checked, configured and migrated, in autocommit mode); rows
are encoded and decoded by ``sqlite_codec``.

* Every write function is ``BEGIN IMMEDIATE`` … ``COMMIT`` (``_write``): the write lock
  is taken up front, so a fence check and the write it guards cannot interleave with
  another writer. Any error rolls back; sqlite3 errors leave as ``PersistenceError`` with a
  short ``cause`` and the original as ``__cause__``. ``StoreConnection.commits`` counts the
  COMMITs that succeeded.
* Events are buffered by the caller (already encoded by ``sqlite_codec.encode_event``) and
  handed to the next write function as its ``events`` argument (always the second, after
  the connection), which inserts them in its own transaction: they commit with that write
  or not at all.
* Stored rows decode into exactly equal model values; a row that does not decode is
  reported as ``BadInput`` naming table, row id and column. Reads never modify anything.

SQL strings are module constants, so sqlite3's per-connection statement cache prepares
each one once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from hermes_ref import delivery  # DEL-2: the replay bound
from hermes_ref.errors import LeaseLost, PersistenceError
from hermes_ref.models import Closed, Closing, Event, Lease, LeaseGrant, Message, Opening, SessionRecord
from hermes_ref.ports import DurableRecord, StoredMessage
from hermes_ref.shell import sqlite_leases as leases
from hermes_ref.shell.sqlite_codec import (
    EventRow,
    decode_event,
    decode_lease,
    decode_message,
    decode_session,
    encode_event,
    message_row,
    persistence_error,
    session_row,
)
from hermes_ref.shell.sqlite_connect import StoreConnection

# -- transactions ------------------------------------------------------------------------

_MAPPED = (sqlite3.Error, UnicodeEncodeError, OverflowError)  # what a transaction maps


class _Busy(Exception):
    """Internal: end a write transaction without committing (nothing to write)."""


@contextmanager
def _write(conn: StoreConnection) -> Iterator[None]:
    """One write transaction: BEGIN IMMEDIATE … COMMIT, rollback on any error.

    Inside a transaction already open (a group commit's batch, ``group_commit``) the write
    is a SAVEPOINT of it instead: an error rolls back this write only, and the batch commits.
    In the batch's first pass (``conn.bare``) it takes no savepoint: an error marks the
    transaction spoiled, and the batch is rolled back and applied again with savepoints.
    """
    if conn.in_transaction:
        if conn.bare:
            try:
                yield
            except BaseException:
                conn.spoiled = True
                raise
            return
        with _savepoint(conn):
            yield
        return
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        raise persistence_error(exc) from exc
    try:
        yield
        conn.execute("COMMIT")
    except BaseException as exc:
        _rollback(conn)
        if isinstance(exc, _MAPPED):
            raise persistence_error(exc) from exc
        raise
    conn.commits += 1


@contextmanager
def _savepoint(conn: StoreConnection) -> Iterator[None]:
    """One write inside the open transaction; the batch's COMMIT is counted, not this."""
    try:
        conn.execute("SAVEPOINT write_op")
    except sqlite3.Error as exc:
        raise persistence_error(exc) from exc
    try:
        yield
        conn.execute("RELEASE write_op")
    except BaseException as exc:
        try:
            if conn.in_transaction:  # SQLite may have abandoned the whole transaction
                conn.execute("ROLLBACK TO write_op")
                conn.execute("RELEASE write_op")
        except sqlite3.Error:
            pass  # the transaction is gone; the batch sees it and the original error says why
        if isinstance(exc, _MAPPED):
            raise persistence_error(exc) from exc
        raise


@contextmanager
def _read(conn: sqlite3.Connection, *, consistent: bool = False) -> Iterator[None]:
    """Map sqlite3 errors of reads; ``consistent`` wraps them in one read transaction."""
    try:
        if consistent:
            conn.execute("BEGIN")
        yield
    except _MAPPED as exc:
        raise persistence_error(exc) from exc
    finally:
        if consistent:
            _rollback(conn)


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # the connection is already broken or closed; the original error says why


# -- events ------------------------------------------------------------------------------

_INSERT_EVENT = ("INSERT INTO events(session_id, turn_id, kind, data, at, turn_seq) "
                 "VALUES (?, ?, ?, ?, ?, ?)")
_EVENT_COLUMNS = "seq, session_id, turn_id, kind, data, at, turn_seq"
_SELECT_EVENTS = f"SELECT {_EVENT_COLUMNS} FROM events ORDER BY seq"
_SELECT_TURN_EVENTS = (f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_id = ? AND turn_id = ? "
                       "AND turn_seq >= ? ORDER BY turn_seq")


def events_after(conn: sqlite3.Connection, session_id: str, turn_id: str,
                 after_seq: int) -> tuple[Event, ...]:
    """DEL-2: the committed events of one turn numbered after ``after_seq``, in order."""
    with _read(conn):
        first = delivery.first_to_replay(after_seq)
        rows = conn.execute(_SELECT_TURN_EVENTS, (session_id, turn_id, first)).fetchall()
    return tuple(decode_event(row) for row in rows)


def _insert_events(conn: sqlite3.Connection, events: Sequence[EventRow]) -> None:
    if events:
        conn.executemany(_INSERT_EVENT, events)


def flush_events(conn: StoreConnection, events: Sequence[EventRow]) -> None:
    if events:
        with _write(conn):
            _insert_events(conn, events)


# -- sessions ----------------------------------------------------------------------------

_SESSION_COLUMNS = (
    "rowid, id, key, platform, chat_type, parent_session_id, system_prompt, "
    "started_at, ended_at, end_reason"
)
_INSERT_SESSION = (
    "INSERT INTO sessions(id, key, platform, chat_type, parent_session_id, system_prompt, "
    "started_at, ended_at, end_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_SESSION_OR_IGNORE = _INSERT_SESSION.replace("INSERT INTO", "INSERT OR IGNORE INTO", 1)
_SELECT_SESSION = f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?"
_SELECT_SESSIONS = f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY rowid"
_END_SESSION = (
    "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL"
)
_SESSION_EXISTS = "SELECT 1 FROM sessions WHERE id = ?"


def create_session(
    conn: StoreConnection, events: Sequence[EventRow], record: SessionRecord
) -> None:
    row = session_row(record)
    with _write(conn):
        conn.execute(_INSERT_SESSION, row)
        _insert_events(conn, events)


def ensure_session(
    conn: StoreConnection, events: Sequence[EventRow], record: SessionRecord
) -> tuple[SessionRecord, bool]:
    """The stored row, inserted from ``record`` if absent; one transaction either way.

    ``INSERT OR IGNORE`` makes a race between two processes harmless: the loser reads the
    winner's row. Pending events are committed in the same transaction.
    """
    row = session_row(record)
    with _write(conn):
        created = conn.execute(_INSERT_SESSION_OR_IGNORE, row).rowcount == 1
        stored = record if created else conn.execute(_SELECT_SESSION, (record.id,)).fetchone()
        _insert_events(conn, events)
    if isinstance(stored, SessionRecord):
        return stored, True
    return decode_session(stored), False


def get_session(conn: sqlite3.Connection, session_id: str) -> SessionRecord | None:
    with _read(conn):
        row = conn.execute(_SELECT_SESSION, (session_id,)).fetchone()
    return None if row is None else decode_session(row)


def end_session(
    conn: StoreConnection, events: Sequence[EventRow], session_id: str, reason: str, at: float
) -> None:
    """End a live session; an ended one keeps its first reason."""
    with _write(conn):
        ended = conn.execute(_END_SESSION, (at, reason, session_id)).rowcount
        if not ended and conn.execute(_SESSION_EXISTS, (session_id,)).fetchone() is None:
            raise PersistenceError(f"no session {session_id!r}", cause="not_found")
        _insert_events(conn, events)


# -- messages ----------------------------------------------------------------------------

_MESSAGE_COLUMNS = (
    "id, role, content, api_content, tool_calls, tool_call_id, tool_name, "
    "finish_reason, turn_id, hidden, created_at"
)
_INSERT_MESSAGE = (
    "INSERT INTO messages(session_id, role, content, api_content, tool_calls, tool_call_id, "
    "tool_name, finish_reason, turn_id, hidden, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SELECT_MESSAGES = (  # live rows only: a compaction in place archives (CMP-5)
    f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND id > ? "
    "AND archived_at IS NULL ORDER BY id"
)
_SELECT_ALL_MESSAGES = (f"SELECT session_id, {_MESSAGE_COLUMNS} FROM messages "
                        "WHERE archived_at IS NULL ORDER BY id")
_SELECT_ONE = f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id = ? AND session_id = ?"
_REWRITE = (
    "UPDATE messages SET content = ?, api_content = ? WHERE id = ? AND session_id = ? "
    f"RETURNING {_MESSAGE_COLUMNS}"
)
_WATERMARK = "SELECT COALESCE(MAX(id), 0) FROM messages"


def load_messages(
    conn: sqlite3.Connection, session_id: str, after_row_id: int = 0
) -> tuple[Message, ...]:
    with _read(conn):
        rows = conn.execute(_SELECT_MESSAGES, (session_id, after_row_id)).fetchall()
    return tuple(decode_message(row) for row in rows)


def append_messages(
    conn: StoreConnection,
    events: Sequence[EventRow],
    session_id: str,
    lease_token: int,
    messages: tuple[Message, ...],
    now: float | None = None,
) -> tuple[Message, ...]:
    """Insert ``messages`` in one fenced transaction; returns them with row ids set.

    Checks in MemoryStore's order: session exists, fence holds, no scaffolding (SCAF-1).
    """
    with _write(conn):
        _check_fence(conn, session_id, lease_token, session_required=True, now=now)
        stored = _store_rows(conn, session_id, messages)
        _insert_events(conn, events)
    return stored


def _store_rows(conn: sqlite3.Connection, session_id: str,
                messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """Insert ``messages`` (never scaffolding: SCAF-1) and return them with their row ids."""
    for message in messages:
        if message.scaffold is not None:
            raise PersistenceError(
                f"refusing to persist scaffolding ({message.scaffold.value})",
                cause="scaffolding",
            )
    first = _insert_messages(conn, [message_row(session_id, m) for m in messages])
    return tuple(m.model_copy(update={"row_id": first + i}) for i, m in enumerate(messages))


def _insert_messages(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> int:
    """Insert rows, returning the first row id.

    The ids of one call are consecutive: AUTOINCREMENT gives each row max(id, sequence)+1
    and the write lock (BEGIN IMMEDIATE) keeps every other writer out meanwhile.
    """
    if len(rows) == 1:
        return cast(int, conn.execute(_INSERT_MESSAGE, rows[0]).lastrowid)
    if not rows:
        return 0
    conn.executemany(_INSERT_MESSAGE, rows)
    last: int = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
    return last - len(rows) + 1



def lease_holds(conn: sqlite3.Connection, session_id: str, lease_token: int,
                now: float | None) -> bool:
    """LEASE-4 for acts the store cannot fence (a model call, a tool run): would a write
    with ``lease_token`` be accepted now? Reads only."""
    try:
        leases.check_fence(conn, session_id, lease_token, now, session_required=False)
    except LeaseLost:
        return False
    return True


def _check_fence(
    conn: sqlite3.Connection, session_id: str, lease_token: int, *, session_required: bool,
    now: float | None = None,
) -> None:
    """LEASE-4: the session's lease must be held, carry ``lease_token`` and be unexpired."""
    leases.check_fence(conn, session_id, lease_token, now, session_required=session_required)


def rewrite_message(
    conn: StoreConnection,
    events: Sequence[EventRow],
    session_id: str,
    lease_token: int,
    row_id: int,
    content: str,
    now: float | None = None,
) -> Message:
    """Fenced content rewrite: the row becomes what ``Message.rewritten`` makes of it, the
    engine's one rule for a rewrite, so its api_content sidecar goes (WIRE-2)."""
    with _write(conn):
        _check_fence(conn, session_id, lease_token, session_required=False, now=now)
        found = conn.execute(_SELECT_ONE, (row_id, session_id)).fetchall()
        if not found:
            raise PersistenceError(
                f"no row {row_id} in session {session_id!r}", cause="not_found"
            )
        new = decode_message(found[0]).rewritten(content)  # a row that does not decode rolls back
        rows = conn.execute(_REWRITE, (new.content, new.api_content, row_id, session_id)).fetchall()
        message = decode_message(rows[0])
        _insert_events(conn, events)
    return message


def watermark(conn: sqlite3.Connection) -> int:
    with _read(conn):
        value: int = conn.execute(_WATERMARK).fetchone()[0]
    return value


# -- leases ------------------------------------------------------------------------------

_RELEASE = (
    "UPDATE turn_leases SET holder = NULL, expires_at = 0 "
    "WHERE session_id = ? AND token = ? AND holder = ?"
)
_SELECT_LEASES = (
    "SELECT rowid, session_id, holder, token, acquired_at, expires_at "
    "FROM turn_leases ORDER BY rowid"
)


def acquire_lease(
    conn: StoreConnection,
    events: Sequence[EventRow],
    session_id: str,
    holder: str,
    now: float,
    ttl_s: float,
    holder_alive: Callable[[str], bool] | None = None,
    poll_s: float = 0.0,
) -> Lease | None:
    """Grant if free, released or expired (token + 1); None if held and unexpired.

    A live-looking lease whose holder process is dead (``holder_alive`` says so) is
    reclaimable too (LEASE-3): it is marked expired inside the same transaction.
    A refused acquire commits no event: ``events`` stay pending. It writes nothing at all,
    unless the asker waits in line (``poll_s``): then only its place in the queue.
    """
    expires_at = now + ttl_s
    try:
        with _write(conn):
            session_id = _lease_target(conn, session_id)  # CMP-5: a rotated session's tip
            token = leases.take(conn, session_id, holder, now, ttl_s, holder_alive, poll_s)
            if token is None and poll_s <= 0:
                raise _Busy
            if token is not None:
                _insert_events(conn, events)
    except _Busy:
        return None
    if token is None:
        return None
    return Lease(
        session_id=session_id, holder=holder, token=token,
        acquired_at=now, expires_at=expires_at,
    )


def _lease_target(conn: sqlite3.Connection, session_id: str) -> str:
    from hermes_ref.shell.sqlite_compaction import lease_target  # CMP-5: it builds on this

    return lease_target(conn, session_id)


def _follows_tip(end_reason: str | None) -> bool:
    from hermes_ref import rotation  # CMP-5

    return rotation.lease_follows_tip(end_reason)


def open_turn(
    conn: StoreConnection,
    events: Sequence[EventRow],
    record: SessionRecord,
    holder: str,
    now: float,
    ttl_s: float,
    holder_alive: Callable[[str], bool] | None = None,
    poll_s: float = 0.0,
    opening: Opening | None = None,
    before_opening: Callable[[], None] | None = None,
    create: bool = True,
) -> LeaseGrant:
    """Ensure the session row, take its lease and store the opening rows when they apply
    (``Opening.applies``), in ONE transaction (one commit, one fsync).

    When the lease is held and the row already existed, nothing is written: the
    transaction rolls back and pending events stay pending, as with ``acquire_lease``.
    The opening rows are a savepoint of the transaction: if they fail, the grant still
    commits and the grant says why the rows did not (``before_opening`` runs first; the
    simulator plans its write failures there). With ``create`` False the row must exist
    already (a served session's turn): a missing one is refused with ``foreign_key``.
    """
    expires_at = now + ttl_s
    stored: SessionRecord = record
    created = False
    grant: LeaseGrant
    try:
        with _write(conn):
            if create:
                created = conn.execute(_INSERT_SESSION_OR_IGNORE, session_row(record)).rowcount == 1
            if not created:
                row = conn.execute(_SELECT_SESSION, (record.id,)).fetchone()
                if row is None:  # only when not asked to create it
                    raise PersistenceError(f"no session {record.id!r}", cause="foreign_key")
                stored = decode_session(row)
                if _follows_tip(stored.end_reason):  # CMP-5: the turn runs on the tip
                    tip = _lease_target(conn, stored.id)
                    stored = decode_session(conn.execute(_SELECT_SESSION, (tip,)).fetchone())
            token = leases.take(conn, stored.id, holder, now, ttl_s, holder_alive, poll_s,
                                new_session=created)
            if token is None and not created and poll_s <= 0:
                raise _Busy
            if token is not None or created:
                _insert_events(conn, events)
            lease = Lease(session_id=stored.id, holder=holder, token=token,
                          acquired_at=now, expires_at=expires_at) if token is not None else None
            grant = LeaseGrant(session=stored, created=created, lease=lease)
            if opening is not None and opening.applies(record.id, created, lease):
                grant = _store_opening(conn, grant, opening, before_opening)
    except _Busy:
        return LeaseGrant(session=stored, created=False, lease=None)
    return grant


def _store_opening(conn: StoreConnection, grant: LeaseGrant, opening: Opening,
                   before_opening: Callable[[], None] | None) -> LeaseGrant:
    """The opening rows in a savepoint of the grant's transaction; a failure fails them alone."""
    try:
        with _write(conn):  # inside the open transaction: a SAVEPOINT
            if before_opening is not None:
                before_opening()
            opened = _store_rows(conn, grant.session.id, opening.rows)
            _insert_events(conn, [encode_event(e) for e in opening.events])
    except PersistenceError as error:
        if not conn.in_transaction:  # SQLite abandoned the whole transaction: nothing stands
            raise
        return grant.model_copy(update={"opening_failure": (error.cause, str(error))})
    return grant.model_copy(update={"opened": opened})


def close_turn(conn: StoreConnection, events: Sequence[EventRow], lease: Lease, closing: Closing,
               now: float = 0.0, before_release: Callable[[], None] | None = None) -> Closed:
    """The final rows (fenced), the ending's events and the release, in ONE transaction.

    Rows that fail roll the whole transaction back (nothing of it commits, pending events
    stay pending). The release is a savepoint of its own: if it fails, the rows and the
    events still commit and ``Closed.release_failure`` says why (``before_release`` runs
    first; the simulator plans its write failures there).
    """
    with _write(conn):
        _check_fence(conn, lease.session_id, lease.token, session_required=True, now=now)
        stored = _store_rows(conn, lease.session_id, closing.rows)
        _insert_events(conn, events)
        _insert_events(conn, [encode_event(e) for e in closing.events])
        failure = _release_alone(conn, lease, now, before_release)
    return Closed(stored=stored, release_failure=failure)


def _release_alone(conn: StoreConnection, lease: Lease, now: float,
                   before_release: Callable[[], None] | None) -> tuple[str, str] | None:
    """The release in a savepoint of the closing's transaction; a failure fails it alone."""
    try:
        with _write(conn):  # inside the open transaction: a SAVEPOINT
            if before_release is not None:
                before_release()
            if conn.execute(_RELEASE, (lease.session_id, lease.token, lease.holder)).rowcount:
                leases.close_released(conn, lease, now)
    except PersistenceError as error:
        if not conn.in_transaction:  # SQLite abandoned the whole transaction: nothing stands
            raise
        return (error.cause, str(error))
    return None


def release_lease(conn: StoreConnection, events: Sequence[EventRow], lease: Lease,
                  now: float = 0.0) -> None:
    """Release only the caller's own grant; keeps the token so the next grant is higher."""
    with _write(conn):
        if conn.execute(_RELEASE, (lease.session_id, lease.token, lease.holder)).rowcount:
            leases.close_released(conn, lease, now)
        _insert_events(conn, events)


def leave_lease_queue(conn: StoreConnection, events: Sequence[EventRow], session_id: str,
                      holder: str) -> None:
    """A waiter that gives up leaves the session's queue (LEASE-5)."""
    with _write(conn):
        leases.leave_queue(conn, session_id, holder)
        _insert_events(conn, events)


def refresh_lease(conn: StoreConnection, events: Sequence[EventRow], lease: Lease, now: float,
                  ttl_s: float, clock_now: float | None = None) -> Lease:
    """Extend the caller's own unexpired grant (LEASE-2); ``LeaseLost`` when it is gone."""
    with _write(conn):
        refreshed = leases.refresh(conn, lease, now, ttl_s,
                                   now if clock_now is None else clock_now)
        _insert_events(conn, events)
    return refreshed


# -- snapshot ----------------------------------------------------------------------------


def snapshot(conn: sqlite3.Connection) -> DurableRecord:
    """Everything committed, read in one read transaction (one consistent view)."""
    from hermes_ref.shell import sqlite_admissions  # ADM: it builds on this module
    with _read(conn, consistent=True):
        sessions = conn.execute(_SELECT_SESSIONS).fetchall()
        messages = conn.execute(_SELECT_ALL_MESSAGES).fetchall()
        events = conn.execute(_SELECT_EVENTS).fetchall()
        lease_rows = conn.execute(_SELECT_LEASES).fetchall()
        grants = leases.read_grants(conn)
        door = sqlite_admissions.read_door(conn)  # ADM
    return DurableRecord(
        sessions=tuple(decode_session(row) for row in sessions),
        messages=tuple(
            StoredMessage(session_id=row[0], message=decode_message(row[1:])) for row in messages
        ),
        events=tuple(decode_event(row) for row in events),
        leases=tuple(decode_lease(row) for row in lease_rows),
        lease_grants=grants,
        **door,
    )


__all__ = [
    "acquire_lease",
    "append_messages",
    "create_session",
    "end_session",
    "events_after",
    "flush_events",
    "get_session",
    "load_messages",
    "refresh_lease",
    "release_lease",
    "rewrite_message",
    "snapshot",
    "watermark",
]


def refused(op: object, result: object) -> bool:
    """Did ``op`` write nothing? A refused lease write leaves the pending events pending."""
    if op is acquire_lease:
        return result is None
    if op is open_turn:
        return isinstance(result, LeaseGrant) and result.lease is None and not result.created
    return False
