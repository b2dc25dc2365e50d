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

from hermes_ref import admission
from hermes_ref.admission import (
    AdmissionRow,
    AdmissionStatus,
    AdmitAnswer,
    Binding,
    BindingRole,
    ClaimAnswer,
    EpochStart,
    Intent,
    Move,
    Outcome,
    PrincipalKind,
)
from hermes_ref.errors import LeaseLost, PersistenceError
from hermes_ref.lane_restart import LaneEntry  # SES
from hermes_ref.models import (
    Closing,
    Event,
    Lease,
    Message,
    Opening,
    Role,
    ScaffoldFlag,
    SessionRecord,
    ToolCall,
)
from hermes_ref.ports import DurableRecord, Store
from hermes_ref.session import Cause, Route, SessionSource  # SES
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

    def open_turn(self, record: SessionRecord, holder: str, now: float, ttl_s: float,
                  poll_s: float = 0.0, opening: Opening | None = None,
                  before_opening: Any = None, create: bool = True) -> Any:
        assert before_opening is None  # the simulator's hook; a real store has none
        return self._run(self.inner.open_turn(record, holder, now, ttl_s, poll_s, opening, create))

    def close_turn(self, lease: Lease, closing: Closing, before_release: Any = None) -> Any:
        assert before_release is None  # the simulator's hook; a real store has none
        return self._run(self.inner.close_turn(lease, closing))

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

    def acquire_lease(self, session_id: str, holder: str, now: float, ttl_s: float,
                      poll_s: float = 0.0) -> Lease | None:
        return self._run(self.inner.acquire_lease(session_id, holder, now, ttl_s, poll_s))  # type: ignore[no-any-return]

    def release_lease(self, lease: Lease) -> None:
        self._run(self.inner.release_lease(lease))

    def leave_lease_queue(self, session_id: str, holder: str) -> None:
        self._run(self.inner.leave_lease_queue(session_id, holder))

    def refresh_lease(self, lease: Lease, now: float, ttl_s: float) -> Lease:
        return self._run(self.inner.refresh_lease(lease, now, ttl_s))  # type: ignore[no-any-return]

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

    # ADM: the admission door's methods, one for one
    def bind_principal(self, binding: Binding) -> None:
        self._run(self.inner.bind_principal(binding))

    def get_binding(self, principal_id: str, session_id: str) -> Binding | None:
        return self._run(self.inner.get_binding(principal_id, session_id))  # type: ignore[no-any-return]

    def begin_epoch(self, now: float, holder: str) -> EpochStart:
        return self._run(self.inner.begin_epoch(now, holder))  # type: ignore[no-any-return]

    def recover_epochs(self, epoch: int, now: float) -> EpochStart:
        return self._run(self.inner.recover_epochs(epoch, now))  # type: ignore[no-any-return]

    def admit_input(self, candidate: AdmissionRow) -> AdmitAnswer:
        return self._run(self.inner.admit_input(candidate))  # type: ignore[no-any-return]

    def claim_admission(self, session_id: str, epoch: int, now: float) -> ClaimAnswer:
        return self._run(self.inner.claim_admission(session_id, epoch, now))  # type: ignore[no-any-return]

    def move_admission(self, admission_id: str, session_id: str, move: Move, epoch: int,
                       now: float, outcome: Outcome | None = None,
                       turn_id: str | None = None) -> AdmissionRow:
        return self._run(self.inner.move_admission(  # type: ignore[no-any-return]
            admission_id, session_id, move, epoch, now, outcome, turn_id))

    def admission_mark(self) -> int:
        return self._run(self.inner.admission_mark())  # type: ignore[no-any-return]

    # SES: session lanes, one for one
    def put_route(self, route: Route, end_session_id: str | None = None,
                  end_reason: str | None = None, start: SessionRecord | None = None) -> bool:
        return self._run(self.inner.put_route(route, end_session_id, end_reason, start))  # type: ignore[no-any-return]

    def get_route(self, key: str) -> Route | None:
        return self._run(self.inner.get_route(key))  # type: ignore[no-any-return]

    def latest_routes(self) -> tuple[Route, ...]:
        return self._run(self.inner.latest_routes())  # type: ignore[no-any-return]

    def read_markers(self) -> dict[str, float]:
        return self._run(self.inner.read_markers())  # type: ignore[no-any-return]

    def write_lane(self, markers: tuple[tuple[str, float | None], ...],
                   log: tuple[LaneEntry, ...] = ()) -> None:
        self._run(self.inner.write_lane(markers, log))

    def live_background(self) -> frozenset[str]:
        return self._run(self.inner.live_background())  # type: ignore[no-any-return]


