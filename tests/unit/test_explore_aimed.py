"""The explorer's aimed parts (``sim.explore.corrected``, ``sim.explore.lineage``,
``sim.explore.cooldown``, ``sim.explore.waiter``, ``sim.explore.gated`` with its refused
check): each drawn last on a stream of its own, moving nothing of the other parts; each
carried out where it is aimed, found under its sabotage, rendered, replayed and kept by
the shrinker."""

from __future__ import annotations

from typing import Any

from hermes_ref.models import Message, Role
from hermes_ref.session import SessionSource
from hermes_ref.wire import ProviderRequest
from sim.clock import VirtualClock
from sim.explore import cooldown, lineage, waiter
from sim.explore.edges import FlakySummarizer
from sim.explore.lanes import HOLD_S, LaneMessage, LanePlan, LaneReset, LaneWorld
from sim.explore.model import ExploreModel, _corrected_after_tools
from sim.explore.plan import (
    Drain,
    FaultKind,
    FaultMix,
    Redirect,
    Submit,
    WorldPlan,
    generate,
    load_plan,
)
from sim.explore.render import render
from sim.explore.run import NO_FOLDER, run_plan
from sim.explore.shrink import shrink
from sim.harness import Story
from sim.sabotage import SABOTAGES
from tests.unit.explore_replay import replay_rendered, same_timeline

# the smallest world of each kind, as the shrinker left the plans of seeds 25 and 153: the
# first under the sabotage that puts the defect of seed 32677 back, the second under the
# one that puts seed 44893's back (it then failed on the intact engine too: a turn that
# asked for the rotated child itself lost the carried memory, since fixed)
CORRECTED = WorldPlan(
    seed=25, processes=1, sessions={"s-1": "p-1"},
    files={"notes-1.txt": "note 1 of seed 25", "notes-2.txt": "note 2 of seed 25"},
    steps=(Redirect(at_s=92.0, session="s-1", text="Say hello 85 instead.", during="tools"),
           Submit(at_s=103.0, process=0, principal="p-1", session="s-1", request_id="r-160a63",
                  text="Write note 1 to s-1-out-1.txt."),
           Drain(at_s=111.0, process=0, session="s-1")),
    empty_after_correction=True)
ALICE = SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                      participant="alice")
LINEAGE = WorldPlan(
    seed=153, processes=1, sessions={"s-1": "p-1"},
    files={"notes-1.txt": "note 1 of seed 153", "notes-2.txt": "note 2 of seed 153"},
    context_window=250,
    lanes=LanePlan(idle_minutes=30, at_hour=3, thread_per_user=True, prune_after_s=10800.0,
                   stuck_threshold=2, events=(
        LaneMessage(at_s=26953.2, process=0, source=ALICE, text="Say hello 2."),
        LaneMessage(at_s=26954.2, process=0, source=ALICE, text="Say hello 175.",
                    at_rotation=True),
        LaneMessage(at_s=26975.3, process=0, source=ALICE, text="Read notes-1.txt."),
        LaneMessage(at_s=27006.6, process=0, source=ALICE, text="Say hello 201."),
        LaneMessage(at_s=27043.3, process=0, source=ALICE,
                    text="Write note 202 to lane-out-202.txt."),
        LaneMessage(at_s=27067.5, process=0, source=ALICE, text="Read notes-1.txt."))))
