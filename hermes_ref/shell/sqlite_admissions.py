"""The admission door's SQL: plain synchronous functions over one connection.

Theory of operation
-------------------
These functions follow ``sqlite_ops``' rules: each write is one ``BEGIN IMMEDIATE`` …
``COMMIT`` (``sqlite_ops._write``) that also inserts the caller's pending events, and
both SQLite stores call them (the async store on aiosqlite's worker thread, whole).

The SQL stays dumb on purpose. Inside the write transaction each function reads the rows
it needs, asks ``hermes_ref.admission`` what to do (``decide_admit``, ``next_claim``,
``apply_move``, ``recover``, the functions ``MemoryStore`` asks too), and writes the
answer. So the idempotency check and its insert are one transaction (ADM-3), the claim
and its FIFO choice are one (ADM-4), and a fenced move cannot interleave with another
writer: the write lock is taken before anything is read.

``runtime_epoch`` is a singleton row: the highest epoch begun and the admission clock
(``tick``), which counts transitions so that checkers can order claims, orphanings and
settlements without trusting anyone's clock. ``runtime_epochs`` holds one row per
process's epoch: its holder identity (``pid=..:pidns=..``), when it began, and when
recovery retired it. Recovery asks the store's ``holder_alive`` probe (production:
``liveness.holder_alive``, by pid) which holders are dead, inside the write transaction;
a store without a probe presumes every other holder alive.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from hermes_ref import admission
from hermes_ref.admission import (
    AdmissionRow,
    AdmitAnswer,
    Binding,
    ClaimAnswer,
    EpochRecord,
    EpochStart,
    Move,
    Outcome,
)
from hermes_ref.errors import PersistenceError
from hermes_ref.shell import sqlite_ops as ops
from hermes_ref.shell.sqlite_codec import (
    ADMISSION_COLUMNS,
    EventRow,
    admission_values,
    decode_admission,
    decode_binding,
)
from hermes_ref.shell.sqlite_connect import StoreConnection

_COLUMNS = ", ".join(ADMISSION_COLUMNS)
_INSERT = (f"INSERT INTO admissions({_COLUMNS}) "
           f"VALUES ({', '.join('?' for _ in ADMISSION_COLUMNS)})")
_MUTABLE = ADMISSION_COLUMNS[ADMISSION_COLUMNS.index("status"):]
_UPDATE = (f"UPDATE admissions SET {', '.join(f'{c} = ?' for c in _MUTABLE)} "
           "WHERE admission_id = ?")
_BY_REQUEST = (f"SELECT {_COLUMNS} FROM admissions "
               "WHERE session_id = ? AND request_id = ? ORDER BY seq")
_BY_ID = f"SELECT {_COLUMNS} FROM admissions WHERE admission_id = ?"
_OF_SESSION = f"SELECT {_COLUMNS} FROM admissions WHERE session_id = ? ORDER BY seq"
_ALL = f"SELECT {_COLUMNS} FROM admissions ORDER BY seq"
_NEXT_SEQ = "SELECT COALESCE(MAX(seq), 0) + 1 FROM admissions"
_MARK = "SELECT COALESCE(MAX(seq), 0) FROM admissions"
_SESSION_EXISTS = "SELECT 1 FROM sessions WHERE id = ?"
_WATERMARK = "SELECT COALESCE(MAX(id), 0) FROM messages"
_EPOCH = "SELECT epoch, tick FROM runtime_epoch WHERE singleton = 1"
_SET_TICK = "UPDATE runtime_epoch SET tick = ? WHERE singleton = 1"
_BEGIN_EPOCH = (
    "INSERT INTO runtime_epoch(singleton, epoch, tick, started_at) VALUES (1, ?, ?, ?) "
    "ON CONFLICT(singleton) DO UPDATE SET epoch = excluded.epoch, tick = excluded.tick, "
    "started_at = excluded.started_at"
)
_EPOCHS = "SELECT epoch, holder, started_at, retired_at FROM runtime_epochs ORDER BY epoch"
_NEW_EPOCH = "INSERT INTO runtime_epochs(epoch, holder, started_at) VALUES (?, ?, ?)"
_RETIRE = "UPDATE runtime_epochs SET retired_at = ? WHERE epoch = ? AND retired_at IS NULL"
_BIND = (
    "INSERT INTO session_bindings(principal_id, session_id, kind, role) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(principal_id, session_id) DO UPDATE SET kind = excluded.kind, "
    "role = excluded.role"
)
_BINDING = ("SELECT rowid, principal_id, session_id, kind, role FROM session_bindings "
            "WHERE principal_id = ? AND session_id = ?")
_BINDINGS = ("SELECT rowid, principal_id, session_id, kind, role FROM session_bindings "
             "ORDER BY session_id, principal_id")


def _epoch_tick(conn: sqlite3.Connection) -> tuple[int, int]:
    found = conn.execute(_EPOCH).fetchone()
    return (0, 0) if found is None else (int(found[0]), int(found[1]))


def _update(conn: sqlite3.Connection, row: AdmissionRow) -> None:
    values = admission_values(row)
    conn.execute(_UPDATE, (*values[ADMISSION_COLUMNS.index("status"):], row.admission_id))


def bind_principal(conn: StoreConnection, events: Sequence[EventRow], binding: Binding) -> None:
    with ops._write(conn):
        conn.execute(_BIND, (binding.principal_id, binding.session_id, binding.kind.value,
                             binding.role.value))
        ops._insert_events(conn, events)


def get_binding(conn: sqlite3.Connection, principal_id: str, session_id: str) -> Binding | None:
    with ops._read(conn):
        found = conn.execute(_BINDING, (principal_id, session_id)).fetchone()
    return None if found is None else decode_binding(found)


def _epochs(conn: sqlite3.Connection) -> list[EpochRecord]:
    return [EpochRecord(epoch=int(e), holder=str(h), started_at=float(at),
                        retired_at=None if gone is None else float(gone))
            for e, h, at, gone in conn.execute(_EPOCHS).fetchall()]


def _live(conn: sqlite3.Connection, epoch: int) -> bool:
    return admission.epoch_live(_epochs(conn), epoch)


def begin_epoch(conn: StoreConnection, events: Sequence[EventRow], now: float, holder: str,
                holder_alive: Callable[[str], bool] | None) -> EpochStart:
    """This process's new epoch, recorded with its holder, and recovery, in one transaction."""
    with ops._write(conn):
        epoch, tick = _epoch_tick(conn)
        conn.execute(_NEW_EPOCH, (epoch + 1, holder, now))
        conn.execute(_BEGIN_EPOCH, (epoch + 1, tick, now))
        start = _recover(conn, epoch + 1, now, holder_alive)
        ops._insert_events(conn, events)
    return start


