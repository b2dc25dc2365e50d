"""Stories of session lanes: keys, incarnations, resets, expiry and restarts (SES)."""

from __future__ import annotations

from hermes_ref.errors import ProviderRejected
from hermes_ref.session import INCARNATION_ID, SessionSource
from sim.harness import Story, scenario
from sim.provider import text

ALICE = SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                      participant="alice")
BOB = SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                    participant="bob")
DM = SessionSource(platform="telegram", chat_type="dm", chat_id="99", participant="42")
OTHER_DM = SessionSource(platform="telegram", chat_type="dm", chat_id="77")


def _answers(s: Story, count: int) -> None:
    s.script(*(text(f"Answer {n}.") for n in range(1, count + 1)))


def _sid(s: Story, source: SessionSource) -> str:
    route = s.route_of(source)
    s.expect(route is not None, f"{source.platform} lane has a route")
    assert route is not None
    return route.session_id


def _key(s: Story, source: SessionSource) -> str:
    route = s.route_of(source)
    return route.key if route is not None else ""


@scenario("Group members get lanes of their own, a thread is one lane, a DM has no participant",
          invariants=("SES-1",), stage="session")
def lanes_follow_the_isolation_defaults(s: Story) -> None:
    _answers(s, 5)
    thread = {"chat_type": "group", "chat_id": "-1002285219667", "thread_id": "17585"}
    s.message(ALICE, "Hi from Alice.")
    s.message(BOB, "Hi from Bob.")
    s.expect(_key(s, ALICE) == "agent:main:discord:group:guild-123:alice", "Alice's own lane")
    s.expect(_sid(s, ALICE) != _sid(s, BOB), "Bob has another lane")
    s.message(SessionSource(platform="telegram", participant="alice", **thread), "In the thread.")
    bob_thread = SessionSource(platform="telegram", participant="bob", **thread)
    s.message(bob_thread, "Me too.")
    s.expect(_key(s, bob_thread) == "agent:main:telegram:group:-1002285219667:17585",
             "the thread is shared")
    s.message(DM, "A direct message.")
    s.expect(_key(s, DM) == "agent:main:telegram:dm:99", "a DM with a chat id has no participant")


@scenario("With per-user threads on, each participant of a thread has a lane of their own",
          invariants=("SES-1",), stage="session")
def threads_split_when_the_setting_says_so(s: Story) -> None:
    s.limits(thread_sessions_per_user=True)
    _answers(s, 2)
    thread = {"chat_type": "group", "chat_id": "-1002285219667", "thread_id": "17585"}
    alice = SessionSource(platform="telegram", participant="alice", **thread)
    bob = SessionSource(platform="telegram", participant="bob", **thread)
    s.message(alice, "In the thread.")
    s.message(bob, "Me too.")
    s.expect(_key(s, bob) == "agent:main:telegram:group:-1002285219667:17585:bob",
             "Bob's own lane in the thread")
    s.expect(_sid(s, alice) != _sid(s, bob), "two incarnations")


@scenario("With per-user groups off, a whole group shares one lane",
          invariants=("SES-1",), stage="session")
def shared_groups_are_one_lane(s: Story) -> None:
    s.limits(group_sessions_per_user=False)
    _answers(s, 2)
    s.message(ALICE, "Hi from Alice.")
    s.message(BOB, "Hi from Bob.")
    s.expect(_key(s, BOB) == "agent:main:discord:group:guild-123", "one lane for the group")
    s.expect(_sid(s, ALICE) == _sid(s, BOB), "one incarnation for both")


@scenario("A user reset starts a fresh incarnation, silently, and ends the old row",
          invariants=("SES-2", "SES-4"), stage="session")
def user_reset_starts_a_fresh_incarnation(s: Story) -> None:
    _answers(s, 2)
    s.message(DM, "Remember the number 7.")
    first = _sid(s, DM)
    s.expect(INCARNATION_ID.match(first) is not None, "YYYYMMDD_HHMMSS_ + 8 hex")
    s.advance(5)
    fresh = s.reset_lane(DM)
    s.expect(fresh.is_fresh_reset and not fresh.was_auto_reset, "a fresh, user-requested reset")
    s.message(DM, "What was the number?")
    s.expect(_sid(s, DM) == fresh.session_id != first, "the lane has a new incarnation")
    old = s.world.store.get_session(first)
    s.expect(old is not None and old.end_reason == "new_session", "the old row is ended, kept")


