"""Group commit: batching on the loop (a fake commit step), transactions on the worker (SQLite).

The loop side is driven by ``FakeDisk``, a commit step whose batches end only when the
test says so: no thread, no timer. ``turns()`` lets every ready task run up to its next
await (it yields to the loop; it does not wait for time to pass). The worker side runs
``run_batch`` on a real connection, and the store tests go through ``AsyncSqliteStore``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from hermes_ref.errors import LeaseLost, PersistenceError
from hermes_ref.models import Lease, Message, Role, SessionRecord
from hermes_ref.shell import group_commit, sqlite_ops
from hermes_ref.shell.group_commit import GroupCommit, Outcome, Write, run_batch
from hermes_ref.shell.sqlite_connect import StoreConnection, connect
from hermes_ref.shell.sqlite_store import AsyncSqliteStore

# -- the loop side, on a fake commit step ------------------------------------------------------


class FakeDisk:
    """A commit step that holds every batch until ``commit`` or ``fail`` ends it."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self._pending: list[asyncio.Future[Sequence[Outcome]]] = []

    def start(self, writes: Sequence[str]) -> asyncio.Future[Sequence[Outcome]]:
        self.batches.append(list(writes))
        future: asyncio.Future[Sequence[Outcome]] = asyncio.get_running_loop().create_future()
        self._pending.append(future)
        return future

    def commit(self, *errors: tuple[int, Exception]) -> None:
        """End the oldest open batch: each write gets ``done:<write>``, or the error given."""
        batch = self.batches[len(self.batches) - len(self._pending)]
        failed = dict(errors)
        outcomes = [Outcome(error=failed[i]) if i in failed else Outcome(value=f"done:{w}")
                    for i, w in enumerate(batch)]
        self._pending.pop(0).set_result(outcomes)

    def fail(self, error: BaseException) -> None:
        self._pending.pop(0).set_exception(error)


async def turns(n: int = 3) -> None:
    """Let every ready task and callback run for ``n`` loop rounds (a yield, not a wait)."""
    for _ in range(n):
        await asyncio.sleep(0)


def submit_all(group: GroupCommit[str], *writes: str) -> list[asyncio.Task[Any]]:
    return [asyncio.create_task(group.submit(w)) for w in writes]


async def test_a_lone_write_is_a_batch_of_one_and_resumes_only_after_its_commit() -> None:
    """One writer starts at once, alone, and its await returns only when the commit ends."""
    disk = FakeDisk()
    group = GroupCommit(disk.start)
    (task,) = submit_all(group, "a")
    await turns()
    assert disk.batches == [["a"]] and not task.done()
    disk.commit()
    assert await task == "done:a"
    assert (group.batches, group.writes, group.largest) == (1, 1, 1)


async def test_writes_arriving_during_a_commit_share_the_next_one_in_order() -> None:
    """Writes queued while a batch commits go together, in arrival order, into the next batch."""
    disk = FakeDisk()
    group = GroupCommit(disk.start)
    first = submit_all(group, "a")
    await turns()
    rest = submit_all(group, "b", "c", "d")
    await turns()
    assert disk.batches == [["a"]] and group.queued == 3
    disk.commit()
    await turns()
    assert disk.batches == [["a"], ["b", "c", "d"]]
    assert first[0].done() and not any(t.done() for t in rest)
    disk.commit()
    assert await asyncio.gather(*rest) == ["done:b", "done:c", "done:d"]


async def test_an_op_that_fails_fails_only_its_own_caller() -> None:
    """A fenced write's LeaseLost reaches its caller alone; the batch's other writes succeed."""
    disk = FakeDisk()
    group = GroupCommit(disk.start)
    submit_all(group, "a")
    await turns()
    tasks = submit_all(group, "b", "c", "d")
    await turns()
    disk.commit()
    await turns()
    disk.commit((1, LeaseLost("stale token")))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[0] == "done:b" and results[2] == "done:d"
    assert isinstance(results[1], LeaseLost)


async def test_a_failed_commit_fails_its_whole_batch_and_not_the_next() -> None:
    """If the batch's future fails, every write of it fails; the next batch is unaffected."""
    disk = FakeDisk()
    group = GroupCommit(disk.start)
    doomed = submit_all(group, "a")
    await turns()
    later = submit_all(group, "b")
    await turns()
    disk.fail(PersistenceError("disk I/O error", cause="io"))
    with pytest.raises(PersistenceError, match="disk I/O"):
        await doomed[0]
    await turns()
    disk.commit()
    assert await later[0] == "done:b"