class Harness:
    """A store under test and how to crash it and come back."""

    def __init__(self, kind: str, directory: Path, synchronous: str = "FULL") -> None:
        self.kind = kind
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "store.db"
        self.synchronous = synchronous
        self._loop = asyncio.new_event_loop() if kind == "async" else None
        self.now = 0.0  # the stores' own clock (LEASE-4 expiry); a test may move it
        self.store: Any = self._open()

    def clock(self) -> float:
        return self.now

    def _open(self) -> Any:
        if self.kind == "memory":
            return MemoryStore(clock=self.clock)
        if self.kind == "sqlite":
            return SqliteStore(self.path, synchronous=self.synchronous, clock=self.clock)
        assert self._loop is not None
        inner = self._loop.run_until_complete(
            AsyncSqliteStore.open(self.path, synchronous=self.synchronous)
        )
        inner.clock = self.clock
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


def opening(text: str = "hi", expected_token: int = 0, sid: str = "s1") -> Opening:
    return Opening(rows=(user(text, turn_id="t1"),), expected_token=expected_token,
                   events=(event("turn.started", sid).model_copy(update={"turn_seq": 1}),))


def test_open_turn_stores_the_opening_of_a_new_session_in_the_same_commit(harness: Harness) -> None:
    """A session this request creates: grant, user row and its event are one commit."""
    store = harness.store
    before = getattr(store, "commits", None)
    store.log_event(event("turn.overlap", "s0"))
    grant = store.open_turn(session("s1"), "w1", 0.0, 30.0, opening=opening())
    assert grant.created and grant.lease is not None and grant.opening_failure is None
    assert [(m.content, m.row_id is not None) for m in grant.opened] == [("hi", True)]
    if before is not None:
        assert store.commits == before + 1
    record = store.snapshot()
    assert [m.message for m in record.messages] == list(grant.opened)
    assert [e.kind for e in record.events] == ["turn.overlap", "turn.started"]
    assert store.watermark() == grant.opened[0].row_id


def test_open_turn_stores_an_opening_only_on_the_expected_token(store: Store) -> None:
    """On a served session the opening needs the token the asker expects; else the grant
    stands alone, and its events are not committed."""
    first = store.open_turn(session("s1"), "w1", 0.0, 30.0)
    assert first.lease is not None
    store.release_lease(first.lease)
    wrong = store.open_turn(session("s1"), "w1", 1.0, 30.0, opening=opening(expected_token=5))
    assert wrong.lease is not None and wrong.lease.token == 2 and wrong.opened == ()
    assert store.snapshot().messages == () and store.snapshot().events == ()
    store.release_lease(wrong.lease)
    right = store.open_turn(session("s1"), "w1", 2.0, 30.0, opening=opening(expected_token=3))
    assert right.lease is not None and right.lease.token == 3 and len(right.opened) == 1
    assert [e.kind for e in store.snapshot().events] == ["turn.started"]


def test_open_turn_stores_no_opening_while_the_lease_is_busy(store: Store) -> None:
    """Busy: no grant, so no opening either; an existing session is not 'created'."""
    store.open_turn(session("s1"), "w1", 0.0, 30.0)
    grant = store.open_turn(session("s1"), "w2", 1.0, 30.0, opening=opening())
    assert grant.lease is None and grant.opened == () and store.snapshot().messages == ()


def test_a_failed_opening_leaves_the_grant_standing(harness: Harness) -> None:
    """Rows that cannot be stored (scaffolding here) fail alone: the grant commits."""
    store = harness.store
    bad = Opening(rows=(user("nudge", scaffold=ScaffoldFlag.DROPPED_TOOLCALL_NUDGE),))
    grant = store.open_turn(session("s1"), "w1", 0.0, 30.0, opening=bad)
    assert grant.lease is not None and grant.opened == ()
    assert grant.opening_failure is not None and grant.opening_failure[0] == "scaffolding"
    assert store.snapshot().messages == ()
    store.append_messages("s1", grant.lease.token, (user("hi"),))  # the lease holds


def test_a_served_sessions_open_turn_never_recreates_a_missing_row(store: Store) -> None:
    """create=False (a served session's ask): a row that is gone is refused, nothing written."""
    with pytest.raises(PersistenceError) as refused:
        store.open_turn(session("gone"), "w1", 0.0, 30.0, opening=opening(expected_token=2),
                        create=False)
    assert refused.value.cause == "foreign_key"
    record = store.snapshot()
    assert record.sessions == () and record.messages == () and record.lease_grants == ()


def test_an_opening_for_a_new_session_never_lands_on_an_existing_one(store: Store) -> None:
    """expected_token 0 means 'a session I have not seen': only a session created now takes it."""
    first = store.open_turn(session("s1"), "w1", 0.0, 30.0)
    assert first.lease is not None
    store.release_lease(first.lease)
    again = store.open_turn(session("s1"), "w1", 1.0, 30.0, opening=opening())
    assert again.lease is not None and not again.created and again.opened == ()
    assert store.snapshot().messages == ()


