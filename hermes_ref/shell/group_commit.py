"""Group commit: concurrent writes share one transaction, one COMMIT and one fsync.

Theory of operation
-------------------
Two halves, one on each side of the thread hop.

``GroupCommit`` runs on the event loop. ``await submit(write)`` queues the write and
returns its result, or raises its error, only once the transaction that holds it has
committed (or failed): a caller never resumes before its own rows are durable, so every
effect that depends on them still comes after. Only one batch is in flight at a time
(SQLite has one writer). Writes that arrive meanwhile queue up, and the moment it ends its
callers are settled and the next batch starts, in arrival order.

When to start a batch, as PostgreSQL's ``commit_siblings`` asks "are others about to
commit?": the turns that the last commit resumed are on their way to their next write
(``awaited`` counts them until each writes again or its task ends, which a done callback
on the task reports). With the worker idle, a write that finds none of them still on the
way starts a batch at once, inside its own step; so one writer alone starts at once, and
N turns in flight that all write between two model calls start the batch with the last of
their N writes. While some are still on the way, the start waits for the end of the
current loop round (``call_soon``), and again, at most ``ROUNDS_MAX`` rounds (a turn that
first joins a task writes a round later). There is no timer: a loop with nothing else to
do ends its rounds at once. (Splitting the writers in
two halves, so that one half commits while the loop runs the other, measured no faster:
the worker's SQL needs the GIL between statements, so it runs when the loop is idle.)

``start(writes)`` (the store's thread hop, started synchronously) returns a future of one
``Outcome`` per write, in order; if that future fails, every write of the batch fails
with its error. There is no task: the batches are chained by the future's callback.

A write whose caller is cancelled stays in its batch (it may already be on its way to the
disk); its result is dropped. ``crash()`` is the process dying: the writes still queued
are dropped, never applied, and their callers get ``PersistenceError(cause="closed")``;
the batch already being applied commits whole or not at all, like any transaction at a
real crash. ``drain()`` waits until nothing is queued or in flight (a clean close).

``run_batch`` runs on the store's worker thread, over the connection. A batch of one is the
write op alone, exactly as without batching (its own ``BEGIN IMMEDIATE`` … ``COMMIT``). A
larger batch opens one ``BEGIN IMMEDIATE`` and runs each op inside it, first *bare*: no
savepoints, two statements fewer per op. If every op succeeds, that is what the savepoints
would have left, and it commits. If one fails (even one that catches its own error), the
bare pass is rolled back whole and the batch applied again, each op now a ``SAVEPOINT`` of
the transaction (``sqlite_ops._write``), so an op that fails (a fencing ``LeaseLost``, a
missing session, scaffolding) rolls back only its own rows and only its caller sees the
error. An op is a function of the database and its arguments, so applying it again after a
rollback is applying it once. Then one COMMIT. If the COMMIT fails, every op
that had succeeded gets that error: none of the batch is durable. If SQLite abandons the
whole transaction while an op fails (it does so for a full disk, an I/O error, an
interrupt), the ops before it are lost with it and get its error, and the ops after it run
one transaction each. ``StoreConnection.commits`` counts the one COMMIT.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from hermes_ref.errors import PersistenceError
from hermes_ref.shell.sqlite_codec import EventRow, persistence_error
from hermes_ref.shell.sqlite_connect import StoreConnection

W = TypeVar("W")

__all__ = ["GroupCommit", "Outcome", "Write", "run_batch"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one write came to: its op's return value, or the error its caller gets."""

    value: Any = None
    error: Exception | None = None


@dataclass(slots=True)
class _Waiter(Generic[W]):
    write: W
    done: asyncio.Future[Any]
    task: asyncio.Task[Any] | None  # the caller, to know when it comes back


Start = Callable[[Sequence[W]], "asyncio.Future[Sequence[Outcome]]"]

ROUNDS_MAX = 4
"""The most loop rounds a batch waits for the turns the last commit resumed."""


