"""The compaction contract (CMP-5, CMP-6), run unchanged against every Store implementation.

The same cases as ``test_store_contract`` runs for the rest of the store: MemoryStore,
SqliteStore on a file, and AsyncSqliteStore behind a synchronous facade.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_ref.errors import LeaseLost, PersistenceError
from hermes_ref.models import Compacted, Lease, Message, Role, ScaffoldFlag, SessionRecord
from hermes_ref.ports import DurableRecord
from tests.contract.test_store_contract import KINDS, Harness, SyncFacade, event, session, user

HOLDER = "pid=1:pidns=sim:turn=turn-1:platform=cli"
OTHER = "pid=2:pidns=sim:turn=turn-9:platform=cli"


class CompactionFacade(SyncFacade):
    """``SyncFacade`` with the compaction methods, one for one."""

    def take_compression_lock(self, session_id: str, holder: str, now: float,
                              ttl_s: float) -> bool:
        return self._run(self.inner.take_compression_lock(session_id, holder, now, ttl_s))  # type: ignore[no-any-return]

    def release_compression_lock(self, session_id: str, holder: str, now: float) -> None:
        self._run(self.inner.release_compression_lock(session_id, holder, now))

    def compact_session(self, session_id: str, lease_token: int, messages: tuple[Message, ...],
                        child: SessionRecord | None, at: float,
                        flush: tuple[Message, ...] = ()) -> Compacted:
        return self._run(self.inner.compact_session(  # type: ignore[no-any-return]
            session_id, lease_token, messages, child, at, flush))

    def compression_tip(self, session_id: str) -> SessionRecord | None:
        return self._run(self.inner.compression_tip(session_id))  # type: ignore[no-any-return]


class CompactionHarness(Harness):
    def _open(self) -> Any:
        opened = super()._open()
        if isinstance(opened, SyncFacade):
            return CompactionFacade(opened._loop, opened.inner)
        return opened


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    h = CompactionHarness(request.param, tmp_path)
    yield h.store
    h.close()


def opened(store: Any, sid: str = "s1", rows: int = 4) -> tuple[int, tuple[Message, ...]]:
    """A session with ``rows`` rows, its lease held by HOLDER: (token, rows)."""
    store.create_session(session(sid))
    lease = store.acquire_lease(sid, HOLDER, 0.0, 30.0)
    assert lease is not None
    written = store.append_messages(sid, lease.token, tuple(
        user(f"m{i}") if i % 2 == 0 else Message(role=Role.ASSISTANT, content=f"a{i}")
        for i in range(rows)))
    return lease.token, written


def child_of(parent: str, cid: str = "c1") -> SessionRecord:
    return session(cid).model_copy(update={"parent_session_id": parent, "started_at": 5.0})


COMPACTED = (user("[summary] the first rows"), Message(role=Role.ASSISTANT, content="a3"))


def unchanged(store: Any, before: DurableRecord) -> None:
    after = store.snapshot()
    assert (after.sessions, after.messages, after.archived, after.leases, after.lease_grants,
            after.compactions) == (before.sessions, before.messages, before.archived,
                                   before.leases, before.lease_grants, before.compactions)


# -- rotation ------------------------------------------------------------------------------


def test_rotation_ends_the_parent_creates_the_child_and_carries_the_lease(store: Any) -> None:
    """One commit: parent ended compression, child with its parent, lease token carried."""
    token, _ = opened(store)
    done = store.compact_session("s1", token, COMPACTED, child_of("s1"), 5.0)
    assert done.session.id == "c1" and done.session.parent_session_id == "s1"
    assert [m.content for m in done.rows] == [m.content for m in COMPACTED]
    assert (done.lease.session_id, done.lease.token, done.lease.holder) == ("c1", token, HOLDER)
    parent = store.get_session("s1")
    assert (parent.ended_at, parent.end_reason) == (5.0, "compression")
    assert [m.content for m in store.load_messages("c1")] == [m.content for m in COMPACTED]
    assert len(store.load_messages("s1")) == 4  # the parent keeps its rows
    store.append_messages("c1", done.lease.token, (user("next"),))  # the carried lease fences
    with pytest.raises(LeaseLost):
        store.append_messages("s1", token, (user("late"),))  # the parent's fence is closed
    record = store.snapshot()
    grants = [(g.session_id, g.token, g.end_reason) for g in record.lease_grants]
    assert grants == [("s1", token, "rotated"), ("c1", token, None)]
    assert [(c.session_id, c.child_id, c.rows_before, c.rows_after) for c in record.compactions] \
        == [("s1", "c1", 4, 2)]


def test_rotation_flushes_pending_rows_to_the_parent_first(store: Any) -> None:
    """The turn's unwritten rows land in the parent before it ends."""
    token, _ = opened(store, rows=2)
    store.compact_session("s1", token, COMPACTED, child_of("s1"), 5.0, (user("pending"),))
    assert [m.content for m in store.load_messages("s1")][-1] == "pending"


