"""The explored world's context and loop-ending parts (``sim.explore.edges``): drawn from
streams of their own, rendered as Story calls, replayed exactly, shrunk away."""

from __future__ import annotations

from sim.explore import edges
from sim.explore.plan import (
    Drain,
    FaultKind,
    FaultMix,
    Handover,
    ReplyFault,
    Submit,
    WorldPlan,
    generate,
)
from sim.explore.render import render
from sim.explore.run import run_plan
from sim.explore.terminal import Direct
from sim.tools import SIM_ROOT
from tests.unit.explore_replay import replay_rendered, same_timeline

EDGES = WorldPlan(
    seed=5, processes=1, sessions={"s-1": "p-1"},
    files={"notes-1.txt": "one", "notes-2.txt": "two"},
    steps=(Submit(at_s=0.0, process=0, principal="p-1", session="s-1", request_id="r-1",
                  text="Read notes-1.txt and rewrite it as note 70 at link-notes-1.txt."),
           Drain(at_s=1.0, process=0, session="s-1"),
           Submit(at_s=2.0, process=0, principal="p-1", session="s-1", request_id="r-2",
                  text=f"Read notes-2.txt and rewrite it as note 71 at {SIM_ROOT}/notes-2.txt."),
           Drain(at_s=3.0, process=0, session="s-1"),
           Submit(at_s=4.0, process=0, principal="p-1", session="s-1", request_id="r-3",
                  text="Say hello 3."),
           Drain(at_s=5.0, process=0, session="s-1"),
           Submit(at_s=900.0, process=0, principal="p-1", session="s-1", request_id="r-4",
                  text="Read notes-1.txt and rewrite it as note 70 at link-notes-1.txt."),
           Drain(at_s=901.0, process=0, session="s-1"),
           Handover(at_s=10.0, process=0, into="h-1", text="Say hello 80.", history=2),
           Handover(at_s=20.0, process=0, into="h-1", text="Say hello 81.", history=3)),
    replies=(ReplyFault(call=5, kind=FaultKind.REFUSED_WRITE),),
    symlinks={"link-notes-1.txt": "notes-1.txt"}, context_window=320,
    idle_compact_after_s=600.0, summary_failures=(1,), iteration_budget=3, grace_call=False)


def test_the_edges_render_as_story_calls_and_replay() -> None:
    """Budgets, symlinks, idle compaction, failed summaries and handed-over turns render as
    Story calls, and the scenario replays the run."""
    report = run_plan(EDGES)
    assert report.verdict.value == "passed", report.violations
    assert {FaultKind.REFUSED_WRITE, FaultKind.SUMMARY_FAILURE} <= report.fired, report.fired
    source = render(EDGES, report)
    for call in ("s.limits(iteration_budget=3, grace_call_enabled=False, "
                 "idle_compact_after_s=600.0)",
                 "s.symlinks({'link-notes-1.txt': 'notes-1.txt'})",
                 "model.summarizer = FlakySummarizer((1,), model)",
                 "from sim.explore.edges import FlakySummarizer, handed_history",
                 "s.start_turn('Say hello 80.', session='h-1', process=one, after_s=10.0, "
                 "history=handed_history(2))"):
        assert call in source, call
    outcome = replay_rendered(EDGES, report, source)
    assert same_timeline(outcome, report)


def test_a_rewrite_through_an_alias_waits_for_the_read() -> None:
    """One file by two names: the read runs alone, then the write (TOOL-4 on the intact
    engine), and the refused write is reported in its answer (TOOL-9)."""
    report = run_plan(EDGES)
    assert "FENCED" not in report.timeline
    assert not [v for v in report.violations if v.startswith(("TOOL-4", "TOOL-9"))], \
        report.violations
    assert "sequential" in report.timeline


def test_the_edges_are_drawn_and_move_no_older_part() -> None:
    """Every part of ``edges`` is drawn in some of the first seeds; without the new fault
    kinds the rest of the plan is the same."""
    plans = [generate(seed) for seed in range(60)]
    assert any(p.iteration_budget for p in plans) and any(not p.grace_call for p in plans)
    assert any(p.symlinks for p in plans) and any(p.idle_compact_after_s for p in plans)
    assert any(p.summary_failures for p in plans)
    assert any(r.kind is FaultKind.REFUSED_WRITE for p in plans for r in p.replies)
    assert any(edges.REWRITE.match(s.text) for p in plans for s in p.steps
               if isinstance(s, Submit))
    assert any(isinstance(s, Handover) for p in plans for s in p.steps)
    fewer = FaultMix(kinds=FaultMix().kinds - {FaultKind.SUMMARY_FAILURE, FaultKind.REFUSED_WRITE})
    for seed in range(30):
        every, older = generate(seed), generate(seed, fewer)
        assert every.steps == older.steps
        assert [r for r in every.replies if r.kind is not FaultKind.REFUSED_WRITE] == \
            list(older.replies)
        assert not older.summary_failures


