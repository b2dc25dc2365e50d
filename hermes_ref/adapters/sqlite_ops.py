"""The SQL of the durable store, as plain synchronous functions over one connection.

Theory of operation
-------------------
Both SQLite stores (``sim.sqlite_store.SqliteStore`` over stdlib sqlite3 and
``hermes_ref.adapters.sqlite_store.AsyncSqliteStore`` over aiosqlite) call these
functions; the async store runs each one whole on aiosqlite's worker thread, so a store
method is one thread hop and one transaction.

* ``open_connection`` (= ``check_header`` + ``connect`` + ``prepare``) refuses a file that
  is not SQLite or fails ``PRAGMA quick_check`` (``BadInput`` naming the path), applies
  the PRAGMAs and migrations, and returns a ``StoreConnection`` in autocommit mode: every
  transaction here is explicit.
* Every write function is ``BEGIN IMMEDIATE`` … ``COMMIT`` (``_write``): the write lock
  is taken up front, so a fence check and the write it guards cannot interleave with
  another writer. Any error rolls back; sqlite3 errors leave as ``PersistenceError`` with a
  short ``cause`` and the original as ``__cause__``. ``StoreConnection.commits`` counts the
  COMMITs that succeeded.
* Events are buffered by the caller (already encoded by ``encode_event``) and handed to
  the next write function as its ``events`` argument (always the second, after the
  connection), which inserts them in its own transaction: they commit with that write or
  not at all.
* Stored rows decode into exactly equal model values; a row that does not decode is
  reported as ``BadInput`` naming table, row id and column. Reads never modify anything.

SQL strings are module constants, so sqlite3's per-connection statement cache prepares
each one once.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ValidationError

from hermes_ref.adapters.sqlite_schema import (
    DEFAULT_BUSY_TIMEOUT_MS,
    check_synchronous,
    configure,
    migrate,
)
from hermes_ref.errors import BadInput, LeaseLost, PersistenceError
from hermes_ref.models import Event, Lease, Message, SessionRecord
from hermes_ref.ports import DurableRecord, LeaseRow, StoredMessage

EventRow = tuple[str, str, str, str, float]
"""An event encoded for ``INSERT INTO events``: session_id, turn_id, kind, data, at."""

ModelT = TypeVar("ModelT", bound=BaseModel)


class StoreConnection(sqlite3.Connection):
    """A sqlite3 connection that counts the write transactions it committed."""

    commits: int = 0


# -- errors ------------------------------------------------------------------------------

_CAUSES = (  # sqlite error-name prefix -> PersistenceError.cause; first match wins
    ("SQLITE_CONSTRAINT_FOREIGNKEY", "foreign_key"),
    ("SQLITE_CONSTRAINT_PRIMARYKEY", "duplicate"),
    ("SQLITE_CONSTRAINT_UNIQUE", "duplicate"),
    ("SQLITE_CONSTRAINT", "constraint"),
    ("SQLITE_BUSY", "locked"),
    ("SQLITE_LOCKED", "locked"),
    ("SQLITE_IOERR", "io"),
    ("SQLITE_CANTOPEN", "io"),
    ("SQLITE_FULL", "disk_full"),
    ("SQLITE_CORRUPT", "corrupt"),
    ("SQLITE_NOTADB", "corrupt"),
    ("SQLITE_READONLY", "readonly"),
    ("SQLITE_INTERRUPT", "interrupted"),
)


def error_cause(exc: sqlite3.Error) -> str:
    """The short machine-readable cause of a sqlite3 error."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    for prefix, cause in _CAUSES:
        if name.startswith(prefix):
            return cause
    if isinstance(exc, sqlite3.ProgrammingError) and "closed" in str(exc):
        return "closed"
    return "sqlite"


def persistence_error(exc: sqlite3.Error | ValueError | OverflowError) -> PersistenceError:
    """Map a sqlite3 error, or a value sqlite3 cannot bind (a str with a lone surrogate,
    an int beyond 64 bits); raise the result ``from exc`` to keep the cause."""
    if not isinstance(exc, sqlite3.Error):
        return PersistenceError(f"sqlite cannot store a value: {exc}", cause="encoding")
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    return PersistenceError(f"sqlite: {exc} ({name})", cause=error_cause(exc))


_MAPPED = (sqlite3.Error, UnicodeEncodeError, OverflowError)


# -- opening -----------------------------------------------------------------------------

_MAGIC = b"SQLite format 3\x00"


