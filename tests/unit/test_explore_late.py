"""A process frozen while its late tool call waits to begin (``sim.explore.late``): drawn
last on a stream of its own, moving nothing of the other parts; carried out by the batch
runner as a stall; rendered, replayed and kept by the shrinker where it matters."""

from __future__ import annotations

from sim.explore.late import STALL_S
from sim.explore.plan import (
    Drain,
    FaultKind,
    FaultMix,
    Submit,
    ToolTiming,
    WorldPlan,
    generate,
    load_plan,
)
from sim.explore.render import render
from sim.explore.run import run_plan
from sim.explore.shrink import shrink
from sim.sabotage import SABOTAGES
from tests.unit.explore_replay import replay_rendered, same_timeline

# the smallest world of the kind, as the shrinker left the plan of seed 136 under the
# sabotage that vouches for a lease only as a batch begins: one turn reads two notes at
# once; the second read waits 300 s to begin, and its process freezes 400 s meanwhile (in
# the faulty phase: the calm phase disarms the freeze)
LATE = WorldPlan(
    seed=136, processes=1, sessions={"s-3": "p-3"},
    files={"notes-1.txt": "note 1 of seed 136", "notes-2.txt": "note 2 of seed 136"},
    steps=(Submit(at_s=80.0, process=0, principal="p-3", session="s-3", request_id="r-63f0fd",
                  text="Read notes-1.txt and notes-2.txt."),
           Drain(at_s=92.0, process=0, session="s-3")),
    tool_timings=(ToolTiming(tool="read_file", path="notes-2.txt", seconds=1.0,
                             start_delay_s=300.0, stall_s=STALL_S),))


def test_the_freeze_is_drawn_last_and_moves_nothing() -> None:
    """Without its kind a plan is what the other parts drew: the part only sets the freeze
    of a late tool call, in most of the worlds that hold one."""
    fewer = FaultMix(kinds=FaultMix().kinds - {FaultKind.FROZEN_LATE_START})
    late = drew = 0
    for seed in range(300):
        every, without = generate(seed), generate(seed, fewer)
        calm = tuple(t.model_copy(update={"stall_s": 0.0}) for t in every.tool_timings)
        assert every.model_copy(update={"tool_timings": calm}) == without
        late += any(t.start_delay_s > 0 for t in without.tool_timings)
        frozen = [t for t in every.tool_timings if t.stall_s > 0]
        assert all(t.start_delay_s > 0 and t.stall_s == STALL_S for t in frozen)
        drew += bool(frozen)
    assert 0.5 * late <= drew <= late and drew >= 10, (drew, late)


def test_a_frozen_late_call_never_begins_and_the_world_replays() -> None:
    """On the intact engine the frozen process wakes past its lease and the late read never
    begins (LEASE-4); the freeze is a fault of its own, narrated, rendered as Story calls,
    and the plan goes through its JSON file unchanged."""
    report = run_plan(LATE)
    assert report.verdict.value == "passed", report.violations
    assert FaultKind.FROZEN_LATE_START in report.fired and FaultKind.STALL not in report.fired
    assert "stalls for 400 s while" in report.timeline and "waits 300 s to begin" in report.timeline
    source = render(LATE, report)
    assert "start_delay_s=300.0, stall_s=400.0)" in source
    assert same_timeline(replay_rendered(LATE, report, source), report)
    assert load_plan(LATE.model_dump_json()) == LATE


def test_the_sabotage_is_found_through_the_freeze_and_the_shrinker_keeps_it() -> None:
    """Vouching only as the batch begins, the late read runs on a lease gone: LEASE-4. The
    shrinker cannot drop the freeze (without it the world passes), so it stays in the plan."""
    import scenarios  # noqa: F401 - the sabotages register beside the scenarios

    unfrozen = LATE.model_copy(update={"tool_timings": (
        LATE.tool_timings[0].model_copy(update={"stall_s": 0.0}),)})
    with SABOTAGES["late_tool_call_on_the_batch_vouch"].applied():
        report = run_plan(LATE, trace=False)
        assert "LEASE-4" in report.invariants, report.violations
        assert run_plan(unfrozen, trace=False).verdict.value == "passed"
        shrunk = shrink(LATE)
    assert shrunk.plan.tool_timings[0].stall_s == STALL_S
