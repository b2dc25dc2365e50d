"""Compaction in the simulator's memory store: rotation, compaction in place, the lock.

Theory of operation
-------------------
A mixin of ``MemoryStore`` with the contract of the SQLite stores
(``hermes_ref.shell.sqlite_compaction``); the contract suite runs the same cases on both.

* ``compact_session`` is one transaction, fenced by the lease token like every write. A
  rotation writes the ``flush`` rows to the old session, ends it ``compression``, creates
  the child (``parent_session_id`` = the old id), carries the lease to the child (same
  holder, same token, same expiry; the old grant ends ``rotated``) and writes the
  compacted rows there. In place, the session's live rows are archived (kept for the
  record, no longer loaded) and the compacted rows take their place under the same id.
  Every commit is logged (``compactions``). Bad input (an unknown session, a child whose
  parent is not the compacted session, an empty set) is refused before anything changes.
* ``compression_tip`` follows ``parent_session_id`` forward while the session ended
  ``compression``, through the whole chain.
* The compression lock (CMP-6) is holder-qualified and expiring: free, expired, held by a
  dead process or already ours is taken (ours is extended); a live holder's is refused.
  Every ask is a row of the lock log, refusals included, so a checker can tell from the
  record alone who held the lock when.

Every write commits the pending events, like every other write of the store.
"""

from __future__ import annotations

from collections.abc import Callable

from hermes_ref import lease as lease_rules
from hermes_ref import rotation
from hermes_ref.errors import PersistenceError
from hermes_ref.models import Compacted, Lease, Message, SessionRecord
from hermes_ref.ports import (
    CompactionRow,
    DurableRecord,
    LeaseGrantRow,
    LeaseRow,
    LockGrantRow,
    StoredMessage,
)
from hermes_ref.rotation import COMPRESSION, ROTATED, compaction_refusal, lock_refusal


