"""One store contract, run unchanged against every Store implementation.

MemoryStore is the reference; SqliteStore runs on a file in tmp_path; AsyncSqliteStore runs
behind ``SyncFacade``, which drives each coroutine to completion on a private event loop,
so the same test bodies apply. Each test gets a ``Harness``: the store plus the two world
operations a store does not share (crash, and recovering from a crash).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_ref.errors import LeaseLost, PersistenceError
from hermes_ref.models import Event, Lease, Message, Role, ScaffoldFlag, SessionRecord, ToolCall
from hermes_ref.ports import DurableRecord, Store
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from sim.sqlite_store import SqliteStore
from sim.store import MemoryStore

# -- harnesses -----------------------------------------------------------------------------


class SyncFacade:
    """The synchronous ``Store`` shape over an AsyncSqliteStore."""

    def __init__(self, loop: asyncio.AbstractEventLoop, inner: AsyncSqliteStore) -> None:
        self._loop = loop
        self.inner = inner

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    @property
    def commits(self) -> int:
        return self.inner.commits

    def create_session(self, record: SessionRecord) -> None:
        self._run(self.inner.create_session(record))

    def ensure_session(self, record: SessionRecord) -> tuple[SessionRecord, bool]:
        return self._run(self.inner.ensure_session(record))  # type: ignore[no-any-return]

    def open_turn(self, record: SessionRecord, holder: str, now: float, ttl_s: float) -> Any:
        return self._run(self.inner.open_turn(record, holder, now, ttl_s))

    def get_session(self, session_id: str) -> SessionRecord | None:
        return self._run(self.inner.get_session(session_id))  # type: ignore[no-any-return]

    def end_session(self, session_id: str, reason: str, at: float) -> None:
        self._run(self.inner.end_session(session_id, reason, at))

    def load_messages(self, session_id: str, after_row_id: int = 0) -> tuple[Message, ...]:
        return self._run(self.inner.load_messages(session_id, after_row_id))  # type: ignore[no-any-return]

    def append_messages(
        self, session_id: str, lease_token: int, messages: tuple[Message, ...]
    ) -> tuple[Message, ...]:
        return self._run(self.inner.append_messages(session_id, lease_token, messages))  # type: ignore[no-any-return]

    def rewrite_message(
        self, session_id: str, lease_token: int, row_id: int, content: str
    ) -> Message:
        return self._run(self.inner.rewrite_message(session_id, lease_token, row_id, content))  # type: ignore[no-any-return]

    def acquire_lease(self, session_id: str, holder: str, now: float, ttl_s: float) -> Lease | None:
        return self._run(self.inner.acquire_lease(session_id, holder, now, ttl_s))  # type: ignore[no-any-return]

    def release_lease(self, lease: Lease) -> None:
        self._run(self.inner.release_lease(lease))

    def log_event(self, event: Event) -> None:
        self._run(self.inner.log_event(event))

    def flush_events(self) -> None:
        self._run(self.inner.flush_events())

    def watermark(self) -> int:
        return self._run(self.inner.watermark())  # type: ignore[no-any-return]

    def snapshot(self) -> DurableRecord:
        return self._run(self.inner.snapshot())  # type: ignore[no-any-return]

    def crash(self) -> None:
        self._run(self.inner.crash())

    def close(self) -> None:
        self._run(self.inner.close())


class Harness:
    """A store under test and how to crash it and come back."""

    def __init__(self, kind: str, directory: Path, synchronous: str = "FULL") -> None:
        self.kind = kind
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "store.db"
        self.synchronous = synchronous
        self._loop = asyncio.new_event_loop() if kind == "async" else None
        self.store: Any = self._open()

    def _open(self) -> Any:
        if self.kind == "memory":
            return MemoryStore()
        if self.kind == "sqlite":
            return SqliteStore(self.path, synchronous=self.synchronous)
        assert self._loop is not None
        inner = self._loop.run_until_complete(
            AsyncSqliteStore.open(self.path, synchronous=self.synchronous)
        )
        return SyncFacade(self._loop, inner)

    def crash_and_recover(self) -> None:
        """Kill the process (pending events are lost) and come back from what is durable."""
        self.store.crash()
        if self.kind == "sqlite":
            self.store.reopen()
        elif self.kind == "async":
            self.store = self._open()

    def close(self) -> None:
        self.store.close()
        if self._loop is not None:
            self._loop.close()


KINDS = ("memory", "sqlite", "async")


@pytest.fixture(params=KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(request.param, tmp_path)
    yield h
    h.close()


@pytest.fixture
def store(harness: Harness) -> Store:
    return harness.store  # type: ignore[no-any-return]


# -- helpers -------------------------------------------------------------------------------


def session(sid: str = "s1", **kw: Any) -> SessionRecord:
    return SessionRecord(id=sid, key=f"key-{sid}", system_prompt="be brief", started_at=1.0, **kw)


def user(text: str, **kw: Any) -> Message:
    return Message(role=Role.USER, content=text, **kw)


def leased(store: Store, sid: str = "s1", holder: str = "w1", now: float = 0.0) -> Lease:
    if store.get_session(sid) is None:
        store.create_session(session(sid))
    lease = store.acquire_lease(sid, holder, now, 30.0)
    assert lease is not None
    return lease


def event(kind: str, sid: str = "s1", **data: Any) -> Event:
    return Event(session_id=sid, turn_id="t1", kind=kind, data=data, at=2.0)


# -- sessions ------------------------------------------------------------------------------


def test_create_and_get_session(store: Store) -> None:
    record = session("s1", platform="telegram", chat_type="group")
    store.create_session(record)
    assert store.get_session("s1") == record
    assert store.get_session("nope") is None


def test_ensure_session_creates_once_and_keeps_the_stored_prompt(store: Store) -> None:
    """ensure_session creates a missing row once, then returns the stored row unchanged."""
    first, created = store.ensure_session(session("s1"))
    assert created and first == session("s1")
    other = session("s1").model_copy(update={"system_prompt": "a different prompt"})
    again, created_again = store.ensure_session(other)
    assert not created_again and again == session("s1")
    assert store.get_session("s1") == session("s1")


def test_ensure_session_commits_pending_events(store: Store) -> None:
    """Pending events ride along with ensure_session's transaction, created or not."""
    store.ensure_session(session("s1"))
    store.log_event(event("turn.started"))
    store.ensure_session(session("s1"))
    assert [e.kind for e in store.snapshot().events] == ["turn.started"]


