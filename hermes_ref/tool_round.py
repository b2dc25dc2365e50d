"""One tool round: persist the calls, then run them, then persist the results.

Theory of operation
-------------------
The order inside a round is the heart of crash safety (TOOL-1)::

    await AppendMessages(token, sid, (assistant_with_calls,), "tool_calls")   # durable first
    for segment in plan_segments(calls):
        results = await ExecuteTools(token, sid, segment.calls, segment.parallel)
        await AppendMessages(token, sid, result_rows, "tool_results")

If the process dies after the first line, the record shows calls without results and
recovery reports them as unknown instead of running them again (TOOL-10). If the first
write fails, no tool runs and the turn ends ``session_persistence_failed``. Results are
appended to the model's view only after they are durable (TOOL-8).

Every call keeps its place (TOOL-2): a call to a tool that does not exist gets an error
result in place and is never dispatched; [3] all-invalid rounds in a row end the turn as a
failure (``invalid_tool_calls``). Every call id gets exactly one result (TOOL-3).

``plan_segments`` (TOOL-4) cuts the model's calls into segments that keep the model's
order: path readers share a segment unless a writer touches an overlapping path,
declared parallel-safe tools join, interactive tools and unparsable arguments are
barriers, and everything else runs alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from hermes_ref.context import TurnContext
from hermes_ref.effects import Emit, ExecuteTools
from hermes_ref.models import Event, Message, Role, ToolCall, ToolKind, ToolResult, ToolSpec
from hermes_ref.outcomes import ExitReason
from hermes_ref.phases import Phase
from hermes_ref.tool_specs import scoped_path


@dataclass(frozen=True, slots=True)
class Segment:
    calls: tuple[ToolCall, ...]
    parallel: bool


def _path_of(call: ToolCall, spec: ToolSpec) -> str | None:
    """The call's normalized path; "" (overlaps everything) for the root or outside it."""
    path = scoped_path(call, spec)
    if path is None or not path.strip():
        return None
    if path in (".", "..") or path.startswith("../"):
        return ""
    return path


def _overlaps(a: str, b: str) -> bool:
    """Component-prefix overlap: 'a' overlaps 'a/b'; 'ab' does not overlap 'a'."""
    if a == "" or b == "":
        return True
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def _joins(run: list[tuple[ToolCall, ToolSpec, str | None]], spec: ToolSpec, path: str) -> bool:
    for _, other_spec, other_path in run:
        if other_path is None:
            continue
        both_readers = spec.kind is ToolKind.READER and other_spec.kind is ToolKind.READER
        if not both_readers and _overlaps(path, other_path):
            return False
    return True


def plan_segments(calls: tuple[ToolCall, ...], specs: dict[str, ToolSpec]) -> list[Segment]:
    """Cut calls into ordered segments (TOOL-4). Unknown tools are planned as barriers."""
    segments: list[Segment] = []
    run: list[tuple[ToolCall, ToolSpec, str | None]] = []

    def close_run() -> None:
        if run:
            segments.append(Segment(tuple(c for c, _, _ in run), parallel=len(run) > 1))
            run.clear()

    for call in calls:
        spec = specs.get(call.name)
        joinable = spec is not None and call.arguments_object is not None
        path: str | None = None
        if spec is not None and joinable and spec.kind in (ToolKind.READER, ToolKind.WRITER):
            path = _path_of(call, spec)
            joinable = path is not None and _joins(run, spec, path)
            if not joinable and path is not None:
                close_run()
                run.append((call, spec, path))
                continue
        elif spec is not None and joinable:
            joinable = spec.kind is ToolKind.PARALLEL_SAFE
        if spec is not None and joinable:
            run.append((call, spec, path))
            continue
        close_run()
        segments.append(Segment((call,), parallel=False))
    close_run()
    return segments


def _result_row(ctx: TurnContext, result: ToolResult) -> Message:
    return Message(
        role=Role.TOOL,
        content=result.content,
        tool_call_id=result.call_id,
        tool_name=result.name,
        turn_id=ctx.turn_id,
    )


def unknown_tool_result(call: ToolCall, known: list[str]) -> ToolResult:
    return ToolResult(
        call_id=call.id,
        name=call.name,
        content=f"error: tool {call.name!r} does not exist; available tools: {', '.join(known)}",
        is_error=True,
        disposition="none",
    )


