"""Session lanes (SES): keys, ids, resolution priority, policies, restarts, the router's writes."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hermes_ref import effects as fx
from hermes_ref import lane_restart, lane_states, router, session
from hermes_ref.errors import BadInput, IllegalTransition
from hermes_ref.limits import Limits
from hermes_ref.prologue import build_system_prompt
from hermes_ref.session import (
    Action,
    Cause,
    LaneState,
    Order,
    ResetMode,
    ResetPolicy,
    Route,
    SessionSource,
    Situation,
)
from hermes_ref.tool_specs import REFERENCE_TOOLS
from sim.store import MemoryStore

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def key(**kw: Any) -> str:
    flags = {k: kw.pop(k) for k in ("group_per_user", "thread_per_user") if k in kw}
    return session.build_session_key(SessionSource(**kw), **flags)


# ---- SES-1: keys ------------------------------------------------------------------------------


def test_group_members_get_their_own_lane_by_default() -> None:
    """A group isolates per participant: alice and bob of guild-123 get two keys."""
    base = {"platform": "discord", "chat_type": "group", "chat_id": "guild-123"}
    assert key(participant="alice", **base) == "agent:main:discord:group:guild-123:alice"
    assert key(participant="bob", **base) == "agent:main:discord:group:guild-123:bob"


def test_a_shared_group_setting_gives_one_key() -> None:
    """With group_per_user off, both members share agent:main:discord:group:guild-123."""
    base = {"platform": "discord", "chat_type": "group", "chat_id": "guild-123",
            "group_per_user": False}
    assert key(participant="alice", **base) == key(participant="bob", **base) \
        == "agent:main:discord:group:guild-123"


def test_a_thread_is_shared_unless_the_setting_isolates_it() -> None:
    """Thread 17585 is one lane for alice and bob; thread_per_user appends the participant."""
    base = {"platform": "telegram", "chat_type": "group", "chat_id": "-1002285219667",
            "thread_id": "17585"}
    shared = "agent:main:telegram:group:-1002285219667:17585"
    assert key(participant="alice", **base) == key(participant="bob", **base) == shared
    assert key(participant="42", thread_per_user=True, **base) == shared + ":42"


def test_dm_keys_carry_no_participant_when_they_have_a_chat_id() -> None:
    """DM 99 thread topic-1 → dm:99:topic-1; no chat id → the participant, then the thread."""
    assert key(platform="telegram", chat_id="99", thread_id="topic-1", participant="42") \
        == "agent:main:telegram:dm:99:topic-1"
    assert key(platform="telegram", thread_id="7") == "agent:main:telegram:dm:7"
    assert key(platform="telegram", participant="42") == "agent:main:telegram:dm:42"
    assert key(platform="telegram") == "agent:main:telegram:dm"


@pytest.mark.parametrize("bad", [{"platform": "tele:gram"}, {"platform": "x", "chat_id": "../x"},
                                 {"platform": "x", "chat_type": "room"},
                                 {"platform": "x", "participant": "a b"}, {"platform": ""}])
def test_a_malformed_source_is_bad_input(bad: dict[str, str]) -> None:
    """A source part that cannot be one key segment is refused with BadInput."""
    with pytest.raises(BadInput, match="malformed session source"):
        SessionSource(**bad)


@pytest.mark.parametrize("bad", ["agent:other:x:dm", "agent:main:x:room:1", "agent:main:x",
                                 "agent:main:x:dm:a/b", "agent:main:x:dm:.."])
def test_a_malformed_key_is_bad_input(bad: str) -> None:
    """check_session_key names what is wrong with a key the builder could not have made."""
    with pytest.raises(BadInput, match="malformed session key"):
        session.check_session_key(bad)


def test_every_built_key_passes_the_key_check() -> None:
    """The builder's output is always a well-formed key."""
    built = key(platform="slack", chat_type="channel", chat_id="C1", thread_id="t",
                participant="u", thread_per_user=True)
    assert session.check_session_key(built) == built


# ---- SES-2: incarnation ids ---------------------------------------------------------------------


def test_incarnation_id_is_the_clock_and_eight_hex() -> None:
    """YYYYMMDD_HHMMSS_ (UTC, from the injected time) + 8 hex of the random bits."""
    sid = session.incarnation_id(_at("2026-03-04T05:06:07"), 0xABCDEF12)
    assert sid == "20260304_050607_abcdef12"
    assert session.INCARNATION_ID.match(sid)
    assert session.incarnation_id(0.0, 1) == "19700101_000000_00000001"


# ---- SES-3: the priority of resolution ----------------------------------------------------------