@scenario("A reset between routing a message and running its turn still ends the old row "
          "(explored seed 3915)", invariants=("SES-2",), stage="session")
def reset_before_the_routed_turn_runs(s: Story) -> None:
    """A new lane's first message is routed, and a new incarnation named for it; before its
    turn runs, the user asks for a new conversation. The reset ended the old incarnation's
    row only if it existed, and it did not yet: the turn, routed before the reset, created
    it afterwards, and nothing ever ended it (SES-2). The route that names an incarnation
    now creates its row in the same write, so the reset finds it and ends it; the turn
    runs on the incarnation it was routed to, and the lane's next message goes to the new
    one."""
    _answers(s, 2)
    routed = s.route_message(DM)
    s.expect(routed is not None, "the message is routed")
    assert routed is not None
    first = routed.route.session_id
    fresh = s.reset_lane(DM)  # the user's /new, before the routed message's turn runs
    s.run_routed(routed, "Remember the number 7.")
    old = s.world.store.get_session(first)
    s.expect(old is not None and old.end_reason == "new_session", "the old row is ended, kept")
    s.message(DM, "What was the number?")
    s.expect(_sid(s, DM) == fresh.session_id != first, "the lane has a new incarnation")


@scenario("An idle lane expires into a new incarnation whose notice is sent once",
          invariants=("SES-2", "SES-3", "SES-4"), stage="session")
def idle_lane_expires_with_one_notice(s: Story) -> None:
    s.limits(session_reset_mode="idle", session_idle_minutes=30)
    _answers(s, 4)
    s.message(DM, "Hello.")
    first = _sid(s, DM)
    s.advance(10 * 60)
    s.message(DM, "Still here.")
    s.expect(_sid(s, DM) == first, "ten quiet minutes keep the lane")
    s.advance(31 * 60)
    s.message(DM, "Back after lunch.")
    route = s.route_of(DM)
    s.expect(route is not None and route.session_id != first and route.was_auto_reset
             and route.auto_reset_reason == "idle", "a new incarnation, reset for idle")
    s.message(DM, "And another thing.")
    s.expect(_sid(s, DM) != first, "the new incarnation stays")


@scenario("A crash before the first row of a reset lane sends its notice again, still once",
          invariants=("SES-4",), stage="session")
def notice_survives_a_crash_before_the_first_row(s: Story) -> None:
    s.limits(session_reset_mode="idle", session_idle_minutes=30)
    _answers(s, 3)
    s.message(DM, "Hello.")
    s.advance(31 * 60)
    s.faults(crash="before:user")
    s.expect(s.message(DM, "Anyone there?") is None, "the process died before the user row")
    s.faults()
    s.lane_restart(graceful=False)
    s.message(DM, "Anyone there?")
    s.message(DM, "Thanks.")


@scenario("A suspended lane is cleared with a new id, ahead of everything else",
          invariants=("SES-3", "SES-7"), stage="session")
def suspended_lane_is_cleared(s: Story) -> None:
    _answers(s, 2)
    s.message(DM, "Start a long job.")
    first = _sid(s, DM)
    for _ in range(3):
        s.advance(30)
        s.lane_restart(graceful=True, running=(DM,))
    route = s.route_of(DM)
    s.expect(route is not None and route.suspended, "running across three restarts: suspended")
    s.advance(5)
    s.message(DM, "Are you there?")
    route = s.route_of(DM)
    s.expect(route is not None and route.session_id != first
             and route.auto_reset_reason == "suspended", "hard clear: a new incarnation")


@scenario("A failed turn leaves its lane's restart count, so the next stop still counts it",
          invariants=("SES-7",), stage="session")
def failed_turn_keeps_the_restart_count(s: Story) -> None:
    s.limits(stuck_restart_threshold=2)
    s.script(text("Started."), ProviderRejected("bad request", status=400))
    s.message(DM, "Start a long job.")
    s.advance(30)
    s.lane_restart(graceful=True, running=(DM,))
    failed = s.message(DM, "Is it done?")
    s.expect(failed is not None and failed.failed, "the second turn failed")
    s.advance(30)
    s.lane_restart(graceful=True, running=(DM,))
    route = s.route_of(DM)
    s.expect(route is not None and route.suspended,
             "two stops in a row with the job running, no success between: suspended")