class CompactionStoreMixin:
    """Lock, rotation and archive state of ``MemoryStore`` (CMP-5, CMP-6)."""

    _sessions: dict[str, SessionRecord]
    _by_session: dict[str, list[Message]]
    _messages: list[tuple[str, Message]]
    _row_index: dict[int, int]
    _next_row_id: int
    _leases: dict[str, LeaseRow]
    _grants: list[LeaseGrantRow]
    _open_grant: dict[str, int]
    _waiters: dict[str, dict[str, tuple[int, float]]]
    _holder_alive: Callable[[str], bool]

    def _init_compaction(self) -> None:
        self._archived_ids: set[int] = set()
        self._lock_log: list[LockGrantRow] = []
        self._open_lock: dict[str, int] = {}  # session -> index of its live lock grant
        self._compactions: list[CompactionRow] = []

    # provided by MemoryStore
    def _commit_events(self) -> None:
        raise NotImplementedError

    def _check_fence(self, session_id: str, lease_token: int) -> None:
        raise NotImplementedError

    def _end_grant(self, session_id: str, at: float, reason: str) -> None:
        raise NotImplementedError

    # -- the lineage --------------------------------------------------------------------
    def compression_tip(self, session_id: str) -> SessionRecord | None:
        current = self._sessions.get(session_id)
        seen = {session_id}
        while current is not None and current.end_reason == COMPRESSION:
            children = [s for s in self._sessions.values()
                        if s.parent_session_id == current.id and s.id not in seen]
            if not children:
                break
            current = children[-1]
            seen.add(current.id)
        return current

    def _tip_id(self, session_id: str) -> str:
        """The id a lease or a turn acts on: the tip when the session was rotated away."""
        record = self._sessions.get(session_id)
        if record is None or not rotation.lease_follows_tip(record.end_reason):
            return session_id
        tip = self.compression_tip(session_id)
        return tip.id if tip is not None else session_id

    # -- the compression lock -------------------------------------------------------------
    def take_compression_lock(self, session_id: str, holder: str, now: float,
                              ttl_s: float) -> bool:
        _check_lock_args(session_id, holder, ttl_s)
        if session_id not in self._sessions:
            raise PersistenceError(f"no session {session_id!r}", cause="not_found")
        index = self._open_lock.get(session_id)
        current = self._lock_log[index] if index is not None else None
        if current is not None and current.expires_at > now:
            if current.holder == holder:  # ours: extend it
                self._lock_log[index] = current.model_copy(  # type: ignore[index]
                    update={"expires_at": max(current.expires_at, now + ttl_s)})
                self._commit_events()
                return True
            incumbent = current.holder
            if not lease_rules.reclaimable(current.expires_at, now,
                                           lambda: not self._holder_alive(incumbent)):
                self._lock_log.append(LockGrantRow(session_id=session_id, holder=holder,
                                                   granted=False, acquired_at=now,
                                                   expires_at=now, ended_at=now,
                                                   end_reason="refused"))
                self._commit_events()
                return False
        if current is not None and index is not None:
            expired = current.expires_at <= now
            self._lock_log[index] = current.model_copy(update={
                "ended_at": min(now, current.expires_at) if expired else now,
                "end_reason": "expired" if expired else "holder_dead"})
        self._open_lock[session_id] = len(self._lock_log)
        self._lock_log.append(LockGrantRow(session_id=session_id, holder=holder, granted=True,
                                           acquired_at=now, expires_at=now + ttl_s))
        self._commit_events()
        return True

    def release_compression_lock(self, session_id: str, holder: str, now: float) -> None:
        index = self._open_lock.get(session_id)
        if index is not None and self._lock_log[index].holder == holder:
            current = self._lock_log[index]
            late = now >= current.expires_at
            self._lock_log[index] = current.model_copy(update={
                "ended_at": min(now, current.expires_at),
                "end_reason": "expired" if late else "released"})
            del self._open_lock[session_id]
        self._commit_events()

    # -- the compaction -------------------------------------------------------------------
    def compact_session(self, session_id: str, lease_token: int, messages: tuple[Message, ...],
                        child: SessionRecord | None, at: float,
                        flush: tuple[Message, ...] = ()) -> Compacted:
        old = self._sessions.get(session_id)
        if old is None:
            raise PersistenceError(f"no session {session_id!r}", cause="not_found")
        self._check_fence(session_id, lease_token)
        refusal = compaction_refusal(old, messages, flush, child,
                                     child is not None and child.id in self._sessions)
        if refusal is not None:
            raise PersistenceError(refusal[1], cause=refusal[0])
        self._insert(session_id, flush)
        before = len(self._by_session[session_id])
        lease = self._leases[session_id]
        target = session_id
        if child is not None:
            target = child.id
            self._sessions[session_id] = rotation.ended_by_rotation(old, at)
            self._sessions[child.id] = child
            self._by_session[child.id] = []
            lease = self._carry_lease(session_id, child.id, at)
        else:
            self._archived_ids.update(m.row_id or 0 for m in self._by_session[session_id])
            self._by_session[session_id] = []
        rows = self._insert(target, messages)
        self._compactions.append(CompactionRow(
            session_id=session_id, child_id=child.id if child else None,
            holder=lease.holder or "", token=lease.token, at=at, rows_before=before,
            rows_after=len(rows), first_row_id=rows[0].row_id or 0))
        self._commit_events()
        return Compacted(session=self._sessions[target], rows=rows,
                         lease=Lease(session_id=target, holder=lease.holder or "",
                                     token=lease.token, acquired_at=lease.acquired_at,
                                     expires_at=lease.expires_at))

    def _carry_lease(self, parent: str, child: str, at: float) -> LeaseRow:
        """The lease moves to the child whole: same holder, token and expiry (LEASE-1), and
        its line of waiters with it, each in its place (``_carry_line``)."""
        held = self._leases[parent]
        self._leases[parent] = held.model_copy(update={"holder": None, "expires_at": 0.0})
        self._end_grant(parent, at, ROTATED)
        carried = LeaseRow(session_id=child, holder=held.holder, token=held.token,
                           acquired_at=at, expires_at=held.expires_at)
        self._leases[child] = carried
        self._open_grant[child] = len(self._grants)
        self._grants.append(LeaseGrantRow(session_id=child, token=held.token,
                                          holder=held.holder or "", acquired_at=at,
                                          expires_at=held.expires_at))
        self._carry_line(parent, child)
        return carried

    def _carry_line(self, parent: str, child: str) -> None:
        """The turns waiting for the lineage's lease keep their places: the line is the
        lease's, and moves with it (``sqlite_leases.carry_line``)."""
        line = self._waiters.pop(parent, None)
        if line:
            self._waiters.setdefault(child, {}).update(line)

    def _insert(self, session_id: str, messages: tuple[Message, ...]) -> tuple[Message, ...]:
        stored: list[Message] = []
        for message in messages:
            row = message.model_copy(update={"row_id": self._next_row_id})
            self._row_index[self._next_row_id] = len(self._messages)
            self._next_row_id += 1
            self._messages.append((session_id, row))
            self._by_session[session_id].append(row)
            stored.append(row)
        return tuple(stored)

    def _with_compaction(self, record: DurableRecord) -> DurableRecord:
        """The snapshot's messages are the live rows; archived ones are kept apart."""
        if not self._archived_ids:
            return record.model_copy(update={"compression_locks": tuple(self._lock_log),
                                             "compactions": tuple(self._compactions)})
        archived = self._archived_ids
        live = tuple(m for m in record.messages if (m.message.row_id or 0) not in archived)
        gone = tuple(StoredMessage(session_id=s, message=m) for s, m in self._messages
                     if (m.row_id or 0) in archived)
        return record.model_copy(update={
            "messages": live, "archived": gone, "compression_locks": tuple(self._lock_log),
            "compactions": tuple(self._compactions)})



def _check_lock_args(session_id: str, holder: str, ttl_s: float) -> None:
    refusal = lock_refusal(session_id, holder, ttl_s)
    if refusal is not None:
        raise PersistenceError(refusal, cause="bad_input")