def test_open_turn_creates_the_row_and_takes_the_lease_in_one_commit(harness: Harness) -> None:
    """open_turn creates a missing session and grants its first lease together."""
    store = harness.store
    before = getattr(store, "commits", None)
    grant = store.open_turn(session("s1"), "w1", 0.0, 30.0)
    assert grant.created and grant.session == session("s1")
    assert grant.lease is not None and grant.lease.token == 1
    if before is not None:
        assert store.commits == before + 1
    store.append_messages("s1", grant.lease.token, (user("hi"),))


def test_open_turn_on_a_busy_session_writes_nothing(store: Store) -> None:
    """A held lease: open_turn returns the stored row, no lease, and leaves events pending."""
    store.open_turn(session("s1"), "w1", 0.0, 30.0)
    store.log_event(event("turn.started"))
    other = session("s1").model_copy(update={"system_prompt": "another prompt"})
    grant = store.open_turn(other, "w2", 1.0, 30.0)
    assert not grant.created and grant.lease is None and grant.session == session("s1")
    assert store.snapshot().events == ()


def test_duplicate_session_is_refused(store: Store) -> None:
    store.create_session(session("s1"))
    with pytest.raises(PersistenceError) as info:
        store.create_session(session("s1"))
    assert info.value.cause == "duplicate"


def test_end_session_first_reason_wins(store: Store) -> None:
    store.create_session(session("s1"))
    store.end_session("s1", "user_quit", 5.0)
    store.end_session("s1", "timeout", 9.0)
    ended = store.get_session("s1")
    assert ended is not None
    assert (ended.ended_at, ended.end_reason) == (5.0, "user_quit")
    with pytest.raises(PersistenceError) as info:
        store.end_session("ghost", "x", 1.0)
    assert info.value.cause == "not_found"


def test_parent_session_must_exist(store: Store) -> None:
    with pytest.raises(PersistenceError) as info:
        store.create_session(session("child", parent_session_id="ghost"))
    assert info.value.cause == "foreign_key"
    assert store.get_session("child") is None
    store.create_session(session("parent"))
    store.create_session(session("child", parent_session_id="parent"))
    child = store.get_session("child")
    assert child is not None and child.parent_session_id == "parent"


# -- messages ------------------------------------------------------------------------------