def test_a_later_end_keeps_the_compression_reason(store: Any) -> None:
    """Ending the parent again changes nothing: the first reason wins."""
    token, _ = opened(store)
    store.compact_session("s1", token, COMPACTED, child_of("s1"), 5.0)
    store.end_session("s1", "resumed_other", 9.0)
    assert store.get_session("s1").end_reason == "compression"


def test_rotation_commits_pending_events(store: Any) -> None:
    """The compaction is a write: the pending events commit with it."""
    token, _ = opened(store)
    store.log_event(event("turn.started"))
    store.compact_session("s1", token, COMPACTED, child_of("s1"), 5.0)
    assert [e.kind for e in store.snapshot().events] == ["turn.started"]


# -- in place ------------------------------------------------------------------------------


def test_in_place_archives_the_old_rows_and_keeps_the_id(store: Any) -> None:
    """The live rows are archived (kept, not loaded); the compacted set takes their place."""
    token, written = opened(store)
    done = store.compact_session("s1", token, COMPACTED, None, 5.0)
    assert done.session.id == "s1" and done.session.ended_at is None
    assert done.lease.session_id == "s1" and done.lease.token == token
    assert [m.content for m in store.load_messages("s1")] == [m.content for m in COMPACTED]
    record = store.snapshot()
    assert [m.message.row_id for m in record.archived] == [m.row_id for m in written]
    assert [m.message.content for m in record.messages] == [m.content for m in COMPACTED]
    assert [(c.child_id, c.rows_before, c.rows_after) for c in record.compactions] == [
        (None, 4, 2)]
    assert record.compactions[0].first_row_id == done.rows[0].row_id


# -- fencing and bad input -----------------------------------------------------------------


def test_a_stale_token_is_fenced_and_changes_nothing(store: Any) -> None:
    """A holder whose lease was taken over compacts nothing."""
    token, _ = opened(store)
    store.release_lease(Lease(session_id="s1", holder=HOLDER, token=token, acquired_at=0.0,
                              expires_at=30.0))
    assert store.acquire_lease("s1", OTHER, 1.0, 30.0) is not None
    before = store.snapshot()
    for child in (child_of("s1"), None):
        with pytest.raises(LeaseLost):
            store.compact_session("s1", token, COMPACTED, child, 5.0)
    unchanged(store, before)


@pytest.mark.parametrize("case", ["unknown", "orphan_child", "empty", "scaffold",
                                  "duplicate_child", "ended"])
def test_bad_input_is_one_typed_line_and_changes_nothing(store: Any, case: str) -> None:
    """Unknown session, a child whose parent is not the session, nothing left, scaffolding,
    an existing child id, an ended session: PersistenceError, one line, nothing written."""
    token, _ = opened(store)
    store.create_session(session("other"))
    args: dict[str, Any] = {"session_id": "s1", "messages": COMPACTED, "child": child_of("s1")}
    if case == "unknown":
        args.update(session_id="ghost", child=child_of("ghost"))
    elif case == "orphan_child":
        args.update(child=child_of("ghost"))
    elif case == "empty":
        args.update(messages=())
    elif case == "scaffold":
        args.update(messages=(user("nudge", scaffold=ScaffoldFlag.DROPPED_TOOLCALL_NUDGE),))
    elif case == "duplicate_child":
        args.update(child=child_of("s1", cid="other"))
    else:
        store.compact_session("s1", token, COMPACTED, child_of("s1", cid="c0"), 4.0)
    before = store.snapshot()
    with pytest.raises(PersistenceError) as raised:
        store.compact_session(args["session_id"], token, args["messages"], args["child"], 5.0)
    assert "\n" not in str(raised.value) and raised.value.cause in {
        "not_found", "foreign_key", "bad_input", "scaffolding", "duplicate", "ended", "lease_lost"}
    unchanged(store, before)