# as the shrinker left seed 178's plan at 60f1bd6, under the sabotage that puts seed 7922's
# defect back (the part has since left worlds with more processes, 178 among them, alone)
FRANK = SessionSource(platform="slack", participant="frank")
COOLDOWN = WorldPlan(
    seed=178, processes=1, sessions={"s-2": "p-2"},
    files={"notes-1.txt": "note 1 of seed 178", "notes-2.txt": "note 2 of seed 178"},
    context_window=250, summary_delay_s=180.0, summary_stumbles=True,
    lanes=LanePlan(idle_minutes=60, at_hour=9, thread_per_user=True, prune_after_s=43200.0,
                   job_s=400.0, events=(
        LaneMessage(at_s=5249.3, process=0, source=FRANK, text="Say hello 130."),
        LaneMessage(at_s=5250.3, process=0, source=FRANK, text="Say hello 322.",
                    after_failure_s=485.7),
        LaneMessage(at_s=5280.3, process=0, source=FRANK, text="Say hello 200."),
        LaneMessage(at_s=5302.8, process=0, source=FRANK, text="Read notes-1.txt."),
        LaneMessage(at_s=5324.4, process=0, source=FRANK, text="Read notes-1.txt."),
        LaneMessage(at_s=5329.8, process=0, source=FRANK,
                    text="Write note 3 to lane-out-3.txt."))))
# as the shrinker left seed 287's plan, under the sabotage that puts seed 14792's defect back
ERIN = SessionSource(platform="telegram", chat_type="group", chat_id="-1002285219667",
                     thread_id="17585", participant="erin")
WAITER = WorldPlan(
    seed=287, processes=2, sessions={"s-2": "p-2"},
    files={"notes-1.txt": "note 1 of seed 287", "notes-2.txt": "note 2 of seed 287"},
    context_window=250, summary_delay_s=180.0,
    lanes=LanePlan(reset_mode="daily", idle_minutes=240, at_hour=9, stuck_threshold=2, events=(
        LaneMessage(at_s=2397.5, process=1, source=ERIN, text="Say hello 1."),
        LaneMessage(at_s=2398.5, process=0, source=ERIN, text="Say hello 505.",
                    after_rotation_s=1.0),
        LaneMessage(at_s=2398.5, process=1, source=ERIN, text="Say hello 607.",
                    at_pass_elsewhere=True),
        LaneMessage(at_s=3039.3, process=1, source=ERIN, text="Read notes-1.txt."),
        LaneMessage(at_s=3637.1, process=1, source=ERIN, text="Write note 401 to lane-out-401.txt."),
        LaneMessage(at_s=4898.4, process=1, source=ERIN, text="Read notes-1.txt."))))


def test_the_aimed_parts_are_drawn_last_and_move_nothing() -> None:
    """Without their kinds a plan is what the other parts drew: the correction part only
    adds one correction during a tool round and its empty reply, the lineage part only a
    lane's chatter, a held message, the 250-token window (dropping the chat clients) and
    the summaries' delay, and the cooldown part, in a lineage world with late summaries,
    only a stumbling summarizer and one more held message of the same lane."""
    fewer = FaultMix(kinds=FaultMix().kinds - {FaultKind.EMPTY_AFTER_CORRECTION,
                                               FaultKind.LANE_AT_ROTATION,
                                               FaultKind.COOLDOWN_EDGE})
    corrected = held = stumbling = 0
    for seed in range(400):
        every, without = generate(seed), generate(seed, fewer)
        extra = [s for s in every.steps if s not in without.steps]
        if every.empty_after_correction:
            corrected += 1
            assert len(extra) == 1 and isinstance(extra[0], Redirect), seed
            assert extra[0].during == "tools" and without.max_iterations is None
        else:
            assert not extra, seed
        if every.lanes is not None and every.lanes.held:
            held += 1
            assert every.context_window == lineage.WINDOW and not every.clients
            assert without.context_window is not None or without.processes == 1
            added = [e for e in every.lanes.events if e not in without.lanes.events]  # type: ignore[union-attr]
            returning = [e for e in added if isinstance(e, LaneMessage) and e.after_failure_s]
            assert len(added) == lineage.CHATTER + 1 + len(returning)
            assert sum(isinstance(e, LaneMessage) and e.at_rotation for e in added) == 1
            assert len({e.source for e in added if isinstance(e, LaneMessage)}) == 1
            assert len(returning) == every.summary_stumbles, seed
            if every.summary_stumbles:
                stumbling += 1
                assert every.processes == 1
                assert not (every.summary_failures or every.summary_timeouts)
                delay = every.summary_delay_s
                assert delay is not None and 0 < cooldown.COOLDOWN_S - returning[0].after_failure_s < delay  # type: ignore[operator]
            every = every.model_copy(update={"lanes": without.lanes, "context_window":
                                             without.context_window, "clients": without.clients,
                                             "summary_delay_s": without.summary_delay_s,
                                             "summary_stumbles": False,
                                             "summary_failures": without.summary_failures,
                                             "summary_timeouts": without.summary_timeouts})
        assert not every.summary_stumbles, seed  # only in a lineage world
        assert every.model_copy(update={"steps": without.steps,
                                         "empty_after_correction": False}) == without, seed
    assert corrected >= 20 and held >= 3 and stumbling >= 3, (corrected, held, stumbling)