@pytest.mark.parametrize("kind", ("memory", "sqlite"))
def test_would_open_answers_what_open_turn_then_does(kind: str, tmp_path: Path) -> None:
    """The simulator's question (``would_open``) agrees with the act, case by case: a new
    session, an existing one for a new asker, the expected and an unexpected token, a busy
    lease, a waiter queued ahead; and asking writes nothing."""
    harness = Harness(kind, tmp_path)
    store = harness.store
    try:
        cases: list[tuple[str, Opening, float, float]] = [
            ("w1", opening(), 0.0, 0.0),                     # created: applies
            ("w2", opening(), 1.0, 0.0),                     # busy: no grant
            ("w2", opening(expected_token=2), 40.0, 0.0),    # expired: token 2, expected
            ("w3", opening(expected_token=9), 80.0, 0.0),    # expired: token 3, unexpected
            ("w4", opening(expected_token=4), 81.0, 1.0),    # busy, joins the queue
            ("w5", opening(expected_token=4), 200.0, 1.0),   # w4 queued ahead of w5
        ]
        for holder, offer, now, poll in cases:
            before = store.snapshot()
            answer = store.would_open(session("s1"), holder, now, 30.0, poll, offer)
            assert store.snapshot() == before, holder
            grant = store.open_turn(session("s1"), holder, now, 30.0, poll, opening=offer)
            assert answer == bool(grant.opened), (holder, answer, grant)
    finally:
        harness.close()


def closing(text: str = "done", sid: str = "s1") -> Closing:
    return Closing(rows=(Message(role=Role.ASSISTANT, content=text, turn_id="t1"),),
                   events=(event("turn.exit", sid).model_copy(update={"turn_seq": 5}),
                           event("turn.completed", sid).model_copy(update={"turn_seq": 6})))


def test_close_turn_commits_the_rows_the_ending_and_the_release_in_one_commit(
        harness: Harness) -> None:
    """The final row, the pending events, the ending and the release: one commit."""
    store = harness.store
    lease = leased(store)
    store.log_event(event("delta.text"))
    before = getattr(store, "commits", None)
    closed = store.close_turn(lease, closing())
    assert closed.release_failure is None
    assert [(m.content, m.row_id is not None) for m in closed.stored] == [("done", True)]
    if before is not None:
        assert store.commits == before + 1
    record = store.snapshot()
    assert [m.message for m in record.messages] == list(closed.stored)
    assert [e.kind for e in record.events] == ["delta.text", "turn.exit", "turn.completed"]
    assert store.acquire_lease("s1", "w2", 1.0, 30.0) is not None  # released
    assert store.watermark() == closed.stored[0].row_id


@pytest.mark.parametrize("bad", ("stale", "scaffolding"))
def test_close_turn_whose_rows_fail_commits_nothing(store: Store, bad: str) -> None:
    """Fenced rows or scaffolding: no row, no ending, no release; pending events stay pending."""
    lease = leased(store)
    store.log_event(event("delta.text"))
    shut = closing()
    if bad == "stale":
        store.release_lease(lease)
    else:
        shut = shut.model_copy(update={"rows": (user("nudge", scaffold=ScaffoldFlag.EMPTY_RECOVERY),)})
    with pytest.raises(PersistenceError):
        store.close_turn(lease, shut)
    record = store.snapshot()
    assert record.messages == ()
    assert [e.kind for e in record.events] == ([] if bad == "scaffolding" else ["delta.text"])
    if bad == "scaffolding":
        assert store.acquire_lease("s1", "w2", 1.0, 30.0) is None  # still the turn's
        store.flush_events()
        assert [e.kind for e in store.snapshot().events] == ["delta.text"]


@pytest.mark.parametrize("kind", ("memory", "sqlite"))
def test_a_failed_release_in_the_closing_leaves_the_rows_and_the_ending(kind: str,
                                                                         tmp_path: Path) -> None:
    """The release is a savepoint of its own: it fails alone, the lease lapses later."""
    harness = Harness(kind, tmp_path)
    try:
        store = harness.store
        lease = leased(store)

        def refuse() -> None:
            raise PersistenceError("simulated store failure at release", cause="injected_io_error")
        closed = store.close_turn(lease, closing(), refuse)
        assert closed.release_failure is not None and closed.release_failure[0] == "injected_io_error"
        record = store.snapshot()
        assert [m.message.content for m in record.messages] == ["done"]
        assert [e.kind for e in record.events] == ["turn.exit", "turn.completed"]
        assert store.acquire_lease("s1", "w2", 1.0, 30.0) is None  # not released: it will lapse
    finally:
        harness.close()


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
    inner.clock = lambda: 0.0  # the grants below never expire by this clock
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


