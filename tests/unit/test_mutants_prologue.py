"""The prologue's decisions, pinned where mutation testing found them unobserved.

Each test runs ``prologue.build_turn_context`` (or one of its steps) on the scripted rig
with a store that opens, polls or refuses, and asserts what the turn did: the prompt it
built, the rows and events it wrote, whether it reloaded the history, what it handed
back when it could not begin. See docs/mutation.md.
"""

from __future__ import annotations

from typing import Any

import pytest

from hermes_ref import effects as fx
from hermes_ref import prologue
from hermes_ref.compression import CompressionState
from hermes_ref.context import SessionCache, TurnContext
from hermes_ref.errors import BadInput, InvariantBroken, PersistenceError
from hermes_ref.limits import Limits
from hermes_ref.models import (
    EventKind,
    Lease,
    LeaseGrant,
    Message,
    Role,
    ScaffoldFlag,
    SessionRecord,
    ToolCall,
)
from hermes_ref.outcomes import ExitReason, TurnResult
from hermes_ref.phases import PhaseTracker
from hermes_ref.prologue import TurnInput
from hermes_ref.tool_specs import MEMORY, READ_FILE, WRITE_FILE
from hermes_ref.transcript import Transcript
from tests.unit.test_mutants_rig import Rig, failing

INPUT = TurnInput("s", "hello", session_key="agent:main:tg:dm", platform="telegram")


def lease(token: int) -> Lease:
    return Lease(session_id="s", holder="h", token=token, acquired_at=0.0, expires_at=300.0)


def opened(token: int | None, *, created: bool = True) -> Any:
    """An OpenTurn handler: the session row as sent, and a lease (None: it is busy)."""
    def handler(effect: fx.OpenTurn) -> LeaseGrant:
        return LeaseGrant(session=effect.record, created=created,
                          lease=lease(token) if token is not None else None)
    return handler


def deps(caches: dict[str, SessionCache] | None = None, **limits: Any) -> prologue.PrologueDeps:
    return prologue.PrologueDeps(Limits(**limits), (READ_FILE,), "pid=7", caches or {},
                                 PhaseTracker())


def begin(rig: Rig, d: prologue.PrologueDeps | None = None,
          inp: TurnInput = INPUT) -> TurnContext | TurnResult:
    return rig.run(prologue.build_turn_context(inp, d or deps()))


def cached(token: int, *rows: Message) -> dict[str, SessionCache]:
    cache = SessionCache("s", "p", Message(role=Role.SYSTEM, content="p"), Transcript(rows))
    cache.last_lease_token = token
    return {"s": cache}


def test_the_system_prompt_is_three_layers_stable_first() -> None:
    """The prompt is the stable text with the tool list, the session line, then the start time."""
    assert prologue.build_system_prompt("k", "cli", (READ_FILE, WRITE_FILE), 1_767_225_600.0) == (
        "You are a careful assistant. Use tools when they help; answer in plain text. "
        "Tools available: read_file, write_file.\n\nSession: k on cli.\n\n"
        "Conversation started: 2026-01-01 00:00:00 UTC.")
    assert "Tools available: none." in prologue.build_system_prompt("k", "cli", (), 0.0)


def test_a_new_session_row_records_its_key_platform_and_prompt() -> None:
    """The row a new session gets names its key and platform, and its prompt says them."""
    record = prologue.session_record(INPUT, (READ_FILE,), 5.0)
    assert (record.key, record.platform, record.started_at) == ("agent:main:tg:dm", "telegram", 5.0)
    assert "Session: agent:main:tg:dm on telegram." in record.system_prompt


def test_the_first_turn_of_a_new_session_loads_nothing() -> None:
    """A session created with the first lease ever granted has no rows to load."""
    rig = Rig(OpenTurn=opened(1))
    assert isinstance(begin(rig), TurnContext)
    assert rig.of(fx.LoadMessages) == []


def test_an_existing_session_seen_first_is_loaded() -> None:
    """A session this turn did not create is loaded, even on token 1."""
    rig = Rig(OpenTurn=opened(1, created=False), LoadMessages=lambda e: ())
    begin(rig)
    assert [e.after_row_id for e in rig.of(fx.LoadMessages)] == [0]