def recover_epochs(conn: StoreConnection, events: Sequence[EventRow], epoch: int, now: float,
                   holder_alive: Callable[[str], bool] | None) -> EpochStart:
    """Recovery under the caller's live ``epoch``, in one transaction."""
    with ops._write(conn):
        start = _recover(conn, epoch, now, holder_alive)
        ops._insert_events(conn, events)
    return start


def _recover(conn: sqlite3.Connection, epoch: int, now: float,
             holder_alive: Callable[[str], bool] | None) -> EpochStart:
    """Retire dead holders' epochs and make their started rows unknown (inside the write)."""
    dead = admission.retirable(_epochs(conn), epoch, holder_alive or (lambda holder: True))
    for number in dead:
        conn.execute(_RETIRE, (now, number))
    _, tick = _epoch_tick(conn)
    rows = [decode_admission(r) for r in conn.execute(_ALL).fetchall()]
    changed = admission.recover(rows, dead, now, tick)
    for row in changed:
        _update(conn, row)
    conn.execute(_SET_TICK, (tick + len(changed),))
    return EpochStart(epoch=epoch, retired=tuple(dead), orphaned=tuple(changed))


def admit_input(conn: StoreConnection, events: Sequence[EventRow],
                candidate: AdmissionRow) -> AdmitAnswer:
    """The idempotency check and the insert in one transaction (ADM-3)."""
    with ops._write(conn):
        same = [decode_admission(r) for r in conn.execute(
            _BY_REQUEST, (candidate.session_id, candidate.request_id)).fetchall()]
        existing = next((r for r in same if admission.same_request(r, candidate)), None)
        verdict = admission.decide_admit(existing, candidate)
        if verdict == "new" and conn.execute(
                _SESSION_EXISTS, (candidate.session_id,)).fetchone() is None:
            verdict = "not_found"
        row = existing if verdict == "hit" else None
        if verdict == "new":
            row = candidate.model_copy(update={"seq": conn.execute(_NEXT_SEQ).fetchone()[0]})
            conn.execute(_INSERT, admission_values(row))
        ops._insert_events(conn, events)
    return AdmitAnswer(verdict=verdict, row=row)