# -- admission door (ADM) ------------------------------------------------------------------


def candidate(aid: str, request: str = "r1", text: str = "hi", principal: str = "alice",
              sid: str = "s1") -> AdmissionRow:
    payload = {"text": text}
    return AdmissionRow(
        admission_id=aid, principal_id=principal, principal_kind=PrincipalKind.USER,
        session_id=sid, request_id=request, payload_json=admission.canonical_json(payload),
        payload_digest=admission.payload_digest(sid, payload, Intent.QUEUE),
        intent=Intent.QUEUE, role=BindingRole.MEMBER, owner_epoch=1, created_at=1.0,
        updated_at=1.0)


HOLDER = "pid=1:pidns=contract"  # every epoch of the door's tests is this one process's


def door(store: Store) -> int:
    """A session with alice bound to it and a first runtime epoch; returns the epoch."""
    store.create_session(session("s1"))
    store.bind_principal(Binding(principal_id="alice", kind=PrincipalKind.USER,
                                 session_id="s1", role=BindingRole.MEMBER))
    return store.begin_epoch(1.0, HOLDER).epoch


def test_bindings_are_durable_and_need_their_session(harness: Harness) -> None:
    """A binding is stored, survives a crash, replaces an older one, and needs its session."""
    store = harness.store
    door(store)
    owner = Binding(principal_id="alice", kind=PrincipalKind.USER, session_id="s1",
                    role=BindingRole.OWNER)
    store.bind_principal(owner)
    harness.crash_and_recover()
    assert harness.store.get_binding("alice", "s1") == owner
    assert harness.store.get_binding("alice", "s2") is None
    with pytest.raises(PersistenceError) as info:
        harness.store.bind_principal(owner.model_copy(update={"session_id": "ghost"}))
    assert info.value.cause == "foreign_key"
    assert harness.store.snapshot().bindings == (owner,)


def test_admit_is_idempotent_by_key_and_digest(store: Store) -> None:
    """Same key and digest: the stored row; another digest: a conflict; no session: not found."""
    door(store)
    first = store.admit_input(candidate("a1"))
    assert first.verdict == "new" and first.row is not None and first.row.seq == 1
    hit = store.admit_input(candidate("a2"))
    assert hit.verdict == "hit" and hit.row == first.row
    assert store.admit_input(candidate("a3", text="other")).verdict == "conflict"
    assert store.admit_input(candidate("a4", sid="ghost")).verdict == "not_found"
    second = store.admit_input(candidate("a5", request="r2"))
    assert second.row is not None and second.row.seq == 2
    assert [r.admission_id for r in store.snapshot().admissions] == ["a1", "a5"]
    assert store.admission_mark() == 2


def test_request_ids_are_per_principal(store: Store) -> None:
    """Two principals' equal request ids are two requests, with two rows."""
    door(store)
    store.bind_principal(Binding(principal_id="bob", kind=PrincipalKind.USER, session_id="s1",
                                 role=BindingRole.MEMBER))
    mine = store.admit_input(candidate("a1"))
    theirs = store.admit_input(candidate("b1", principal="bob", text="other"))
    assert (mine.verdict, theirs.verdict) == ("new", "new")
    assert [r.principal_id for r in store.snapshot().admissions] == ["alice", "bob"]


def test_admit_commits_pending_events_with_the_row(store: Store) -> None:
    """The row and the events pending before it commit in one transaction."""
    door(store)
    store.log_event(event("turn.started"))
    store.admit_input(candidate("a1"))
    assert [e.kind for e in store.snapshot().events] == ["turn.started"]


def test_claims_are_fifo_one_in_flight_and_fenced(store: Store) -> None:
    """Lowest seq first, nothing while one is started, a stale epoch claims nothing."""
    epoch = door(store)
    for i in (1, 2):
        store.admit_input(candidate(f"a{i}", request=f"r{i}"))
    with pytest.raises(PersistenceError) as info:
        store.claim_admission("s1", epoch + 1, 2.0)
    assert info.value.cause == "stale_epoch"
    claim = store.claim_admission("s1", epoch, 2.0)
    assert claim.row is not None and claim.row.admission_id == "a1"
    assert (claim.row.claims, claim.row.claim_mark, claim.row.claimed_tick) == (1, 0, 1)
    assert store.claim_admission("s1", epoch, 3.0) == ClaimAnswer(busy=True)
    settled = store.move_admission("a1", "s1", Move.SETTLE, epoch, 4.0, Outcome.COMPLETED, "t-1")
    assert (settled.status, settled.outcome, settled.turn_id) == (
        AdmissionStatus.TERMINAL, Outcome.COMPLETED, "t-1")
    nxt = store.claim_admission("s1", epoch, 5.0)
    assert nxt.row is not None and nxt.row.admission_id == "a2"