def test_a_correction_after_a_round_is_answered_with_nothing_once() -> None:
    """The model tells a request that ends on a correction taken in after a tool round;
    a correction before any tool round, or the first user row, is not one."""
    def request(*messages: Message) -> ProviderRequest:
        return ProviderRequest(model="m", messages=messages, tools=(), prompt_tokens=0)
    ask = Message(role=Role.USER, content="Write note 1 to a.txt.", turn_id="t-1")
    call = Message(role=Role.ASSISTANT, content="", turn_id="t-1")
    result = Message(role=Role.TOOL, content="ok", tool_call_id="c-1", turn_id="t-1")
    fix = Message(role=Role.USER, content="Say hello 2 instead.", turn_id="t-1")
    assert _corrected_after_tools(request(ask, call, result, fix)) == ("t-1", 2)
    assert _corrected_after_tools(request(ask, fix)) is None
    assert _corrected_after_tools(request(ask)) is None
    assert _corrected_after_tools(request(ask, call, result)) is None


def test_the_correction_world_runs_replays_and_finds_its_sabotage() -> None:
    """On the intact engine the corrected round is nudged once and the turn answers; the
    empty reply is a fault of its own, rendered, replayed, and the plan goes through its
    JSON file unchanged. A correction that restarts the ladder is LOOP-8, and the shrinker
    keeps the empty reply (without it the world passes)."""
    import scenarios  # noqa: F401 - the sabotages register beside the scenarios

    report = run_plan(CORRECTED)
    assert report.verdict.value == "passed", report.violations
    assert {FaultKind.EMPTY_AFTER_CORRECTION, FaultKind.REDIRECT} <= report.fired
    source = render(CORRECTED, report)
    assert "empty_after_correction=True" in source
    assert same_timeline(replay_rendered(CORRECTED, report, source), report)
    assert load_plan(CORRECTED.model_dump_json()) == CORRECTED
    calm = CORRECTED.model_copy(update={"empty_after_correction": False})
    with SABOTAGES["correction_restarts_the_ladder"].applied():
        assert "LOOP-8" in run_plan(CORRECTED, trace=False).invariants
        assert run_plan(calm, trace=False).verdict.value == "passed"
        assert shrink(CORRECTED).plan.empty_after_correction