def test_the_cache_is_trusted_only_on_the_next_token() -> None:
    """Token last+1 reuses the cache; a gap means someone else held the lease: reload."""
    rig = Rig(OpenTurn=opened(6, created=False), AcquireLease=lambda e: lease(6), LoadMessages=lambda e: ())
    begin(rig, deps(cached(5)))
    assert rig.of(fx.LoadMessages) == []
    rig = Rig(OpenTurn=opened(8, created=False), AcquireLease=lambda e: lease(8), LoadMessages=lambda e: ())
    begin(rig, deps(cached(5)))
    assert len(rig.of(fx.LoadMessages)) == 1


def test_a_known_session_is_not_reported_as_created() -> None:
    """Taking the lease of a cached session reports that this turn did not create it."""
    d = deps(cached(5))
    rig = Rig(OpenTurn=opened(6, created=False), AcquireLease=lambda e: lease(6))
    taken = rig.run(prologue._take_lease(INPUT, d, d.caches["s"], "x", 0.0))
    assert taken.created is False and taken.lease == lease(6)


def test_a_busy_lease_is_polled_under_the_turn_holder_name() -> None:
    """Every poll asks for the lease as this process, turn and platform (LEASE-2)."""
    grants = iter([None, lease(2)])
    rig = Rig(OpenTurn=opened(None, created=False), AcquireLease=lambda e: next(grants),
              LoadMessages=lambda e: ())
    assert isinstance(begin(rig), TurnContext)
    assert [e.holder for e in rig.of(fx.AcquireLease)] == ["pid=7:turn=turn-1:platform=telegram"] * 2


def test_the_user_row_is_stamped_and_the_start_event_names_the_lease() -> None:
    """The user row carries the clock's time; turn.started carries the token and the time."""
    rig = Rig(OpenTurn=opened(1))
    begin(rig)
    (user,) = [m for m in rig.written() if m.role is Role.USER]
    assert (user.created_at, user.turn_id) == (100.0, "turn-1")
    (started,) = [e.event for e in rig.of(fx.Emit)]
    assert started.kind is EventKind.TURN_STARTED
    assert (started.data["lease_token"], started.at) == (1, 100.0)


def test_a_clean_history_needs_no_recovery_write() -> None:
    """Nothing is written for recovery when the history is closed: only the user row."""
    rig = Rig(OpenTurn=opened(1))
    begin(rig)
    assert [e.label for e in rig.of(fx.AppendMessages)] == [fx.Site.USER]


def test_recovery_rows_belong_to_the_turn_that_writes_them() -> None:
    """The results and boundary row that close a crashed turn carry the new turn's id."""
    open_round = Message(role=Role.ASSISTANT, row_id=2, turn_id="old",
                         tool_calls=(ToolCall(id="a", name="read_file"),))
    rows = (Message(role=Role.USER, content="q", row_id=1, turn_id="old"), open_round)
    rig = Rig(OpenTurn=opened(9, created=False), AcquireLease=lambda e: lease(9), LoadMessages=lambda e: rows)
    begin(rig, deps(cached(5)))
    recovery = [m for e in rig.of(fx.AppendMessages) if e.label is fx.Site.RECOVERY
                for m in e.messages]
    assert [m.role for m in recovery] == [Role.TOOL, Role.ASSISTANT]
    assert {m.turn_id for m in recovery} == {"turn-1"}


def test_a_lease_timeout_hands_the_input_back_as_busy() -> None:
    """A refused turn is failed, retryable, names the session and says it was busy."""
    user = Message(role=Role.USER, content="hello")
    result = prologue.refused_result(INPUT, "t", user, None)
    assert (result.exit_reason, result.exit_detail, result.failure_reason) == (
        ExitReason.LEASE_TIMEOUT, "session_turn_lease_timeout:s", "session_busy")
    assert result.failed and result.retryable and result.carried_input == user


def test_a_store_failure_before_the_turn_names_its_cause() -> None:
    """A turn whose store fails before it begins reports the persistence cause."""
    user = Message(role=Role.USER, content="hello")
    failure = PersistenceError("db locked", cause="busy")
    result = prologue.refused_result(INPUT, "t", user, failure)
    assert (result.exit_reason, result.exit_detail, result.failure_reason) == (
        ExitReason.PERSISTENCE_FAILED, "busy: db locked", "session_persistence_failed:busy")
    assert result.failed