def route(**kw: Any) -> Route:
    base: dict[str, Any] = {"key": "agent:main:telegram:dm:99", "revision": 1,
                            "session_id": "20260101_000000_00000001", "cause": Cause.CREATED,
                            "at": 0.0, "source": SessionSource(platform="telegram", chat_id="99"),
                            "created_at": 0.0, "updated_at": 0.0}
    base.update(kw)
    return Route(**base)


def decide(r: Route, now: float, *, mode: str = "idle", idle: int = 1440, order: Order = Order.REFERENCE,
           live: bool = False, ended: str | None = None) -> tuple[str, str | None]:
    situation = Situation(route=r, now=now, policy=ResetPolicy(mode=ResetMode(mode),
                          idle_minutes=idle), background_live=live, ended_reason=ended)
    decision = session.resolve(situation, order)
    return decision.action.value, decision.reason


def test_suspended_beats_resume_pending() -> None:
    """Suspended and resume_pending together: a new id, reason suspended (both orders)."""
    r = route(suspended=True, resume_pending=True, resume_marked_at=0.0)
    for order in Order:
        assert decide(r, 10.0, order=order) == ("new", "suspended")


def test_resume_pending_keeps_the_id_before_the_policy_in_the_reference_order() -> None:
    """Expired by idle and resume_pending: the reference resumes, 0.19.0 resets for idle."""
    r = route(resume_pending=True, resume_reason="restart_interrupted", resume_marked_at=0.0)
    assert decide(r, 31 * 60, idle=30) == ("resume", "restart_interrupted")
    assert decide(r, 31 * 60, idle=30, order=Order.RELEASED_0_19) == ("new", "idle")


def test_the_released_freshness_gate_resets_a_two_hour_old_marker() -> None:
    """Marked 2 h ago, idle 24 h, recent activity: 0.19.0 says resume_pending_expired; mode
    none keeps the id; the reference keeps it in every mode."""
    r = route(resume_pending=True, resume_marked_at=0.0, updated_at=7000.0)
    assert decide(r, 7200.0, order=Order.RELEASED_0_19) == ("new", "resume_pending_expired")
    assert decide(r, 7200.0, mode="none", order=Order.RELEASED_0_19)[0] == "resume"
    assert decide(r, 7200.0)[0] == "resume"


def test_a_stale_route_never_keeps_its_ended_incarnation() -> None:
    """An ended row, or a finalized route, resolves to a new incarnation first of all."""
    assert decide(route(), 1.0, ended="agent_close") == ("new", "agent_close")
    assert decide(route(expiry_finalized=True), 1.0, mode="none") == ("new", "session_reset")


def test_a_quiet_lane_is_kept_and_touched() -> None:
    """Nothing fires: keep, and the router touches updated_at."""
    assert decide(route(), 60.0) == ("keep", "touch")


def test_the_priority_table_is_what_resolve_walks() -> None:
    """Each order's first rule is the stale guard and its last is keep."""
    for names in session.PRIORITY.values():
        assert names[0] == "stale" and names[-1] == "keep"
        assert {session.RULES[n][1] for n in names} <= set(Action)


# ---- SES-3, SES-6: reset policies -----------------------------------------------------------------


def test_idle_policy_and_the_background_exemption() -> None:
    """Idle 30, updated 31 min ago → idle; with a live background process → nothing."""
    policy = ResetPolicy(mode=ResetMode.IDLE, idle_minutes=30)
    assert session.policy_reason(policy, 0.0, 31 * 60) == "idle"
    assert session.policy_reason(policy, 0.0, 29 * 60) is None
    assert session.expiry_reason(policy, 0.0, 31 * 60, background_live=True) is None


def test_daily_boundary_at_four() -> None:
    """At 03:00, a lane last active yesterday 05:00 is kept; one active yesterday 03:00 resets."""
    policy = ResetPolicy(mode=ResetMode.DAILY, at_hour=4)
    now = _at("2026-01-02T03:00:00")
    assert session.policy_reason(policy, _at("2026-01-01T05:00:00"), now) is None
    assert session.policy_reason(policy, _at("2026-01-01T03:00:00"), now) == "daily"


def test_both_checks_idle_first_and_none_never_resets() -> None:
    """Mode both reports idle when both fire; mode none reports nothing."""
    both = ResetPolicy(mode=ResetMode.BOTH, idle_minutes=30, at_hour=4)
    assert session.policy_reason(both, _at("2026-01-01T00:00:00"),
                                 _at("2026-01-03T10:00:00")) == "idle"
    assert session.policy_reason(ResetPolicy(), 0.0, 10 ** 9) is None


def test_pruning_spares_suspended_lanes_and_live_background_processes() -> None:
    """Idle past the prune age → pruned, unless suspended, backed by a live process, or off."""
    assert session.prune_due(route(), 100.0, 50.0, background_live=False)
    assert not session.prune_due(route(), 100.0, 50.0, background_live=True)
    assert not session.prune_due(route(suspended=True), 100.0, 50.0, background_live=False)
    assert not session.prune_due(route(), 100.0, 0.0, background_live=False)
    assert not session.prune_due(route(updated_at=60.0), 100.0, 50.0, background_live=False)