def test_the_lineage_world_runs_replays_and_finds_its_sabotage() -> None:
    """On the intact engine the held message arrives as its lane's session rotates and
    waits for the lease; the turn that gets it keeps the block of the two ineffective
    passes the rotating turn made. With the summaries on time both rotations share one
    instant and the message asks for the tip itself; with them 180 s late it arrives
    between them and asks for the first child. Either way a turn that kept the memory it
    had as it asked compacts again (CMP-4), and the shrinker keeps the hold (without it
    the world passes)."""
    import scenarios  # noqa: F401

    report = run_plan(LINEAGE)
    assert report.verdict.value == "passed", report.violations
    assert FaultKind.LANE_AT_ROTATION in report.fired
    assert "arrives as" in report.timeline and "rotates" in report.timeline
    source = render(LINEAGE, report)
    assert "at_rotation=True)" in source
    assert same_timeline(replay_rendered(LINEAGE, report, source), report)
    assert load_plan(LINEAGE.model_dump_json()) == LINEAGE
    assert LINEAGE.lanes is not None
    unheld = LINEAGE.model_copy(update={"lanes": LINEAGE.lanes.model_copy(update={"events": tuple(
        e.model_copy(update={"at_rotation": False}) for e in LINEAGE.lanes.events)})})
    late = LINEAGE.model_copy(update={"summary_delay_s": lineage.DELAY_S})
    assert run_plan(late, trace=False).verdict.value == "passed"
    with SABOTAGES["child_waiter_keeps_the_memory_from_before"].applied():
        for plan in (LINEAGE, late):
            assert "CMP-4" in run_plan(plan, trace=False).invariants
            assert run_plan(unheld.model_copy(update={"summary_delay_s": plan.summary_delay_s}),
                            trace=False).verdict.value == "passed"
        shrunk = shrink(late).plan
    assert shrunk.lanes is not None and shrunk.lanes.held == 1


def _one_dm_lane(first: dict[str, Any], second: dict[str, Any]) -> tuple[Story, str]:
    """A one-process world with a telegram DM lane: two messages, at 0 s and 10 s, with the
    ``LaneWorld.message`` keywords given; run out. The story and its timeline."""
    s = Story(store_kind="memory", workdir=NO_FOLDER, trace=True)
    s.use_provider(ExploreModel())
    lanes = LaneWorld(s, [s.main_process()], job_s=240.0)
    dm = SessionSource(platform="telegram", chat_type="dm", chat_id="7", participant="7")
    lanes.message(0, dm, "Say hello 1.", after_s=0.0, **first)
    lanes.message(0, dm, "Say hello 2.", after_s=10.0, **second)
    s.run_all()
    return s, s.world.timeline.render()


def test_a_held_message_with_no_rotation_arrives_after_the_hold() -> None:
    """A message held for a rotation that never comes arrives ``HOLD_S`` later, and one of
    a lane nobody spoke on yet arrives at once."""
    s, timeline = _one_dm_lane(dict(at_rotation=True), dict(at_rotation=True))
    assert "is held until its lane's session rotates" in timeline
    assert f"arrives after {HOLD_S:g} s without a rotation" in timeline
    assert s.world.rotation_arrivals == 0 and s.world.clock.now() >= 10.0 + HOLD_S
    assert not s.violations


def test_the_summarizer_stumbles_only_as_a_late_summary_arrives() -> None:
    """Given the clock, the summarizer fails a request asked in the instant its last late
    summary arrives, and no other; without the clock, or in the calm phase, it never does."""
    clock = VirtualClock()
    model = ExploreModel()
    request = ProviderRequest(model="m", messages=(Message(role=Role.USER, content="hi"),),
                              tools=(), prompt_tokens=0)
    flaky = FlakySummarizer((), model, stumble_on=clock)
    flaky.delay_s = 180.0
    flaky.complete(request)  # arrives at 180
    clock.advance(179.0)
    flaky.complete(request)  # asked before: answered, and the next late one arrives at 359
    clock.advance(180.0)
    try:
        flaky.complete(request)
    except Exception as failure:
        assert "fell over" in str(failure)
    else:
        raise AssertionError("a request asked as a late summary arrived was answered")
    assert flaky.stumbled == 1 and flaky.failed == 0
    clock.advance(180.0)  # the failed request scheduled no late arrival
    flaky.complete(request)
    model.calm = True
    clock.advance(180.0)
    flaky.complete(request)  # the calm phase: no stumble
    plain = FlakySummarizer((), model)
    plain.delay_s = 180.0
    plain.complete(request)
    assert flaky.stumbled == 1 and plain.stumbled == 0