def _fail_persistence(ctx: TurnContext) -> None:
    ctx.finish(
        ExitReason.PERSISTENCE_FAILED, ctx.state.persistence_cause or "unknown", failed=True
    )
    ctx.final_response = ""


async def run_tool_round(ctx: TurnContext, assistant: Message) -> bool:
    """Persist, execute and record one round. Returns False when the turn must end."""
    ctx.enter(Phase.TOOL_ROUND)
    specs = {t.name: t for t in ctx.tools}
    if not await ctx.persist((assistant,), "tool_calls"):
        _fail_persistence(ctx)
        return False
    ctx.state.dropped_toolcall_retries = 0
    valid = tuple(c for c in assistant.tool_calls if c.name in specs)
    if not valid:
        return await _all_invalid_round(ctx, assistant, list(specs))
    ctx.state.invalid_tool_rounds = 0
    known = sorted(specs)
    for segment in plan_segments(assistant.tool_calls, specs):
        results = await _run_segment(ctx, segment, specs, known)
        if not await ctx.persist(tuple(_result_row(ctx, r) for r in results), "tool_results"):
            ctx.state.unrecorded_calls.update(r.call_id for r in results)
            _fail_persistence(ctx)
            return False
        _track_mutations(ctx, segment.calls, results)
        await Emit(Event(session_id=ctx.session_id, turn_id=ctx.turn_id, kind="tool.progress",
                         data={"calls": [r.call_id for r in results], "parallel": segment.parallel,
                               "errors": sum(r.is_error for r in results)}))
    if all(c.name in specs and specs[c.name].refundable for c in assistant.tool_calls):
        ctx.state.budget.refund()  # LOOP-2: a round of refundable tools costs no budget
    ctx.state.last_round_had_tools = True
    ctx.state.post_tool_nudged = False
    return True


MUTATING_TOOLS = frozenset({"write_file", "patch"})


def _track_mutations(ctx: TurnContext, calls: tuple[ToolCall, ...],
                     results: tuple[ToolResult, ...]) -> None:
    """TOOL-9: remember failed writes until a later write to the same path succeeds."""
    for call, result in zip(calls, results, strict=True):
        path = scoped_path(call) if call.name in MUTATING_TOOLS else None
        if path is None:
            continue
        if result.is_error:
            ctx.state.failed_mutations[path] = call.name
        else:
            ctx.state.failed_mutations.pop(path, None)


async def _run_segment(
    ctx: TurnContext, segment: Segment, specs: dict[str, ToolSpec], known: list[str]
) -> tuple[ToolResult, ...]:
    dispatch = tuple(c for c in segment.calls
                     if c.name in specs and c.arguments_object is not None)
    ran: dict[str, ToolResult] = {}
    if dispatch:
        results = await ExecuteTools(ctx.token, ctx.session_id, dispatch, segment.parallel)
        ran = {r.call_id: r for r in results}
    return tuple(ran[c.id] if c.id in ran else _in_place_error(c, specs, known)
                 for c in segment.calls)


def _in_place_error(call: ToolCall, specs: dict[str, ToolSpec], known: list[str]) -> ToolResult:
    """The result of a call that is answered without running: unknown tool or bad JSON."""
    if call.name not in specs:
        return unknown_tool_result(call, known)
    return ToolResult(call_id=call.id, name=call.name, is_error=True, disposition="none",
                      content="error: the arguments are not a JSON object, so the call was not run")


async def _all_invalid_round(ctx: TurnContext, assistant: Message, known: list[str]) -> bool:
    """TOOL-2: every call names a missing tool; answer each in place, count the round."""
    results = tuple(unknown_tool_result(c, sorted(known)) for c in assistant.tool_calls)
    if not await ctx.persist(tuple(_result_row(ctx, r) for r in results), "tool_results"):
        _fail_persistence(ctx)
        return False
    ctx.state.invalid_tool_rounds += 1
    if ctx.state.invalid_tool_rounds >= ctx.limits.invalid_tool_rounds_max:
        names = ", ".join(c.name for c in assistant.tool_calls)
        ctx.finish(ExitReason.INVALID_TOOL_CALLS, f"model generated invalid tool calls: {names}",
                   failed=True)
        return False
    return True