def test_a_pruned_route_is_stale() -> None:
    """A retired route resolves to a plain new incarnation (reason pruned, no notice)."""
    assert decide(route(retired=True), 1.0, mode="none") == ("new", "pruned")
    assert "pruned" not in session.AUTO_RESET_REASONS


# ---- SES-7: restart rules ---------------------------------------------------------------------------


def test_a_start_without_the_marker_marks_only_lanes_active_in_the_window() -> None:
    """Updated 60 s and 300 s ago with a 120 s window: only the first is marked."""
    recent, older = route(key="agent:main:x:dm:a", updated_at=940.0), \
        route(key="agent:main:x:dm:b", updated_at=700.0)
    marked = lane_restart.mark_recently_active([recent, older], 1000.0, 120.0)
    assert [r.key for r in marked] == [recent.key]
    assert marked[0].resume_pending and marked[0].resume_reason == "restart_interrupted"
    assert marked[0].resume_marked_at == 1000.0 and marked[0].revision == 2


def test_pending_and_suspended_lanes_are_not_marked_again() -> None:
    """A lane already pending or suspended is skipped by the marking pass."""
    lanes = [route(resume_pending=True, updated_at=990.0), route(suspended=True, updated_at=990.0)]
    assert lane_restart.mark_recently_active(lanes, 1000.0, 120.0) == []


def test_three_graceful_restarts_while_running_suspend_the_lane() -> None:
    """Counts {k:2} with k running at the stop → {k:3} → the next start suspends k."""
    k = "agent:main:x:dm:a"
    updates = lane_restart.shutdown_markers({lane_restart.restart_marker(k): 2.0}, [k], True)
    assert updates[lane_restart.restart_marker(k)] == 3.0 and updates["clean_exit"] == 1.0
    counts = lane_restart.restart_counts({lane_restart.restart_marker(k): 3.0})
    stuck = lane_restart.suspend_stuck([route(key=k)], counts, 3, 5.0)
    assert [r.suspended for r in stuck] == [True]
    assert lane_restart.suspend_stuck([route(key=k)], {k: 2}, 3, 5.0) == []


def test_a_key_idle_at_the_stop_loses_its_count() -> None:
    """Counts {k:2}, k not running at a graceful stop: k is dropped; no drain, no marker."""
    k = "agent:main:x:dm:a"
    updates = lane_restart.shutdown_markers({lane_restart.restart_marker(k): 2.0}, [], False)
    assert updates == {lane_restart.restart_marker(k): None, "clean_exit": None}


def test_a_start_consumes_the_marker_and_only_the_suspended_counts() -> None:
    """The clean-exit marker goes; counts stay unless their key was suspended."""
    markers = {"clean_exit": 1.0, "restarts:a": 3.0, "restarts:b": 1.0}
    assert lane_restart.startup_updates(markers, ["a"]) == {"clean_exit": None,
                                                           "restarts:a": None}


# ---- the state machine and its diagram --------------------------------------------------------------


def test_a_move_the_table_does_not_list_is_an_engine_bug() -> None:
    """A finalized lane cannot be finalized again, nor touched."""
    with pytest.raises(IllegalTransition):
        session.check_move(LaneState.FINALIZED, LaneState.FINALIZED, Cause.FINALIZED)
    with pytest.raises(IllegalTransition):
        route(expiry_finalized=True).revise(Cause.TOUCHED, 1.0, updated_at=1.0)


def test_docs_carry_the_rendered_state_machine_and_priority_table() -> None:
    """docs/sessions.md holds render_mermaid() and render_priority() verbatim."""
    text = (DOCS / "sessions.md").read_text(encoding="utf-8")
    assert lane_states.render_mermaid() in text
    assert session.render_priority() in text


# ---- the router, through its effects ------------------------------------------------------------------


def drive(coro: Coroutine[Any, Any, Any], store: MemoryStore, now: float,
          before_put: Callable[[], None] | None = None) -> Any:
    """Perform the router's effects against a memory store; ``before_put`` runs once."""
    hook = [before_put]
    handlers: dict[type[Any], Callable[[Any], Any]] = {
        fx.Now: lambda e: now, fx.RandomBits: lambda e: 0x1234ABCD,
        fx.LoadRoute: lambda e: store.get_route(e.key),
        fx.LoadRoutes: lambda e: store.latest_routes(),
        fx.LoadSession: lambda e: store.get_session(e.session_id),
        fx.LiveBackground: lambda e: store.live_background(),
        fx.LoadMessages: lambda e: store.load_messages(e.session_id, e.after_row_id),
        fx.ReadMarkers: lambda e: store.read_markers(),
        fx.WriteLane: lambda e: store.write_lane(e.markers, e.log),
    }

    def put(e: fx.PutRoute) -> bool:
        if hook[0] is not None:
            hook.pop()()
            hook.append(None)
        return store.put_route(e.route, e.end_session_id, e.end_reason, e.start)
    handlers[fx.PutRoute] = put
    value: Any = None
    while True:
        try:
            effect = coro.send(value)
        except StopIteration as stop:
            return stop.value
        value = handlers[type(effect)](effect)