@scenario("A lane interrupted by a crash resumes with the same id and the flag cleared",
          invariants=("SES-3", "SES-7"), stage="session")
def interrupted_lane_resumes(s: Story) -> None:
    _answers(s, 2)
    s.message(DM, "Working on it.")
    first = _sid(s, DM)
    s.advance(60)
    startup = s.lane_restart(graceful=False)
    s.expect(startup.marked == (_key(s, DM),), "active a minute ago: resume_pending")
    s.message(DM, "Continue.")
    route = s.route_of(DM)
    s.expect(route is not None and route.session_id == first and not route.resume_pending,
             "same id, flag cleared")


@scenario("Resume_pending shields a lane from its idle policy; the released order resets it",
          invariants=("SES-3",), stage="session")
def resume_pending_before_policy_only_in_the_reference_order(s: Story) -> None:
    s.limits(session_reset_mode="idle", session_idle_minutes=30)
    _answers(s, 4)
    s.message(DM, "Lane A.")
    s.message(OTHER_DM, "Lane B.")
    a, b = _sid(s, DM), _sid(s, OTHER_DM)
    s.advance(30)
    s.lane_restart(graceful=False)
    s.advance(31 * 60)
    s.message(DM, "Reference order.")
    s.expect(_sid(s, DM) == a, "reference: resume_pending keeps the id despite the policy")
    s.limits(session_resolution_order="released_0_19")
    s.message(OTHER_DM, "Released order.")
    route = s.route_of(OTHER_DM)
    s.expect(route is not None and route.session_id != b and route.auto_reset_reason == "idle",
             "0.19.0: the policy comes first and resets the lane")


@scenario("The released freshness gate resets a stale resume marker; the reference keeps it",
          invariants=("SES-3",), stage="session")
def released_freshness_gate_resets_old_markers(s: Story) -> None:
    s.limits(session_reset_mode="idle", session_idle_minutes=24 * 60)
    _answers(s, 4)
    s.message(DM, "Lane A.")
    s.message(OTHER_DM, "Lane B.")
    a, b = _sid(s, DM), _sid(s, OTHER_DM)
    s.advance(30)
    s.lane_restart(graceful=False)
    s.advance(2 * 3600)
    s.message(DM, "Reference order.")
    s.expect(_sid(s, DM) == a, "reference: the marker keeps the id")
    s.limits(session_resolution_order="released_0_19")
    s.message(OTHER_DM, "Released order.")
    route = s.route_of(OTHER_DM)
    s.expect(route is not None and route.session_id != b
             and route.auto_reset_reason == "resume_pending_expired",
             "0.19.0: a marker older than 3600 s resets the lane")


@scenario("Expiry is finalized once across restarts and the ended incarnation never revives",
          invariants=("SES-2", "SES-5"), stage="session")
def expiry_finalized_once_across_restarts(s: Story) -> None:
    s.limits(session_reset_mode="idle", session_idle_minutes=30)
    _answers(s, 2)
    s.message(DM, "Hello.")
    first = _sid(s, DM)
    s.advance(31 * 60)
    s.lane_restart(graceful=True)
    old = s.world.store.get_session(first)
    s.expect(old is not None and old.end_reason == "session_reset", "finalized: reset-ended")
    s.advance(60)
    s.lane_restart(graceful=True)
    s.message(DM, "Hello again.")
    route = s.route_of(DM)
    s.expect(route is not None and route.session_id != first and route.was_auto_reset,
             "a new incarnation, never the finalized one")


@scenario("A lane whose row was closed elsewhere starts a new incarnation",
          invariants=("SES-5",), stage="session")
def closed_row_is_never_revived(s: Story) -> None:
    _answers(s, 2)
    s.message(DM, "Hello.")
    first = _sid(s, DM)
    s.advance(5)
    s.world.store.end_session(first, "agent_close", s.world.clock.now())
    s.advance(5)
    s.message(DM, "Hello again.")
    s.expect(_sid(s, DM) != first, "the stale route does not revive the closed row")