def test_the_cooldown_world_runs_replays_and_finds_its_sabotage() -> None:
    """On the intact engine the second pass after a slow one fails, the lane's user comes
    back inside the cooldown that runs from that failure and no summary is asked. A
    cooldown that runs from the turn's decision has ended by then, and the turn asks for
    one (CMP-4). Without the stumble or the hold the world passes under the sabotage, and
    the shrinker keeps both."""
    import scenarios  # noqa: F401

    report = run_plan(COOLDOWN)
    assert report.verdict.value == "passed", report.violations
    assert {FaultKind.COOLDOWN_EDGE, FaultKind.SMALL_WINDOW} <= report.fired
    assert "fell over after its slow answer" in report.timeline
    assert "485.7 s after a summary of" in report.timeline
    source = render(COOLDOWN, report)
    assert "stumble_on=s.world.clock" in source and "after_failure_s=485.7)" in source
    assert same_timeline(replay_rendered(COOLDOWN, report, source), report)
    assert load_plan(COOLDOWN.model_dump_json()) == COOLDOWN
    assert COOLDOWN.lanes is not None
    unheld = COOLDOWN.model_copy(update={"lanes": COOLDOWN.lanes.model_copy(update={
        "events": tuple(e.model_copy(update={"after_failure_s": None})
                        for e in COOLDOWN.lanes.events)})})
    with SABOTAGES["cooldown_runs_from_the_decision"].applied():
        assert "CMP-4" in run_plan(COOLDOWN, trace=False).invariants
        assert run_plan(unheld, trace=False).verdict.value == "passed"
        assert run_plan(COOLDOWN.model_copy(update={"summary_stumbles": False}),
                        trace=False).verdict.value == "passed"
        shrunk = shrink(COOLDOWN).plan
    assert shrunk.summary_stumbles and shrunk.lanes is not None and shrunk.lanes.returning == 1


def test_a_message_held_for_a_failure_that_never_comes_arrives_after_the_hold() -> None:
    """A message held for a failed summary that never comes arrives ``HOLD_S`` later."""
    s, timeline = _one_dm_lane({}, dict(after_failure_s=500.0))
    assert "is held until 500 s after a summary of its lane's session fails" in timeline
    assert f"arrives after {HOLD_S:g} s without a failed summary" in timeline
    assert s.world.failure_arrivals == 0 and s.world.clock.now() >= 10.0 + HOLD_S
    assert not s.violations


def test_the_waiter_part_is_drawn_last_and_moves_nothing() -> None:
    """Without its kind a plan is what the other parts drew: the waiter part takes only
    windowless worlds with lanes and more than one process, and only adds a lane's chatter
    on one process and two held messages, one on another process, takes the lane's other
    talk of the while away, and sets the 250-token window (dropping the chat clients), the
    summaries' delay and no summary failures."""
    fewer = FaultMix(kinds=FaultMix().kinds - {FaultKind.WAIT_PAST_ROTATION})
    drawn = 0
    for seed in range(1000):
        every, without = generate(seed), generate(seed, fewer)
        if every.lanes is None or not every.lanes.waiting_out:
            assert every == without, seed
            continue
        drawn += 1
        assert without.lanes is not None and without.context_window is None
        assert every.processes > 1 and not without.lanes.held and not every.lanes.held
        assert every.context_window == waiter.WINDOW and not every.clients
        assert not (every.summary_failures or every.summary_timeouts)
        added = [e for e in every.lanes.events if e not in without.lanes.events]
        gone = [e for e in without.lanes.events if e not in every.lanes.events]
        assert all(isinstance(e, LaneMessage) for e in added)
        assert len(added) == waiter.CHATTER + 2 and len({e.source for e in added}) == 1  # type: ignore[union-attr]
        nudged = [e for e in added if isinstance(e, LaneMessage) and e.after_rotation_s]
        back = [e for e in added if isinstance(e, LaneMessage) and e.at_pass_elsewhere]
        assert len(nudged) == len(back) == 1 and nudged[0].process != back[0].process
        assert all(isinstance(e, LaneMessage | LaneReset) and e.source.platform
                   == added[0].source.platform for e in gone)  # type: ignore[union-attr]
        assert every.model_copy(update={
            "lanes": without.lanes, "context_window": None, "clients": without.clients,
            "summary_delay_s": without.summary_delay_s, "lease_wait_s": without.lease_wait_s,
            "summary_failures": without.summary_failures,
            "summary_timeouts": without.summary_timeouts}) == without, seed
    assert drawn >= 3, drawn


