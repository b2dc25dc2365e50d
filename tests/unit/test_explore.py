"""The explorer: the seed decides, shards split a sweep exactly, replay and render agree."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from hermes_ref.effects import Site
from hermes_ref.errors import BadInput
from sim.cli import main
from sim.explore.plan import (
    ClockJump,
    Drain,
    FaultKind,
    FaultMix,
    Interrupt,
    Kill,
    Redirect,
    ReplyFault,
    Stall,
    Submit,
    ToolTiming,
    WorldPlan,
    generate,
    load_plan,
)
from sim.explore.render import render
from sim.explore.run import RunReport, Verdict, run_plan
from sim.explore.shapes import SHAPES
from sim.explore.sweep import Shard, SweepReport, first_difference, merge, sweep
from sim.explore.swimlane import lanes_of, render_html, rows_of
from sim.faults import CrashPoint
from tests.unit.explore_replay import replay_rendered, same_timeline

ODD_KINDS = (FaultKind.AUTH_ERROR, FaultKind.REASONING_ONLY, FaultKind.NARRATED_CALL,
             FaultKind.LONE_SURROGATE, FaultKind.SHARED_CALL_IDS, FaultKind.DEEP_ARGUMENTS,
             FaultKind.WIDE_BATCH, FaultKind.STREAM_CUT, FaultKind.OVERFLOW, FaultKind.OUTAGE,
             FaultKind.INTERRUPT, FaultKind.REDIRECT, FaultKind.SLOW_TOOL, FaultKind.FALLBACK,
             FaultKind.SMALL_WINDOW, FaultKind.RUN_CODE, FaultKind.HUGE_READ,
             FaultKind.VERIFY_GATE, FaultKind.SUMMARY_FAILURE,
             FaultKind.REFUSED_WRITE, *SHAPES)  # the kinds drawn after the first parts

# a stalled holder whose lease runs out while its model call is slow: a small world with
# one lease loss, used wherever a test needs a run with a fault in it
STALLED = WorldPlan(
    seed=7, processes=2, sessions={"s-1": "p-1"}, files={"notes-1.txt": "one"},
    steps=(Submit(at_s=0.0, process=0, principal="p-1", session="s-1", request_id="r-1",
                  text="Read notes-1.txt."),
           Submit(at_s=1.0, process=1, principal="p-1", session="s-1", request_id="r-2",
                  text="Say hello 2."),
           Drain(at_s=2.0, process=1, session="s-1"),
           Drain(at_s=3.0, process=0, session="s-1"),
           Stall(at_s=2.5, process=1, seconds=30.0)),
)


def test_one_seed_gives_one_record_byte_for_byte() -> None:
    first, second = run_plan(generate(11)), run_plan(generate(11))
    assert first.digest == second.digest
    assert first.timeline == second.timeline


def test_two_seeds_give_two_records() -> None:
    digests = {run_plan(generate(seed), trace=False).digest for seed in range(6)}
    assert len(digests) == 6


def _ids(report: RunReport) -> list[str]:
    return sorted(set(re.findall(r"\b(?:turn|adm)-[0-9a-f]{6}\b|\bcall_[0-9a-f]{6}\b",
                                 report.timeline)))


def test_the_seed_decides_the_ids() -> None:
    """Turn, admission, call and request ids are drawn from the seed, not counted: two
    seeds give different ids and records, one seed the same record byte for byte twice."""
    plan = generate(11)
    first, again = run_plan(plan), run_plan(plan)
    assert first.digest == again.digest and first.timeline == again.timeline
    ids = _ids(first)
    assert {i.split("-")[0].split("_")[0] for i in ids} == {"turn", "adm", "call"}
    assert re.search(r"\b(?:turn|adm)-\d{1,3}\b|\bcall_\d{1,3}\b", first.timeline) is None
    other_world = run_plan(plan.model_copy(update={"seed": 12}))  # same workload, other seed
    assert other_world.digest != first.digest and not set(_ids(other_world)) & set(ids)
    requests = {s.request_id for s in generate(12).steps if isinstance(s, Submit)}
    assert requests.isdisjoint({s.request_id for s in plan.steps if isinstance(s, Submit)})
    assert all(re.fullmatch(r"r-[0-9a-f]{6}x?", r) for r in requests)


def test_the_workload_does_not_move_when_the_faults_do() -> None:
    """Each part of a plan has its own sub-stream: fewer fault kinds, same submissions."""
    every, none = generate(5), generate(5, FaultMix.parse("none"))
    assert [s for s in every.steps if s.op == "submit"] == [
        s for s in none.steps if s.op == "submit"]
    assert none.fault_kinds() == set()


def test_a_plan_without_faults_passes_and_converges() -> None:
    for seed in range(8):
        report = run_plan(generate(seed, FaultMix.parse("none")), trace=False)
        assert report.verdict is Verdict.PASSED, (seed, report.violations, report.stuck)
        assert report.admissions > 0 and not report.stuck


def test_shards_cover_a_range_exactly_once() -> None:
    shards = [Shard.parse(f"{k}/3").seeds(10, 20) for k in (1, 2, 3)]
    flat = sorted(s for shard in shards for s in shard)
    assert flat == list(range(10, 30))
    assert all(set(a).isdisjoint(b) for a in shards for b in shards if a is not b)


@pytest.mark.parametrize("text", ["0/3", "4/3", "x/2", "2", "1/0"])
def test_a_bad_shard_is_refused(text: str) -> None:
    with pytest.raises(BadInput, match="--shard"):
        Shard.parse(text)


def test_merged_shards_equal_the_whole_sweep() -> None:
    whole = sweep(0, 12).as_json()
    parts = [sweep(0, 12, shard=Shard(k, 3)).as_json() for k in (1, 2, 3)]
    merged = merge(parts)
    for key in ("seeds", "passed", "fired", "crash_points", "failures", "steps",
                "first_seed", "last_seed", "exit_code"):
        assert merged[key] == whole[key], key


def test_a_report_that_is_no_report_is_refused() -> None:
    with pytest.raises(BadInput, match="report 1 is not a sweep report"):
        merge([{"seeds": 3}])


def test_a_declared_fault_that_never_fired_fails_the_sweep() -> None:
    report = SweepReport(declared=["kill", "stall"])
    report.fired.update({"kill": 2})
    assert report.unfired == ["stall"] and report.exit_code == 6


def test_an_unknown_fault_kind_is_named() -> None:
    with pytest.raises(BadInput, match=r"unknown fault kind.*meteor"):
        FaultMix.parse("kill,meteor")


def test_a_broken_plan_file_gets_one_line(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"plan\.json: processes"):
        load_plan('{"seed": 1, "processes": 0, "sessions": {}}', where="plan.json")
    with pytest.raises(BadInput, match=r"plan\.json"):
        load_plan("not json", where="plan.json")


def test_first_difference_names_the_line() -> None:
    assert first_difference("a\nb\nc", "a\nx\nc") == "line 2: b | x"
    assert first_difference("a", "a") is None


def test_a_rendered_scenario_replays_the_run(tmp_path: Path) -> None:
    """The scenario file makes the plan's calls in the plan's order: the same timeline."""
    report = run_plan(STALLED)
    source = render(STALLED, report)
    outcome = replay_rendered(STALLED, report, source, seed=STALLED.seed)
    assert same_timeline(outcome, report)
    assert outcome.passed == (report.verdict is Verdict.PASSED)


ODDER = STALLED.model_copy(update={
    "steps": (
        *STALLED.steps,
        Submit(at_s=40.0, process=0, principal="p-1", session="s-1", request_id="r-3",
               text="Read notes-1.txt and notes-2.txt."),
        Drain(at_s=41.0, process=0, session="s-1"),
        Redirect(at_s=43.0, session="s-1", text="Say hello 12 instead."),
        Interrupt(at_s=60.0, session="s-1")),
    "files": {"notes-1.txt": "one", "notes-2.txt": "two"},
    "replies": (ReplyFault(call=1, kind=FaultKind.STREAM_CUT, deltas=2),
                ReplyFault(call=2, kind=FaultKind.OUTAGE),
                ReplyFault(call=5, kind=FaultKind.HUGE_READ),
                ReplyFault(call=7, kind=FaultKind.SLOW_REPLY, seconds=90.0)),
    "tool_timings": (ToolTiming(tool="read_file", path="notes-2.txt", seconds=30.0),),
    "context_window": 900, "fallback_window": 4_000, "verify_before_answer": True})


def test_the_odder_parts_render_as_story_calls_and_replay() -> None:
    """Corrections, interrupts, slow tools, a small window, a fallback route, stream cuts
    and outages render as plain Story calls, and the scenario replays the run."""
    report = run_plan(ODDER)
    assert {FaultKind.STREAM_CUT, FaultKind.OUTAGE, FaultKind.FALLBACK, FaultKind.SLOW_TOOL,
            FaultKind.HUGE_READ} <= report.fired, report.fired
    source = render(ODDER, report)
    for call in ("redirect_a_running_turn(s, 'Say hello 12 instead.'", "s.interrupt(after_s=60.0",
                 "s.world.tools.slow('read_file', 30.0, path='notes-2.txt'",
                 "s.limits(context_window_tokens=900)", "s.world.stream_cuts[1] = 2",
                 "s.use_provider_for('fallback-small', model.for_fallback())",
                 "s.files({'big.log': BIG_LOG_TEXT})", "s.limits(verify_before_answer=True)"):
        assert call in source, call
    outcome = replay_rendered(ODDER, report, source)
    assert same_timeline(outcome, report)


DOOR_AND_SUMMARY = STALLED.model_copy(update={
    "processes": 1,
    "members": {"q-1": "s-1"},
    "steps": (
        Submit(at_s=0.0, process=0, principal="p-1", session="s-1", request_id="r-1",
               text="Read notes-1.txt."),
        Submit(at_s=0.5, process=0, principal="q-1", session="s-1", request_id="r-5",
               text="Say hello 5 from q-1, now.", intent="steer"),
        Submit(at_s=0.7, process=0, principal="p-1", session="s-1", request_id="cron:e-1",
               text="Say hello 6: the cron job is done.", kind="cron"),
        Drain(at_s=2.0, process=0, session="s-1"),
        Interrupt(at_s=30.0, session="s-1")),
    "replies": (ReplyFault(call=1, kind=FaultKind.HUGE_READ),
                ReplyFault(call=3, kind=FaultKind.HUGE_READ)),
    "write_failures": {Site.ADMIT: 1}, "context_window": 900, "summary_failures": (2,),
    "summary_timeouts": (1,), "huge_reads_share_id": True, "summary_delay_s": 30.0})


def test_the_last_drawn_parts_render_as_story_calls_and_replay() -> None:
    """A member's steer, an internal event under a kind, a refused admission write, a
    summary that times out, a slow summarizer and huge reads under one call id (the parts
    drawn last) render as plain Story calls, and the scenario replays the run."""
    report = run_plan(DOOR_AND_SUMMARY)
    source = render(DOOR_AND_SUMMARY, report)
    for call in ("intent='steer'", "kind='cron'", "fail_writes={'admit': 1}",
                 "FlakySummarizer((2,), model, (1,))", "model.summarizer.delay_s = 30.0",
                 "huge_reads_share_id=True"):
        assert call in source, call
    outcome = replay_rendered(DOOR_AND_SUMMARY, report, source)
    assert same_timeline(outcome, report)


def test_the_odder_parts_have_streams_of_their_own() -> None:
    """The parts drawn later (odd replies, interventions, tools, windows) move nothing of
    the parts drawn before them: without their kinds a plan is the older parts alone."""
    older = FaultMix(kinds=frozenset(FaultKind) - set(ODD_KINDS))
    for seed in range(30):
        every, fewer = generate(seed), generate(seed, older)
        later = ("interrupt", "redirect") + (("direct",) if every.lock_stall_s else ())
        assert [s for s in every.steps if s.op not in later or s in fewer.steps] == \
            list(fewer.steps)  # the contention's terminal turns come with the small window
        assert [r for r in every.replies if r.kind not in ODD_KINDS] == list(fewer.replies)
        assert not (fewer.tool_timings or fewer.context_window or fewer.fallback_window
                    or (fewer.verify_before_answer and fewer.iteration_budget is None))


def test_the_verification_gate_is_drawn_only_when_named() -> None:
    """The verification gate with the whole budget is opt-in: ``all`` leaves it out,
    ``all,verify_gate`` draws it (``edges``' budgets draw it with a tight budget, and the
    ``gated`` part beside a small window)."""
    assert FaultKind.VERIFY_GATE not in FaultMix.parse("all").kinds
    named = FaultMix.parse("all,verify_gate")
    assert named.kinds == set(FaultKind)
    plans = [generate(seed) for seed in range(40)]  # with the whole budget: only when named
    assert not any(p.verify_before_answer and p.iteration_budget is None
                   and p.context_window is None for p in plans)
    assert any(generate(seed, named).verify_before_answer for seed in range(40))
    assert any(generate(seed).context_window for seed in range(40))


def test_a_clock_jump_pauses_every_live_process() -> None:
    plan = STALLED.model_copy(update={"steps": (*STALLED.steps[:4],
                                                ClockJump(at_s=2.2, seconds=400.0))})
    report = run_plan(plan)
    assert FaultKind.CLOCK_JUMP in report.fired
    assert "the clock jumps 400 s" in report.timeline


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.heads: list[str] = []
        self.marked_rows = 0
        self._in_head = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "tr" and found.get("class") == "marked":
            self.marked_rows += 1
        self._in_head = tag == "th" and found.get("class") is None

    def handle_data(self, data: str) -> None:
        if self._in_head and data.strip():
            self.heads.append(data.strip())
            self._in_head = False


def test_the_swimlane_has_a_lane_per_process_and_marks_the_faults() -> None:
    report = run_plan(STALLED)
    page = render_html(STALLED, report, report.entries)
    cells = _Cells()
    cells.feed(page)
    assert cells.heads == ["world", "pid 1", "pid 2", "provider", "store", "tools"]
    assert cells.marked_rows >= 1  # the stall
    assert "<script" not in page and "http" not in page.split("<body>")[1]


def test_repeated_lines_fold_into_one_row() -> None:
    entries = [(1.0, "write", "claim s-1 busy", 2), (2.0, "write", "claim s-1 busy", 2),
               (3.0, "call", "primary -> stop", 2)]
    rows = rows_of(entries)
    assert [(r[1], r[4]) for r in rows] == [("write", 2), ("call", 1)]
    assert lanes_of(rows) == ["world", "provider", "store", "tools"]


def test_the_command_line_sweeps_and_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                             ) -> None:
    code = main(["explore", "--seeds", "4", "--faults", "none", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["seeds"] == 4 and data["passed"] == 4
    page = tmp_path / "seed.html"
    code = main(["explore", "--replay", "3", "--faults", "none", "--html", str(page)])
    out = capsys.readouterr().out
    assert code == 0 and "seed 3: passed" in out and page.read_text().startswith("<!DOCTYPE")


def test_the_command_line_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explore", "--seeds", "3", "--shard", "5/2"]) == 2
    assert main(["explore", "--plan", "/nonexistent/plan.json"]) == 2
    assert "hermes-ref:" in capsys.readouterr().err
    for flags, said in ((["--html", "x.html"], "--hunt does not take --html"),
                        (["--store", "sqlite"], "--hunt does not take --store sqlite"),
                        (["--shard", "1/2", "--check-determinism"],
                         "--hunt does not take --shard, --check-determinism"),
                        (["--workers", "0"], "--workers must be 1 or more"),
                        (["--hunt-seeds", "0"], "--hunt-seeds and --workers must be 1 or more"),
                        (["--seed-start", "-1"], "--seed-start 0 or more")):
        assert main(["explore", "--hunt", "cooldown_ignored", *flags]) == 2, flags
        assert said in capsys.readouterr().err, flags


def test_a_one_process_plan_renders_a_scenario_that_runs() -> None:
    plan = STALLED.model_copy(update={"processes": 1, "steps": tuple(
        s.model_copy(update={"process": 0}) for s in STALLED.steps)})
    report = run_plan(plan)
    outcome = replay_rendered(plan, report)
    assert outcome.error is None or "expectation" in outcome.error, outcome.error
    assert same_timeline(outcome, report)


def test_a_fault_counts_as_fired_only_when_it_lands() -> None:
    """A kill or a stall scheduled after the world went quiet never happens; a clock jump's
    pauses are not stalls; a crash point is not a kill."""
    late = STALLED.model_copy(update={
        "steps": (*STALLED.steps[:4], Kill(at_s=5000.0, process=0),
                  Stall(at_s=5000.0, process=1, seconds=10.0), ClockJump(at_s=2.2, seconds=60.0)),
        "crash": CrashPoint(when="before", site=Site.FINAL)})
    report = run_plan(late)
    assert FaultKind.CLOCK_JUMP in report.fired and FaultKind.CRASH_POINT in report.fired
    assert FaultKind.KILL not in report.fired and FaultKind.STALL not in report.fired


@pytest.mark.parametrize(("change", "says"), [
    ({"steps": [{"op": "drain", "at_s": 1, "process": 5, "session": "s-1"}]}, "names process 5"),
    ({"steps": [{"op": "drain", "at_s": 1, "process": 0, "session": "s-9"}]}, "session 's-9'"),
    ({"steps": [{"op": "stall", "at_s": -1, "process": 0, "seconds": 3}]}, "greater than or equal"),
    ({"replies": [{"call": 0, "kind": "empty_reply"}]}, "greater than or equal to 1"),
])
def test_a_plan_that_names_what_is_not_there_is_bad_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object],
        says: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"seed": 1, "processes": 2, "sessions": {"s-1": "p-1"}, **change}))
    assert main(["explore", "--plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_merge_checks_each_report() -> None:
    good = sweep(0, 2, mix=FaultMix.parse("none")).as_json()
    with pytest.raises(BadInput, match=r"report 2 is not a sweep report: failures"):
        merge([good, {**good, "failures": "abc"}])
    with pytest.raises(BadInput, match=r"fired\.kill"):
        merge([{**good, "fired": {"kill": "many"}}])


def test_the_kept_plan_of_the_frozen_holder_passes() -> None:
    """The plan the explorer shrank (fixtures/explore/frozen-holder.json) is kept as data:
    before the driver asked the store, it broke LEASE-4."""
    plan = load_plan((Path(__file__).parents[2] / "fixtures/explore/frozen-holder.json")
                     .read_text(encoding="utf-8"))
    report = run_plan(plan)
    assert report.verdict is Verdict.PASSED, report.violations
    assert "model call with token 1 refused: the lease is gone" in report.timeline