def test_recovery_orphans_started_rows_and_pauses_the_queue(harness: Harness) -> None:
    """A new epoch makes a dead epoch's started row unknown; queued rows stay claimable."""
    store = harness.store
    epoch = door(store)
    for i in (1, 2):
        store.admit_input(candidate(f"a{i}", request=f"r{i}"))
    store.claim_admission("s1", epoch, 2.0)
    harness.crash_and_recover()
    store = harness.store
    start = store.begin_epoch(3.0, HOLDER)  # the same pid again: its predecessor is gone
    assert start.epoch == epoch + 1 and start.retired == (epoch,)
    assert [r.admission_id for r in start.orphaned] == ["a1"]
    assert store.claim_admission("s1", start.epoch, 4.0) == ClaimAnswer(paused=True)
    with pytest.raises(PersistenceError) as info:
        store.move_admission("a1", "s1", Move.SETTLE, epoch, 4.0, Outcome.COMPLETED)
    assert info.value.cause == "illegal_move"
    done = store.move_admission("a1", "s1", Move.RECONCILE, start.epoch, 5.0, Outcome.INTERRUPTED)
    assert done.status is AdmissionStatus.TERMINAL and done.settled_via is Move.RECONCILE
    nxt = store.claim_admission("s1", start.epoch, 6.0)
    assert nxt.row is not None and nxt.row.admission_id == "a2"
    assert store.snapshot().epoch == start.epoch


def test_a_refused_move_changes_nothing(store: Store) -> None:
    """An unknown id, another session, an illegal move or a stale epoch write nothing."""
    epoch = door(store)
    store.admit_input(candidate("a1"))
    before = store.snapshot()
    for args in (("nope", "s1", Move.CANCEL, epoch), ("a1", "s2", Move.CANCEL, epoch),
                 ("a1", "s1", Move.RECONCILE, epoch), ("a1", "s1", Move.CANCEL, epoch + 5)):
        with pytest.raises(PersistenceError):
            outcome = Outcome.INTERRUPTED if args[2] is Move.RECONCILE else Outcome.CANCELLED
            store.move_admission(*args, 2.0, outcome)
    assert store.snapshot() == before
    cancelled = store.move_admission("a1", "s1", Move.CANCEL, epoch, 3.0, Outcome.CANCELLED)
    assert cancelled.outcome is Outcome.CANCELLED


@pytest.mark.parametrize("kind", KINDS)
def test_epochs_are_per_process_and_only_a_dead_ones_rows_go_unknown(
        kind: str, tmp_path: Path) -> None:
    """ADM-5: live processes' epochs coexist; recovery retires only a dead holder's epoch."""
    dead: set[str] = set()
    store, loop = _store_with_liveness(kind, tmp_path / "db.sqlite", lambda h: h not in dead)
    try:
        for sid in ("s1", "s2"):
            store.create_session(session(sid))
            store.bind_principal(Binding(principal_id="alice", kind=PrincipalKind.USER,
                                         session_id=sid, role=BindingRole.MEMBER))
        one = store.begin_epoch(1.0, "pid=11").epoch
        two = store.begin_epoch(1.0, "pid=12").epoch
        store.admit_input(candidate("a1", sid="s1"))
        store.admit_input(candidate("b1", sid="s2"))
        assert store.claim_admission("s1", one, 2.0).row is not None
        assert store.claim_admission("s2", two, 2.0).row is not None
        with pytest.raises(PersistenceError) as info:
            store.move_admission("a1", "s1", Move.SETTLE, two, 3.0, Outcome.COMPLETED)
        assert info.value.cause == "stale_epoch"
        assert store.recover_epochs(two, 3.0).orphaned == ()
        dead.add("pid=11")
        start = store.recover_epochs(two, 4.0)
        assert start.retired == (one,) and [r.admission_id for r in start.orphaned] == ["a1"]
        done = store.move_admission("b1", "s2", Move.SETTLE, two, 5.0, Outcome.COMPLETED)
        assert done.status is AdmissionStatus.TERMINAL
        epochs = store.snapshot().epochs
        assert [(e.epoch, e.holder, e.retired_at) for e in epochs] == [
            (one, "pid=11", 4.0), (two, "pid=12", None)]
        with pytest.raises(PersistenceError) as info:
            store.claim_admission("s1", one, 6.0)
        assert info.value.cause == "stale_epoch"
    finally:
        store.close()
        if loop is not None:
            loop.close()


# -- SES: session lanes --------------------------------------------------------------------


