"""Pure decisions of the engine, tested directly."""

from __future__ import annotations

import json
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hermes_ref.compression import CompressionState
from hermes_ref.context import IterationBudget, SessionCache, TurnContext, TurnState
from hermes_ref.effects import Now
from hermes_ref.engine import Engine
from hermes_ref.errors import BadInput, IllegalTransition
from hermes_ref.limits import Limits
from hermes_ref.loop import cleared_to_send, dropped_call, handle_reply
from hermes_ref.models import Lease, Message, ProviderReply, Role, ScaffoldFlag, ToolCall
from hermes_ref.outcomes import ExitReason
from hermes_ref.phases import TRANSITIONS, Phase, PhaseTracker, render_mermaid
from hermes_ref.prologue import compose_api_content
from hermes_ref.scaffolding import DROPPED_TOOLCALL_NUDGE
from hermes_ref.tool_round import plan_segments
from hermes_ref.tool_specs import REFERENCE_TOOLS, TOOLS_BY_NAME
from hermes_ref.transcript import Transcript
from sim.faults import CrashPoint

T = TypeVar("T")


def call(name: str, **args: object) -> ToolCall:
    return ToolCall(id=f"{name}-{len(args)}-{json.dumps(args, sort_keys=True)}", name=name,
                    arguments=json.dumps(args))


def shape(calls: list[ToolCall]) -> list[tuple[bool, list[str]]]:
    return [(s.parallel, [c.name for c in s.calls]) for s in plan_segments(tuple(calls), TOOLS_BY_NAME)]


def test_readers_on_distinct_paths_share_a_segment() -> None:
    """Three reads of different files form one parallel segment."""
    calls = [call("read_file", path=p) for p in ("a", "b", "c")]
    assert shape(calls) == [(True, ["read_file"] * 3)]


def test_writer_overlap_closes_the_segment() -> None:
    """A write to a path a read in the run touches starts a new segment."""
    calls = [call("read_file", path="a.txt"), call("write_file", path="a.txt", content="x")]
    assert shape(calls) == [(False, ["read_file"]), (False, ["write_file"])]


def test_readers_may_overlap_each_other() -> None:
    """Two reads of the same file stay parallel: readers do not conflict."""
    calls = [call("read_file", path="a/x"), call("read_file", path="a/x")]
    assert shape(calls) == [(True, ["read_file", "read_file"])]


def test_directory_prefix_counts_as_overlap() -> None:
    """Writing 'a/b' conflicts with searching 'a', but 'ab' does not conflict with 'a'."""
    assert shape([call("search_files", pattern="x", path="a"),
                  call("write_file", path="a/b", content="")]) == [
        (False, ["search_files"]), (False, ["write_file"])]
    assert shape([call("read_file", path="a"), call("write_file", path="ab", content="")]) == [
        (True, ["read_file", "write_file"])]


def test_barriers_keep_model_order() -> None:
    """Sequential tools and unknown tools split runs and never move."""
    calls = [call("read_file", path="a"), call("terminal", command="ls"),
             call("read_file", path="b"), call("nope")]
    assert shape(calls) == [(False, ["read_file"]), (False, ["terminal"]),
                            (False, ["read_file"]), (False, ["nope"])]


def test_unparsable_arguments_are_a_barrier() -> None:
    """A call whose arguments are not a JSON object runs alone."""
    bad = ToolCall(id="x", name="read_file", arguments="{not json")
    assert shape([call("read_file", path="a"), bad, call("read_file", path="b")]) == [
        (False, ["read_file"]), (False, ["read_file"]), (False, ["read_file"])]


@given(st.lists(st.sampled_from(["read_file", "write_file", "terminal", "search_files"]),
                max_size=8))
def test_plan_preserves_every_call_in_order(names: list[str]) -> None:
    """Segmentation never drops, duplicates or reorders calls."""
    calls = [ToolCall(id=str(i), name=n, arguments=json.dumps({"path": f"p{i % 3}",
             "content": "", "pattern": "x", "command": "ls"})) for i, n in enumerate(names)]
    flat = [c.id for s in plan_segments(tuple(calls), TOOLS_BY_NAME) for c in s.calls]
    assert flat == [c.id for c in calls]