def test_the_waiter_world_runs_replays_and_finds_its_sabotage() -> None:
    """On the intact engine pid=2's turn rotates the lane's session and ends on the child
    with two ineffective passes in a row; pid=1's held message is next, and its pass waits
    for the summary while pid=2's second held message asks for the child and waits for the
    lease. pid=2 holds no cache of the child, only the memory it carried there, and finds
    it by reading the child again under the lease: ended by compression now. A walk that
    takes the child's row as read before the wait stops there, and the turn compacts with
    no memory (CMP-4). Without the holds the world passes under the sabotage, and the
    shrinker keeps both."""
    import scenarios  # noqa: F401

    report = run_plan(WAITER)
    assert report.verdict.value == "passed", report.violations
    assert {FaultKind.WAIT_PAST_ROTATION, FaultKind.SMALL_WINDOW} <= report.fired
    assert "as another process asks for a summary of" in report.timeline
    assert "with no cache of it and a memory of its lineage" in report.timeline
    source = render(WAITER, report)
    assert "after_rotation_s=1.0" in source and "at_pass_elsewhere=True" in source
    assert same_timeline(replay_rendered(WAITER, report, source), report)
    assert load_plan(WAITER.model_dump_json()) == WAITER
    assert WAITER.lanes is not None
    unheld = WAITER.model_copy(update={"lanes": WAITER.lanes.model_copy(update={
        "events": tuple(e.model_copy(update={"after_rotation_s": None,
                                             "at_pass_elsewhere": False})
                        for e in WAITER.lanes.events)})})
    with SABOTAGES["walk_reads_the_parent_from_before_the_wait"].applied():
        assert "CMP-4" in run_plan(WAITER, trace=False).invariants
        assert run_plan(unheld, trace=False).verdict.value == "passed"
        shrunk = shrink(WAITER).plan
    assert shrunk.lanes is not None and shrunk.lanes.waiting_out == 2


def test_messages_held_for_a_pass_or_a_rotation_that_never_comes_arrive_after_the_hold() -> None:
    """A message held for another process's pass, or for a rotation and some seconds more,
    arrives ``HOLD_S`` later when none comes; a message can wait for one moment only."""
    s, timeline = _one_dm_lane({}, dict(at_pass_elsewhere=True))
    assert "is held until another process asks for a summary of its lane's session" in timeline
    assert f"arrives after {HOLD_S:g} s without a pass elsewhere" in timeline
    assert s.world.rotation_waits == 0 and not s.violations
    s, timeline = _one_dm_lane({}, dict(after_rotation_s=5.0))
    assert "is held until 5 s after its lane's session rotates" in timeline
    assert f"arrives after {HOLD_S:g} s without a rotation" in timeline
    assert s.world.rotation_arrivals == 0 and not s.violations
    try:
        LaneMessage(at_s=0.0, process=0, source=ERIN, text="Say hello 1.", at_rotation=True,
                    at_pass_elsewhere=True)
    except ValueError as error:
        assert "one moment" in str(error)
    else:
        raise AssertionError("a message held for two moments was taken")