# -- the lock ------------------------------------------------------------------------------


def test_the_lock_is_held_by_one_holder_and_refused_to_another(store: Any) -> None:
    """Free: taken; ours: extended; another live holder's: refused, and the ask is kept."""
    opened(store)
    assert store.take_compression_lock("s1", HOLDER, 1.0, 10.0)
    assert store.take_compression_lock("s1", HOLDER, 2.0, 10.0)  # ours: extended to 12
    assert not store.take_compression_lock("s1", OTHER, 3.0, 10.0)
    log = store.snapshot().compression_locks
    assert [(g.holder, g.granted, g.expires_at, g.end_reason) for g in log] == [
        (HOLDER, True, 12.0, None), (OTHER, False, 3.0, "refused")]


def test_release_by_another_holder_is_a_no_op(store: Any) -> None:
    """Only the holder's own lock is released."""
    opened(store)
    assert store.take_compression_lock("s1", HOLDER, 1.0, 10.0)
    store.release_compression_lock("s1", OTHER, 2.0)
    assert not store.take_compression_lock("s1", OTHER, 3.0, 10.0)
    store.release_compression_lock("s1", HOLDER, 4.0)
    assert store.take_compression_lock("s1", OTHER, 5.0, 10.0)
    first = store.snapshot().compression_locks[0]
    assert (first.ended_at, first.end_reason) == (4.0, "released")


def test_an_expired_lock_is_taken_over(store: Any) -> None:
    """Past its expiry the lock goes to the next holder; the old grant ends expired."""
    opened(store)
    assert store.take_compression_lock("s1", HOLDER, 1.0, 0.5)
    assert store.take_compression_lock("s1", OTHER, 2.0, 10.0)
    first = store.snapshot().compression_locks[0]
    assert (first.ended_at, first.end_reason) == (1.5, "expired")


@pytest.mark.parametrize("args", [("", HOLDER, 10.0), ("s1", "", 10.0), ("s1", HOLDER, 0.0),
                                  ("ghost", HOLDER, 10.0)])
def test_a_malformed_lock_ask_is_refused_and_changes_nothing(store: Any, args: Any) -> None:
    """An empty session or holder, no ttl, an unknown session: a typed error, no row."""
    opened(store)
    with pytest.raises(PersistenceError):
        store.take_compression_lock(args[0], args[1], 1.0, args[2])
    assert store.snapshot().compression_locks == ()


# -- the lineage tip -----------------------------------------------------------------------


def test_the_tip_walks_the_whole_chain_and_leases_follow_it(store: Any) -> None:
    """s1 -> c1 -> c2: every member resolves to c2; a lease asked for s1 is c2's."""
    token, _ = opened(store)
    one = store.compact_session("s1", token, COMPACTED, child_of("s1", "c1"), 5.0)
    store.compact_session("c1", one.lease.token, COMPACTED, child_of("c1", "c2"), 6.0)
    assert [store.compression_tip(s).id for s in ("s1", "c1", "c2")] == ["c2"] * 3
    assert store.compression_tip("ghost") is None
    store.end_session("c2", "new_session", 7.0)  # ended otherwise: still the tip
    assert store.compression_tip("s1").id == "c2"
    held = [(lease.session_id, lease.holder is not None) for lease in store.snapshot().leases]
    assert sorted(held) == [("c1", False), ("c2", True), ("s1", False)]  # one live lease