def test_budget_consumes_and_refunds_within_bounds() -> None:
    """Consume stops at the maximum; a refund never goes below zero (LOOP-2)."""
    budget = IterationBudget(2)
    assert [budget.consume(), budget.consume(), budget.consume()] == [True, True, False]
    budget.refund()
    assert budget.remaining == 1
    empty = IterationBudget(1)
    empty.refund()
    assert empty.used == 0


def test_illegal_phase_transition_is_an_engine_bug() -> None:
    """The tracker refuses a transition the table does not list."""
    tracker = PhaseTracker()
    tracker.enter(Phase.PROLOGUE)
    with pytest.raises(IllegalTransition):
        tracker.enter(Phase.TOOL_ROUND)


def test_every_phase_can_reach_done() -> None:
    """The transition table has no dead ends."""
    for start in Phase:
        seen, todo = {start}, [start]
        while todo:
            for nxt in TRANSITIONS[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert Phase.DONE in seen or start is Phase.DONE
    assert "tool_round --> preflight" in render_mermaid()


def test_transcript_tracks_tokens_and_drops_scaffolding() -> None:
    """The running token total follows appends and scaffolding removal."""
    t = Transcript([Message(role=Role.USER, content="hello world")])
    nudge = Message(role=Role.USER, content="nudge", scaffold=ScaffoldFlag.EMPTY_RECOVERY)
    t.append(nudge)
    before = t.tokens
    assert t.drop_scaffolding() == 1
    assert t.tokens == before - nudge.tokens == sum(m.tokens for m in t)


def test_a_hidden_row_adds_no_tokens_to_the_request() -> None:
    """The running total is what a request carries: a hidden row stays off the wire (LOOP-4),
    so preflight does not count it against the window (CMP-7)."""
    cut = Message(role=Role.ASSISTANT, content="", hidden=True)
    correction = Message(role=Role.USER, content="Say hello 59 instead.")
    t = Transcript([Message(role=Role.USER, content="Read notes-2.txt."), cut, correction])
    shown = [m for m in t if not m.hidden]
    assert t.tokens == sum(m.tokens for m in shown) and cut.tokens > 0
    t.replace_last(cut)
    assert t.tokens == sum(m.tokens for m in shown[:-1])


def test_copy_does_not_share_the_list() -> None:
    """A turn's copy of the history never changes the cached list (CTX-2)."""
    cached = Transcript([Message(role=Role.USER, content="a")])
    work = cached.copy()
    work.append(Message(role=Role.ASSISTANT, content="b"))
    assert len(cached) == 1 and len(work) == 2


def test_trailing_open_calls_sees_only_the_last_group() -> None:
    """Missing results are reported for the trailing assistant row only."""
    calls = (ToolCall(id="a", name="read_file"), ToolCall(id="b", name="read_file"))
    t = Transcript([Message(role=Role.USER, content="q"),
                    Message(role=Role.ASSISTANT, tool_calls=calls),
                    Message(role=Role.TOOL, content="r", tool_call_id="a")])
    owner, missing = t.trailing_open_calls()
    assert owner is not None and missing == ["b"]


def test_wire_form_hides_bookkeeping_and_replays_sidecar() -> None:
    """The wire carries the sidecar text and none of the local fields (WIRE-1, WIRE-3)."""
    sent = compose_api_content("hi", "memory: X")
    m = Message(role=Role.USER, content="hi", api_content=sent, row_id=3, turn_id="t",
                created_at=1.0)
    assert m.wire == {"role": "user", "content": sent}
    assert compose_api_content("hi", None) is None


def test_model_copy_recomputes_cached_wire() -> None:
    """A changed copy never serves the old wire bytes (WIRE-2)."""
    m = Message(role=Role.ASSISTANT, content="old", api_content="old+ctx")
    assert m.wire["content"] == "old+ctx"
    n = m.model_copy(update={"content": "new", "api_content": None})
    assert n.wire["content"] == "new"


@pytest.mark.parametrize("text", ["during:tools", "before:nowhere", "after:tool_calls#x", ""])
def test_bad_crash_point_names_what_is_wrong(text: str) -> None:
    """A malformed crash point is refused with the accepted form and sites."""
    with pytest.raises(BadInput, match="before\\|after"):
        CrashPoint.parse(text)


def test_crash_point_round_trips() -> None:
    """Parsed crash points print back in the same form."""
    assert CrashPoint.parse("after:tools#2").name == "after:tools#2"
    assert CrashPoint.parse("before:final").occurrence == 1


@given(st.lists(st.text(max_size=12), min_size=1, max_size=6), st.booleans())
def test_request_json_bytes_equal_the_wire_form(texts: list[str], with_tools: bool) -> None:
    """The byte-joined body parses to the messages' wire forms and the head, whatever the text."""
    from hermes_ref.tool_specs import REFERENCE_TOOLS
    from hermes_ref.wire import ProviderRequest

    messages = tuple(Message(role=Role.USER if i % 2 == 0 else Role.ASSISTANT, content=t)
                     for i, t in enumerate(texts))
    request = ProviderRequest(model="m", messages=messages,
                              tools=REFERENCE_TOOLS if with_tools else (), prompt_tokens=1)
    tools = {"tools": [t.wire() for t in REFERENCE_TOOLS]} if with_tools else {}
    assert json.loads(request.body()) == {"messages": [m.wire for m in messages], "model": "m",
                                          **tools}


def test_dot_dot_paths_are_normalized_before_planning() -> None:
    """'a/../b.txt' is 'b.txt': a write there conflicts with a write to b.txt (TOOL-4)."""
    calls = [call("write_file", path="a/../b.txt", content="1"),
             call("write_file", path="b.txt", content="2")]
    assert shape(calls) == [(False, ["write_file"]), (False, ["write_file"])]


def test_paths_outside_the_workspace_overlap_everything() -> None:
    """A path that climbs out of the workspace never shares a segment with a writer."""
    calls = [call("read_file", path="../x"), call("write_file", path="y", content="")]
    assert shape(calls) == [(False, ["read_file"]), (False, ["write_file"])]


def test_a_store_that_changes_rows_is_an_engine_bug() -> None:
    """The paired check after a write refuses rows that came back different (InvariantBroken)."""
    from hermes_ref.context import check_stored
    from hermes_ref.errors import InvariantBroken

    sent = (Message(role=Role.USER, content="hi"),)
    good = (sent[0].model_copy(update={"row_id": 7}),)
    check_stored(sent, good)
    for bad in ((), (sent[0],), (sent[0].model_copy(update={"row_id": 7, "content": "HI"}),)):
        with pytest.raises(InvariantBroken):
            check_stored(sent, bad)


# ---- loop decisions: dropped calls (LOOP-7) and requests preflight refuses (LOOP-2) ----------


def _turn_context(**limits: object) -> TurnContext:
    """A bare turn context: one user row, no store behind it (the steps below await nothing)."""
    system = Message(role=Role.SYSTEM, content="You are terse.")
    tracker = PhaseTracker()
    tracker.enter(Phase.PROLOGUE)
    return TurnContext(
        session_id="s-1", turn_id="turn-1", limits=Limits.model_validate(limits), tools=(),
        cache=SessionCache("s-1", system.content or "", system),
        lease=Lease(session_id="s-1", holder="pid=1", token=1, acquired_at=0.0, expires_at=300.0),
        tracker=tracker, state=TurnState(budget=IterationBudget(5)),
        transcript=Transcript([Message(role=Role.USER, content="What does a.txt say?", row_id=1)]),
    )


def _settle(step: Coroutine[Any, Any, T]) -> T:
    """Run a core step that performs no effect; awaiting one would be a surprise here."""
    try:
        step.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]  # StopIteration.value is Any
    raise AssertionError("the step awaited an effect")