def test_a_turn_that_got_the_lease_and_cannot_load_gives_it_back() -> None:
    """When loading the history fails after the lease, that lease is released."""
    rig = Rig(OpenTurn=opened(8, created=False), AcquireLease=lambda e: lease(8), LoadMessages=failing())
    result = begin(rig, deps(cached(5)))
    assert isinstance(result, TurnResult) and result.exit_reason is ExitReason.PERSISTENCE_FAILED
    assert [e.lease for e in rig.of(fx.ReleaseLease)] == [lease(8)]
    assert result.cleanup_errors == ()


def test_cleanup_failures_of_a_refused_turn_are_reported() -> None:
    """A failed release and a failed event flush are both named in the result."""
    rig = Rig(OpenTurn=opened(8, created=False), AcquireLease=lambda e: lease(8), LoadMessages=failing("io"),
              ReleaseLease=failing("lease_lost"), FlushEvents=failing("disk_full"))
    result = begin(rig, deps(cached(5)))
    assert isinstance(result, TurnResult)
    assert result.cleanup_errors == ("release: lease_lost", "events: disk_full")


def test_a_seed_history_is_written_first_without_foreign_ids() -> None:
    """A new session's caller history is stored before the user row, its old ids dropped."""
    seed = [Message(role=Role.USER, content="earlier", row_id=7, turn_id="x"),
            Message(role=Role.ASSISTANT, content="reply", turn_id="x")]
    rig = Rig(OpenTurn=opened(1))
    ctx = begin(rig, inp=TurnInput("s", "hello", history=seed))
    writes = rig.of(fx.AppendMessages)
    assert [e.label for e in writes] == [fx.Site.USER, fx.Site.USER]
    assert [(m.content, m.row_id, m.turn_id) for m in writes[0].messages] == [
        ("earlier", None, None), ("reply", None, None)]
    assert isinstance(ctx, TurnContext)
    assert [m.content for m in ctx.transcript] == ["earlier", "reply", "hello"]


def test_a_session_with_a_transcript_keeps_it_over_the_seed() -> None:
    """A caller history is ignored when the session already has rows."""
    rows = (Message(role=Role.USER, content="stored", row_id=1),
            Message(role=Role.ASSISTANT, content="ok", row_id=2))
    rig = Rig(OpenTurn=opened(9, created=False), AcquireLease=lambda e: lease(9), LoadMessages=lambda e: rows)
    seed = [Message(role=Role.USER, content="other")]
    ctx = begin(rig, deps(cached(5)), TurnInput("s", "hello", history=seed))
    assert [m.content for m in rig.written()] == ["hello"]
    assert isinstance(ctx, TurnContext)
    assert [m.content for m in ctx.transcript] == ["stored", "ok", "hello"]


def test_the_caller_history_is_copied_before_the_turn_waits() -> None:
    """What the caller appends to its list while the turn waits never reaches the turn."""
    seed = [Message(role=Role.USER, content="earlier"),
            Message(role=Role.ASSISTANT, content="reply")]

    def open_and_meddle(effect: fx.OpenTurn) -> LeaseGrant:
        seed.append(Message(role=Role.USER, content="late"))
        return opened(1)(effect)
    ctx = begin(Rig(OpenTurn=open_and_meddle), inp=TurnInput("s", "hello", history=seed))
    assert isinstance(ctx, TurnContext)
    assert [m.content for m in ctx.transcript] == ["earlier", "reply", "hello"]


def _started(rig: Rig) -> dict[str, Any]:
    (event,) = [e.event for e in rig.of(fx.Emit) if e.event.kind is EventKind.TURN_STARTED]
    return dict(event.data)


def test_the_memory_review_comes_due_every_interval_when_offered() -> None:
    """User turns are counted per session; the review is due on the interval-th turn."""
    d = prologue.PrologueDeps(Limits(memory_nudge_interval=2), (READ_FILE, MEMORY), "h", {},
                              PhaseTracker())
    first = Rig(OpenTurn=opened(1))
    first.run(prologue.build_turn_context(INPUT, d))
    d.caches["s"].last_lease_token, d.tracker = 1, PhaseTracker()  # as the finalizer leaves it
    second = Rig(OpenTurn=opened(2, created=False), AcquireLease=lambda e: lease(2))
    second.run(prologue.build_turn_context(INPUT, d))
    assert [(_started(r)["user_turn"], _started(r)["memory_review"]) for r in (first, second)] == [
        (1, False), (2, True)]


