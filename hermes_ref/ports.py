"""What a driver needs from the world: the store, the provider and the tools.

Theory of operation
-------------------
Drivers perform effects through these ports. There are two shapes of each port: a
synchronous one for the simulator (and the stdlib-sqlite store it can use), and an
asynchronous one for the asyncio driver. The methods are the same, one for one, so a
single contract suite (tests/contract) checks every implementation.

``DurableRecord`` is the read side used by checkers: a plain snapshot of everything
committed, read from the store itself and never from the engine's memory.

Store rules every implementation keeps:

* ``append_messages`` and ``rewrite_message`` are fenced: they raise ``LeaseLost`` unless
  ``lease_token`` is the token of the session's current lease and that lease has not
  expired by the store's clock (LEASE-4). ``refresh_lease`` extends only the caller's own
  unexpired grant, else ``LeaseLost``. Every grant is kept in ``lease_grants``.
* Each write method is one transaction; when it returns, the write is durable.
* Events logged with ``log_event`` are pending until the next write commits (or
  ``flush_events`` runs); a crash drops pending events, never committed rows.
  ``events_after(session, turn, n)`` reads back one turn's committed events numbered
  after ``n`` (``Event.turn_seq``), in order: a reconnecting client's replay (DEL-2).
* ``end_session`` only ends a live row: the first reason wins.
* ``ensure_session`` returns the stored row, creating it from the given one if absent,
  atomically; it also commits any pending events. ``open_turn`` does that and takes the
  session's lease in the same transaction (a turn's first write); given an ``Opening``
  that applies, it stores those rows in that transaction too, fenced by the new grant, in
  a savepoint: rows that fail leave the grant standing and say why
  (``LeaseGrant.opening_failure``).
* ``put_route`` (SES) takes a route revision only if it is its key's next one (a
  compare-and-set), ends the session row it names and creates the row of the incarnation
  it begins (``start``) in the same transaction, and commits the pending events whether or
  not it took the revision; nothing deletes a revision.
* ``compact_session`` (CMP-5) is one fenced transaction: a rotation (``child`` given) ends
  the session ``compression``, creates the child with ``parent_session_id``, carries the
  lease to it and writes the compacted rows there; in place (``child`` None) the live rows
  are archived, kept and no longer loaded, and the compacted rows take their place.
  ``compression_tip`` walks ``parent_session_id`` forward through every session ended
  ``compression`` to the live tip; ``open_turn`` and ``acquire_lease`` on a session ended
  that way act on its tip. The compression lock (CMP-6) is holder-qualified and expiring,
  and every ask is kept.
* ``watermark`` is the highest committed message row id; tools record it when they run,
  which is how persist-before-execute is checked without trusting the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

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
from hermes_ref.lane_restart import LaneEntry  # SES
from hermes_ref.models import (
    Closed,
    Closing,
    Compacted,
    Event,
    Frozen,
    Lease,
    LeaseGrant,
    Message,
    Opening,
    ProviderReply,
    SessionRecord,
    ToolCall,
    ToolResult,
)
from hermes_ref.session import Route  # SES
from hermes_ref.wire import ProviderRequest


class StoredMessage(Frozen):
    session_id: str
    message: Message


class LeaseRow(Frozen):
    session_id: str
    holder: str | None
    token: int
    acquired_at: float
    expires_at: float


class _Span(Frozen):
    """A grant kept after it ends: live until the first of its expiry and its end."""

    expires_at: float
    ended_at: float | None = None

    def live_until(self) -> float:
        return self.expires_at if self.ended_at is None else min(self.expires_at, self.ended_at)


class LeaseGrantRow(_Span):
    """One grant of a session's turn lease, kept after it ends (LEASE-1..4).

    A grant is *live* from ``acquired_at`` until the first of ``expires_at`` (moved on by
    each refresh) and ``ended_at`` (released, or replaced by the next grant after expiry
    or its holder's death). Every row written with ``token`` must fall inside that span.
    """

    session_id: str
    token: int
    holder: str
    acquired_at: float
    expires_at: float
    ended_at: float | None = None
    end_reason: str | None = None  # released | expired | holder_dead


class LockGrantRow(_Span):
    """One ask for a session's compression lock, kept after it ends (CMP-6).

    ``granted`` False is a refusal (another live holder had it); a grant is live from
    ``acquired_at`` until the first of ``expires_at`` and ``ended_at`` (released, or taken
    over after expiry or its holder's death). Taking a lock one already holds extends it.
    """

    session_id: str
    holder: str
    granted: bool
    acquired_at: float
    expires_at: float
    ended_at: float | None = None
    end_reason: str | None = None  # released | expired | holder_dead


class CompactionRow(Frozen):
    """One committed compaction (CMP-5): whose lease token did it, when, from which session
    to which (the same one when in place), and how many live rows it replaced."""

    session_id: str
    child_id: str | None  # None: compacted in place
    holder: str
    token: int
    at: float
    rows_before: int
    rows_after: int
    first_row_id: int  # the compacted rows are this one and the ``rows_after - 1`` after it


class DurableRecord(Frozen):
    """Everything committed, in commit order where order exists."""

    sessions: tuple[SessionRecord, ...] = ()
    messages: tuple[StoredMessage, ...] = ()
    events: tuple[Event, ...] = ()
    leases: tuple[LeaseRow, ...] = ()
    lease_grants: tuple[LeaseGrantRow, ...] = ()  # LEASE: every grant, in grant order
    # ADM: the admission door's rows (in seq order), the bindings, the highest runtime
    # epoch begun, and every process's epoch (whose, since when, retired when)
    admissions: tuple[AdmissionRow, ...] = ()
    bindings: tuple[Binding, ...] = ()
    epoch: int = 0
    epochs: tuple[EpochRecord, ...] = ()
    # SES: every route revision (write order), the lane markers (by name), the lane log
    routes: tuple[Route, ...] = ()
    markers: tuple[tuple[str, float], ...] = ()
    lane_log: tuple[LaneEntry, ...] = ()
    # CMP-5, CMP-6: rows a compaction in place archived (kept, no longer live), every ask
    # for a compression lock, every committed compaction
    archived: tuple[StoredMessage, ...] = ()
    compression_locks: tuple[LockGrantRow, ...] = ()
    compactions: tuple[CompactionRow, ...] = ()

    def transcript(self, session_id: str) -> list[Message]:
        return [m.message for m in self.messages if m.session_id == session_id]

    def session_ids(self) -> list[str]:
        return [s.id for s in self.sessions]


class Store(Protocol):
    """Synchronous store port (simulator)."""

    def create_session(self, record: SessionRecord) -> None: ...
    def ensure_session(self, record: SessionRecord) -> tuple[SessionRecord, bool]: ...
    def get_session(self, session_id: str) -> SessionRecord | None: ...
    def end_session(self, session_id: str, reason: str, at: float) -> None: ...
    def load_messages(self, session_id: str, after_row_id: int = 0) -> tuple[Message, ...]: ...
    def append_messages(
        self, session_id: str, lease_token: int, messages: tuple[Message, ...]
    ) -> tuple[Message, ...]: ...
    def rewrite_message(
        self, session_id: str, lease_token: int, row_id: int, content: str
    ) -> Message: ...
    def acquire_lease(
        self, session_id: str, holder: str, now: float, ttl_s: float, poll_s: float = 0.0
    ) -> Lease | None: ...
    def open_turn(
        self, record: SessionRecord, holder: str, now: float, ttl_s: float, poll_s: float = 0.0,
        opening: Opening | None = None, before_opening: Callable[[], None] | None = None,
        create: bool = True,
    ) -> LeaseGrant: ...
    def release_lease(self, lease: Lease) -> None: ...
    def close_turn(self, lease: Lease, closing: Closing,
                   before_release: Callable[[], None] | None = None) -> Closed: ...
    def refresh_lease(self, lease: Lease, now: float, ttl_s: float) -> Lease: ...
    def lease_holds(self, session_id: str, lease_token: int) -> bool: ...
    def leave_lease_queue(self, session_id: str, holder: str) -> None: ...
    def log_event(self, event: Event) -> None: ...
    def flush_events(self) -> None: ...
    def events_after(self, session_id: str, turn_id: str, after_seq: int) -> tuple[Event, ...]: ...
    def watermark(self) -> int: ...
    def snapshot(self) -> DurableRecord: ...
    def close(self) -> None: ...
    # ADM: the admission door; each method is one transaction
    def bind_principal(self, binding: Binding) -> None: ...
    def get_binding(self, principal_id: str, session_id: str) -> Binding | None: ...
    def begin_epoch(self, now: float, holder: str) -> EpochStart: ...
    def recover_epochs(self, epoch: int, now: float) -> EpochStart: ...
    def admit_input(self, candidate: AdmissionRow) -> AdmitAnswer: ...
    def claim_admission(self, session_id: str, epoch: int, now: float) -> ClaimAnswer: ...
    def move_admission(
        self, admission_id: str, session_id: str, move: Move, epoch: int, now: float,
        outcome: Outcome | None = None, turn_id: str | None = None,
    ) -> AdmissionRow: ...
    def admission_mark(self) -> int: ...
    # SES: session lanes; each write is one transaction
    def put_route(self, route: Route, end_session_id: str | None = None,
                  end_reason: str | None = None, start: SessionRecord | None = None) -> bool: ...
    def get_route(self, key: str) -> Route | None: ...
    def latest_routes(self) -> tuple[Route, ...]: ...
    def read_markers(self) -> dict[str, float]: ...
    def write_lane(self, markers: tuple[tuple[str, float | None], ...],
                   log: tuple[LaneEntry, ...] = ()) -> None: ...
    def live_background(self) -> frozenset[str]: ...
    # CMP-5, CMP-6: compaction (sim/store_compaction.py, hermes_ref/shell/sqlite_compaction.py)
    def take_compression_lock(self, session_id: str, holder: str, now: float,
                              ttl_s: float) -> bool: ...
    def release_compression_lock(self, session_id: str, holder: str, now: float) -> None: ...
    def compact_session(self, session_id: str, lease_token: int, messages: tuple[Message, ...],
                        child: SessionRecord | None, at: float,
                        flush: tuple[Message, ...] = ()) -> Compacted: ...
    def compression_tip(self, session_id: str) -> SessionRecord | None: ...


class AsyncStore(Protocol):
    """Asynchronous store port (asyncio driver); same contract as ``Store``."""

    async def create_session(self, record: SessionRecord) -> None: ...
    async def ensure_session(self, record: SessionRecord) -> tuple[SessionRecord, bool]: ...
    async def get_session(self, session_id: str) -> SessionRecord | None: ...
    async def end_session(self, session_id: str, reason: str, at: float) -> None: ...
    async def load_messages(
        self, session_id: str, after_row_id: int = 0
    ) -> tuple[Message, ...]: ...
    async def append_messages(
        self, session_id: str, lease_token: int, messages: tuple[Message, ...]
    ) -> tuple[Message, ...]: ...
    async def rewrite_message(
        self, session_id: str, lease_token: int, row_id: int, content: str
    ) -> Message: ...
    async def acquire_lease(
        self, session_id: str, holder: str, now: float, ttl_s: float, poll_s: float = 0.0
    ) -> Lease | None: ...
    async def open_turn(
        self, record: SessionRecord, holder: str, now: float, ttl_s: float, poll_s: float = 0.0,
        opening: Opening | None = None, create: bool = True,
    ) -> LeaseGrant: ...
    async def release_lease(self, lease: Lease) -> None: ...
    async def close_turn(self, lease: Lease, closing: Closing) -> Closed: ...
    async def refresh_lease(self, lease: Lease, now: float, ttl_s: float) -> Lease: ...
    async def lease_holds(self, session_id: str, lease_token: int) -> bool: ...
    async def leave_lease_queue(self, session_id: str, holder: str) -> None: ...
    async def log_event(self, event: Event) -> None: ...
    async def flush_events(self) -> None: ...
    async def events_after(
        self, session_id: str, turn_id: str, after_seq: int
    ) -> tuple[Event, ...]: ...
    async def watermark(self) -> int: ...
    async def snapshot(self) -> DurableRecord: ...
    async def close(self) -> None: ...
    # ADM: the admission door; each method is one transaction
    async def bind_principal(self, binding: Binding) -> None: ...
    async def get_binding(self, principal_id: str, session_id: str) -> Binding | None: ...
    async def begin_epoch(self, now: float, holder: str) -> EpochStart: ...
    async def recover_epochs(self, epoch: int, now: float) -> EpochStart: ...
    async def admit_input(self, candidate: AdmissionRow) -> AdmitAnswer: ...
    async def claim_admission(self, session_id: str, epoch: int, now: float) -> ClaimAnswer: ...
    async def move_admission(
        self, admission_id: str, session_id: str, move: Move, epoch: int, now: float,
        outcome: Outcome | None = None, turn_id: str | None = None,
    ) -> AdmissionRow: ...
    async def admission_mark(self) -> int: ...
    # SES: session lanes; each write is one transaction
    async def put_route(self, route: Route, end_session_id: str | None = None,
                        end_reason: str | None = None,
                        start: SessionRecord | None = None) -> bool: ...
    async def get_route(self, key: str) -> Route | None: ...
    async def latest_routes(self) -> tuple[Route, ...]: ...
    async def read_markers(self) -> dict[str, float]: ...
    async def write_lane(self, markers: tuple[tuple[str, float | None], ...],
                         log: tuple[LaneEntry, ...] = ()) -> None: ...
    async def live_background(self) -> frozenset[str]: ...
    # CMP-5, CMP-6: compaction
    async def take_compression_lock(self, session_id: str, holder: str, now: float,
                                    ttl_s: float) -> bool: ...
    async def release_compression_lock(self, session_id: str, holder: str, now: float) -> None: ...
    async def compact_session(self, session_id: str, lease_token: int,
                              messages: tuple[Message, ...], child: SessionRecord | None,
                              at: float, flush: tuple[Message, ...] = ()) -> Compacted: ...
    async def compression_tip(self, session_id: str) -> SessionRecord | None: ...


class LedgerEntry(Frozen):
    """One real side effect, recorded by the tool world when it happens."""

    call_id: str
    name: str
    arguments: str
    watermark: int  # the store's committed message high-water mark at execution time
    at: float
    outcome: str = "applied"


class Provider(Protocol):
    """Synchronous provider port (simulator fakes)."""

    def complete(self, request: ProviderRequest) -> ProviderReply: ...


class AsyncProvider(Protocol):
    """Asynchronous provider port (asyncio driver; ``HttpProvider``); same contract."""

    async def complete(self, request: ProviderRequest) -> ProviderReply: ...


class ToolRunner(Protocol):
    """Synchronous tool port: runs one call; a tool error is a result, never a raise."""

    def run(self, call: ToolCall, *, watermark: int, at: float) -> ToolResult: ...