async def test_a_crash_drops_exactly_the_uncommitted_batch() -> None:
    """At a crash the batch in flight still ends; queued writes are never applied and fail."""
    disk = FakeDisk()
    group = GroupCommit(disk.start)
    inflight = submit_all(group, "a", "b")
    await turns()
    queued = submit_all(group, "c", "d")
    await turns()
    assert disk.batches == [["a"]] and group.queued == 3
    assert group.crash() == 3
    disk.commit()
    assert await inflight[0] == "done:a"
    for task in [inflight[1], *queued]:
        with pytest.raises(PersistenceError) as info:
            await task
        assert info.value.cause == "closed"
    assert disk.batches == [["a"]]  # the dropped writes never reached the commit step
    with pytest.raises(PersistenceError):
        await group.submit("e")


async def test_a_cancelled_caller_leaves_its_write_in_the_batch() -> None:
    """Cancelling a caller drops its result, not its write; the others still resume."""
    disk = FakeDisk()
    group = GroupCommit(disk.start)
    submit_all(group, "a")
    await turns()
    b, c = submit_all(group, "b", "c")
    await turns()
    b.cancel()
    disk.commit()
    await turns()
    assert disk.batches[1] == ["b", "c"]
    disk.commit()
    assert await c == "done:c"
    assert b.cancelled()


async def test_a_batch_starts_with_the_last_write_of_the_turns_the_commit_resumed() -> None:
    """Writers resumed by a commit are awaited: the batch starts inside the last one's step."""
    disk = FakeDisk()
    group = GroupCommit(disk.start)

    async def writer(name: str) -> None:
        for i in range(3):
            assert await group.submit(f"{name}{i}") == f"done:{name}{i}"

    writers = [asyncio.create_task(writer(name)) for name in "abc"]
    await turns()
    assert disk.batches == [["a0"]] and group.queued == 2
    disk.commit()
    await turns()
    assert disk.batches[-1] == ["b0", "c0", "a1"]  # a came back: nobody else on the way
    disk.commit()
    await turns()
    assert group.awaited == 0 and disk.batches[-1] == ["b1", "c1", "a2"]
    disk.commit()
    await turns()
    assert disk.batches[-1] == ["b2", "c2"]  # a ended: the round's end starts them
    disk.commit()
    await asyncio.gather(*writers)


async def test_a_batch_waits_at_most_rounds_max_rounds_for_a_resumed_turn() -> None:
    """A resumed turn that does not write again holds the next batch ``ROUNDS_MAX`` rounds."""
    disk = FakeDisk()
    group = GroupCommit(disk.start)
    never = asyncio.Event()

    async def write_then_wait() -> None:
        await group.submit("a0")
        await never.wait()

    stuck = asyncio.create_task(write_then_wait())
    await turns(1)
    later = submit_all(group, "b0")
    await turns()
    disk.commit()
    await turns(2)
    assert group.awaited == 1 and group.queued == 1  # still waiting for a
    await turns(group_commit.ROUNDS_MAX)
    assert disk.batches[-1] == ["b0"] and not stuck.done()
    disk.commit()
    assert await later[0] == "done:b0"
    stuck.cancel()


async def test_drain_applies_what_is_queued_and_waits_for_it() -> None:
    """``drain`` returns only once the batch in flight and the writes queued behind it ended."""
    disk = FakeDisk()
    group = GroupCommit(disk.start)
    tasks = submit_all(group, "a", "b")
    await turns()
    drained = asyncio.create_task(group.drain())
    await turns()
    disk.commit()
    await turns()
    assert disk.batches == [["a"], ["b"]] and not drained.done()
    disk.commit()
    await drained
    assert [t.result() for t in tasks] == ["done:a", "done:b"]


# -- the worker side: one transaction, a savepoint per op --------------------------------------


@pytest.fixture
def conn() -> Iterator[StoreConnection]:
    c = connect(":memory:")
    c.execute("PRAGMA foreign_keys = ON")
    c.execute("CREATE TABLE parent(id INTEGER PRIMARY KEY)")
    c.execute("CREATE TABLE child(id INTEGER PRIMARY KEY, parent INTEGER "
              "REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)")
    yield c
    c.close()


def put(conn: StoreConnection, events: Sequence[Any], row: int) -> int:
    """A write op: one parent row."""
    with sqlite_ops._write(conn):
        conn.execute("INSERT INTO parent(id) VALUES (?)", (row,))
    return row