def test_append_and_load_after_row_id(store: Store) -> None:
    lease = leased(store)
    first = store.append_messages("s1", lease.token, (user("a"), user("b")))
    second = store.append_messages("s1", lease.token, (user("c"),))
    ids = [m.row_id for m in first + second]
    assert ids == [1, 2, 3]
    assert store.load_messages("s1") == first + second
    assert store.load_messages("s1", after_row_id=1) == first[1:] + second
    assert store.load_messages("s1", after_row_id=3) == ()
    assert store.load_messages("unknown") == ()
    assert store.append_messages("s1", lease.token, ()) == ()


def test_row_ids_strictly_increase_across_sessions(store: Store) -> None:
    a, b = leased(store, "a"), leased(store, "b")
    ids: list[int] = []
    for i in range(4):
        lease = a if i % 2 else b
        for m in store.append_messages(lease.session_id, lease.token, (user(f"{i}"), user("x"))):
            assert m.row_id is not None
            ids.append(m.row_id)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [m.row_id for m in store.load_messages("a")] == sorted(
        m.row_id or 0 for m in store.load_messages("a")
    )


def test_round_trip_is_exact(store: Store) -> None:
    lease = leased(store)
    sent = (
        Message(role=Role.SYSTEM, content="sys"),
        user("hello", api_content="hello\n[context: monday]", turn_id="t1", created_at=1.5),
        Message(
            role=Role.ASSISTANT,
            content=None,
            tool_calls=(
                ToolCall(id="c1", name="read", arguments='{"path": "a.txt"}'),
                ToolCall(id="c2", name="ls"),
            ),
            finish_reason="tool_calls",
            turn_id="t1",
        ),
        Message(role=Role.TOOL, content="contents", tool_call_id="c1", tool_name="read"),
        Message(role=Role.ASSISTANT, content="thinking…", hidden=True, finish_reason="stop"),
        Message(role=Role.USER, content=""),
    )
    stored = store.append_messages("s1", lease.token, sent)
    assert [m.model_copy(update={"row_id": None}) for m in stored] == list(sent)
    assert store.load_messages("s1") == stored
    assert tuple(store.snapshot().transcript("s1")) == stored


def test_append_to_missing_session_is_refused(store: Store) -> None:
    with pytest.raises(PersistenceError) as info:
        store.append_messages("ghost", 1, (user("x"),))
    assert info.value.cause == "foreign_key"


def test_scaffolding_is_refused(store: Store) -> None:
    lease = leased(store)
    scaffold = Message(role=Role.USER, content="nudge", scaffold=ScaffoldFlag.EMPTY_RECOVERY)
    with pytest.raises(PersistenceError) as info:
        store.append_messages("s1", lease.token, (user("real"), scaffold))
    assert info.value.cause == "scaffolding"
    assert store.load_messages("s1") == ()
    assert store.watermark() == 0


# -- fencing -------------------------------------------------------------------------------


def test_write_without_a_lease_is_fenced(store: Store) -> None:
    store.create_session(session("s1"))
    with pytest.raises(LeaseLost):
        store.append_messages("s1", 1, (user("x"),))
    assert store.load_messages("s1") == ()


def test_stale_token_is_fenced_and_writes_nothing(store: Store) -> None:
    old = leased(store, now=0.0)
    [row] = store.append_messages("s1", old.token, (user("mine", api_content="side"),))
    new = store.acquire_lease("s1", "w2", 30.0, 30.0)  # expired at 30.0: reclaimed
    assert new is not None and new.token == old.token + 1
    before = store.snapshot()
    with pytest.raises(LeaseLost):
        store.append_messages("s1", old.token, (user("late"),))
    with pytest.raises(LeaseLost):
        store.rewrite_message("s1", old.token, row.row_id or 0, "overwritten")
    assert store.snapshot() == before
    assert store.load_messages("s1") == (row,)


def test_released_token_is_fenced(store: Store) -> None:
    lease = leased(store)
    store.release_lease(lease)
    with pytest.raises(LeaseLost):
        store.append_messages("s1", lease.token, (user("after release"),))
    assert store.load_messages("s1") == ()


# -- leases --------------------------------------------------------------------------------


def test_lease_acquire_busy_expiry_and_token_growth(store: Store) -> None:
    store.create_session(session("s1"))
    first = store.acquire_lease("s1", "w1", 10.0, 5.0)
    assert first == Lease(session_id="s1", holder="w1", token=1, acquired_at=10.0, expires_at=15.0)
    assert store.acquire_lease("s1", "w2", 14.9, 5.0) is None
    assert store.acquire_lease("s1", "w1", 14.9, 5.0) is None  # not re-entrant
    second = store.acquire_lease("s1", "w2", 15.0, 5.0)  # expires_at <= now: reclaimable
    assert second is not None and (second.holder, second.token) == ("w2", 2)
    store.release_lease(second)
    third = store.acquire_lease("s1", "w3", 16.0, 5.0)
    assert third is not None and third.token == 3


