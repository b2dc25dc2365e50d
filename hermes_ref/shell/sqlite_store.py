"""The durable store for the asyncio driver: ``AsyncStore`` over aiosqlite.

Theory of operation
-------------------
aiosqlite owns one sqlite3 connection on a private worker thread and runs queued
callables there, one at a time. All SQL lives in ``sqlite_ops`` as synchronous functions
that each do a whole transaction (``BEGIN IMMEDIATE`` … ``COMMIT``); ``_hop`` queues one of
them on the worker, so every store method is one thread hop and at most one transaction.
Writes go through a group commit (``group_commit``): a write that arrives while another
batch is committing waits for the next one, and each batch is one hop, one transaction and
one COMMIT, each op as if in its own savepoint (applied bare first, with savepoints only if
one fails: ``group_commit.run_batch``). A caller resumes only after the commit that holds
its write; a lone writer gets a batch of one, exactly the op's own transaction.
Opening first runs ``sqlite_connect.ready`` in a thread: the same classification as the
simulator's ``SqliteStore`` (a file that is not ours, or newer, is refused before a byte
of it changes, and a missing one is created). Only then is the connection made by
aiosqlite's connector and configured, checked and migrated by ``sqlite_connect.prepare``
in one hop, both on the worker thread that will use it.

Pending events follow ``MemoryStore``: ``log_event`` encodes and buffers in memory (no
hop); the next write takes the whole buffer into its transaction. The buffer is handed
over before the hop, so concurrent writes never insert the same event twice; it is put
back when the write fails or writes nothing (a refused ``acquire_lease``). A write whose
caller is cancelled still runs (it was already queued): its events commit with it or are
lost, exactly like events pending at a crash. ``crash`` drops the writes still queued for
the next batch; the batch already committing ends whole or not at all.

``commits`` counts the write transactions committed on this connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import aiosqlite

from hermes_ref.admission import (
    AdmissionRow,
    AdmitAnswer,
    Binding,
    ClaimAnswer,
    EpochStart,
    Move,
)
from hermes_ref.admission import Outcome as AdmissionOutcome
from hermes_ref.errors import PersistenceError
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
from hermes_ref.shell import liveness, sqlite_connect
from hermes_ref.shell import sqlite_admissions as adm
from hermes_ref.shell import sqlite_compaction as compaction  # CMP-5, CMP-6
from hermes_ref.shell import sqlite_ops as ops
from hermes_ref.shell import sqlite_routes as lanes  # SES
from hermes_ref.shell.group_commit import GroupCommit, Outcome, Write, run_batch
from hermes_ref.shell.sqlite_codec import EventRow, encode_event
from hermes_ref.shell.sqlite_connect import StoreConnection
from hermes_ref.shell.sqlite_schema import DEFAULT_BUSY_TIMEOUT_MS, check_synchronous

P = ParamSpec("P")
R = TypeVar("R")

_WriteOp = Callable[Concatenate[StoreConnection, Sequence[EventRow], P], R]


class AsyncSqliteStore:
    """An ``AsyncStore`` on a SQLite file. Create with ``await AsyncSqliteStore.open(path)``."""

    def __init__(self, db: aiosqlite.Connection, raw: StoreConnection, path: Path,
                 holder_alive: Callable[[str], bool] | None = None) -> None:
        self.path = path
        self._holder_alive = holder_alive
        self.clock: Callable[[], float] = time.time  # LEASE-4: expiry at each fenced write
        self._db = db
        self._raw = raw  # made on the worker thread, used only there; we only read .commits
        self._pending: list[EventRow] = []
        self._pending_events: list[Event] = []  # DEL-2: the same events, for the listeners
        self._commit_listeners: list[Callable[[Sequence[Event]], None]] = []
        self._closed = False
        self._watermark = 0  # highest message id committed or read here (see ``watermark``)
        self._group: GroupCommit[Write] = GroupCommit(self._start_batch)
        self._reader: sqlite3.Connection | None = None  # LEASE-4's reads, on the loop

    @classmethod
    async def open(
        cls,
        path: str | Path,
        *,
        synchronous: str = "FULL",
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        holder_alive: Callable[[str], bool] | None = liveness.holder_alive,
    ) -> AsyncSqliteStore:
        """Classify (and create) the file, then connect, configure, check and migrate it.

        ``ready`` runs before aiosqlite starts, so a refused file never reaches it; the
        aiosqlite connector, a bare ``sqlite3.connect``, then practically never fails (a
        failing connector leaves aiosqlite's stop unawaited). A failing ``prepare`` closes
        the connection through aiosqlite, which also stops its worker thread cleanly.
        """
        mode = check_synchronous(synchronous)
        await asyncio.to_thread(sqlite_connect.ready, path)  # small reads, fsyncs on creation
        opened: list[StoreConnection] = []

        def connect() -> StoreConnection:
            opened.append(sqlite_connect.connect(path, busy_timeout_ms=busy_timeout_ms))
            return opened[0]

        store = cls(await aiosqlite.Connection(connect, iter_chunk_size=64), opened[0], Path(path),
                    holder_alive)
        try:
            await store._hop(sqlite_connect.prepare, path, synchronous=mode, busy_timeout_ms=busy_timeout_ms)
            store._watermark = await store._hop(ops.watermark)
            store._reader = sqlite_connect.open_reader(path)
        except BaseException:
            await store.close()
            raise
        return store

    @property
    def commits(self) -> int:
        return self._raw.commits

    async def _hop(
        self,
        fn: Callable[Concatenate[StoreConnection, P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """Run ``fn(connection, *args)`` whole on aiosqlite's worker thread.

        aiosqlite's public API hops to the worker once per call (BEGIN, each statement,
        COMMIT: three or more hops per transaction, each a queue put plus a wake-up of the
        event loop). Its private ``Connection._execute`` queues any callable on that same
        worker, in order with everything else, so a whole transaction costs one hop. This is
        the only use of aiosqlite internals besides constructing the Connection.
        """
        if self._closed:
            raise PersistenceError(f"{self.path}: store is closed", cause="closed")
        return await self._on_worker(fn, *args, **kwargs)

    async def _on_worker(
        self,
        fn: Callable[Concatenate[StoreConnection, P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """``_hop`` without the closed check: a closing store still applies queued writes."""
        execute = cast(Callable[..., Awaitable[Any]], self._db._execute)
        return cast(R, await execute(fn, self._raw, *args, **kwargs))

    def _start_batch(self, writes: Sequence[Write]) -> asyncio.Future[Sequence[Outcome]]:
        """The group commit's one hop per batch, queued on the worker before this returns.

        ``Connection._execute`` (see ``_hop``) puts the callable on the worker's queue in its
        first step and then awaits the future it made; that first step is taken here, by
        hand, and the future is returned, so the batch reaches the worker inside the
        caller's step and not one loop iteration later. The coroutine is then closed; the
        worker still settles the future.
        """
        execute = cast(Callable[..., Coroutine[Any, Any, list[Outcome]]], self._db._execute)
        hop = execute(run_batch, self._raw, writes)
        try:
            pending = hop.send(None)
        except StopIteration as stop:  # aiosqlite answered at once: never, but keep it
            pending = asyncio.get_running_loop().create_future()
            pending.set_result(stop.value)
        except ValueError as exc:  # aiosqlite's worker is gone ("Connection closed")
            raise PersistenceError(f"{self.path}: store is closed", cause="closed") from exc
        finally:
            hop.close()
        return cast(asyncio.Future[Sequence[Outcome]], pending)

    @property
    def group_commit(self) -> GroupCommit[Write]:
        """The write batcher (read its ``batches``, ``writes`` and ``largest``; see ``group_commit``)."""
        return self._group

    async def _write(self, op: _WriteOp[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run a write op with the pending events, group-committed with concurrent writes.

        Returns once the transaction holding it has committed; keeps the events pending if
        nothing committed.
        """
        if self._closed:
            raise PersistenceError(f"{self.path}: store is closed", cause="closed")
        events, self._pending = self._pending, []
        logged, self._pending_events = self._pending_events, []
        try:
            result = cast(R, await self._group.submit(Write(op, events, args, kwargs)))
        except asyncio.CancelledError:
            raise  # already queued: the events commit with the op or are lost (see module doc)
        except BaseException:
            if not self._closed:  # a crashed or closed store keeps nothing pending
                self._pending[:0] = events
                self._pending_events[:0] = logged
            raise
        if ops.refused(op, result):
            self._pending[:0] = events  # refused: nothing was written
            self._pending_events[:0] = logged
        elif logged:  # DEL-2: committed, so now they may be handed out
            for listener in self._commit_listeners:
                listener(logged)
        return result

    # -- sessions -------------------------------------------------------------------------
    async def create_session(self, record: SessionRecord) -> None:
        await self._write(ops.create_session, record)

    async def ensure_session(self, record: SessionRecord) -> tuple[SessionRecord, bool]:
        return await self._write(ops.ensure_session, record)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return await self._hop(ops.get_session, session_id)

    async def end_session(self, session_id: str, reason: str, at: float) -> None:
        await self._write(ops.end_session, session_id, reason, at)

    # -- messages -------------------------------------------------------------------------
    async def load_messages(self, session_id: str, after_row_id: int = 0) -> tuple[Message, ...]:
        return await self._hop(ops.load_messages, session_id, after_row_id)

    async def append_messages(
        self, session_id: str, lease_token: int, messages: tuple[Message, ...]
    ) -> tuple[Message, ...]:
        stored = await self._write(ops.append_messages, session_id, lease_token, messages,
                                   self.clock())
        if stored:
            self._watermark = max(self._watermark, stored[-1].row_id or 0)
        return stored

    async def rewrite_message(
        self, session_id: str, lease_token: int, row_id: int, content: str
    ) -> Message:
        return await self._write(ops.rewrite_message, session_id, lease_token, row_id, content,
                                 self.clock())

    async def watermark(self) -> int:
        """The committed high-water mark as this connection knows it, without a thread hop.

        It is the highest message id committed through this store or present when it was
        opened: exact while this process is the only writer, which the turn lease makes
        true for the session whose tools are about to run, and never above the truth. The
        ledger records it at each tool run; persist-before-execute compares it with the
        tool-call row's id, so a low value could only ever make that check stricter.
        """
        if self._closed:
            raise PersistenceError(f"{self.path}: store is closed", cause="closed")
        return self._watermark

    # -- leases ---------------------------------------------------------------------------
    async def acquire_lease(
        self, session_id: str, holder: str, now: float, ttl_s: float, poll_s: float = 0.0
    ) -> Lease | None:
        return await self._write(
            ops.acquire_lease, session_id, holder, now, ttl_s, self._holder_alive, poll_s
        )

    async def open_turn(
        self, record: SessionRecord, holder: str, now: float, ttl_s: float, poll_s: float = 0.0,
        opening: Opening | None = None, create: bool = True,
    ) -> LeaseGrant:
        grant: LeaseGrant = await self._write(ops.open_turn, record, holder, now, ttl_s,
                                              self._holder_alive, poll_s, opening, None, create)
        if grant.opened:
            self._watermark = max(self._watermark, grant.opened[-1].row_id or 0)
            if opening is not None and opening.events:  # DEL-2: committed with the rows
                for listener in self._commit_listeners:
                    listener(opening.events)
        return grant

    async def release_lease(self, lease: Lease) -> None:
        await self._write(ops.release_lease, lease, self.clock())

    async def close_turn(self, lease: Lease, closing: Closing) -> Closed:
        """The final rows, the ending and the release in one commit (``sqlite_ops.close_turn``)."""
        closed: Closed = await self._write(ops.close_turn, lease, closing, self.clock())
        if closed.stored:
            self._watermark = max(self._watermark, closed.stored[-1].row_id or 0)
        if closing.events:  # DEL-2: committed with the rows
            for listener in self._commit_listeners:
                listener(closing.events)
        return closed

    async def leave_lease_queue(self, session_id: str, holder: str) -> None:
        await self._write(ops.leave_lease_queue, session_id, holder)

    async def refresh_lease(self, lease: Lease, now: float, ttl_s: float) -> Lease:
        return await self._write(ops.refresh_lease, lease, now, ttl_s, self.clock())

    async def lease_holds(self, session_id: str, lease_token: int) -> bool:
        """LEASE-4: would a write with ``lease_token`` be accepted now? One read of the
        committed lease, on the loop through the reader when it can answer at once (it sees
        every commit made so far, this process's and others'), else on the worker."""
        if self._closed:
            raise PersistenceError(f"{self.path}: store is closed", cause="closed")
        if self._reader is not None:
            try:
                return ops.lease_holds(self._reader, session_id, lease_token, self.clock())
            except sqlite3.Error:
                pass  # it would have to wait: ask the worker, in line with the writes
        return bool(await self._hop(ops.lease_holds, session_id, lease_token, self.clock()))

    # -- events ---------------------------------------------------------------------------
    async def log_event(self, event: Event) -> None:
        self._pending.append(encode_event(event))
        self._pending_events.append(event)

    def add_commit_listener(self, listener: Callable[[Sequence[Event]], None]) -> None:
        """DEL-2: call ``listener`` with the events each write commits, once it committed."""
        self._commit_listeners.append(listener)

    async def flush_events(self) -> None:
        if self._pending:
            await self._write(ops.flush_events)

    async def events_after(self, session_id: str, turn_id: str,
                           after_seq: int) -> tuple[Event, ...]:
        """DEL-2: the committed events of one turn numbered after ``after_seq``."""
        return await self._hop(ops.events_after, session_id, turn_id, after_seq)

    # -- world operations -----------------------------------------------------------------
    async def snapshot(self) -> DurableRecord:
        return await self._hop(compaction.snapshot)  # sqlite_ops.snapshot + SES and CMP tables

    async def crash(self) -> None:
        """The process died: pending events and queued writes are gone; commits stay.

        Writes still queued for the next batch are dropped (their callers get
        ``PersistenceError(cause="closed")``); the batch being committed ends whole or not
        at all.
        """
        self._group.crash()
        await self.close()

    async def close(self) -> None:
        """Refuse new work, let queued writes commit, then close the connection."""
        self._pending.clear()
        self._pending_events.clear()
        if not self._closed:
            self._closed = True
            if self._reader is not None:
                self._reader.close()
                self._reader = None
            await self._group.drain()
            await self._db.close()

    # -- ADM: the admission door (hermes_ref/shell/sqlite_admissions.py) ---------------------
    async def bind_principal(self, binding: Binding) -> None:
        await self._write(adm.bind_principal, binding)

    async def get_binding(self, principal_id: str, session_id: str) -> Binding | None:
        return await self._hop(adm.get_binding, principal_id, session_id)

    async def begin_epoch(self, now: float, holder: str) -> EpochStart:
        return await self._write(adm.begin_epoch, now, holder, self._holder_alive)

    async def recover_epochs(self, epoch: int, now: float) -> EpochStart:
        return await self._write(adm.recover_epochs, epoch, now, self._holder_alive)

    async def admit_input(self, candidate: AdmissionRow) -> AdmitAnswer:
        return await self._write(adm.admit_input, candidate)

    async def claim_admission(self, session_id: str, epoch: int, now: float) -> ClaimAnswer:
        return await self._write(adm.claim_admission, session_id, epoch, now)

    async def move_admission(
        self, admission_id: str, session_id: str, move: Move, epoch: int, now: float,
        outcome: AdmissionOutcome | None = None, turn_id: str | None = None,
    ) -> AdmissionRow:
        return await self._write(adm.move_admission, admission_id, session_id, move, epoch,
                                 now, outcome, turn_id)

    async def admission_mark(self) -> int:
        return await self._hop(adm.admission_mark)

    # -- SES: session lanes (hermes_ref/shell/sqlite_routes.py) ------------------------------
    async def put_route(self, route: Route, end_session_id: str | None = None,
                        end_reason: str | None = None,
                        start: SessionRecord | None = None) -> bool:
        return await self._write(lanes.put_route, route, end_session_id, end_reason, start)

    async def get_route(self, key: str) -> Route | None:
        return await self._hop(lanes.get_route, key)

    async def latest_routes(self) -> tuple[Route, ...]:
        return await self._hop(lanes.latest_routes)

    async def read_markers(self) -> dict[str, float]:
        return await self._hop(lanes.read_markers)

    async def write_lane(self, markers: tuple[tuple[str, float | None], ...],
                         log: tuple[LaneEntry, ...] = ()) -> None:
        await self._write(lanes.write_lane, markers, log)

    async def live_background(self) -> frozenset[str]:
        return await self._hop(lanes.live_background)

    # -- CMP-5, CMP-6: compaction (hermes_ref/shell/sqlite_compaction.py) ---------------------
    async def take_compression_lock(self, session_id: str, holder: str, now: float,
                                    ttl_s: float) -> bool:
        return await self._write(compaction.take_compression_lock, session_id, holder, now,
                                 ttl_s, self._holder_alive)

    async def release_compression_lock(self, session_id: str, holder: str, now: float) -> None:
        await self._write(compaction.release_compression_lock, session_id, holder, now)

    async def compact_session(self, session_id: str, lease_token: int,
                              messages: tuple[Message, ...], child: SessionRecord | None,
                              at: float, flush: tuple[Message, ...] = ()) -> Compacted:
        done = await self._write(compaction.compact_session, session_id, lease_token, messages,
                                 child, at, flush, self.clock())
        if done.rows:
            self._watermark = max(self._watermark, done.rows[-1].row_id or 0)
        return done

    async def compression_tip(self, session_id: str) -> SessionRecord | None:
        return await self._hop(compaction.compression_tip, session_id)