def orphan(conn: StoreConnection, events: Sequence[Any], row: int) -> int:
    """A write op whose foreign key fails only at COMMIT (deferred)."""
    with sqlite_ops._write(conn):
        conn.execute("INSERT INTO child(id, parent) VALUES (?, 999)", (row,))
    return row


def abandon(conn: StoreConnection, events: Sequence[Any]) -> None:
    """A write op during which SQLite abandons the whole transaction (as for a full disk)."""
    with sqlite_ops._write(conn):
        conn.execute("ROLLBACK")
        raise sqlite3.OperationalError("database or disk is full")


def put_then_fail(conn: StoreConnection, events: Sequence[Any], row: int) -> None:
    """A write op that inserts a row and then fails (as a fence checked late would)."""
    with sqlite_ops._write(conn):
        conn.execute("INSERT INTO parent(id) VALUES (?)", (row,))
        raise LeaseLost("refused after a row was written")


def put_or_give_up(conn: StoreConnection, events: Sequence[Any], row: int) -> int | None:
    """A write op that inserts a row, gives up and swallows its own error (as ``_Busy`` is)."""
    try:
        with sqlite_ops._write(conn):
            conn.execute("INSERT INTO parent(id) VALUES (?)", (row,))
            raise sqlite_ops._Busy
    except sqlite_ops._Busy:
        return None


def parents(conn: StoreConnection) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM parent ORDER BY id")]


def test_a_batch_is_one_transaction_and_a_failing_op_rolls_back_alone(
        conn: StoreConnection) -> None:
    """Three ops, one COMMIT; the duplicate key rolls back its own savepoint only."""
    outcomes = run_batch(conn, [Write(put, (), (1,)), Write(put, (), (1,)), Write(put, (), (2,))])
    assert [o.value for o in outcomes] == [1, None, 2]
    assert isinstance(outcomes[1].error, PersistenceError)
    assert parents(conn) == [1, 2] and conn.commits == 1 and not conn.in_transaction


def test_a_batch_without_failures_commits_without_savepoints(conn: StoreConnection) -> None:
    """The first pass runs the ops bare: no SAVEPOINT reaches SQLite, and one COMMIT."""
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    outcomes = run_batch(conn, [Write(put, (), (1,)), Write(put, (), (2,)), Write(put, (), (3,))])
    conn.set_trace_callback(None)
    assert [o.value for o in outcomes] == [1, 2, 3]
    assert not any("SAVEPOINT" in s for s in statements)
    assert parents(conn) == [1, 2, 3] and conn.commits == 1 and not conn.bare


def test_an_op_failing_after_a_write_leaves_none_of_its_rows(conn: StoreConnection) -> None:
    """The bare pass is rolled back whole; the batch again with savepoints keeps the others."""
    outcomes = run_batch(conn, [Write(put, (), (1,)), Write(put_then_fail, (), (7,)),
                                Write(put, (), (2,))])
    assert [o.value for o in outcomes] == [1, None, 2]
    assert isinstance(outcomes[1].error, LeaseLost)
    assert parents(conn) == [1, 2] and conn.commits == 1 and not conn.in_transaction


def test_an_op_that_swallows_its_own_failure_still_rolls_back_alone(
        conn: StoreConnection) -> None:
    """An op whose write failed inside it but returned normally leaves no row behind."""
    outcomes = run_batch(conn, [Write(put, (), (1,)), Write(put_or_give_up, (), (7,)),
                                Write(put, (), (2,))])
    assert [o.value for o in outcomes] == [1, None, 2] and all(o.error is None for o in outcomes)
    assert parents(conn) == [1, 2] and conn.commits == 1 and not conn.spoiled


def test_a_batch_of_one_is_the_op_alone(conn: StoreConnection) -> None:
    """A lone op commits its own transaction and raises its own mapped error."""
    assert run_batch(conn, [Write(put, (), (1,))]) == [Outcome(value=1)]
    (failed,) = run_batch(conn, [Write(put, (), (1,))])
    assert isinstance(failed.error, PersistenceError) and failed.error.cause == "duplicate"
    assert conn.commits == 1