def test_a_reply_that_only_narrates_its_tool_call_is_a_dropped_call() -> None:
    """finish_reason=tool_calls without calls is a dropped call whatever text it carries."""
    assert dropped_call(ProviderReply(content="Let me read a.txt now.", finish_reason="tool_calls"))
    assert dropped_call(ProviderReply(content=None, finish_reason="tool_calls"))
    assert not dropped_call(ProviderReply(content="It says alpha.", finish_reason="stop"))
    with_call = ProviderReply(content="Reading.", finish_reason="tool_calls",
                              tool_calls=(call("read_file", path="a.txt"),))
    assert not dropped_call(with_call)


def test_narration_is_replayed_as_scaffolding_and_never_becomes_the_answer() -> None:
    """A narrated dropped call adds the narration and the nudge as scaffolding; no exit is recorded."""
    ctx = _turn_context()
    _settle(handle_reply(ctx, ProviderReply(content="Let me read a.txt now.",
                                            finish_reason="tool_calls")))
    added = ctx.transcript.messages()[1:]
    assert [(m.role, m.content, m.scaffold) for m in added] == [
        (Role.ASSISTANT, "Let me read a.txt now.", ScaffoldFlag.DROPPED_TOOLCALL_NUDGE),
        (Role.USER, DROPPED_TOOLCALL_NUDGE, ScaffoldFlag.DROPPED_TOOLCALL_NUDGE)]
    assert not ctx.ended and ctx.transcript.pending() == ()