def test_the_gated_part_only_turns_the_gate_on(monkeypatch: Any) -> None:
    """With the part held back a plan is what the other parts drew; with it, the one-process
    worlds with a small window and no lanes, tight bound, fallback or gate get the gate,
    and nothing else of theirs changes."""
    from sim.explore import gated

    every = [generate(seed) for seed in range(300)]
    monkeypatch.setattr(gated, "SHARE", 0.0)
    gated_worlds = 0
    for seed, plan in enumerate(every):
        without = generate(seed)
        if plan == without:
            continue
        gated_worlds += 1
        assert plan.verify_before_answer and not without.verify_before_answer, seed
        assert plan.context_window is not None and plan.processes == 1 and plan.lanes is None
        assert plan.model_copy(update={"verify_before_answer": False,
                                       "refuse_the_check": False}) == without, seed
    assert gated_worlds >= 5, gated_worlds


def test_the_gated_world_runs_and_finds_its_sabotage() -> None:
    """Seed 183: a turn writes a file, its answer is held back for a check, and the request
    that asks for the check does not fit the window. On the intact engine the answer stands;
    the sabotaged finalizer loses it (FIN-6), and without the gate the world passes under
    the sabotage."""
    import scenarios  # noqa: F401

    plan = generate(183)
    assert plan.verify_before_answer and plan.context_window is not None
    report = run_plan(plan)
    assert report.verdict.value == "passed", report.violations
    # the turn failed closed for context pressure and still ended on the answer's row
    assert "reason=context_compression_exhausted calls=3 budget=3/90 last=assistant" \
        in report.timeline
    with SABOTAGES["held_answer_lost_at_preflight"].applied():
        assert run_plan(plan, trace=False).invariants == ["FIN-6"]
        ungated = plan.model_copy(update={"verify_before_answer": False})
        assert run_plan(ungated, trace=False).verdict.value == "passed"


# the world of seed 21 as the shrinker left it under ``held_answer_lost_to_a_failed_check``
REFUSED = WorldPlan(
    seed=21, processes=1, sessions={"s-2": "p-2"},
    files={"notes-1.txt": "note 1 of seed 21", "notes-2.txt": "note 2 of seed 21"},
    steps=(Submit(at_s=61.0, process=0, principal="p-2", session="s-2", request_id="r-89a91a",
                  text="Write note 4 to s-2-out-4.txt."),
           Drain(at_s=75.0, process=0, session="s-2")),
    verify_before_answer=True, refuse_the_check=True)


def test_the_check_is_refused_or_corrected_only_with_the_gate(monkeypatch: Any) -> None:
    """With the check part held back a plan is what the other parts drew; with it, about
    half the worlds with the gate on and no budget of 3 refuse the check, and the worlds
    with a budget of 3 correct it (one correction per session whose turns write, during
    the check), and nothing else of theirs changes. A plan that refuses a check no gate
    asks for is refused as it loads."""
    from sim.explore import gated

    every = [generate(seed) for seed in range(600)]
    monkeypatch.setattr(gated, "CHECK_SHARE", 0.0)
    monkeypatch.setattr(gated, "CHECK_LAST", 0)
    others = refused = corrected = 0
    for seed, plan in enumerate(every):
        without = generate(seed)
        checks = [s for s in plan.steps if isinstance(s, Redirect) and s.during == "check"]
        if checks:
            corrected += 1
            assert plan.verify_before_answer and plan.iteration_budget == 3, seed
            assert not plan.refuse_the_check and {s.session for s in checks} == {
                s.session for s in plan.steps if isinstance(s, Submit)
                and s.text.startswith(gated.WRITES)}, seed
        elif plan.verify_before_answer and plan.iteration_budget != 3:
            others += 1
            refused += plan.refuse_the_check
        assert plan.verify_before_answer or not plan.refuse_the_check, seed
        assert plan.model_copy(update={"refuse_the_check": False, "steps": tuple(
            s for s in plan.steps if s not in checks)}) == without, seed
    assert others >= 30 and 0.3 * others <= refused <= 0.7 * others, (others, refused)
    assert corrected >= 3, corrected
    try:
        WorldPlan.model_validate({**REFUSED.model_dump(), "verify_before_answer": False})
    except ValueError as error:
        assert "refuse_the_check needs verify_before_answer" in str(error)
    else:
        raise AssertionError("a refused check without the gate was taken")