def lane_route(revision: int, sid: str = "s1", lane: str = "agent:main:x:dm:1", **kw: Any) -> Route:
    values: dict[str, Any] = {
        "key": lane, "revision": revision, "session_id": sid,
        "cause": Cause.CREATED if revision == 1 else Cause.TOUCHED, "at": float(revision),
        "source": SessionSource(platform="x", chat_id="1"), "created_at": 1.0,
        "updated_at": float(revision)}
    values.update(kw)
    return Route(**values)


def test_put_route_takes_only_the_next_revision(store: Store) -> None:
    """Revision 1, then 2; a repeated or skipped revision is refused and writes nothing."""
    assert store.put_route(lane_route(1))
    assert not store.put_route(lane_route(1, sid="other"))
    assert not store.put_route(lane_route(3))
    assert store.put_route(lane_route(2))
    head = store.get_route("agent:main:x:dm:1")
    assert head is not None and head.revision == 2 and head.session_id == "s1"
    assert [r.revision for r in store.snapshot().routes] == [1, 2]
    assert store.get_route("agent:main:x:dm:404") is None


def test_put_route_ends_the_named_row_first_reason_wins(store: Store) -> None:
    """The write ends the session row it names; an ended row keeps its reason; a missing
    row is left alone."""
    store.create_session(session("s1"))
    assert store.put_route(lane_route(1), "s1", "idle")
    assert store.put_route(lane_route(2), "s1", "daily")
    assert store.put_route(lane_route(3), "missing", "idle")
    row = store.get_session("s1")
    assert row is not None and row.end_reason == "idle" and row.ended_at == 1.0
    assert store.get_session("missing") is None


def test_put_route_creates_the_row_of_the_incarnation_it_begins(harness: Harness) -> None:
    """A revision that begins an incarnation creates its row in the same commit, so a reset
    right after it finds the row to end (SES-2); an existing row is kept as it is, and a
    refused revision creates nothing."""
    store = harness.store
    assert store.put_route(lane_route(1, sid="s1"), start=session("s1"))
    assert store.put_route(lane_route(2, sid="s2", cause=Cause.USER_RESET), "s1", "new_session",
                           start=session("s2"))
    assert not store.put_route(lane_route(2, sid="s3", cause=Cause.USER_RESET), "s2",
                               "new_session", start=session("s3"))
    store.create_session(session("s4"))
    kept = store.get_session("s4")
    assert store.put_route(lane_route(1, sid="s4", lane="agent:main:a:dm"),
                           start=session("s4").model_copy(update={"system_prompt": "other"}))
    harness.crash_and_recover()
    store = harness.store
    first, second = store.get_session("s1"), store.get_session("s2")
    assert first is not None and first.end_reason == "new_session" and first.ended_at == 2.0
    assert second is not None and second.ended_at is None
    assert store.get_session("s3") is None and store.get_session("s4") == kept


def test_routes_round_trip_exactly(harness: Harness) -> None:
    """Every field of a revision, the source's optional parts and each flag, survive a crash."""
    full = lane_route(1, lane="agent:main:x:group:g:t:u", source=SessionSource(
        platform="x", chat_type="group", chat_id="g", thread_id="t", participant="u"),
        suspended=True, resume_pending=True, resume_reason="restart_interrupted",
        resume_marked_at=1.5, was_auto_reset=True, auto_reset_reason="idle",
        is_fresh_reset=True, expiry_finalized=True, retired=True, notice_delivered=True,
        order="released_0_19")
    assert harness.store.put_route(full)
    assert harness.store.put_route(lane_route(1, lane="agent:main:a:dm"))
    harness.crash_and_recover()
    assert harness.store.get_route(full.key) == full
    assert [r.key for r in harness.store.latest_routes()] == ["agent:main:a:dm", full.key]
    assert harness.store.snapshot().routes[0] == full


def test_a_refused_route_write_still_commits_pending_events(store: Store) -> None:
    """Pending events commit with a route write whether or not the revision was taken."""
    store.create_session(session("s1"))
    store.put_route(lane_route(1))
    store.log_event(event("turn.started"))
    assert not store.put_route(lane_route(1))
    assert len(store.snapshot().events) == 1


def test_markers_and_the_lane_log(harness: Harness) -> None:
    """write_lane sets, replaces and drops markers and appends to the log, in one commit;
    live_background is the keys whose last background entry is a start."""
    store = harness.store
    log = (LaneEntry(at=1.0, kind="background_started", key="a"),
           LaneEntry(at=1.0, kind="background_started", key="b"),
           LaneEntry(at=2.0, kind="background_ended", key="a"))
    store.write_lane((("clean_exit", 1.0), ("restarts:k", 2.0)), log)
    store.write_lane((("restarts:k", 3.0), ("clean_exit", None), ("never", None)))
    harness.crash_and_recover()
    assert harness.store.read_markers() == {"restarts:k": 3.0}
    assert harness.store.live_background() == frozenset({"b"})
    record = harness.store.snapshot()
    assert record.markers == (("restarts:k", 3.0),) and record.lane_log == log