@scenario("A lane with a live background process never expires",
          invariants=("SES-6",), stage="session")
def background_process_keeps_the_lane(s: Story) -> None:
    s.limits(session_reset_mode="idle", session_idle_minutes=30)
    _answers(s, 3)
    s.message(DM, "Start the build in the background.")
    first = _sid(s, DM)
    s.background(DM, live=True)
    s.advance(2 * 3600)
    s.expect(s.expiry_watch().finalized == (), "the watcher leaves the lane alone")
    s.message(DM, "Is it done?")
    s.expect(_sid(s, DM) == first, "two idle hours, same incarnation")
    s.advance(60)
    s.background(DM, live=False)
    s.advance(31 * 60)
    s.message(DM, "Thanks.")
    s.expect(_sid(s, DM) != first, "with the process gone, the policy applies again")


@scenario("A start without the clean-exit marker marks only the lanes active in the window",
          invariants=("SES-7",), stage="session")
def unclean_start_marks_recent_lanes(s: Story) -> None:
    _answers(s, 3)
    s.message(OTHER_DM, "Five minutes ago.")
    s.advance(240)
    s.message(DM, "One minute ago.")
    s.advance(60)
    startup = s.lane_restart(graceful=False)
    s.expect(startup.marked == (_key(s, DM),), "only the lane active 60 s ago is marked")
    s.message(DM, "Back.")
    s.advance(30)
    clean = s.lane_restart(graceful=True)
    s.expect(clean.clean and clean.marked == (), "a clean exit marks nothing")


@scenario("A lane with a live background process is never pruned; an idle one is retired",
          invariants=("SES-6",), stage="session")
def background_process_is_never_pruned(s: Story) -> None:
    s.limits(session_prune_after_s=24 * 3600.0)
    _answers(s, 4)
    s.message(DM, "Watch the deploy.")
    s.message(OTHER_DM, "Nothing running here.")
    kept, gone = _sid(s, DM), _sid(s, OTHER_DM)
    s.background(DM, live=True)
    s.advance(25 * 3600)
    watched = s.expiry_watch()
    s.expect(watched.pruned == (_key(s, OTHER_DM),), "only the lane without a process is pruned")
    s.message(DM, "Still deploying?")
    s.expect(_sid(s, DM) == kept, "the lane with the live process keeps its incarnation")
    s.message(OTHER_DM, "Hello again.")
    route = s.route_of(OTHER_DM)
    s.expect(route is not None and route.session_id != gone and not route.was_auto_reset,
             "a pruned lane starts a plain new incarnation, with no notice")
    old = s.world.store.get_session(gone)
    s.expect(old is not None and old.end_reason == "pruned", "the pruned row is ended, kept")


@scenario("A daily policy resets a lane last active before the reset hour, not one after it",
          invariants=("SES-3", "SES-4"), stage="session")
def daily_policy_resets_at_the_hour(s: Story) -> None:
    s.limits(session_reset_mode="daily", session_reset_at_hour=4)
    _answers(s, 3)
    s.message(DM, "Just after midnight.")
    first = _sid(s, DM)
    s.advance(3 * 3600)
    s.message(DM, "At three.")
    s.expect(_sid(s, DM) == first, "03:00: the 04:00 boundary has not passed since")
    s.advance(2 * 3600)
    s.message(DM, "At five.")
    route = s.route_of(DM)
    s.expect(route is not None and route.session_id != first
             and route.auto_reset_reason == "daily", "05:00: last active before 04:00, reset")


@scenario("Within the reset hour itself the daily boundary has passed: 03:50, then 04:10, "
          "is a new day",
          invariants=("SES-3",), stage="session")
def daily_boundary_inside_the_reset_hour(s: Story) -> None:
    s.limits(session_reset_mode="daily", session_reset_at_hour=4)
    _answers(s, 2)
    s.advance(3 * 3600 + 50 * 60)
    s.message(DM, "At ten to four.")
    first = _sid(s, DM)
    s.advance(20 * 60)
    s.message(DM, "At ten past four.")
    route = s.route_of(DM)
    s.expect(route is not None and route.session_id != first
             and route.auto_reset_reason == "daily", "04:10: last active at 03:50, reset")