def test_the_refused_check_world_runs_replays_and_finds_its_sabotage() -> None:
    """A turn writes a file and answers; the gate holds the answer back, and the provider
    refuses the request that asks for the check (a 400, terminal). On the intact engine
    the held answer stands; the fault is rendered and replayed, and the plan goes through
    its JSON file unchanged. A finalizer that rescues the held answer on context pressure
    alone loses it (FIN-6), and the shrinker keeps the refusal (without it the world passes)."""
    calm = REFUSED.model_copy(update={"refuse_the_check": False})
    kept = _held_world_holds(REFUSED, FaultKind.CHECK_REFUSED, "reason=terminal_provider_error",
                             "refuse_the_check=True", "held_answer_lost_to_a_failed_check",
                             "FIN-6", calm)
    assert kept.refuse_the_check


# the world of seed 117 as the shrinker left it under ``correction_keeps_the_held_answer``
CHECKED = WorldPlan(
    seed=117, processes=1, sessions={"s-2": "p-2"},
    files={"notes-1.txt": "note 1 of seed 117", "notes-2.txt": "note 2 of seed 117"},
    steps=(Redirect(at_s=5.0, session="s-2", text="Say hello 55 instead.", during="check",
                    slow_s=30.0),
           Submit(at_s=21.0, process=0, principal="p-2", session="s-2", request_id="r-246cad",
                  text="Write note 1 to s-2-out-1.txt."),
           Drain(at_s=47.0, process=0, session="s-2")),
    verify_before_answer=True, iteration_budget=3)


def test_the_corrected_check_world_runs_replays_and_finds_its_sabotage() -> None:
    """A turn writes a file and answers; the gate holds the answer back, and the user
    corrects the turn during the call that asks for the check, the last the budget of 3
    allows. On the intact engine the correction overrules the held answer and the budget's
    end asks for a summary; the moment is rendered and replayed. A correction that leaves
    the held answer in place delivers it (FIN-1), and the shrinker keeps the correction
    (without it the world passes)."""
    calm = CHECKED.model_copy(update={"steps": CHECKED.steps[1:]})
    kept = _held_world_holds(CHECKED, FaultKind.REDIRECT, "during the check call",
                             "during='check'", "correction_keeps_the_held_answer", "FIN-1", calm)
    assert any(isinstance(s, Redirect) for s in kept.steps)


def _held_world_holds(plan: WorldPlan, fault: FaultKind, shown: str, rendered: str,
                      sabotage: str, invariant: str, calm: WorldPlan) -> WorldPlan:
    """``plan`` passes on the intact engine with ``fault`` and the gate fired and ``shown``
    in its timeline; its scenario renders ``rendered`` and replays the same timeline; the
    plan goes through its JSON file unchanged. Under ``sabotage`` it breaks ``invariant``
    alone and ``calm`` (the plan without its moment) passes. Returns the shrunk plan."""
    import scenarios  # noqa: F401 - the sabotages register beside the scenarios

    report = run_plan(plan)
    assert report.verdict.value == "passed", report.violations
    assert {fault, FaultKind.VERIFY_GATE} <= report.fired
    assert shown in report.timeline
    source = render(plan, report)
    assert rendered in source
    assert same_timeline(replay_rendered(plan, report, source), report)
    assert load_plan(plan.model_dump_json()) == plan
    with SABOTAGES[sabotage].applied():
        assert run_plan(plan, trace=False).invariants == [invariant]
        assert run_plan(calm, trace=False).verdict.value == "passed"
        return shrink(plan).plan
