"""The simulator's durable store over stdlib sqlite3 (a synchronous ``Store``).

Theory of operation
-------------------
All SQL lives in ``hermes_ref.shell.sqlite_ops``; this class owns one connection and
the pending-event buffer, exactly like ``MemoryStore``: ``log_event`` encodes the event
and keeps it in memory; the next write method hands the whole buffer to its op, which
inserts it in the write's own transaction. The buffer is taken before the op runs and put
back if the op fails or (a refused ``acquire_lease``) writes nothing, so pending events
are committed exactly once, in order.

``crash()`` is a killed process: the buffer is dropped and the connection closed without
committing anything (every write already committed before it returned). ``reopen()``, or
a new ``SqliteStore`` on the same path, recovers the committed state from the file.

Opening (``hermes_ref.shell.sqlite_connect.open_connection``, whose ``ready`` the async
store calls too) judges the file read-only first: a missing path becomes a new database, a database of ours
opens (older ones are migrated), and anything else (a foreign or newer database, an empty
or non-SQLite file) is refused with ``BadInput`` before a byte of it changes.

``commits`` counts the write transactions committed through this object, across reopens
(schema migrations are not counted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from hermes_ref.admission import (
    AdmissionRow,
    AdmitAnswer,
    Binding,
    ClaimAnswer,
    EpochStart,
    Move,
    Outcome,
)
from hermes_ref.lane_restart import LaneEntry  # SES
from hermes_ref.models import (
    Closed,
    Closing,
    Compacted,
    Event,
    Lease,
    LeaseGrant,
    Message,
    Opening,
    SessionRecord,
)
from hermes_ref.ports import DurableRecord
from hermes_ref.session import Route  # SES
from hermes_ref.shell import sqlite_admissions as adm
from hermes_ref.shell import sqlite_compaction as compaction  # CMP-5, CMP-6
from hermes_ref.shell import sqlite_ops as ops
from hermes_ref.shell import sqlite_routes as lanes  # SES
from hermes_ref.shell.sqlite_codec import EventRow, encode_event
from hermes_ref.shell.sqlite_connect import StoreConnection, open_connection
from hermes_ref.shell.sqlite_schema import DEFAULT_BUSY_TIMEOUT_MS

P = ParamSpec("P")
R = TypeVar("R")


class SqliteStore:
    """A synchronous ``Store`` on a SQLite file."""

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "FULL",
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        holder_alive: Callable[[str], bool] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.path = Path(path)
        self._holder_alive = holder_alive
        self._clock = clock  # LEASE-4: the store's clock decides expiry (None: never)
        self._synchronous = synchronous
        self._busy_timeout_ms = busy_timeout_ms
        self._pending: list[Event] = []
        self._past_commits = 0
        self._conn = self._open()

    def _open(self) -> StoreConnection:
        return open_connection(
            self.path, synchronous=self._synchronous, busy_timeout_ms=self._busy_timeout_ms
        )

    @property
    def commits(self) -> int:
        """Write transactions committed through this store (all connections)."""
        return self._past_commits + self._conn.commits

    def _write(
        self,
        op: Callable[Concatenate[StoreConnection, Sequence[EventRow], P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """Run a write op with the pending events; keep them if nothing committed."""
        held, self._pending = self._pending, []
        events: list[EventRow] = [encode_event(event) for event in held]
        try:
            result = op(self._conn, events, *args, **kwargs)
        except BaseException:
            self._pending[:0] = held
            raise
        if ops.refused(op, result):
            self._pending[:0] = held  # refused: nothing was written
        return result

    # -- sessions -------------------------------------------------------------------------
    def create_session(self, record: SessionRecord) -> None:
        self._write(ops.create_session, record)

    def ensure_session(self, record: SessionRecord) -> tuple[SessionRecord, bool]:
        return self._write(ops.ensure_session, record)

    def get_session(self, session_id: str) -> SessionRecord | None:
        return ops.get_session(self._conn, session_id)

    def end_session(self, session_id: str, reason: str, at: float) -> None:
        self._write(ops.end_session, session_id, reason, at)

    # -- messages -------------------------------------------------------------------------
    def load_messages(self, session_id: str, after_row_id: int = 0) -> tuple[Message, ...]:
        return ops.load_messages(self._conn, session_id, after_row_id)

    def append_messages(
        self, session_id: str, lease_token: int, messages: tuple[Message, ...]
    ) -> tuple[Message, ...]:
        return self._write(ops.append_messages, session_id, lease_token, messages, self._now())

    def rewrite_message(
        self, session_id: str, lease_token: int, row_id: int, content: str
    ) -> Message:
        return self._write(ops.rewrite_message, session_id, lease_token, row_id, content,
                           self._now())

    def watermark(self) -> int:
        return ops.watermark(self._conn)

    # -- leases ---------------------------------------------------------------------------
    def acquire_lease(self, session_id: str, holder: str, now: float, ttl_s: float,
                      poll_s: float = 0.0) -> Lease | None:
        return self._write(ops.acquire_lease, session_id, holder, now, ttl_s, self._holder_alive,
                           poll_s)

    def open_turn(self, record: SessionRecord, holder: str, now: float, ttl_s: float,
                  poll_s: float = 0.0, opening: Opening | None = None,
                  before_opening: Callable[[], None] | None = None,
                  create: bool = True) -> LeaseGrant:
        return self._write(ops.open_turn, record, holder, now, ttl_s, self._holder_alive, poll_s,
                           opening, before_opening, create)

    def would_open(self, record: SessionRecord, holder: str, now: float, ttl_s: float,
                   poll_s: float, opening: Opening) -> bool:
        """Would ``open_turn`` store ``opening`` now? Asked in a transaction rolled back."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            grant = ops.open_turn(self._conn, (), record, holder, now, ttl_s, self._holder_alive,
                                  poll_s, opening)
        finally:
            self._conn.execute("ROLLBACK")
        return bool(grant.opened)

    def release_lease(self, lease: Lease) -> None:
        self._write(ops.release_lease, lease, self._now() or 0.0)

    def close_turn(self, lease: Lease, closing: Closing,
                   before_release: Callable[[], None] | None = None) -> Closed:
        return self._write(ops.close_turn, lease, closing, self._now() or 0.0, before_release)

    def leave_lease_queue(self, session_id: str, holder: str) -> None:
        self._write(ops.leave_lease_queue, session_id, holder)

    def refresh_lease(self, lease: Lease, now: float, ttl_s: float) -> Lease:
        return self._write(ops.refresh_lease, lease, now, ttl_s, self._now())

    def lease_holds(self, session_id: str, lease_token: int) -> bool:
        return ops.lease_holds(self._conn, session_id, lease_token, self._now())

    def _now(self) -> float | None:
        return self._clock() if self._clock is not None else None

    # -- events ---------------------------------------------------------------------------
    def log_event(self, event: Event) -> None:
        self._pending.append(event)

    def take_pending_events(self) -> list[Event]:
        """Hand back the events no write has committed yet (a process keeps its own)."""
        held, self._pending = self._pending, []
        return held

    def flush_events(self) -> None:
        if self._pending:
            self._write(ops.flush_events)

    def events_after(self, session_id: str, turn_id: str, after_seq: int) -> tuple[Event, ...]:
        """DEL-2: the committed events of one turn numbered after ``after_seq``."""
        return ops.events_after(self._conn, session_id, turn_id, after_seq)

    # -- world operations -----------------------------------------------------------------
    def snapshot(self) -> DurableRecord:
        return compaction.snapshot(self._conn)  # sqlite_ops.snapshot + the SES and CMP tables

    def admission_rows(self) -> tuple[AdmissionRow, ...]:
        """The door's rows in seq order, as ``snapshot().admissions`` holds them."""
        return self.snapshot().admissions

    def crash(self) -> None:
        """The process died: pending events are gone, committed rows stay in the file."""
        self._pending.clear()
        self._close_connection()

    def reopen(self) -> None:
        """Recover after ``crash()`` (or ``close()``) from what the file holds."""
        self._close_connection()
        self._conn = self._open()

    def close(self) -> None:
        self._pending.clear()
        self._close_connection()

    def _close_connection(self) -> None:
        self._past_commits += self._conn.commits
        self._conn.commits = 0
        self._conn.close()  # an open transaction, if any, is rolled back by SQLite

    # -- ADM: the admission door (hermes_ref/shell/sqlite_admissions.py) ---------------------
    def bind_principal(self, binding: Binding) -> None:
        self._write(adm.bind_principal, binding)

    def get_binding(self, principal_id: str, session_id: str) -> Binding | None:
        return adm.get_binding(self._conn, principal_id, session_id)

    def begin_epoch(self, now: float, holder: str) -> EpochStart:
        return self._write(adm.begin_epoch, now, holder, self._holder_alive)

    def recover_epochs(self, epoch: int, now: float) -> EpochStart:
        return self._write(adm.recover_epochs, epoch, now, self._holder_alive)

    def admit_input(self, candidate: AdmissionRow) -> AdmitAnswer:
        return self._write(adm.admit_input, candidate)

    def claim_admission(self, session_id: str, epoch: int, now: float) -> ClaimAnswer:
        return self._write(adm.claim_admission, session_id, epoch, now)

    def move_admission(
        self, admission_id: str, session_id: str, move: Move, epoch: int, now: float,
        outcome: Outcome | None = None, turn_id: str | None = None,
    ) -> AdmissionRow:
        return self._write(adm.move_admission, admission_id, session_id, move, epoch, now,
                           outcome, turn_id)

    def admission_mark(self) -> int:
        return adm.admission_mark(self._conn)

    # -- SES: session lanes (hermes_ref/shell/sqlite_routes.py) ------------------------------
    def put_route(self, route: Route, end_session_id: str | None = None,
                  end_reason: str | None = None, start: SessionRecord | None = None) -> bool:
        return self._write(lanes.put_route, route, end_session_id, end_reason, start)

    def get_route(self, key: str) -> Route | None:
        return lanes.get_route(self._conn, key)

    def latest_routes(self) -> tuple[Route, ...]:
        return lanes.latest_routes(self._conn)

    def read_markers(self) -> dict[str, float]:
        return lanes.read_markers(self._conn)

    def write_lane(self, markers: tuple[tuple[str, float | None], ...],
                   log: tuple[LaneEntry, ...] = ()) -> None:
        self._write(lanes.write_lane, markers, log)

    def live_background(self) -> frozenset[str]:
        return lanes.live_background(self._conn)

    # -- CMP-5, CMP-6: compaction (hermes_ref/shell/sqlite_compaction.py) ---------------------
    def take_compression_lock(self, session_id: str, holder: str, now: float,
                              ttl_s: float) -> bool:
        return self._write(compaction.take_compression_lock, session_id, holder, now, ttl_s,
                           self._holder_alive)

    def release_compression_lock(self, session_id: str, holder: str, now: float) -> None:
        self._write(compaction.release_compression_lock, session_id, holder, now)

    def compact_session(self, session_id: str, lease_token: int, messages: tuple[Message, ...],
                        child: SessionRecord | None, at: float,
                        flush: tuple[Message, ...] = ()) -> Compacted:
        return self._write(compaction.compact_session, session_id, lease_token, messages, child,
                           at, flush, self._now())

    def compression_tip(self, session_id: str) -> SessionRecord | None:
        return compaction.compression_tip(self._conn, session_id)