def test_a_failed_commit_fails_every_op_that_had_succeeded(conn: StoreConnection) -> None:
    """A COMMIT refused (a deferred foreign key) leaves nothing of the batch and fails them all."""
    outcomes = run_batch(conn, [Write(put, (), (1,)), Write(orphan, (), (5,))])
    causes = [o.error.cause if isinstance(o.error, PersistenceError) else None for o in outcomes]
    assert causes == ["foreign_key", "foreign_key"]
    assert parents(conn) == [] and conn.commits == 0 and not conn.in_transaction


def test_an_abandoned_transaction_loses_the_ops_before_and_runs_the_rest_alone(
        conn: StoreConnection) -> None:
    """Ops before the abandoning one are lost (and told so); the ones after commit one by one."""
    outcomes = run_batch(conn, [Write(put, (), (1,)), Write(abandon, ()),
                                Write(put, (), (2,)), Write(put, (), (3,))])
    assert isinstance(outcomes[0].error, PersistenceError)
    assert "rolled back with its batch" in str(outcomes[0].error)
    assert isinstance(outcomes[1].error, PersistenceError)
    assert [o.value for o in outcomes[2:]] == [2, 3]
    assert parents(conn) == [2, 3] and conn.commits == 2


# -- through the store ---------------------------------------------------------------------------


async def open_with_sessions(db: Path, count: int) -> tuple[AsyncSqliteStore, list[Lease]]:
    """A store with ``count`` leased sessions, set up in a task of its own that has ended.

    A caller the last commit resumed is awaited by the next batch; the setup's task has
    ended, so the test's first write starts a batch at once.
    """
    return await asyncio.create_task(_set_up(db, count))


async def _set_up(db: Path, count: int) -> tuple[AsyncSqliteStore, list[Lease]]:
    store = await AsyncSqliteStore.open(db)
    leases = []
    for i in range(count):
        await store.create_session(SessionRecord(id=f"s{i}", key=f"k{i}", system_prompt="p",
                                                 started_at=0.0))
        lease = await store.acquire_lease(f"s{i}", "w", time.time(), 60.0)
        assert lease is not None
        leases.append(lease)
    return store, leases


def user(text: str) -> tuple[Message, ...]:
    return (Message(role=Role.USER, content=text),)


async def test_concurrent_appends_share_a_commit_and_a_stale_token_fails_alone(
        tmp_path: Path) -> None:
    """Three sessions' appends at once: two commits; the stale token's LeaseLost is its own."""
    store, leases = await open_with_sessions(tmp_path / "g.db", 3)
    try:
        before = store.commits
        results = await asyncio.gather(
            store.append_messages("s0", leases[0].token, user("zero")),
            store.append_messages("s1", leases[1].token + 1, user("stale")),
            store.append_messages("s2", leases[2].token, user("two")),
            return_exceptions=True)
        assert isinstance(results[1], LeaseLost)
        assert store.commits - before == 2  # s0 alone, then s1 and s2 in one transaction
        assert [m.content for m in await store.load_messages("s2")] == ["two"]
        assert await store.load_messages("s1") == ()
        assert await store.load_messages("s0") == results[0]
    finally:
        await store.close()


async def test_a_store_crash_drops_the_queued_writes_and_keeps_the_committing_one(
        tmp_path: Path) -> None:
    """``crash`` while one write commits and two wait: only the committing one is in the file."""
    db = tmp_path / "c.db"
    store, leases = await open_with_sessions(db, 3)
    writes = [asyncio.create_task(store.append_messages(f"s{i}", leases[i].token, user(f"m{i}")))
              for i in range(3)]
    await turns(1)
    assert store.group_commit.busy and store.group_commit.queued == 2
    await store.crash()
    results = await asyncio.gather(*writes, return_exceptions=True)
    assert isinstance(results[0], tuple)
    assert all(isinstance(r, PersistenceError) and r.cause == "closed" for r in results[1:])
    again = await AsyncSqliteStore.open(db)
    try:
        assert [len(await again.load_messages(f"s{i}")) for i in range(3)] == [1, 0, 0]
    finally:
        await again.close()


async def test_a_write_to_a_store_whose_worker_is_gone_is_a_closed_store_error(
        tmp_path: Path) -> None:
    """If aiosqlite's worker has stopped, a write fails as PersistenceError(closed), not ValueError."""
    store, leases = await open_with_sessions(tmp_path / "w.db", 1)
    await store._db.close()  # the worker stops; the store has not been told
    try:
        with pytest.raises(PersistenceError) as info:
            await store.append_messages("s0", leases[0].token, user("late"))
        assert info.value.cause == "closed"
    finally:
        await store.close()
