"""The tool round's decisions, pinned where mutation testing found them unobserved.

Segment planning is checked on the catalog's tools and on specs of kinds the catalog does
not use (a parallel-safe tool, a reader under another name); the round itself runs on the
scripted rig, and a few checks run the whole turn. See docs/mutation.md.
"""

from __future__ import annotations

import json

import pytest

from hermes_ref import effects as fx
from hermes_ref import finalizer, loop, tool_round
from hermes_ref.context import TurnContext
from hermes_ref.errors import InvariantBroken
from hermes_ref.limits import Limits
from hermes_ref.models import (
    EventKind,
    Message,
    ProviderReply,
    Role,
    ToolCall,
    ToolKind,
    ToolResult,
    ToolSpec,
)
from hermes_ref.outcomes import ExitReason
from hermes_ref.phases import Phase
from hermes_ref.tool_specs import REFERENCE_TOOLS, TOOLS_BY_NAME
from tests.unit.test_mutants_rig import Rig, context, failing

PING = ToolSpec(name="ping", description="p", kind=ToolKind.PARALLEL_SAFE)
PEEK = ToolSpec(name="peek", description="p", kind=ToolKind.READER)
SAVE = ToolSpec(name="save", description="s", kind=ToolKind.WRITER)
SPECS = {**TOOLS_BY_NAME, "ping": PING, "peek": PEEK, "save": SAVE}
HISTORY = (Message(role=Role.USER, content="go", row_id=1, turn_id="t"),)


def call(name: str, arguments: str | None = None, **args: object) -> ToolCall:
    raw = arguments if arguments is not None else json.dumps(args)
    return ToolCall(id=f"{name}{len(raw)}{raw}", name=name, arguments=raw)


def shape(*calls: ToolCall) -> list[tuple[bool, list[str]]]:
    return [(s.parallel, [c.name for c in s.calls])
            for s in tool_round.plan_segments(calls, SPECS)]


def round_of(*calls: ToolCall) -> Message:
    return Message(role=Role.ASSISTANT, tool_calls=calls, turn_id="t")


def next_call(ctx: TurnContext) -> TurnContext:
    """Walk the phases to the next model call, as the loop does between rounds."""
    if ctx.tracker.phase is Phase.TOOL_ROUND:
        ctx.enter(Phase.PREFLIGHT)
        ctx.enter(Phase.MODEL_CALL)
    return ctx


def test_parallel_safe_tools_share_a_segment_and_admit_a_writer() -> None:
    """Parallel-safe calls join one run, and a writer joins it: they have no path."""
    assert shape(call("ping"), call("ping")) == [(True, ["ping", "ping"])]
    assert shape(call("ping"), call("write_file", path="a", content="")) == [
        (True, ["ping", "write_file"])]


def test_a_parallel_safe_call_with_unusable_arguments_is_a_barrier() -> None:
    """Arguments that are not a JSON object make even a parallel-safe call run alone."""
    assert shape(call("ping", "[1]"), call("ping")) == [(False, ["ping"]), (False, ["ping"])]


def test_a_writer_is_checked_against_every_path_in_the_run() -> None:
    """A pathless call in the run does not hide a later read of the path being written."""
    assert shape(call("ping"), call("read_file", path="a"), call("write_file", path="a",
                                                                 content="")) == [
        (True, ["ping", "read_file"]), (False, ["write_file"])]


def test_the_turn_specs_decide_a_path_scoped_kind() -> None:
    """A reader the catalog does not know is still planned by its own spec."""
    assert shape(call("peek", path="a"), call("peek", path="b")) == [(True, ["peek", "peek"])]


def test_the_workspace_root_overlaps_every_path() -> None:
    """Writing the root, or searching it, conflicts with any other path in the run."""
    assert shape(call("read_file", path="x"), call("write_file", path=".", content="")) == [
        (False, ["read_file"]), (False, ["write_file"])]
    assert shape(call("search_files", pattern="p"), call("write_file", path="x", content="")) == [
        (False, ["search_files"]), (False, ["write_file"])]
    assert shape(call("read_file", path=".."), call("write_file", path="x", content="")) == [
        (False, ["read_file"]), (False, ["write_file"])]


def test_writing_a_folder_conflicts_with_reading_inside_it() -> None:
    """A write to 'd' after a read of 'd/f' starts a new segment."""
    assert shape(call("read_file", path="d/f"), call("write_file", path="d", content="")) == [
        (False, ["read_file"]), (False, ["write_file"])]


def test_a_writer_without_a_usable_path_is_a_barrier() -> None:
    """A write with no path, or a blank one, runs alone."""
    assert shape(call("read_file", path="a"), call("write_file", content="")) == [
        (False, ["read_file"]), (False, ["write_file"])]
    assert shape(call("read_file", path="a"), call("write_file", path="  ", content="")) == [
        (False, ["read_file"]), (False, ["write_file"])]


def test_a_recorded_round_runs_fenced_and_reports_progress() -> None:
    """Tools run under the lease token; each segment's event lists its calls and errors."""
    rig = Rig(ExecuteTools=lambda e: tuple(
        ToolResult(call_id=c.id, name=c.name, content="x", is_error=c.name == "write_file")
        for c in e.calls))
    ctx = context(HISTORY, phase=Phase.MODEL_CALL, tools=REFERENCE_TOOLS, token=7)
    a, b = call("read_file", path="a"), call("write_file", path="b", content="")
    assert rig.run(tool_round.run_tool_round(ctx, round_of(a, b))) is True
    (execute,) = rig.of(fx.ExecuteTools)
    assert (execute.lease_token, execute.session_id, execute.parallel) == (7, "s", True)
    (event,) = [e.event for e in rig.of(fx.Emit)]
    assert event.kind is EventKind.TOOL_PROGRESS
    assert event.data == {"calls": [a.id, b.id], "parallel": True, "errors": 1}
    results = [m for m in rig.written() if m.role is Role.TOOL]
    assert [(m.tool_call_id, m.tool_name) for m in results] == [(a.id, "read_file"),
                                                                 (b.id, "write_file")]