def claim_admission(conn: StoreConnection, events: Sequence[EventRow], session_id: str,
                    epoch: int, now: float) -> ClaimAnswer:
    """The FIFO choice and the claim in one transaction (ADM-4)."""
    with ops._write(conn):
        admission.fence(_epochs(conn), epoch)
        rows = [decode_admission(r) for r in conn.execute(_OF_SESSION, (session_id,)).fetchall()]
        answer = admission.next_claim(rows)
        if answer.row is not None:
            _, tick = _epoch_tick(conn)
            mark = conn.execute(_WATERMARK).fetchone()[0]
            claimed = admission.apply_move(answer.row, Move.CLAIM, epoch=epoch,
                                           live=_live(conn, epoch), now=now, tick=tick + 1,
                                           claim_mark=mark)
            _update(conn, claimed)
            conn.execute(_SET_TICK, (tick + 1,))
            answer = ClaimAnswer(row=claimed)
        ops._insert_events(conn, events)
    return answer


def move_admission(conn: StoreConnection, events: Sequence[EventRow], admission_id: str,
                   session_id: str, move: Move, epoch: int, now: float,
                   outcome: Outcome | None = None, turn_id: str | None = None) -> AdmissionRow:
    """Settle, cancel or reconcile, fenced by the stored epoch (``admission.apply_move``)."""
    with ops._write(conn):
        found = conn.execute(_BY_ID, (admission_id,)).fetchone()
        row = None if found is None else decode_admission(found)
        if row is None or row.session_id != session_id:
            raise PersistenceError(f"no admission {admission_id!r} in session {session_id!r}",
                                   cause="not_found")
        _, tick = _epoch_tick(conn)
        moved = admission.apply_move(row, move, epoch=epoch, live=_live(conn, epoch), now=now,
                                     tick=tick + 1, outcome=outcome, turn_id=turn_id)
        _update(conn, moved)
        conn.execute(_SET_TICK, (tick + 1,))
        ops._insert_events(conn, events)
    return moved


def admission_mark(conn: sqlite3.Connection) -> int:
    """The highest committed admission seq (0 when there is none)."""
    with ops._read(conn):
        value: int = conn.execute(_MARK).fetchone()[0]
    return value


def read_door(conn: sqlite3.Connection) -> dict[str, Any]:
    """The snapshot's door fields: rows, bindings, the highest epoch and every epoch (the
    caller holds the read transaction)."""
    rows = tuple(decode_admission(r) for r in conn.execute(_ALL).fetchall())
    bindings = tuple(decode_binding(r) for r in conn.execute(_BINDINGS).fetchall())
    return {"admissions": rows, "bindings": bindings, "epoch": _epoch_tick(conn)[0],
            "epochs": tuple(_epochs(conn))}