@dataclass
class GroupCommit(Generic[W]):
    """Queue writes while a batch commits; start each batch with one ``start`` call.

    ``start(writes)`` must hand the batch to the worker at once and return a future of one
    ``Outcome`` per write, in order (a failed future fails every write of the batch).
    Starting it synchronously puts the batch on the worker inside the caller's step, not a
    loop round later; no task is involved.
    """

    start: Start[W]
    batches: int = 0          # batches started (one transaction each, if ``start`` commits)
    writes: int = 0           # writes handed to them
    largest: int = 0          # the most writes one batch held
    _queue: list[_Waiter[W]] = field(default_factory=list)
    _inflight: asyncio.Future[Sequence[Outcome]] | None = None
    _released: set[asyncio.Task[Any]] = field(default_factory=set)  # resumed, not back yet
    _watched: set[asyncio.Task[Any]] = field(default_factory=set)  # told us when they end
    _kick_pending: bool = False
    _rounds: int = 0          # loop rounds waited so far for this batch
    _crashed: bool = False

    async def submit(self, write: W) -> Any:
        """Apply ``write`` in the next batch; return once that batch has committed."""
        if self._crashed:
            raise _dropped()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        task = asyncio.current_task(loop)
        if task is not None:
            self._released.discard(task)
        self._queue.append(_Waiter(write, done, task))
        if self._inflight is None:
            self._start_or_wait(loop)
        return await done

    @property
    def queued(self) -> int:
        """Writes waiting for the next batch (not yet handed to ``start``)."""
        return len(self._queue)

    @property
    def busy(self) -> bool:
        """Is a batch being applied?"""
        return self._inflight is not None

    @property
    def awaited(self) -> int:
        """Callers the last commit resumed that have neither written again nor ended."""
        return len(self._released)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        """A caller's task ended: it writes no more, so nobody waits for it."""
        self._watched.discard(task)
        self._released.discard(task)
        if not self._released and self._queue and self._inflight is None and not self._crashed:
            self._start_next()

    def _start_or_wait(self, loop: asyncio.AbstractEventLoop) -> None:
        """The worker is idle: start now if nobody is on the way, else after this loop round."""
        if not self._queue or self._crashed:
            return
        if not self._released:
            self._start_next()
        elif not self._kick_pending:
            self._arm(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._kick_pending = True
        self._rounds += 1
        loop.call_soon(self._kick, loop)

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        """A loop round ended: start what queued, unless writers are still on the way."""
        self._kick_pending = False
        if not self._queue or self._inflight is not None or self._crashed:
            return
        if self.awaited and self._rounds < ROUNDS_MAX:
            self._arm(loop)  # a turn the last commit resumed may write in the next round
        else:
            self._start_next()

    def _start_next(self) -> None:
        batch, self._queue = self._queue, []
        self._rounds = 0
        self.batches += 1
        self.writes += len(batch)
        self.largest = max(self.largest, len(batch))
        try:
            inflight = self.start([w.write for w in batch])
        except Exception as exc:  # could not even be queued: every caller of it fails
            for waiter in batch:
                _settle(waiter.done, Outcome(error=exc))
            return
        self._inflight = inflight
        inflight.add_done_callback(lambda f: self._finished(batch, f))

    def _finished(self, batch: list[_Waiter[W]], inflight: asyncio.Future[Sequence[Outcome]]) -> None:
        """The batch's transaction ended: settle its callers, then start what queued meanwhile."""
        self._inflight = None
        self._released = {w.task for w in batch if w.task is not None and not w.done.done()}
        for task in self._released - self._watched:  # once per task: its end clears it
            self._watched.add(task)
            task.add_done_callback(self._ended)
        for waiter, outcome in zip(batch, _outcomes(inflight, len(batch)), strict=True):
            _settle(waiter.done, outcome)
        self._start_or_wait(inflight.get_loop())

    def crash(self) -> int:
        """The process died: drop the queued writes (their callers get an error); say how many."""
        self._crashed = True
        dropped, self._queue = self._queue, []
        for waiter in dropped:
            _settle(waiter.done, Outcome(error=_dropped()))
        return len(dropped)

    async def drain(self) -> None:
        """Apply what is queued, without waiting for company, and wait for it to end.

        A cancelled wait cancels nothing: the batch in flight still ends and settles.
        """
        while self._inflight is not None or self._queue:
            if self._inflight is None:
                self._start_next()
            if self._inflight is not None:
                await asyncio.shield(self._inflight)


def _outcomes(inflight: asyncio.Future[Sequence[Outcome]], count: int) -> Sequence[Outcome]:
    """One outcome per write: the batch's own, or its failure repeated."""
    if inflight.cancelled():
        return [Outcome(error=_dropped())] * count
    failure = inflight.exception()
    if failure is not None:
        return [Outcome(error=_as_error(failure))] * count
    outcomes = inflight.result()
    if len(outcomes) != count:  # a bug in ``start``'s worker side: every caller raises it
        bug = AssertionError(f"a batch of {count} writes came back with {len(outcomes)} outcomes")
        return [Outcome(error=bug)] * count
    return outcomes


def _settle(done: asyncio.Future[Any], outcome: Outcome) -> None:
    if done.done():  # its caller was cancelled; the write still ran
        return
    if outcome.error is not None:
        done.set_exception(outcome.error)
    else:
        done.set_result(outcome.value)


def _as_error(exc: BaseException) -> Exception:
    if isinstance(exc, Exception):
        return exc
    return PersistenceError(f"the batch's transaction was interrupted: {exc!r}", cause="io")


def _dropped() -> PersistenceError:
    return PersistenceError("the store crashed before this write was committed", cause="closed")


# -- the worker side: one transaction per batch --------------------------------------------


@dataclass(frozen=True, slots=True)
class Write:
    """One store write op with its arguments, as ``sqlite_ops`` spells it: op(conn, events, ...)."""

    op: Callable[..., Any]
    events: Sequence[EventRow]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def run(self, conn: StoreConnection) -> Outcome:
        try:
            return Outcome(value=self.op(conn, self.events, *self.args, **self.kwargs))
        except Exception as exc:  # the caller's error, raised to that caller
            return Outcome(error=exc)


def run_batch(conn: StoreConnection, writes: Sequence[Write]) -> list[Outcome]:
    """Apply ``writes`` in one transaction, each op in its own savepoint; one COMMIT.

    The first pass runs the ops without savepoints (``_bare``); if none fails, the result
    is the one the savepoints would have given, and it commits. If one fails, that pass is
    rolled back whole and the batch applied again, each op in its own savepoint.
    """
    if len(writes) == 1:
        return [writes[0].run(conn)]
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        return [Outcome(error=persistence_error(exc)) for _ in writes]
    committed = _bare(conn, writes)
    if committed is not None:
        return committed
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        return [Outcome(error=persistence_error(exc)) for _ in writes]
    return _with_savepoints(conn, writes)


def _bare(conn: StoreConnection, writes: Sequence[Write]) -> list[Outcome] | None:
    """The ops without savepoints, then COMMIT; None (rolled back) if any op failed.

    Ops are functions of the database and their arguments, so running one again after a
    rollback is running it once. A COMMIT that fails fails every op, as with savepoints.
    """
    outcomes: list[Outcome] = []
    conn.bare, conn.spoiled = True, False
    try:
        for write in writes:
            outcome = write.run(conn)
            if outcome.error is not None or conn.spoiled:
                _rollback(conn)
                return None
            outcomes.append(outcome)
    except BaseException:
        _rollback(conn)
        raise
    finally:
        conn.bare = conn.spoiled = False
    try:
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        _rollback(conn)
        return [Outcome(error=persistence_error(exc)) for _ in writes]
    conn.commits += 1
    return outcomes


def _with_savepoints(conn: StoreConnection, writes: Sequence[Write]) -> list[Outcome]:
    """Each op in its own savepoint of the open transaction; one COMMIT."""
    outcomes: list[Outcome] = []
    try:
        for index, write in enumerate(writes):
            outcome = write.run(conn)
            if outcome.error is not None and not conn.in_transaction:
                lost = [Outcome(error=_lost_with(outcome.error)) for _ in outcomes]
                alone = [w.run(conn) for w in writes[index + 1:]]
                return [*lost, outcome, *alone]
            outcomes.append(outcome)
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        _rollback(conn)
        return [o if o.error is not None else Outcome(error=persistence_error(exc))
                for o in outcomes]
    except BaseException:
        _rollback(conn)
        raise
    conn.commits += 1
    return outcomes


def _lost_with(error: Exception) -> PersistenceError:
    cause = error.cause if isinstance(error, PersistenceError) else "io"
    return PersistenceError(f"rolled back with its batch's transaction: {error}", cause=cause)


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # the connection is broken or closed; the original error says why
