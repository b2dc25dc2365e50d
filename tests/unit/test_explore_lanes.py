"""The explored world's session lanes: drawn on streams of their own, run, rendered, shrunk."""

from __future__ import annotations

from hermes_ref.session import SessionSource
from sim.explore.lanes import (
    JOB_TEXT,
    Background,
    Evict,
    LaneMessage,
    LanePlan,
    LaneReset,
    LaneRestart,
    WatchPass,
    fewer_events,
)
from sim.explore.plan import FaultKind, FaultMix, Submit, WorldPlan, generate, load_plan
from sim.explore.render import render
from sim.explore.run import Verdict, run_plan
from tests.unit.explore_replay import replay_rendered, same_timeline

DM = SessionSource(platform="telegram", chat_type="dm", chat_id="99", participant="42")
DAVE = SessionSource(platform="telegram", chat_type="group", chat_id="-1002285219667",
                     thread_id="17585", participant="dave")
ERIN = DAVE.model_copy(update={"participant": "erin"})

# a day of one gateway: a DM that goes idle past its policy, a shared thread, a background
# process, an eviction, a crash moments after a message, and a job running at two graceful
# stops in a row (the stuck threshold)
LANES = LanePlan(
    reset_mode="idle", idle_minutes=30, stuck_threshold=2, prune_after_s=3 * 3600.0,
    events=(LaneMessage(at_s=600.0, process=0, source=DM, text="Say hello 1."),
            LaneMessage(at_s=620.0, process=1, source=DAVE, text="Read notes-1.txt."),
            LaneMessage(at_s=640.0, process=0, source=ERIN, text="Say hello 3."),
            Background(at_s=650.0, source=DAVE, live=True),
            LaneRestart(at_s=660.0, process=0, graceful=False),
            LaneMessage(at_s=3000.0, process=0, source=DM, text="Say hello 4."),
            LaneReset(at_s=3010.0, process=1, source=DM),
            LaneMessage(at_s=3020.0, process=1, source=DM, text="Say hello 5."),
            LaneMessage(at_s=3100.0, process=1, source=DM, text=JOB_TEXT),
            LaneRestart(at_s=3110.0, process=1, graceful=True),
            LaneMessage(at_s=3300.0, process=1, source=DM, text=JOB_TEXT),
            LaneRestart(at_s=3310.0, process=1, graceful=True),
            LaneMessage(at_s=3700.0, process=0, source=DM, text="Say hello 8."),
            Evict(at_s=3800.0, source=DM),
            LaneMessage(at_s=4000.0, process=1, source=DAVE, text="Say hello 9."),
            WatchPass(at_s=9000.0, process=0),
            LaneMessage(at_s=20000.0, process=0, source=DM, text="Say hello 10.")))
PLAN = WorldPlan(seed=11, processes=2, sessions={"s-1": "p-1"},
                 files={"notes-1.txt": "one", "notes-2.txt": "two"},
                 steps=(Submit(at_s=0.0, process=0, principal="p-1", session="s-1",
                               request_id="r-1", text="Say hello 1."),),
                 lanes=LANES)


def test_the_lanes_have_streams_of_their_own() -> None:
    """The lanes move nothing drawn before them, and without restarts a world keeps its
    messages, resets, background processes and watcher passes. (The waiter part, drawn
    last, takes only worlds whose lanes do not restart, so it is left out of both.)"""
    lanes = FaultMix(kinds=FaultMix().kinds - {FaultKind.WAIT_PAST_ROTATION})
    calm = FaultMix(kinds=lanes.kinds - {FaultKind.LANE_RESTART})
    drawn = 0
    for seed in range(40):
        every, fewer = generate(seed, lanes), generate(seed, calm)
        assert every.steps == fewer.steps and every.replies == fewer.replies
        if every.lanes is None:
            assert fewer.lanes is None
            continue
        drawn += 1
        assert fewer.lanes is not None and fewer.lanes.restarts == 0
        assert fewer.lanes.settings() == every.lanes.settings()
        kept = iter(every.lanes.events)
        assert all(any(e == other for other in kept) for e in fewer.lanes.events)
    assert 5 < drawn < 30


def test_a_day_of_lanes_runs_through_the_router_and_restarts() -> None:
    report = run_plan(PLAN)
    assert report.verdict is Verdict.PASSED, report.violations
    assert FaultKind.LANE_RESTART in report.fired
    timeline = report.timeline
    rules = {line.split()[2] for line in timeline.splitlines() if line.split()[1:2] == ["routed"]}
    assert {"created", "keep", "resume_pending", "suspended", "stale"} <= rules, rules
    for line in ("+notice", "stuck ->", "start_unclean", "user_reset ->",
                 "agent of agent:main:telegram:dm:99 evicted",
                 "background_started agent:main:telegram:group:-1002285219667:17585"):
        assert line in timeline, line


def test_a_lane_plan_renders_as_story_calls_and_replays() -> None:
    report = run_plan(PLAN)
    source = render(PLAN, report)
    for call in ("lanes = LaneWorld(s, [one, two], job_s=240.0)",
                 "lanes.restart(1, graceful=True, after_s=3110.0)", "lanes.watch(0, after_s=9000.0)",
                 "s.limits(session_reset_mode='idle', session_idle_minutes=30"):
        assert call in source, call
    outcome = replay_rendered(PLAN, report, source)
    assert same_timeline(outcome, report)


def test_the_shrinker_edits_the_lanes() -> None:
    fewer = fewer_events(LANES, 2, 3)
    assert len(fewer.events) == len(LANES.events) - 3
    assert fewer.events[2] == LANES.events[5]
    moved = PLAN.model_copy(update={"processes": 1, "lanes": LANES.on_processes(1)})
    assert all(getattr(e, "process", 0) == 0 for e in moved.lanes.events)  # type: ignore[union-attr]
    assert PLAN.size[2] == 1 + LANES.messages
    assert load_plan(PLAN.model_dump_json()) == PLAN  # a plan file keeps its lanes