def test_past_the_bound_a_narrated_dropped_call_is_the_answer() -> None:
    """Once the re-prompts are used up, the narration is taken as the final answer (LOOP-7)."""
    ctx = _turn_context(dropped_toolcall_retries_max=1)
    ctx.state.dropped_toolcall_retries = 1
    _settle(handle_reply(ctx, ProviderReply(content="I will read it.", finish_reason="tool_calls")))
    assert ctx.ending.answer == "I will read it." and ctx.ending.reason is ExitReason.TEXT_RESPONSE


def test_a_request_preflight_refuses_costs_nothing() -> None:
    """A refused request gives back its budget unit and counts no API call (LOOP-2, CMP-7).

    Over the threshold, preflight reads the clock to decide on compaction; one user row is
    nothing to compact, so the turn fails closed.
    """
    ctx = _turn_context(context_window_tokens=5)
    assert ctx.state.budget.consume()
    step = cleared_to_send(ctx)
    assert isinstance(step.send(None), Now)
    try:
        step.send(1_767_225_600.0)
    except StopIteration as done:
        assert done.value is False
    else:
        raise AssertionError("preflight awaited another effect")
    assert (ctx.state.budget.used, ctx.state.api_calls) == (0, 0)
    assert ctx.ending.reason is ExitReason.COMPRESSION_EXHAUSTED


def test_a_request_that_fits_costs_one_unit_and_one_call() -> None:
    """A request within the window keeps its unit and counts one API call."""
    ctx = _turn_context()
    assert ctx.state.budget.consume()
    assert _settle(cleared_to_send(ctx)) is True
    assert (ctx.state.budget.used, ctx.state.api_calls) == (1, 1)


def test_hydrated_memory_counter_keeps_the_cadence() -> None:
    """7 user rows at interval 3 hydrate the memory counter to 1; the next turn ticks it to 2 (CTX-1)."""
    from hermes_ref.context import NudgeCounters

    nudges = NudgeCounters()
    nudges.hydrate(7, 3)
    assert (nudges.user_turns, nudges.turns_since_memory) == (7, 1)
    assert nudges.count_user_turn(3, memory_offered=True) is False
    assert (nudges.user_turns, nudges.turns_since_memory) == (8, 2)
    assert nudges.count_user_turn(3, memory_offered=True) is True
    assert nudges.turns_since_memory == 0


def test_memory_review_needs_an_interval_and_the_tool() -> None:
    """Interval 0 never makes a review due; a due review without the memory tool is skipped."""
    from hermes_ref.context import NudgeCounters

    off = NudgeCounters()
    assert not any(off.count_user_turn(0, memory_offered=True) for _ in range(5))
    assert (off.user_turns, off.turns_since_memory) == (5, 0)
    toolless = NudgeCounters()
    assert [toolless.count_user_turn(2, memory_offered=False) for _ in range(4)] == [False] * 4
    assert toolless.turns_since_memory == 0