def test_two_racing_routers_agree_on_one_incarnation() -> None:
    """The router that loses the compare-and-set reads again and joins the winner's lane."""
    store, limits = MemoryStore(), Limits()
    source = SessionSource(platform="telegram", chat_id="99")
    winner: list[Any] = []
    routed = drive(router.route(source, limits, ()), store, 100.0,
                   before_put=lambda: winner.append(drive(router.route(source, limits, ()), store,
                                                          100.0)))
    assert routed.route.session_id == winner[0].route.session_id
    assert [r.cause for r in store.snapshot().routes] == [Cause.CREATED, Cause.TOUCHED]


def test_an_unknown_or_malformed_lane_is_bad_input_and_writes_nothing() -> None:
    """lane_of names the problem in one line; the record is unchanged."""
    store = MemoryStore()
    before = store.snapshot()
    with pytest.raises(BadInput, match="unknown session"):
        drive(router.lane_of("agent:main:telegram:dm:404"), store, 1.0)
    with pytest.raises(BadInput, match="malformed session key"):
        drive(router.lane_of("agent:main:telegram"), store, 1.0)
    assert store.snapshot() == before


def test_a_reset_ends_the_old_row_and_a_user_reset_is_fresh() -> None:
    """A user reset writes a new incarnation with is_fresh_reset and ends the old row, which
    the route that began it created, though no turn has run there yet (SES-2)."""
    store, limits = MemoryStore(), Limits()
    source = SessionSource(platform="telegram", chat_id="99")
    first = drive(router.route(source, limits, ()), store, 100.0)
    fresh = drive(router.reset(source, limits, ()), store, 200.0)
    old = store.get_session(first.route.session_id)
    assert fresh.route.is_fresh_reset and fresh.notice is None
    assert old is not None and old.end_reason == "new_session" and old.ended_at == 200.0
    new = store.get_session(fresh.route.session_id)
    assert new is not None and new.ended_at is None and new.started_at == 200.0


def test_a_route_that_begins_an_incarnation_creates_its_row_with_its_prompt() -> None:
    """The row is written with the route, the prompt built first and naming the engine's
    tools (CTX-3, CTX-4); a route that keeps the incarnation writes no row."""
    store, limits = MemoryStore(), Limits()
    source = SessionSource(platform="telegram", chat_id="99")
    first = drive(router.route(source, limits, REFERENCE_TOOLS[:1]), store, 100.0)
    row = store.get_session(first.route.session_id)
    assert row is not None and row.key == first.route.key and row.platform == "telegram"
    assert row.system_prompt == build_system_prompt(row.key, "telegram", REFERENCE_TOOLS[:1],
                                                    100.0)
    again = drive(router.route(source, limits, ()), store, 130.0)
    assert again.route.session_id == row.id and store.get_session(row.id) == row
    assert len(store.snapshot().sessions) == 1


def test_the_asyncio_driver_routes_through_the_sqlite_store(tmp_path: Path) -> None:
    """The shell's handlers perform the router: a lane is created, marked after an unclean
    start, resumed, and its revisions read back from the file."""
    import asyncio

    from hermes_ref.shell.driver import AsyncDriver
    from hermes_ref.shell.sqlite_store import AsyncSqliteStore

    async def story() -> tuple[Any, ...]:
        store = await AsyncSqliteStore.open(tmp_path / "lanes.db")
        clock = iter([100.0, 130.0, 130.0, 140.0])
        driver = AsyncDriver(store=store, provider=None, tools=None,  # type: ignore[arg-type]
                             clock=lambda: next(clock))
        source, limits = SessionSource(platform="telegram", chat_id="99"), Limits()
        first = await driver.run(router.route(source, limits, ()))
        startup = await driver.run(router.start(limits))
        again = await driver.run(router.route(source, limits, ()))
        routes = (await store.snapshot()).routes
        await store.close()
        return first, startup, again, routes

    first, startup, again, routes = asyncio.run(story())
    assert session.INCARNATION_ID.match(first.route.session_id)
    assert startup.marked == (first.route.key,) and not startup.clean
    assert again.rule == "resume_pending" and again.route.session_id == first.route.session_id
    assert [r.cause for r in routes] == [Cause.CREATED, Cause.MARKED, Cause.RESUMED]