def test_no_memory_review_without_the_memory_tool() -> None:
    """A review that comes due with no memory tool offered is skipped."""
    d = prologue.PrologueDeps(Limits(memory_nudge_interval=1), (READ_FILE,), "h", {},
                              PhaseTracker())
    rig = Rig(OpenTurn=opened(1))
    rig.run(prologue.build_turn_context(INPUT, d))
    assert (_started(rig)["user_turn"], _started(rig)["memory_review"]) == (1, False)


def test_a_loaded_history_sets_the_user_turn_count() -> None:
    """Counters are derived from the user rows of a history loaded from the store."""
    rows = tuple(Message(role=role, content="m", row_id=i + 1)
                 for i, role in enumerate([Role.USER, Role.ASSISTANT] * 3))
    d = prologue.PrologueDeps(Limits(memory_nudge_interval=2), (READ_FILE, MEMORY), "h", {},
                              PhaseTracker())
    rig = Rig(OpenTurn=opened(4, created=False), LoadMessages=lambda e: rows)
    rig.run(prologue.build_turn_context(INPUT, d))
    assert (_started(rig)["user_turn"], _started(rig)["memory_review"]) == (4, True)


def test_a_history_with_a_system_message_or_scaffolding_is_refused() -> None:
    """The caller's history may not bring a prompt or scaffolding; the error says which."""
    cases = ((Message(role=Role.SYSTEM, content="p"), "a system message"),
             (Message(role=Role.USER, content="n", scaffold=ScaffoldFlag.EMPTY_RECOVERY),
              "scaffolding"))
    for bad, what in cases:
        with pytest.raises(BadInput) as raised:
            TurnInput("s", "hi", history=[Message(role=Role.USER, content="ok"), bad])
        assert str(raised.value) == (
            f"history message 1 of session 's' is {what}: the session's prompt is its own "
            "and scaffolding is never stored")


def test_every_foreign_id_of_a_seed_is_dropped() -> None:
    """A seed message with only a row id, or only a turn id, loses it too."""
    seed = [Message(role=Role.USER, content="a", row_id=3),
            Message(role=Role.ASSISTANT, content="b", turn_id="x")]
    rig = Rig(OpenTurn=opened(1))
    begin(rig, inp=TurnInput("s", "hello", history=seed))
    assert [(m.row_id, m.turn_id) for m in rig.of(fx.AppendMessages)[0].messages] == [
        (None, None), (None, None)]


def test_a_seed_that_cannot_be_written_hands_the_input_back() -> None:
    """When the seed write fails, the user's message is carried back (LEASE-5)."""
    seed = [Message(role=Role.USER, content="a"), Message(role=Role.ASSISTANT, content="b")]
    ctx = begin(Rig(OpenTurn=opened(1), AppendMessages=failing()),
                inp=TurnInput("s", "hello", history=seed))
    assert isinstance(ctx, TurnContext) and ctx.carried_input is not None
    assert ctx.carried_input.content == "hello"


# ---- the opening: the user row and turn.started ride the grant's commit -------------------


def storing(token: int, *, created: bool = True) -> Any:
    """An OpenTurn handler that stores the opening it is offered, as a store does when it applies."""
    def handler(effect: fx.OpenTurn) -> LeaseGrant:
        opened_rows = ()
        if effect.opening is not None and effect.opening.applies(effect.record.id, created,
                                                                 lease(token)):
            opened_rows = tuple(m.model_copy(update={"row_id": 10 + i})
                                for i, m in enumerate(effect.opening.rows))
        return LeaseGrant(session=effect.record, created=created, lease=lease(token),
                          opened=opened_rows)
    return handler