def test_the_shrinker_can_take_each_edge_away() -> None:
    """Each option of these parts is one edit of ``edges.simpler``."""
    candidates = list(edges.simpler(EDGES))
    assert any(c.iteration_budget is None for c in candidates)
    assert any(c.grace_call for c in candidates)
    assert any(not c.symlinks for c in candidates)
    assert any(c.idle_compact_after_s is None for c in candidates)
    assert any(not c.summary_failures for c in candidates)


# ---- a grace call in an outage, and a holder frozen with a compression lock ------------------

GRACE = WorldPlan(
    seed=9, processes=1, sessions={"s-1": "p-1"}, max_iterations=1,
    files={"notes-1.txt": "one", "notes-2.txt": "two"},
    steps=(Submit(at_s=0.0, process=0, principal="p-1", session="s-1", request_id="r-1",
                  text="Read notes-1.txt."),
           Drain(at_s=1.0, process=0, session="s-1")),
    fallback_window=4_000, grace_outages=(1,))

TEXTS = ("Read t-1-build.log.", "Say hello {k}.", "Write note {k} to t-1-out-{k}.txt.",
         "Read notes-1.txt.")
CONTENTION = WorldPlan(
    seed=7, processes=2, sessions={"s-1": "p-1"},
    files={"notes-1.txt": "one", "notes-2.txt": "two"},
    steps=(Submit(at_s=0.0, process=0, principal="p-1", session="s-1", request_id="r-1",
                  text="Say hello 1."),
           Drain(at_s=1.0, process=0, session="s-1"),
           *(Direct(at_s=2.0 * k, process=k % 2, session="t-1", text=TEXTS[k % 4].format(k=k))
             for k in range(12))),
    terminals=("t-1",), build_log_s=5.0, context_window=500, lock_stall_s=400.0,
    compression_lock_ttl_s=900.0)


def test_a_grace_outage_renders_and_replays() -> None:
    """The outage strikes the turn's grace call, whose retries are spent on the primary: it is
    asked again of the fallback (LOOP-6). The plan renders as the model's ``grace_outages``
    and replays the run."""
    report = run_plan(GRACE)
    assert report.verdict.value == "passed", report.violations
    assert {FaultKind.OUTAGE, FaultKind.FALLBACK} <= report.fired, report.fired
    assert "outage (a grace call)" in report.timeline
    source = render(GRACE, report)
    assert "ids=s.world.chooser, grace_outages=(1,))" in source
    outcome = replay_rendered(GRACE, report, source)
    assert same_timeline(outcome, report)


def test_a_holder_frozen_with_the_lock_renders_and_replays() -> None:
    """The terminal's first compaction freezes its holder with the lock held; its lease lapses,
    the next turn in line compacts too and is refused the lock (CMP-6). The plan renders as
    Story calls and replays the run."""
    report = run_plan(CONTENTION)
    assert report.verdict.value == "passed", report.violations
    assert FaultKind.LOCK_STALL in report.fired and FaultKind.STALL not in report.fired
    assert "holding the compression lock of t-1" in report.timeline
    assert "REFUSED to" in report.timeline
    source = render(CONTENTION, report)
    for call in ("s.world.lock_stalls['t-1'] = 400.0", "s.limits(compression_lock_ttl_s=900.0)",
                 "s.world.lock_stalls.clear()"):
        assert call in source, call
    outcome = replay_rendered(CONTENTION, report, source)
    assert same_timeline(outcome, report)


def test_the_grace_and_contention_parts_are_drawn_and_shrunk_away() -> None:
    """Both parts are drawn in some of the first seeds of the default plan, only where they
    hold (a fallback route and a tight bound; several processes and the terminal), and the
    shrinker can take each away."""
    plans = [generate(seed) for seed in range(200)]
    graces = [p for p in plans if p.grace_outages]
    locked = [p for p in plans if p.lock_stall_s]
    assert graces and locked
    assert all(p.fallback_window and (p.max_iterations or p.iteration_budget) for p in graces)
    assert all(p.processes >= 2 and p.terminals and p.context_window and not p.clients
               for p in locked)
    assert any(not c.grace_outages for c in edges.simpler(GRACE))
    candidates = list(edges.simpler(CONTENTION))
    assert any(c.lock_stall_s is None for c in candidates)
    assert any(c.compression_lock_ttl_s is None for c in candidates)