def test_caller_history_copy_is_the_turns_own() -> None:
    """The copy shares no list with the caller and drops another store's row and turn ids (CTX-2)."""
    from hermes_ref.prologue import adopt_history

    caller = [Message(role=Role.USER, content="a", row_id=9, turn_id="elsewhere"),
              Message(role=Role.ASSISTANT, content="b")]
    work = adopt_history(caller)
    assert work is not None and adopt_history(None) is None
    work.append(Message(role=Role.USER, content="c"))
    caller.append(Message(role=Role.USER, content="d"))
    assert [m.content for m in work] == ["a", "b", "c"]
    assert [m.content for m in caller] == ["a", "b", "d"] and caller[0].row_id == 9
    assert all(m.row_id is None and m.turn_id is None for m in work)


@pytest.mark.parametrize("message", [Message(role=Role.SYSTEM, content="be brief"),
                                     Message(role=Role.USER, content="nudge",
                                             scaffold=ScaffoldFlag.EMPTY_RECOVERY)])
def test_a_history_with_a_prompt_or_scaffolding_is_refused(message: Message) -> None:
    """A caller's history holds the conversation only: a system message or scaffolding is BadInput."""
    from hermes_ref.prologue import TurnInput

    with pytest.raises(BadInput, match="history message 1"):
        TurnInput("s-1", "hi", history=[Message(role=Role.USER, content="q"), message])


def test_seeded_history_hydrates_the_counters() -> None:
    """A seed of 7 user turns at interval 3 leaves the memory counter at 2 after the turn (CTX-1)."""
    from pathlib import Path

    from sim.harness import Story
    from sim.provider import text

    s = Story(store_kind="memory", workdir=Path("unused-by-the-memory-store"), trace=False)
    s.limits(memory_nudge_interval=3)
    s.script(text("ok"))
    history = [Message(role=Role.USER if i % 2 == 0 else Role.ASSISTANT, content=f"m{i}")
               for i in range(14)]
    s.turn("hi", history=history)
    nudges = s.engine.caches["s-1"].nudges
    assert (nudges.user_turns, nudges.turns_since_memory) == (8, 2)
    assert s.violations == []


def test_skill_counter_survives_the_prologue() -> None:
    """iters_since_skill set to 5 before a turn is still 5 after it: turns do not reset it (CTX-1)."""
    from pathlib import Path

    from sim.harness import Story
    from sim.provider import text

    s = Story(store_kind="memory", workdir=Path("unused-by-the-memory-store"), trace=False)
    s.script(text("one"), text("two"))
    s.turn("first")
    s.engine.caches["s-1"].nudges.iters_since_skill = 5
    s.turn("second")
    nudges = s.engine.caches["s-1"].nudges
    assert (nudges.iters_since_skill, nudges.user_turns) == (5, 2)


def test_a_stored_row_takes_the_place_of_its_newest_twin() -> None:
    """A row appended and then stored replaces itself, not an older unstored row of the same text."""
    from hermes_ref.transcript import Transcript

    failed = Message(role=Role.ASSISTANT, content="Done.")
    again = Message(role=Role.ASSISTANT, content="Done.")
    t = Transcript()
    t.extend([failed, again])
    t.absorb((again.model_copy(update={"row_id": 7}),))
    assert [m.row_id for m in t] == [None, 7]


def test_a_manual_compaction_may_be_asked_for_a_child_the_engine_rotated_to() -> None:
    """CMP-4 across CMP-5: the engine carries a rotated child's compression memory to the
    child's first turn, so it may be asked to compact that child; a session it knows
    nothing of is still refused."""
    engine = Engine(limits=Limits(), tools=REFERENCE_TOOLS, holder="pid=1:pidns=test")
    engine.carried["child-1"] = CompressionState()
    engine.request_compaction("child-1")
    assert engine.carried["child-1"].manual_pending
    with pytest.raises(BadInput):
        engine.request_compaction("stranger")