def test_a_new_session_offers_its_user_row_and_start_event_with_the_grant() -> None:
    """The first ask carries the user row and turn.started; stored with the grant, neither
    is written or emitted again."""
    rig = Rig(OpenTurn=storing(1))
    ctx = begin(rig)
    (ask,) = rig.of(fx.OpenTurn)
    assert ask.create is True and ask.opening is not None and ask.opening.expected_token == 0
    assert [m.content for m in ask.opening.rows] == ["hello"]
    (started,) = ask.opening.events
    assert (started.kind, started.data["lease_token"], started.data["user_turn"]) == (
        EventKind.TURN_STARTED, 1, 1)
    assert rig.of(fx.AppendMessages) == []
    assert [e.event.kind for e in rig.of(fx.Emit)] == []
    assert isinstance(ctx, TurnContext) and ctx.transcript.durable_tail() is not None
    assert ctx.transcript.durable_tail().content == "hello"  # type: ignore[union-attr]


def test_an_opening_the_store_did_not_apply_is_written_as_before() -> None:
    """No rows came back: the user row is appended and turn.started emitted, as without it."""
    rig = Rig(OpenTurn=opened(1))
    begin(rig)
    assert [e.label for e in rig.of(fx.AppendMessages)] == [fx.Site.USER]
    assert [e.event.kind for e in rig.of(fx.Emit)] == [EventKind.TURN_STARTED]


def test_a_failed_opening_hands_the_input_back() -> None:
    """The grant stands but the user row is not durable: the turn fails and returns the input."""
    def failing_rows(effect: fx.OpenTurn) -> LeaseGrant:
        return LeaseGrant(session=effect.record, created=True, lease=lease(1),
                          opening_failure=("disk_full", "no space"))
    ctx = begin(Rig(OpenTurn=failing_rows))
    assert isinstance(ctx, TurnContext) and ctx.carried_input is not None
    assert ctx.carried_input.content == "hello" and ctx.state.persistence_failed
    assert ctx.ending.reason is ExitReason.PERSISTENCE_FAILED


def test_a_served_session_expects_the_next_token_and_a_closed_history() -> None:
    """A served session's opening expects last+1; an open tail, a cache without a token of
    its own, or a caller's history offers none (the first ask is then AcquireLease)."""
    rig = Rig(OpenTurn=storing(6, created=False))
    begin(rig, deps(cached(5)))
    (ask,) = rig.of(fx.OpenTurn)
    assert ask.create is False  # a served session's row must exist; it is never recreated
    assert ask.opening is not None and ask.opening.expected_token == 6
    assert ask.opening.events[0].data["lease_token"] == 6
    open_tail = Message(role=Role.USER, content="q", row_id=1, turn_id="old")
    for caches, inp in ((cached(5, open_tail), INPUT), (cached(0), INPUT),
                        (cached(5), TurnInput("s", "hi", history=[]))):
        rig = Rig(AcquireLease=lambda e: lease(6), LoadMessages=lambda e: (open_tail,))
        begin(rig, deps(caches), inp)
        assert rig.of(fx.OpenTurn) == [] and len(rig.of(fx.AcquireLease)) == 1


def test_an_opening_stored_under_another_token_is_an_engine_bug() -> None:
    """A store that claims the rows on a grant they were not offered for is caught."""
    def wrong(effect: fx.OpenTurn) -> LeaseGrant:
        assert effect.opening is not None
        return LeaseGrant(session=effect.record, created=False, lease=lease(7),
                          opened=tuple(m.model_copy(update={"row_id": 3}) for m in effect.opening.rows))
    with pytest.raises(InvariantBroken):
        begin(Rig(OpenTurn=wrong, LoadMessages=lambda e: ()), deps(cached(5)))


def _row(session_id: str, parent: str | None = None, ended: str | None = None) -> SessionRecord:
    return SessionRecord(id=session_id, key="agent:main:tg:dm", parent_session_id=parent,
                         system_prompt="p", started_at=0.0,
                         ended_at=None if ended is None else 1.0, end_reason=ended)