def test_release_by_wrong_holder_or_token_is_a_no_op(store: Store) -> None:
    store.create_session(session("s1"))
    lease = store.acquire_lease("s1", "w1", 0.0, 30.0)
    assert lease is not None
    store.release_lease(lease.model_copy(update={"holder": "intruder"}))
    store.release_lease(lease.model_copy(update={"token": lease.token + 7}))
    assert store.acquire_lease("s1", "w2", 1.0, 30.0) is None
    [row] = store.snapshot().leases
    assert (row.holder, row.token, row.expires_at) == ("w1", 1, 30.0)


def test_release_keeps_the_token(store: Store) -> None:
    lease = leased(store)
    store.release_lease(lease)
    [row] = store.snapshot().leases
    assert (row.session_id, row.holder, row.token, row.expires_at) == ("s1", None, 1, 0.0)


# -- rewrite -------------------------------------------------------------------------------


def test_rewrite_drops_api_content(store: Store) -> None:
    lease = leased(store)
    a, b = store.append_messages(
        "s1", lease.token, (user("a", api_content="A+ctx", turn_id="t1"), user("b"))
    )
    new = store.rewrite_message("s1", lease.token, a.row_id or 0, "a, shorter")
    assert new == a.model_copy(update={"content": "a, shorter", "api_content": None})
    assert store.load_messages("s1") == (new, b)


def test_rewrite_of_a_missing_or_foreign_row_is_not_found(store: Store) -> None:
    other = leased(store, "other")
    [foreign] = store.append_messages("other", other.token, (user("theirs"),))
    lease = leased(store, "s1")
    for row_id in (foreign.row_id or 0, 999):
        with pytest.raises(PersistenceError) as info:
            store.rewrite_message("s1", lease.token, row_id, "x")
        assert info.value.cause == "not_found"
    assert store.load_messages("other") == (foreign,)


# -- events --------------------------------------------------------------------------------


def test_events_are_pending_until_the_next_write(store: Store) -> None:
    store.create_session(session("s1"))
    store.log_event(event("turn.started"))
    store.log_event(event("tool.progress", n=1))
    assert store.snapshot().events == ()
    assert store.acquire_lease("s1", "w1", 0.0, 30.0) is not None  # a write commits them
    events = store.snapshot().events
    assert [(e.seq, e.kind, e.data) for e in events] == [
        (1, "turn.started", {}),
        (2, "tool.progress", {"n": 1}),
    ]
    assert events[0] == event("turn.started").model_copy(update={"seq": 1})


def test_events_survive_a_failed_or_refused_write(store: Store) -> None:
    lease = leased(store)
    store.log_event(event("turn.started"))
    with pytest.raises(LeaseLost):
        store.append_messages("s1", lease.token + 1, (user("x"),))
    assert store.acquire_lease("s1", "w2", 1.0, 30.0) is None  # refused: writes nothing
    assert store.snapshot().events == ()
    store.log_event(event("turn.exit"))
    store.flush_events()
    store.flush_events()  # nothing pending: no duplicate
    assert [e.kind for e in store.snapshot().events] == ["turn.started", "turn.exit"]


def test_crash_drops_pending_events_and_keeps_commits(harness: Harness) -> None:
    lease = leased(harness.store)
    harness.store.log_event(event("turn.started"))
    [row] = harness.store.append_messages("s1", lease.token, (user("durable"),))
    harness.store.log_event(event("turn.completed"))
    harness.crash_and_recover()
    record = harness.store.snapshot()
    assert [e.kind for e in record.events] == ["turn.started"]
    assert record.transcript("s1") == [row]
    harness.store.flush_events()
    assert [e.kind for e in harness.store.snapshot().events] == ["turn.started"]


# -- watermark and snapshot ----------------------------------------------------------------


def test_watermark_is_the_highest_committed_row(store: Store) -> None:
    assert store.watermark() == 0
    a, b = leased(store, "a"), leased(store, "b")
    store.append_messages("a", a.token, (user("1"), user("2")))
    assert store.watermark() == 2
    store.append_messages("b", b.token, (user("3"),))
    assert store.watermark() == 3
    with pytest.raises(LeaseLost):
        store.append_messages("a", a.token + 5, (user("fenced"),))
    assert store.watermark() == 3