# -- LEASE: expiry, refresh and the grant history ---------------------------------------------


def test_an_expired_lease_fences_its_holder_off(harness: Harness) -> None:
    """LEASE-4: by the store's clock, a write under an expired grant raises LeaseLost."""
    store = harness.store
    store.create_session(session())
    lease = store.acquire_lease("s1", "pid=1:turn=t1", 0.0, 300.0)
    assert lease is not None
    store.append_messages("s1", lease.token, (user("in time"),))
    harness.now = 300.0
    with pytest.raises(LeaseLost):
        store.append_messages("s1", lease.token, (user("too late"),))
    assert [m.content for m in store.snapshot().transcript("s1")] == ["in time"]


def test_a_refresh_extends_only_the_holders_own_unexpired_grant(harness: Harness) -> None:
    """LEASE-2: a refresh moves expiry on; a wrong holder, a stale token or an expired grant is refused."""
    store = harness.store
    store.create_session(session())
    lease = store.acquire_lease("s1", "pid=1:turn=t1", 0.0, 300.0)
    assert lease is not None
    harness.now = 60.0
    refreshed = store.refresh_lease(lease, 60.0, 300.0)
    assert refreshed.expires_at == 360.0 and refreshed.token == lease.token
    with pytest.raises(LeaseLost):
        store.refresh_lease(lease.model_copy(update={"holder": "pid=2:turn=t9"}), 60.0, 300.0)
    harness.now = 340.0
    store.append_messages("s1", lease.token, (user("still mine"),))
    harness.now = 360.0
    with pytest.raises(LeaseLost):
        store.refresh_lease(refreshed, 360.0, 300.0)


def test_every_grant_is_kept_with_how_it_ended(harness: Harness) -> None:
    """LEASE-1..3: the grant history shows each token's holder, span and end reason."""
    store = harness.store
    store.create_session(session())
    first = store.acquire_lease("s1", "pid=1:turn=t1", 0.0, 300.0)
    assert first is not None
    harness.now = 10.0
    store.release_lease(first)
    second = store.acquire_lease("s1", "pid=1:turn=t2", 20.0, 300.0)
    assert second is not None
    third = store.acquire_lease("s1", "pid=2:turn=t3", 400.0, 300.0)  # the second expired at 320
    assert third is not None
    grants = store.snapshot().lease_grants
    assert [(g.token, g.holder, g.end_reason) for g in grants] == [
        (1, "pid=1:turn=t1", "released"), (2, "pid=1:turn=t2", "expired"),
        (3, "pid=2:turn=t3", None)]
    assert grants[0].live_until() == 10.0 and grants[1].live_until() == 320.0


door_operations = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(1, 4), st.sampled_from(["hi", "other"])),
        st.tuples(st.just("claim"), st.none(), st.none()),
        st.tuples(st.just("settle"), st.sampled_from(list(Outcome)), st.none()),
        st.tuples(st.just("epoch"), st.none(), st.none()),
        st.tuples(st.just("reconcile"), st.none(), st.none()),
        st.tuples(st.just("cancel"), st.integers(1, 4), st.none()),
    ),
    max_size=14,
)


def _play_door(store: Store, ops: list[tuple[Any, ...]]) -> tuple[DurableRecord, list[str]]:
    """Apply door operations; every answer (or refusal's cause) is kept beside the record."""
    epoch = door(store)
    answers: list[str] = []
    for n, (op, a, b) in enumerate(ops):
        try:
            if op == "admit":
                answers.append(store.admit_input(candidate(f"x{n}", f"r{a}", b)).verdict)
            elif op == "claim":
                got = store.claim_admission("s1", epoch, float(n))
                answers.append(got.row.admission_id if got.row else f"{got.busy}/{got.paused}")
            elif op == "epoch":
                epoch = store.begin_epoch(float(n), HOLDER).epoch
            else:
                rows = store.snapshot().admissions
                pick = {"settle": AdmissionStatus.STARTED, "reconcile": AdmissionStatus.UNKNOWN,
                        "cancel": AdmissionStatus.QUEUED}[op]
                row = next((r for r in rows if r.status is pick), rows[0] if rows else None)
                if row is None:
                    continue
                move = {"settle": Move.SETTLE, "reconcile": Move.RECONCILE,
                        "cancel": Move.CANCEL}[op]
                outcome = b if op == "settle" else (
                    Outcome.INTERRUPTED if op == "reconcile" else Outcome.CANCELLED)
                answers.append(store.move_admission(row.admission_id, "s1", move, epoch,
                                                    float(n), outcome).status.value)
        except PersistenceError as error:
            answers.append(f"refused:{error.cause}")
    return store.snapshot(), answers


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(door_operations)
def test_all_stores_agree_on_any_door_history(ops: list[tuple[Any, ...]]) -> None:
    """Any sequence of admits, claims, moves and epochs leaves the same rows on every store."""
    with tempfile.TemporaryDirectory() as directory:
        played = []
        for kind in KINDS:
            harness = Harness(kind, Path(directory) / kind, synchronous="OFF")
            try:
                played.append(_play_door(harness.store, ops))
            finally:
                harness.close()
    reference = played[0]
    for other in played[1:]:
        assert other[1] == reference[1]
        assert other[0].admissions == reference[0].admissions
        assert other[0].epoch == reference[0].epoch
        assert other[0].epochs == reference[0].epochs