def test_a_child_takes_the_compression_memory_of_its_lineage() -> None:
    """CMP-4 across CMP-5: a child this engine holds no cache of takes the memory of the
    nearest session of its lineage the engine remembers (one it rotated into, or one it
    served), up parents that ended ``compression``; a parent that ended otherwise is
    another conversation, and an engine that remembers nothing reads nothing."""
    rows = {r.id: r for r in (_row("root", ended="compression"),
                              _row("c1", "root", ended="compression"),
                              _row("c2", "c1"), _row("other", ended="session_reset"),
                              _row("c3", "other"))}
    served = cached(5)["s"]
    served.compression.ineffective = 2
    d = deps({"root": served})
    rig = Rig(LoadSession=lambda e: rows.get(e.session_id))
    assert rig.run(prologue._lineage_memory(d, "c2", [rows["c2"]])) is served.compression
    assert [e.session_id for e in rig.of(fx.LoadSession)] == ["c1", "root"]
    d.carried["c1"] = carried = CompressionState(cooldown_until=700.0)  # newer, nearer
    assert rig.run(prologue._lineage_memory(d, "c2", [rows["c2"]])) is carried
    assert rig.run(prologue._lineage_memory(deps({"other": served}), "c3", [rows["c3"]])) \
        == CompressionState()  # a reset's successor starts afresh
    rig = Rig(LoadSession=lambda e: rows.get(e.session_id))
    assert rig.run(prologue._lineage_memory(deps(), "c2", [rows["c2"]])) == CompressionState()
    assert rig.of(fx.LoadSession) == []


def test_the_walk_reads_a_parent_again_under_the_lease() -> None:
    """The row of the session a turn asked for was read before the turn waited; a rotation
    may have ended it since. Its parent link is kept, its end is read again: the walk goes
    on through it to the memory above (CMP-4 across CMP-5, explored seed 14792)."""
    rows = {r.id: r for r in (_row("s", ended="compression"), _row("c1", "s", ended="compression"),
                              _row("c2", "c1"))}
    asked_before = _row("c1", "s")  # as read when the turn asked: not yet rotated
    served = cached(5)["s"]
    served.compression.ineffective = 2
    rig = Rig(LoadSession=lambda e: rows.get(e.session_id))
    memory = rig.run(prologue._lineage_memory(deps({"s": served}), "c2",
                                              [asked_before, rows["c2"]]))
    assert memory is served.compression
    assert [e.session_id for e in rig.of(fx.LoadSession)] == ["c1", "s"]


def test_the_lineage_memory_is_looked_up_from_the_tip_the_lease_names() -> None:
    """A turn asks for a session this engine holds no cache of, and its lease names the
    lineage's tip: the walk starts there, so a session the engine served between the one
    asked for and the tip gives its memory (CMP-4 across CMP-5)."""
    rows = {r.id: r for r in (_row("s", ended="compression"), _row("c1", "s", ended="compression"),
                              _row("c2", "c1"))}
    served = cached(5)["s"]
    served.compression.ineffective = 2
    d = deps({"c1": served})
    tip = lease(3).model_copy(update={"session_id": "c2"})

    def grant(effect: fx.OpenTurn) -> LeaseGrant:
        return LeaseGrant(session=rows["s"], created=False, lease=tip)
    rig = Rig(OpenTurn=grant, LoadSession=lambda e: rows.get(e.session_id),
              LoadMessages=lambda e: ())
    ctx = begin(rig, d)
    assert isinstance(ctx, TurnContext) and ctx.session_id == "c2"
    assert ctx.cache.compression is served.compression
    assert [e.session_id for e in rig.of(fx.LoadSession)] == ["c2", "c1"]  # each row read once


def test_a_failed_read_of_the_lineage_gives_the_lease_back() -> None:
    """The lineage's memory is read after the lease is granted; when that read fails, the
    turn is refused and the lease it got is released (LEASE-6), as when its history cannot
    be loaded."""
    d = deps({"other": cached(5)["s"]})  # an engine that remembers something walks

    def grant(effect: fx.OpenTurn) -> LeaseGrant:  # a child someone else rotated to
        return LeaseGrant(session=effect.record.model_copy(update={"parent_session_id": "p"}),
                          created=False, lease=lease(4))
    rig = Rig(OpenTurn=grant, LoadSession=failing(), LoadMessages=lambda e: ())
    result = begin(rig, d)
    assert isinstance(result, TurnResult) and result.exit_reason is ExitReason.PERSISTENCE_FAILED
    assert [e.lease for e in rig.of(fx.ReleaseLease)] == [lease(4)]
