"""The simulator's in-memory store: committed state plus pending writes.

Theory of operation
-------------------
Every write method is one transaction that commits before it returns, exactly like the
SQLite store. What is *pending* is the event log: events wait in ``_pending_events`` and
are committed together with the next write (or by ``flush_events``). ``crash()`` throws
pending events away, which is what a killed process does to a write-behind buffer; the
committed rows survive because they live in the world, not in the engine.

Values are frozen, so "committing" a message is appending the value with its row id.
Reads return tuples of those values; nothing a caller holds can change the store.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import is_

from hermes_ref import lease as lease_rules
from hermes_ref import rotation  # CMP-5: a rotated session's turns run on its tip
from hermes_ref.delivery import replay  # DEL-2
from hermes_ref.errors import LeaseLost, PersistenceError
from hermes_ref.models import Closed, Closing, Event, Lease, LeaseGrant, Message, Opening, SessionRecord
from hermes_ref.ports import DurableRecord, LeaseGrantRow, LeaseRow, StoredMessage
from sim.store_admissions import AdmissionsMixin
from sim.store_compaction import CompactionStoreMixin  # CMP-5, CMP-6
from sim.store_routes import RouteStoreMixin


class MemoryStore(AdmissionsMixin, RouteStoreMixin, CompactionStoreMixin):
    """The durable record of a simulated world, kept in memory."""

    def __init__(self, *, holder_alive: Callable[[str], bool] | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        # LEASE-3: a lease whose holder process is dead may be reclaimed before it expires.
        self._holder_alive = holder_alive or (lambda holder: True)
        # LEASE-4: the store's own clock decides expiry at each fenced write (None: never)
        self._clock = clock
        self._grants: list[LeaseGrantRow] = []
        self._waiters: dict[str, dict[str, tuple[int, float]]] = {}  # session -> holder -> place
        self._waiter_seq = 0
        self._open_grant: dict[str, int] = {}  # session -> index of its open grant row
        self._sessions: dict[str, SessionRecord] = {}
        # plain tuples, not StoredMessage values: the store keeps every row of a long sweep,
        # and each pydantic wrapper would be three more objects for the garbage collector
        self._messages: list[tuple[str, Message]] = []
        self._by_session: dict[str, list[Message]] = {}
        self._row_index: dict[int, int] = {}  # row_id -> index in _messages
        self._leases: dict[str, LeaseRow] = {}
        self._events: list[tuple[int, Event]] = []  # (seq, event as logged)
        self._pending_events: list[Event] = []
        self._next_row_id = 1
        self._next_event_seq = 1
        self._init_admissions()  # ADM: the admission door's rows (sim/store_admissions.py)
        self._init_routes()  # SES: route revisions, markers, lane log (sim/store_routes.py)
        self._init_compaction()  # CMP-5, CMP-6: archive, lock log (sim/store_compaction.py)
        # what snapshots handed out: each row's wrapper, made from the row pair beside it,
        # and each event numbered (``snapshot``)
        self._snapshot_pairs: list[tuple[str, Message]] = []
        self._snapshot_rows: list[StoredMessage] = []
        self._snapshot_events: list[Event] = []

    # -- sessions -------------------------------------------------------------------
    def create_session(self, record: SessionRecord) -> None:
        if record.id in self._sessions:
            raise PersistenceError(f"session {record.id!r} already exists", cause="duplicate")
        if record.parent_session_id and record.parent_session_id not in self._sessions:
            raise PersistenceError(
                f"parent session {record.parent_session_id!r} does not exist", cause="foreign_key"
            )
        self._sessions[record.id] = record
        self._by_session.setdefault(record.id, [])
        self._commit_events()

    def ensure_session(self, record: SessionRecord) -> tuple[SessionRecord, bool]:
        existing = self._sessions.get(record.id)
        if existing is not None:
            self._commit_events()
            return existing, False
        self.create_session(record)
        return record, True

    def get_session(self, session_id: str) -> SessionRecord | None:
        return self._sessions.get(session_id)

    def end_session(self, session_id: str, reason: str, at: float) -> None:
        current = self._sessions.get(session_id)
        if current is None:
            raise PersistenceError(f"no session {session_id!r}", cause="not_found")
        if current.ended_at is None:
            self._sessions[session_id] = current.model_copy(
                update={"ended_at": at, "end_reason": reason}
            )
        self._commit_events()

    # -- messages -------------------------------------------------------------------
    def load_messages(self, session_id: str, after_row_id: int = 0) -> tuple[Message, ...]:
        rows = self._by_session.get(session_id, [])
        if after_row_id <= 0:
            return tuple(rows)
        # rows are in row-id order: walk back from the end (the common case is a short tail)
        start = len(rows)
        while start > 0 and (rows[start - 1].row_id or 0) > after_row_id:
            start -= 1
        return tuple(rows[start:])

    def lease_holds(self, session_id: str, lease_token: int) -> bool:
        """Would a write with ``lease_token`` be accepted now (LEASE-4)? Reads only."""
        try:
            self._check_fence(session_id, lease_token)
        except LeaseLost:
            return False
        return True

    def _check_fence(self, session_id: str, lease_token: int) -> None:
        lease = self._leases.get(session_id)
        now = self._clock() if self._clock is not None else None
        if lease is None or not lease_rules.fence_holds(
                lease_token, lease.token, lease.holder is not None, lease.expires_at, now):
            raise LeaseLost(
                f"write to session {session_id!r} with lease token {lease_token} "
                f"but the current token is {lease.token if lease else None}"
            )

    def append_messages(
        self, session_id: str, lease_token: int, messages: tuple[Message, ...]
    ) -> tuple[Message, ...]:
        if session_id not in self._sessions:
            raise PersistenceError(f"no session {session_id!r}", cause="foreign_key")
        self._check_fence(session_id, lease_token)
        self._refuse_scaffolding(messages)
        stored = self._insert(session_id, messages)  # the same insert a compaction uses
        self._commit_events()
        return stored

    @staticmethod
    def _refuse_scaffolding(messages: tuple[Message, ...]) -> None:
        for message in messages:
            if message.scaffold is not None:
                raise PersistenceError(
                    f"refusing to persist scaffolding ({message.scaffold.value})", cause="scaffolding"
                )

    def rewrite_message(
        self, session_id: str, lease_token: int, row_id: int, content: str
    ) -> Message:
        self._check_fence(session_id, lease_token)
        index = self._row_index.get(row_id)
        if index is None or self._messages[index][0] != session_id:
            raise PersistenceError(f"no row {row_id} in session {session_id!r}", cause="not_found")
        old = self._messages[index][1]
        new = old.rewritten(content)  # WIRE-2: a content rewrite drops the sidecar
        self._messages[index] = (session_id, new)
        rows = self._by_session[session_id]
        for i in range(len(rows) - 1, -1, -1):
            if rows[i].row_id == row_id:
                rows[i] = new
                break
        self._commit_events()
        return new

    def watermark(self) -> int:
        return self._next_row_id - 1

    # -- leases ---------------------------------------------------------------------
    def acquire_lease(self, session_id: str, holder: str, now: float, ttl_s: float,
                      poll_s: float = 0.0) -> Lease | None:
        session_id = self._tip_id(session_id)  # CMP-5: a rotated session's lease is its tip's
        if session_id not in self._sessions:
            raise PersistenceError(f"no session {session_id!r}", cause="foreign_key")
        current = self._leases.get(session_id)
        token = self._grantable(session_id, holder, now, poll_s)
        if token is None:
            if poll_s > 0:  # wait in line: a write of its own, which commits no event
                self._join_queue(session_id, holder, now, poll_s)
            return None
        self._waiters.get(session_id, {}).pop(holder, None)
        row = LeaseRow(
            session_id=session_id, holder=holder, token=token,
            acquired_at=now, expires_at=now + ttl_s,
        )
        self._leases[session_id] = row
        self._end_grant(session_id, now, "expired" if current is not None
                        and current.expires_at <= now else "holder_dead")
        self._open_grant[session_id] = len(self._grants)
        self._grants.append(LeaseGrantRow(session_id=session_id, token=token, holder=holder,
                                          acquired_at=now, expires_at=now + ttl_s))
        self._commit_events()
        return Lease(
            session_id=session_id, holder=holder, token=token,
            acquired_at=now, expires_at=now + ttl_s,
        )

    def _grantable(self, session_id: str, holder: str, now: float, poll_s: float) -> int | None:
        """The token a grant to ``holder`` would get now, or None while it must wait.

        The queue is read on every ask, busy or not, as the SQLite store reads it: a waiter
        that went two polls without asking loses its place even while the lease is held,
        and its next ask joins the line at the end (LEASE-1's order)."""
        first = poll_s <= 0 or self._first_in_line(session_id, holder, now)
        current = self._leases.get(session_id)
        free = True
        if current is not None and current.holder is not None:
            incumbent = current.holder
            free = lease_rules.reclaimable(current.expires_at, now,
                                           lambda: not self._holder_alive(incumbent))
        if not free or not first:
            return None
        return (current.token if current else 0) + 1

    def would_open(self, record: SessionRecord, holder: str, now: float, ttl_s: float,
                   poll_s: float, opening: Opening) -> bool:
        """Would ``open_turn`` store ``opening`` now? (The simulator's crash points ask.)"""
        if record.id not in self._sessions:
            first = Lease(session_id=record.id, holder=holder, token=1, acquired_at=now,
                          expires_at=now + ttl_s)
            return opening.applies(record.id, True, first)
        session_id = self._tip_id(record.id)
        token = self._grantable(session_id, holder, now, poll_s)
        lease = None if token is None else Lease(session_id=session_id, holder=holder, token=token,
                                                 acquired_at=now, expires_at=now + ttl_s)
        return opening.applies(record.id, False, lease)

    def open_turn(self, record: SessionRecord, holder: str, now: float, ttl_s: float,
                  poll_s: float = 0.0, opening: Opening | None = None,
                  before_opening: Callable[[], None] | None = None,
                  create: bool = True) -> LeaseGrant:
        """Ensure the session row, take its lease and store the opening rows when they apply,
        as one commit (see sqlite_ops.open_turn). ``before_opening`` runs just before the
        rows are stored; a ``PersistenceError`` it raises fails the rows alone, as a failed
        savepoint does in SQLite (the simulator's planned write failures)."""
        existing = self._sessions.get(record.id)
        if existing is None and not create:
            raise PersistenceError(f"no session {record.id!r}", cause="foreign_key")
        if existing is not None and rotation.lease_follows_tip(existing.end_reason):  # CMP-5
            existing = self.compression_tip(record.id) or existing
        if existing is None:
            self._sessions[record.id] = record
            self._by_session.setdefault(record.id, [])
        lease = self.acquire_lease((existing or record).id, holder, now, ttl_s, poll_s)
        if existing is None and lease is None:
            self._commit_events()
        grant = LeaseGrant(session=existing or record, created=existing is None, lease=lease)
        if opening is None or not opening.applies(record.id, grant.created, lease):
            return grant
        try:
            if before_opening is not None:
                before_opening()
            self._refuse_scaffolding(opening.rows)
        except PersistenceError as error:
            return grant.model_copy(update={"opening_failure": (error.cause, str(error))})
        opened = self._insert(record.id, opening.rows)
        self._pending_events.extend(opening.events)  # committed with the rows, and only with them
        self._commit_events()
        return grant.model_copy(update={"opened": opened})

    def release_lease(self, lease: Lease) -> None:
        current = self._leases.get(lease.session_id)
        if current is not None and current.token == lease.token and current.holder == lease.holder:
            self._leases[lease.session_id] = current.model_copy(
                update={"holder": None, "expires_at": 0.0}
            )
            now = self._clock() if self._clock is not None else current.expires_at
            ended = "released" if now < current.expires_at else "expired"  # released too late
            self._end_grant(lease.session_id, min(now, current.expires_at), ended)
        self._commit_events()

    def close_turn(self, lease: Lease, closing: Closing,
                   before_release: Callable[[], None] | None = None) -> Closed:
        """The final rows, the ending and the release as one commit (see sqlite_ops.close_turn).

        Rows that fail raise before anything is stored. ``before_release`` runs just before
        the release; a ``PersistenceError`` it raises fails the release alone, as a failed
        savepoint does in SQLite (the simulator's planned write failures)."""
        session_id = lease.session_id
        if session_id not in self._sessions:
            raise PersistenceError(f"no session {session_id!r}", cause="foreign_key")
        self._check_fence(session_id, lease.token)
        self._refuse_scaffolding(closing.rows)
        stored = self._insert(session_id, closing.rows)
        self._pending_events.extend(closing.events)  # committed with the rows, and only with them
        try:
            if before_release is not None:
                before_release()
        except PersistenceError as error:
            self._commit_events()
            return Closed(stored=stored, release_failure=(error.cause, str(error)))
        self.release_lease(lease)  # commits the events
        return Closed(stored=stored)

    def refresh_lease(self, lease: Lease, now: float, ttl_s: float) -> Lease:
        """Extend the caller's own unexpired grant to ``now + ttl_s`` (LEASE-2, LEASE-4)."""
        current = self._leases.get(lease.session_id)
        at = self._clock() if self._clock is not None else now
        if current is None or current.holder != lease.holder or current.token != lease.token \
                or current.expires_at <= at:
            raise LeaseLost(f"refresh of session {lease.session_id!r} lease token {lease.token} "
                            f"by a holder that no longer has it")
        expires_at = max(current.expires_at, now + ttl_s)
        self._leases[lease.session_id] = current.model_copy(update={"expires_at": expires_at})
        index = self._open_grant[lease.session_id]
        self._grants[index] = self._grants[index].model_copy(update={"expires_at": expires_at})
        self._commit_events()
        return lease.model_copy(update={"expires_at": expires_at})

    def leave_lease_queue(self, session_id: str, holder: str) -> None:
        self._waiters.get(session_id, {}).pop(holder, None)
        self._commit_events()

    def _first_in_line(self, session_id: str, holder: str, now: float) -> bool:
        """Drop waiters that stopped asking or died; is ``holder`` first of those left?"""
        queue = self._waiters.setdefault(session_id, {})
        for waiter, (_, valid_until) in list(queue.items()):
            if valid_until <= now or not self._holder_alive(waiter):
                del queue[waiter]
        mine = queue.get(holder)
        return lease_rules.first_in_line(mine[0] if mine else None,
                                         [seq for w, (seq, _) in queue.items() if w != holder])

    def _join_queue(self, session_id: str, holder: str, now: float, poll_s: float) -> None:
        queue = self._waiters.setdefault(session_id, {})
        if holder in queue:
            seq = queue[holder][0]
        else:
            self._waiter_seq += 1
            seq = self._waiter_seq
        queue[holder] = (seq, now + 2 * poll_s)  # gone unless it asks again within two polls

    def _end_grant(self, session_id: str, at: float, reason: str) -> None:
        index = self._open_grant.pop(session_id, None)
        if index is not None:
            grant = self._grants[index]
            self._grants[index] = grant.model_copy(update={"ended_at": at, "end_reason": reason})

    # -- events ---------------------------------------------------------------------
    def log_event(self, event: Event) -> None:
        self._pending_events.append(event)

    def flush_events(self) -> None:
        self._commit_events()

    def events_after(self, session_id: str, turn_id: str, after_seq: int) -> tuple[Event, ...]:
        """DEL-2: the committed events of one turn numbered after ``after_seq``."""
        committed = (e.model_copy(update={"seq": seq}) for seq, e in self._events
                     if e.session_id == session_id and e.turn_id == turn_id)
        return replay(committed, session_id, turn_id, after_seq)

    def take_pending_events(self) -> list[Event]:
        """Hand back the events no write has committed yet (a process keeps its own)."""
        held, self._pending_events = self._pending_events, []
        return held

    def _commit_events(self) -> None:
        for event in self._pending_events:
            self._events.append((self._next_event_seq, event))
            self._next_event_seq += 1
        self._pending_events.clear()

    # -- world operations -------------------------------------------------------------
    def crash(self) -> None:
        """The process died: pending writes are gone, committed ones stay."""
        self._pending_events.clear()

    def reopen(self) -> None:
        """Nothing to reopen: the committed state lives in the world, not a connection."""

    def snapshot(self) -> DurableRecord:
        return self._with_compaction(self._with_routes(self._with_admissions(DurableRecord(
            sessions=tuple(self._sessions.values()),
            messages=self._stored_rows(),
            events=self._logged_events(),
            leases=tuple(self._leases.values()),
            lease_grants=tuple(self._grants),
        ))))  # ADM; SES: routes; CMP: archive, locks

    def _stored_rows(self) -> tuple[StoredMessage, ...]:
        """Every row as a ``StoredMessage``, each wrapper made once and handed out again by
        every later snapshot while its row stands (a row rewritten in place gets a new one).
        Rows are mostly appended, so the pairs are first compared all at once."""
        pairs, made, kept = self._messages, self._snapshot_pairs, self._snapshot_rows
        del made[len(pairs):], kept[len(pairs):]
        if not all(map(is_, made, pairs)):  # a row was rewritten in place (or removed)
            for index, pair in enumerate(made):
                if pair is not pairs[index]:
                    made[index] = pair = pairs[index]
                    kept[index] = StoredMessage(session_id=pair[0], message=pair[1])
        for pair in pairs[len(made):]:
            made.append(pair)
            kept.append(StoredMessage(session_id=pair[0], message=pair[1]))
        return tuple(kept)

    def _logged_events(self) -> tuple[Event, ...]:
        """The committed events numbered by their seq; the log only grows, so each numbered
        copy is made once, when a snapshot first sees its event."""
        kept = self._snapshot_events
        kept.extend(e.model_copy(update={"seq": seq}) for seq, e in self._events[len(kept):])
        return tuple(kept)

    def close(self) -> None:
        self._pending_events.clear()