def test_snapshot_holds_everything_committed_in_order(store: Store) -> None:
    store.create_session(session("b"))
    store.create_session(session("a", parent_session_id="b"))
    la = store.acquire_lease("a", "w", 0.0, 10.0)
    lb = store.acquire_lease("b", "w", 0.0, 10.0)
    assert la is not None and lb is not None
    store.append_messages("a", la.token, (user("a1"),))
    store.append_messages("b", lb.token, (user("b1"),))
    store.log_event(event("turn.started", sid="a"))
    store.end_session("b", "done", 3.0)
    record = store.snapshot()
    assert record.session_ids() == ["b", "a"]
    assert [(m.session_id, m.message.content) for m in record.messages] == [
        ("a", "a1"),
        ("b", "b1"),
    ]
    assert [(e.seq, e.session_id) for e in record.events] == [(1, "a")]
    assert [(r.session_id, r.holder, r.token) for r in record.leases] == [
        ("a", "w", 1),
        ("b", "w", 1),
    ]
    assert record.sessions[0].end_reason == "done"
    assert record.admissions == ()


# -- property: all stores agree ------------------------------------------------------------

texts = st.text(max_size=12)
maybe_texts = st.none() | texts
tool_calls = st.lists(
    st.builds(ToolCall, id=texts, name=texts, arguments=st.text(max_size=20)), max_size=2
).map(tuple)
messages = st.builds(
    Message,
    role=st.sampled_from(list(Role)),
    content=maybe_texts,
    tool_calls=tool_calls,
    tool_call_id=maybe_texts,
    tool_name=maybe_texts,
    api_content=maybe_texts,
    turn_id=maybe_texts,
    finish_reason=maybe_texts,
    created_at=st.none() | st.floats(allow_nan=False),
    hidden=st.booleans(),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(messages, min_size=1, max_size=3).map(tuple)),
        st.tuples(st.just("rewrite"), st.integers(0, 20), texts),
        st.tuples(st.just("event"), texts),
        st.tuples(st.just("flush"), st.none()),
    ),
    max_size=12,
)


def _play(store: Store, ops: list[tuple[Any, ...]]) -> DurableRecord:
    store.create_session(session("s1"))
    lease = store.acquire_lease("s1", "w1", 0.0, 60.0)
    assert lease is not None
    for op in ops:
        if op[0] == "append":
            store.append_messages("s1", lease.token, op[1])
        elif op[0] == "rewrite":
            rows = store.load_messages("s1")
            if rows:
                target = rows[op[1] % len(rows)].row_id or 0
                store.rewrite_message("s1", lease.token, target, op[2])
        elif op[0] == "event":
            store.log_event(event("tool.progress", text=op[1]))
        else:
            store.flush_events()
    return store.snapshot()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_all_stores_agree_on_any_history(ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        records = []
        for kind in KINDS:
            harness = Harness(kind, Path(directory) / kind, synchronous="OFF")
            try:
                records.append(_play(harness.store, ops))
            finally:
                harness.close()
    reference = records[0]
    for record in records[1:]:
        assert record.transcript("s1") == reference.transcript("s1")
        assert record == reference



def _store_with_liveness(kind: str, path: Path, alive: Any) -> tuple[Any, Any]:
    if kind == "memory":
        return MemoryStore(holder_alive=alive), None
    if kind == "sqlite":
        return SqliteStore(path, holder_alive=alive), None
    loop = asyncio.new_event_loop()
    inner = loop.run_until_complete(AsyncSqliteStore.open(path, holder_alive=alive))
    return SyncFacade(loop, inner), loop


@pytest.mark.parametrize("kind", KINDS)
def test_a_dead_holders_lease_is_reclaimed_before_expiry(kind: str, tmp_path: Path) -> None:
    """LEASE-3: a live holder's lease is kept; a dead holder's is reclaimed with a new token."""
    dead: set[str] = set()
    store, loop = _store_with_liveness(kind, tmp_path / "db.sqlite", lambda h: h not in dead)
    try:
        store.create_session(session("s1"))
        first = store.acquire_lease("s1", "pid=1", 0.0, 300.0)
        assert first is not None
        assert store.acquire_lease("s1", "pid=2", 10.0, 300.0) is None
        dead.add("pid=1")
        second = store.acquire_lease("s1", "pid=2", 10.0, 300.0)
        assert second is not None and second.token == first.token + 1
        with pytest.raises(LeaseLost):
            store.append_messages("s1", first.token, (user("late write"),))
    finally:
        store.close()
        if loop is not None:
            loop.close()