def test_open_turn_on_a_rotated_session_runs_on_the_tip(store: Any) -> None:
    """A route or waiter that still names the parent gets the tip's row and lease."""
    token, _ = opened(store)
    done = store.compact_session("s1", token, COMPACTED, child_of("s1"), 5.0)
    assert store.acquire_lease("s1", OTHER, 6.0, 30.0) is None  # the tip's lease is held
    lease = store.acquire_lease("s1", OTHER, 40.0, 30.0)  # it expired: taken, on the tip
    assert lease is not None and lease.session_id == "c1" and lease.token == done.lease.token + 1
    grant = store.open_turn(session("s1"), HOLDER, 41.0, 30.0)
    assert grant.session.id == "c1" and not grant.created and grant.lease is None


def test_crash_after_rotation_leaves_one_live_tip_and_loses_no_row(tmp_path: Path) -> None:
    """Committed is durable: after a crash the lineage has one live tip and every row."""
    for kind in KINDS:
        h = CompactionHarness(kind, tmp_path / kind)
        token, written = opened(h.store)
        h.store.compact_session("s1", token, COMPACTED, child_of("s1"), 5.0)
        h.crash_and_recover()
        store = h.store
        record = store.snapshot()
        live = [s.id for s in record.sessions if s.ended_at is None]
        assert live == ["c1"], kind
        assert [m.row_id for m in store.load_messages("s1")] == [m.row_id for m in written]
        assert store.compression_tip("s1").id == "c1"
        h.close()


# -- both drivers --------------------------------------------------------------------------


def _lineage(record: DurableRecord) -> tuple[Any, ...]:
    """The shape of a record's lineage, without the ids the drivers mint differently."""
    parent = next(s for s in record.sessions if s.id == "s-1")
    child = next(s for s in record.sessions if s.parent_session_id == "s-1")
    rows = [(m.role.value, m.content) for m in record.transcript(child.id)]
    return parent.end_reason, child.ended_at, rows, len(record.compactions)


async def test_both_drivers_rotate_and_find_the_tip(tmp_path: Path) -> None:
    """A compacting turn, then a turn asked for the parent: the same lineage on both drivers."""
    import httpx

    from hermes_ref.engine import Engine
    from hermes_ref.prologue import TurnInput
    from hermes_ref.shell.driver import AsyncDriver
    from hermes_ref.shell.http_provider import HttpProvider
    from hermes_ref.shell.sqlite_store import AsyncSqliteStore
    from sim.driver import SimDriver
    from sim.provider import ScriptedProvider, text
    from sim.provider_http import handle_http
    from sim.rotation_story import keep_last, run_compacting
    from sim.store import MemoryStore
    from sim.tools import SimTools
    from sim.world import World

    def script() -> ScriptedProvider:
        return ScriptedProvider([text("one"), text("two"), text("three")])

    world = World(store=MemoryStore(), provider=script(), tools=SimTools({}), trace=False)
    engine = Engine(holder="pid=1")
    SimDriver(world).run(engine.run_turn(TurnInput("s-1", "first")))
    SimDriver(world).run(run_compacting(engine, TurnInput("s-1", "second"), keep_last(2)))
    SimDriver(world).run(engine.run_turn(TurnInput("s-1", "third")))
    simulated = world.store.snapshot()

    fake = script()
    store = await AsyncSqliteStore.open(tmp_path / "real.db", holder_alive=lambda holder: True)
    engine = Engine(holder="pid=1")
    try:
        async with httpx.AsyncClient(transport=httpx.MockTransport(
                lambda request: handle_http(fake, request))) as client:
            driver = AsyncDriver(store=store, provider=HttpProvider("http://fake/v1", client=client),
                                 tools=SimTools({}))
            await driver.run(engine.run_turn(TurnInput("s-1", "first")))
            await driver.run(run_compacting(engine, TurnInput("s-1", "second"), keep_last(2)))
            await driver.run(engine.run_turn(TurnInput("s-1", "third")))
        real = await store.snapshot()
    finally:
        await store.close()
    assert _lineage(real) == _lineage(simulated)
    assert _lineage(real)[0] == "compression" and _lineage(real)[2][-2:] == [
        ("user", "third"), ("assistant", "three")]