def open_connection(
    path: str | Path,
    *,
    synchronous: str = "FULL",
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
) -> StoreConnection:
    """Open, check, configure and migrate the database at ``path``."""
    mode = check_synchronous(synchronous)
    check_header(path)
    conn = connect(path, busy_timeout_ms=busy_timeout_ms)
    try:
        prepare(conn, path, synchronous=mode, busy_timeout_ms=busy_timeout_ms)
    except BaseException:
        conn.close()
        raise
    return conn


def connect(path: str | Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> StoreConnection:
    """The bare connection (autocommit mode); ``prepare`` must run on it before use."""
    try:
        return sqlite3.connect(
            path, timeout=busy_timeout_ms / 1000, isolation_level=None, factory=StoreConnection
        )
    except sqlite3.Error as exc:
        raise BadInput(f"{path}: cannot open as a SQLite database: {exc}") from exc


def prepare(
    conn: StoreConnection,
    path: str | Path,
    *,
    synchronous: str = "FULL",
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
) -> None:
    """PRAGMAs, ``quick_check`` and migrations; a damaged file is ``BadInput`` naming it."""
    try:
        configure(conn, synchronous, busy_timeout_ms)
        _check_integrity(conn, str(path))
        migrate(conn, str(path))
    except sqlite3.Error as exc:
        if error_cause(exc) == "corrupt":
            raise BadInput(f"{path}: not a usable SQLite database: {exc}") from exc
        raise persistence_error(exc) from exc


def check_header(path: str | Path) -> None:
    """A clear message for a file that is not SQLite at all (before sqlite3 sees it)."""
    where = str(path)
    if where == ":memory:" or where.startswith("file:"):
        return
    try:
        with open(where, "rb") as handle:
            head = handle.read(100)
    except FileNotFoundError:
        return  # a new database
    except OSError as exc:
        raise BadInput(f"{where}: cannot read the database file: {exc.strerror}") from exc
    if not head:
        return  # an empty file is a new database to SQLite
    if not head.startswith(_MAGIC):
        raise BadInput(
            f"{where}: not a SQLite database (the file starts with {head[:16]!r}, "
            f"expected {_MAGIC!r})"
        )
    if len(head) < 100:
        raise BadInput(f"{where}: truncated SQLite database ({len(head)} bytes of header)")


def _check_integrity(conn: sqlite3.Connection, where: str) -> None:
    rows = conn.execute("PRAGMA quick_check").fetchall()
    if rows != [("ok",)]:
        problems = "; ".join(str(row[0]) for row in rows[:3])
        raise BadInput(f"{where}: database is corrupt (quick_check: {problems})")


# -- transactions ------------------------------------------------------------------------


class _Busy(Exception):
    """Internal: end a write transaction without committing (nothing to write)."""


@contextmanager
def _write(conn: StoreConnection) -> Iterator[None]:
    """One write transaction: BEGIN IMMEDIATE … COMMIT, rollback on any error."""
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

_INSERT_EVENT = "INSERT INTO events(session_id, turn_id, kind, data, at) VALUES (?, ?, ?, ?, ?)"
_SELECT_EVENTS = "SELECT seq, session_id, turn_id, kind, data, at FROM events ORDER BY seq"


def encode_event(event: Event) -> EventRow:
    """Encode at ``log_event`` time, so a bad event fails there and not in a later write."""
    try:
        data = json.dumps(event.data, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise PersistenceError(
            f"event {event.kind!r} data is not JSON: {exc}", cause="encoding"
        ) from exc
    return (event.session_id, event.turn_id, event.kind, data, event.at)


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
    row = (
        record.id, record.key, record.platform, record.chat_type, record.parent_session_id,
        record.system_prompt, record.started_at, record.ended_at, record.end_reason,
    )
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
    row = (
        record.id, record.key, record.platform, record.chat_type, record.parent_session_id,
        record.system_prompt, record.started_at, record.ended_at, record.end_reason,
    )
    with _write(conn):
        created = conn.execute(_INSERT_SESSION_OR_IGNORE, row).rowcount == 1
        stored = record if created else conn.execute(_SELECT_SESSION, (record.id,)).fetchone()
        _insert_events(conn, events)
    if isinstance(stored, SessionRecord):
        return stored, True
    return _decode_session(stored), False


def get_session(conn: sqlite3.Connection, session_id: str) -> SessionRecord | None:
    with _read(conn):
        row = conn.execute(_SELECT_SESSION, (session_id,)).fetchone()
    return None if row is None else _decode_session(row)


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
_SELECT_MESSAGES = (
    f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND id > ? ORDER BY id"
)
_SELECT_ALL_MESSAGES = f"SELECT session_id, {_MESSAGE_COLUMNS} FROM messages ORDER BY id"
_REWRITE = (
    "UPDATE messages SET content = ?, api_content = NULL WHERE id = ? AND session_id = ? "
    f"RETURNING {_MESSAGE_COLUMNS}"
)
_WATERMARK = "SELECT COALESCE(MAX(id), 0) FROM messages"
_FENCE = (
    "SELECT l.holder, l.token FROM sessions s "
    "LEFT JOIN turn_leases l ON l.session_id = s.id WHERE s.id = ?"
)


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
) -> tuple[Message, ...]:
    """Insert ``messages`` in one fenced transaction; returns them with row ids set.

    Checks in MemoryStore's order: session exists, fence holds, no scaffolding (SCAF-1).
    """
    rows = [_message_row(session_id, m) for m in messages]
    with _write(conn):
        _check_fence(conn, session_id, lease_token, session_required=True)
        for message in messages:
            if message.scaffold is not None:
                raise PersistenceError(
                    f"refusing to persist scaffolding ({message.scaffold.value})",
                    cause="scaffolding",
                )
        first = _insert_messages(conn, rows)
        _insert_events(conn, events)
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


def _message_row(session_id: str, m: Message) -> tuple[Any, ...]:
    calls = (
        json.dumps([{"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls])
        if m.tool_calls
        else None
    )
    return (
        session_id, m.role.value, m.content, m.api_content, calls, m.tool_call_id,
        m.tool_name, m.finish_reason, m.turn_id, 1 if m.hidden else 0, m.created_at,
    )


def _check_fence(
    conn: sqlite3.Connection, session_id: str, lease_token: int, *, session_required: bool
) -> None:
    """LEASE-4: the session's lease must be held and carry ``lease_token``."""
    row = conn.execute(_FENCE, (session_id,)).fetchone()
    if row is None and session_required:
        raise PersistenceError(f"no session {session_id!r}", cause="foreign_key")
    holder, token = row if row is not None else (None, None)
    if holder is None or token != lease_token:
        raise LeaseLost(
            f"write to session {session_id!r} with lease token {lease_token} "
            f"but the current token is {token}"
        )


def rewrite_message(
    conn: StoreConnection,
    events: Sequence[EventRow],
    session_id: str,
    lease_token: int,
    row_id: int,
    content: str,
) -> Message:
    """Fenced content rewrite; drops the api_content sidecar (WIRE-2)."""
    with _write(conn):
        _check_fence(conn, session_id, lease_token, session_required=False)
        rows = conn.execute(_REWRITE, (content, row_id, session_id)).fetchall()
        if not rows:
            raise PersistenceError(
                f"no row {row_id} in session {session_id!r}", cause="not_found"
            )
        message = decode_message(rows[0])  # a row that does not decode rolls back
        _insert_events(conn, events)
    return message


def watermark(conn: sqlite3.Connection) -> int:
    with _read(conn):
        value: int = conn.execute(_WATERMARK).fetchone()[0]
    return value


# -- leases ------------------------------------------------------------------------------

_ACQUIRE = (
    "INSERT INTO turn_leases(session_id, holder, token, acquired_at, expires_at) "
    "VALUES (?, ?, 1, ?, ?) "
    "ON CONFLICT(session_id) DO UPDATE SET holder = excluded.holder, "
    "token = turn_leases.token + 1, acquired_at = excluded.acquired_at, "
    "expires_at = excluded.expires_at "
    "WHERE turn_leases.holder IS NULL OR turn_leases.expires_at <= excluded.acquired_at "
    "RETURNING token"
)
_SELECT_LEASE_HOLDER = "SELECT holder, expires_at FROM turn_leases WHERE session_id = ?"
_EXPIRE_LEASE = "UPDATE turn_leases SET expires_at = ? WHERE session_id = ?"
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
) -> Lease | None:
    """Grant if free, released or expired (token + 1); None if held and unexpired.

    A live-looking lease whose holder process is dead (``holder_alive`` says so) is
    reclaimable too (LEASE-3): it is marked expired inside the same transaction.
    A refused acquire writes nothing, so it commits nothing: ``events`` stay pending.
    """
    expires_at = now + ttl_s
    try:
        with _write(conn):
            if holder_alive is not None:
                _expire_dead_holder(conn, session_id, now, holder_alive)
            granted = conn.execute(_ACQUIRE, (session_id, holder, now, expires_at)).fetchall()
            if not granted:
                raise _Busy
            _insert_events(conn, events)
    except _Busy:
        return None
    return Lease(
        session_id=session_id, holder=holder, token=granted[0][0],
        acquired_at=now, expires_at=expires_at,
    )


def _expire_dead_holder(
    conn: StoreConnection, session_id: str, now: float, holder_alive: Callable[[str], bool]
) -> None:
    row = conn.execute(_SELECT_LEASE_HOLDER, (session_id,)).fetchone()
    if row is not None and row[0] is not None and row[1] > now and not holder_alive(row[0]):
        conn.execute(_EXPIRE_LEASE, (now, session_id))


def release_lease(conn: StoreConnection, events: Sequence[EventRow], lease: Lease) -> None:
    """Release only the caller's own grant; keeps the token so the next grant is higher."""
    with _write(conn):
        conn.execute(_RELEASE, (lease.session_id, lease.token, lease.holder))
        _insert_events(conn, events)


# -- snapshot ----------------------------------------------------------------------------


def snapshot(conn: sqlite3.Connection) -> DurableRecord:
    """Everything committed, read in one read transaction (one consistent view)."""
    with _read(conn, consistent=True):
        sessions = conn.execute(_SELECT_SESSIONS).fetchall()
        messages = conn.execute(_SELECT_ALL_MESSAGES).fetchall()
        events = conn.execute(_SELECT_EVENTS).fetchall()
        leases = conn.execute(_SELECT_LEASES).fetchall()
        cursor = conn.execute("SELECT * FROM admissions ORDER BY seq")
        names = [column[0] for column in cursor.description]
        admissions = cursor.fetchall()
    return DurableRecord(
        sessions=tuple(_decode_session(row) for row in sessions),
        messages=tuple(
            StoredMessage(session_id=row[0], message=decode_message(row[1:])) for row in messages
        ),
        events=tuple(_decode_event(row) for row in events),
        leases=tuple(_decode_lease(row) for row in leases),
        admissions=tuple(dict(zip(names, row, strict=True)) for row in admissions),
    )


# -- decoding ----------------------------------------------------------------------------


def decode_message(row: Sequence[Any]) -> Message:
    """A ``messages`` row (``_MESSAGE_COLUMNS`` order) as the exact Message it stored."""
    rid, role, content, api, calls, call_id, name, finish, turn, hidden, created = row
    tool_calls = () if calls is None else _json_column("messages", rid, "tool_calls", calls)
    return _build(Message, "messages", rid, {
        "row_id": rid, "role": role, "content": content, "api_content": api,
        "tool_calls": tool_calls, "tool_call_id": call_id, "tool_name": name,
        "finish_reason": finish, "turn_id": turn, "hidden": _flag(rid, hidden),
        "created_at": created,
    })


def _decode_session(row: Sequence[Any]) -> SessionRecord:
    rowid, *values = row
    names = (
        "id", "key", "platform", "chat_type", "parent_session_id", "system_prompt",
        "started_at", "ended_at", "end_reason",
    )
    return _build(SessionRecord, "sessions", rowid, dict(zip(names, values, strict=True)))


def _decode_event(row: Sequence[Any]) -> Event:
    seq, session_id, turn_id, kind, data, at = row
    return _build(Event, "events", seq, {
        "seq": seq, "session_id": session_id, "turn_id": turn_id, "kind": kind,
        "data": _json_column("events", seq, "data", data), "at": at,
    })


def _decode_lease(row: Sequence[Any]) -> LeaseRow:
    rowid, session_id, holder, token, acquired_at, expires_at = row
    return _build(LeaseRow, "turn_leases", rowid, {
        "session_id": session_id, "holder": holder, "token": token,
        "acquired_at": acquired_at, "expires_at": expires_at,
    })


def _flag(rid: int, value: object) -> bool:
    if not (isinstance(value, int) and value in (0, 1)):
        raise _bad("messages", rid, "hidden", f"{value!r} is not 0 or 1")
    return bool(value)


def _json_column(table: str, rowid: object, column: str, text: object) -> Any:
    if not isinstance(text, str):
        raise _bad(table, rowid, column, f"expected JSON text, found {type(text).__name__}")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _bad(table, rowid, column, f"not JSON ({exc})") from exc


def _build(model: type[ModelT], table: str, rowid: object, fields: dict[str, Any]) -> ModelT:
    try:
        return model(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "?"
        column = {"row_id": "id"}.get(field, field)
        raise _bad(table, rowid, column, f"{error['msg']} (found {error['input']!r:.80})") from exc


def _bad(table: str, rowid: object, column: str, why: str) -> BadInput:
    return BadInput(
        f"stored row does not decode: table {table}, row {rowid}, column {column}: {why}"
    )


__all__ = [
    "EventRow",
    "StoreConnection",
    "acquire_lease",
    "append_messages",
    "check_header",
    "connect",
    "create_session",
    "decode_message",
    "encode_event",
    "end_session",
    "error_cause",
    "flush_events",
    "get_session",
    "load_messages",
    "open_connection",
    "persistence_error",
    "prepare",
    "release_lease",
    "rewrite_message",
    "snapshot",
    "watermark",
]