def test_waiters_are_served_in_the_order_they_asked(harness: Harness) -> None:
    """LEASE-1: a free lease goes to the earliest live waiter, not to whoever asks first after the release."""
    store = harness.store
    store.create_session(session())
    held = store.acquire_lease("s1", "pid=1:turn=a", 0.0, 300.0, 1.0)
    assert held is not None
    assert store.acquire_lease("s1", "pid=2:turn=b", 1.0, 300.0, 1.0) is None  # b waits first
    assert store.acquire_lease("s1", "pid=3:turn=c", 1.5, 300.0, 1.0) is None  # then c
    store.release_lease(held)
    assert store.acquire_lease("s1", "pid=1:turn=d", 2.0, 300.0, 1.0) is None  # d joins behind
    assert store.acquire_lease("s1", "pid=3:turn=c", 2.0, 300.0, 1.0) is None  # b is ahead of c
    got = store.acquire_lease("s1", "pid=2:turn=b", 2.0, 300.0, 1.0)
    assert got is not None and got.holder == "pid=2:turn=b"


def test_a_waiter_that_stops_asking_drops_out_of_line(harness: Harness) -> None:
    """LEASE-1: a place in the queue lapses two poll intervals after its last ask."""
    store = harness.store
    store.create_session(session())
    held = store.acquire_lease("s1", "pid=1:turn=a", 0.0, 300.0, 1.0)
    assert held is not None
    assert store.acquire_lease("s1", "pid=2:turn=b", 1.0, 300.0, 1.0) is None
    store.release_lease(held)
    got = store.acquire_lease("s1", "pid=3:turn=c", 3.5, 300.0, 1.0)  # b last asked at 1.0
    assert got is not None and got.holder == "pid=3:turn=c"


def test_a_lapsed_place_is_lost_while_the_lease_is_held(harness: Harness) -> None:
    """LEASE-1: a waiter that went two polls without asking (its process frozen) has lost
    its place even though the lease stayed busy meanwhile: asking again joins the line at
    its end, behind a waiter that asked again first (explored seed 84)."""
    store = harness.store
    store.create_session(session())
    held = store.acquire_lease("s1", "pid=1:turn=a", 0.0, 300.0, 1.0)
    assert held is not None
    assert store.acquire_lease("s1", "pid=2:turn=b", 1.0, 300.0, 1.0) is None  # b first
    assert store.acquire_lease("s1", "pid=3:turn=c", 1.5, 300.0, 1.0) is None  # then c
    assert store.acquire_lease("s1", "pid=3:turn=c", 60.0, 300.0, 1.0) is None  # c asks again
    assert store.acquire_lease("s1", "pid=2:turn=b", 60.0, 300.0, 1.0) is None  # then b
    store.release_lease(held)
    assert store.acquire_lease("s1", "pid=2:turn=b", 60.5, 300.0, 1.0) is None  # c is ahead
    got = store.acquire_lease("s1", "pid=3:turn=c", 60.5, 300.0, 1.0)
    assert got is not None and got.holder == "pid=3:turn=c"


def test_a_waiter_that_gives_up_makes_way_at_once(harness: Harness) -> None:
    """LEASE-5: a waiter that leaves the queue no longer holds back the next asker."""
    store = harness.store
    store.create_session(session())
    held = store.acquire_lease("s1", "pid=1:turn=a", 0.0, 300.0, 1.0)
    assert held is not None
    assert store.acquire_lease("s1", "pid=2:turn=b", 1.0, 300.0, 1.0) is None
    store.leave_lease_queue("s1", "pid=2:turn=b")
    store.release_lease(held)
    got = store.acquire_lease("s1", "pid=3:turn=c", 1.5, 300.0, 1.0)
    assert got is not None and got.holder == "pid=3:turn=c"
