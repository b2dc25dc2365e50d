"""How the durable store's values become SQLite rows and back, and how sqlite3 errors read.

Theory of operation
-------------------
Pure translation, no SQL: ``sqlite_ops`` runs the statements, this module says what goes
into them and what comes out.

* **Encoding**: ``encode_event`` turns an ``Event`` into an ``EventRow`` when it is logged,
  so a bad event fails there and not in a later write; ``message_row`` lays a ``Message``
  out in ``INSERT INTO messages`` column order (tool calls as JSON text, ``hidden`` as 0/1).
* **Decoding**: ``decode_message``, ``decode_session``, ``decode_event`` and
  ``decode_lease`` rebuild exactly equal model values; a row that does not decode is a
  ``BadInput`` naming table, row id and column (``stored row does not decode: …``).
* **Errors**: ``error_cause`` names a sqlite3 error by its extended error name
  (``duplicate``, ``locked``, ``io``, ``corrupt``, …); ``persistence_error`` wraps it, or a
  value sqlite3 cannot bind, as a ``PersistenceError`` carrying that ``cause``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from hermes_ref.admission import AdmissionRow, Binding
from hermes_ref.errors import BadInput, PersistenceError
from hermes_ref.models import Event, Message, SessionRecord
from hermes_ref.ports import LeaseRow

EventRow = tuple[str, str, str, str, float, int | None]
"""An event encoded for ``INSERT INTO events``: session_id, turn_id, kind, data, at, turn_seq."""

ModelT = TypeVar("ModelT", bound=BaseModel)


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


# -- encoding ----------------------------------------------------------------------------


def encode_event(event: Event) -> EventRow:
    """Encode at ``log_event`` time, so a bad event fails there and not in a later write."""
    try:
        data = json.dumps(event.data, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise PersistenceError(
            f"event {event.kind!r} data is not JSON: {exc}", cause="encoding"
        ) from exc
    at = event.at if event.at is not None else 0.0
    return (event.session_id, event.turn_id, event.kind, data, at, event.turn_seq)


def message_row(session_id: str, m: Message) -> tuple[Any, ...]:
    """The values of ``sqlite_ops._INSERT_MESSAGE`` for ``m`` in ``session_id``."""
    calls = (
        json.dumps([{"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls])
        if m.tool_calls
        else None
    )
    return (
        session_id, m.role.value, m.content, m.api_content, calls, m.tool_call_id,
        m.tool_name, m.finish_reason, m.turn_id, 1 if m.hidden else 0, m.created_at,
    )


# -- decoding ----------------------------------------------------------------------------


def decode_message(row: Sequence[Any]) -> Message:
    """A ``messages`` row (``sqlite_ops._MESSAGE_COLUMNS`` order) as the exact Message it stored."""
    rid, role, content, api, calls, call_id, name, finish, turn, hidden, created = row
    tool_calls = () if calls is None else _json_column("messages", rid, "tool_calls", calls)
    return _build(Message, "messages", rid, {
        "row_id": rid, "role": role, "content": content, "api_content": api,
        "tool_calls": tool_calls, "tool_call_id": call_id, "tool_name": name,
        "finish_reason": finish, "turn_id": turn, "hidden": _flag(rid, hidden),
        "created_at": created,
    })


def decode_session(row: Sequence[Any]) -> SessionRecord:
    rowid, *values = row
    names = (
        "id", "key", "platform", "chat_type", "parent_session_id", "system_prompt",
        "started_at", "ended_at", "end_reason",
    )
    return _build(SessionRecord, "sessions", rowid, dict(zip(names, values, strict=True)))


def decode_event(row: Sequence[Any]) -> Event:
    seq, session_id, turn_id, kind, data, at, turn_seq = row
    return _build(Event, "events", seq, {
        "seq": seq, "session_id": session_id, "turn_id": turn_id, "kind": kind,
        "data": _json_column("events", seq, "data", data), "at": at, "turn_seq": turn_seq,
    })


def decode_lease(row: Sequence[Any]) -> LeaseRow:
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



def session_row(record: SessionRecord) -> tuple[object, ...]:
    """A session's column values, in the order of the sessions INSERT."""
    return (
        record.id, record.key, record.platform, record.chat_type, record.parent_session_id,
        record.system_prompt, record.started_at, record.ended_at, record.end_reason,
    )


# -- the admission door (ADM) ------------------------------------------------------------

ADMISSION_COLUMNS: tuple[str, ...] = tuple(AdmissionRow.model_fields)
"""The ``admissions`` columns in ``AdmissionRow`` field order (one name each)."""


def admission_values(row: AdmissionRow) -> tuple[object, ...]:
    """An admission's column values, in ``ADMISSION_COLUMNS`` order (enums as text)."""
    dumped = row.model_dump(mode="json")
    return tuple(dumped[name] for name in ADMISSION_COLUMNS)


def decode_admission(row: Sequence[Any]) -> AdmissionRow:
    fields = dict(zip(ADMISSION_COLUMNS, row, strict=True))
    return _build(AdmissionRow, "admissions", fields.get("seq"), fields)


def decode_binding(row: Sequence[Any]) -> Binding:
    rowid, principal_id, session_id, kind, role = row
    return _build(Binding, "session_bindings", rowid, {
        "principal_id": principal_id, "session_id": session_id, "kind": kind, "role": role})