def test_a_round_that_cannot_be_recorded_reports_the_end() -> None:
    """A failed write of the calls or of their results returns False: the turn must end."""
    ctx = context(HISTORY, phase=Phase.MODEL_CALL, tools=REFERENCE_TOOLS)
    assert Rig(AppendMessages=failing()).run(
        tool_round.run_tool_round(ctx, round_of(call("read_file", path="a")))) is False
    rig = Rig()
    rig._handlers[fx.AppendMessages] = lambda e: failing()(e) if e.label is fx.Site.TOOL_RESULTS \
        else rig.store(e)
    ctx = context(HISTORY, phase=Phase.MODEL_CALL, tools=REFERENCE_TOOLS)
    assert rig.run(tool_round.run_tool_round(ctx, round_of(call("read_file", path="a")))) is False
    assert ctx.ending.reason is ExitReason.PERSISTENCE_FAILED


def test_all_invalid_rounds_end_the_turn_at_their_limit() -> None:
    """Invalid rounds below the limit continue; the limit-th ends the turn naming the calls."""
    ctx = context(HISTORY, phase=Phase.MODEL_CALL, tools=REFERENCE_TOOLS,
                  limits=Limits(invalid_tool_rounds_max=2))
    bad = round_of(call("nope"), call("nada"))
    assert Rig().run(tool_round.run_tool_round(next_call(ctx), bad)) is True
    assert Rig().run(tool_round.run_tool_round(next_call(ctx), bad)) is False
    assert (ctx.ending.reason, ctx.ending.detail) == (
        ExitReason.INVALID_TOOL_CALLS, "model generated invalid tool calls: nope, nada")
    rig = Rig()
    rig._handlers[fx.AppendMessages] = lambda e: failing()(e) if e.label is fx.Site.TOOL_RESULTS \
        else rig.store(e)
    ctx = context(HISTORY, phase=Phase.MODEL_CALL, tools=REFERENCE_TOOLS)
    assert rig.run(tool_round.run_tool_round(ctx, bad)) is False
    assert ctx.ending.reason is ExitReason.PERSISTENCE_FAILED


def test_a_valid_round_resets_the_invalid_round_count() -> None:
    """Invalid, valid, invalid: with a limit of two the turn goes on."""
    ctx = context(HISTORY, phase=Phase.MODEL_CALL, tools=REFERENCE_TOOLS,
                  limits=Limits(invalid_tool_rounds_max=2))
    for message in (round_of(call("nope")), round_of(call("read_file", path="a")),
                    round_of(call("nope"))):
        Rig().run(tool_round.run_tool_round(next_call(ctx), message))
    assert not ctx.ended


def test_a_tool_round_resets_the_dropped_call_count() -> None:
    """Dropped, tool round, dropped: with one re-prompt allowed, both are re-prompted."""
    dropped = ProviderReply(finish_reason="tool_calls")
    tools = ProviderReply(finish_reason="tool_calls",
                          tool_calls=(call("read_file", path="a"),))
    rig = Rig([dropped, tools, dropped, ProviderReply(content="done")])
    ctx = context(HISTORY, phase=Phase.PROLOGUE, tools=REFERENCE_TOOLS,
                  limits=Limits(dropped_toolcall_retries_max=1))
    rig.run(loop.run_loop(ctx))
    last = rig.of(fx.CallProvider)[-1].request.messages
    assert last[-1].scaffold is not None and last[-1].content is not None
    assert "no tool call" in last[-1].content


def test_a_driver_that_drops_a_result_is_an_engine_bug_naming_the_call() -> None:
    """The tools must answer every call they ran; a missing one names its call id."""
    rig = Rig(ExecuteTools=lambda e: ())
    ctx = context(HISTORY, phase=Phase.MODEL_CALL, tools=REFERENCE_TOOLS)
    with pytest.raises(InvariantBroken, match="read_file"):
        rig.run(tool_round.run_tool_round(ctx, round_of(call("read_file", path="a"))))


def _footer_of(*results: tuple[ToolCall, bool], tools: tuple[ToolSpec, ...] = REFERENCE_TOOLS
               ) -> str:
    """Run one round with the given calls (True = the call fails), then a text answer."""
    errors = {c.id for c, fails in results if fails}
    rig = Rig([ProviderReply(finish_reason="tool_calls", tool_calls=tuple(c for c, _ in results)),
               ProviderReply(content="Done.")],
              ExecuteTools=lambda e: tuple(ToolResult(call_id=c.id, name=c.name, content="r",
                                                      is_error=c.id in errors) for c in e.calls))
    ctx = context(HISTORY, phase=Phase.PROLOGUE, tools=tools)
    rig.run(loop.run_loop(ctx))
    result = rig.run(finalizer.finalize(ctx))
    return result.final_response or ""


def test_only_failed_writes_are_listed_in_the_answer() -> None:
    """A failed read is not a failed change; a failed write next to a read is listed."""
    read, write = call("read_file", path="a"), call("write_file", path="b", content="")
    assert _footer_of((read, True)) == "Done."
    assert _footer_of((read, False), (write, True)).endswith("b (write_file)]")


def test_a_failed_write_is_known_by_the_turn_spec() -> None:
    """A writer under a name the catalog does not know is still tracked."""
    footer = _footer_of((call("save", path="n.txt"), True), tools=(*REFERENCE_TOOLS, SAVE))
    assert footer.endswith("n.txt (save)]")
