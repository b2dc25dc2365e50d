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
barriers, and everything else runs alone. Overlap is judged on where the calls act:
before planning, the round asks the tool world to resolve its path arguments
(``ResolvePaths``), because ``/root/a.txt`` and a symlink to ``a.txt`` are ``a.txt``
only to a resolver that sees the root and the tree. The world answers once, before the
first segment; a barrier of the same round that changes the tree (a ``terminal``
making a symlink) is not seen by that answer.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass

from hermes_ref.context import TurnContext
from hermes_ref.effects import Emit, ExecuteTools, ResolvePaths, Site
from hermes_ref.errors import InvariantBroken, TurnInterrupted
from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role, ToolCall, ToolKind, ToolResult, ToolSpec
from hermes_ref.outcomes import ExitReason, ToolProgress
from hermes_ref.phases import Phase
from hermes_ref.tool_batch import BatchBounds
from hermes_ref.tool_specs import (
    call_problem,
    error_result,
    path_argument,
    paths_overlap,
    relative_path,
    scoped_path,
)


@dataclass(frozen=True, slots=True)
class Segment:
    calls: tuple[ToolCall, ...]
    parallel: bool


Resolved = Mapping[str, str | None]  # a path argument -> where the tools act (None: refused)


def _path_of(call: ToolCall, spec: ToolSpec, resolved: Resolved | None) -> str | None:
    """Where a READER/WRITER call acts; None (a barrier) when it names no usable path.

    With the tool world's answers (``resolved``) the path is the resolved one, and "."
    (overlapping everything) for the root and for a path the tools refuse or nobody
    resolved. Without them (planning on paper, as pure unit tests do) only a relative
    path is placed; an absolute one, or one leaving the root, overlaps everything.
    """
    raw = path_argument(call, spec)
    if raw is None or not posixpath.normpath(raw).strip():
        return None
    if resolved is not None:
        return resolved.get(raw) or "."
    return relative_path(raw) or "."


async def _resolve_paths(calls: tuple[ToolCall, ...], specs: dict[str, ToolSpec]) -> Resolved:
    """Ask the tool world where the round's path-scoped calls act (TOOL-4).

    Only a writer sharing a segment with another path call can race, and two calls that
    name the same string land on the same file, so the world is asked only when a
    writer is among at least two distinct paths; otherwise nothing is asked.
    """
    paths: dict[str, bool] = {}  # path argument -> named by a writer
    for call in calls:
        spec = specs.get(call.name)
        path = path_argument(call, spec) if spec is not None else None
        if spec is not None and path is not None:
            paths[path] = paths.get(path, False) or spec.kind is ToolKind.WRITER
    if len(paths) < 2 or not any(paths.values()):
        return {}
    asked = tuple(paths)
    answers = await ResolvePaths(asked)
    if len(answers) != len(asked):  # the planner would judge paths nobody resolved
        raise InvariantBroken(f"asked where {len(asked)} paths land, got {len(answers)} answers")
    return dict(zip(asked, answers, strict=True))


def _joins(run: list[tuple[ToolCall, ToolSpec, str | None]], spec: ToolSpec, path: str) -> bool:
    for _, other_spec, other_path in run:
        if other_path is None:
            continue
        both_readers = spec.kind is ToolKind.READER and other_spec.kind is ToolKind.READER
        if not both_readers and paths_overlap(path, other_path):
            return False
    return True


def plan_segments(calls: tuple[ToolCall, ...], specs: dict[str, ToolSpec],
                  resolved: Resolved | None = None) -> list[Segment]:
    """Cut calls into ordered segments (TOOL-4). Unknown tools are planned as barriers.

    ``resolved`` holds the tool world's answer for the round's path arguments
    (``ResolvePaths``): overlap is judged on where the calls act, not on their strings.
    """
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
            path = _path_of(call, spec, resolved)
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


async def run_tool_round(ctx: TurnContext, assistant: Message) -> bool:
    """Persist, execute and record one round. Returns False when the turn must end."""
    ctx.enter(Phase.TOOL_ROUND)
    specs = ctx.specs
    if not await ctx.persist((assistant,), Site.TOOL_CALLS):
        return False  # the round was not recorded, so none of its tools runs (TOOL-1)
    ctx.state.dropped_toolcall_retries = 0
    valid = tuple(c for c in assistant.tool_calls if c.name in specs)
    if not valid:
        return await _all_invalid_round(ctx, assistant, specs)
    ctx.state.invalid_tool_rounds = 0
    resolved = await _resolve_paths(assistant.tool_calls, specs)
    if all(c.name in specs and specs[c.name].refundable for c in assistant.tool_calls):
        # LOOP-2: a round of refundable tools costs no budget, whatever becomes of it
        # once recorded: a failed result write or an interrupt while the code runs too
        ctx.state.budget.refund()
    for segment in plan_segments(assistant.tool_calls, specs, resolved):
        results = await _run_segment(ctx, segment, specs)
        if not await ctx.persist(tuple(_result_row(ctx, r) for r in results), Site.TOOL_RESULTS):
            ctx.state.unrecorded_calls.update(r.call_id for r in results)
            return False
        _track_mutations(ctx, segment.calls, results, specs)
        progress = ToolProgress(calls=[r.call_id for r in results], parallel=segment.parallel,
                                errors=sum(r.is_error for r in results))
        await Emit(progress.event(ctx.session_id, ctx.turn_id))
    ctx.state.last_round_had_tools = True
    ctx.state.post_tool_nudged = False
    return True


def _track_mutations(ctx: TurnContext, calls: tuple[ToolCall, ...],
                     results: tuple[ToolResult, ...], specs: dict[str, ToolSpec]) -> None:
    """TOOL-9: remember failed file writes until a later write to the same path succeeds.

    A file write is a call of a WRITER tool (the turn's own spec says so, not its name).
    """
    for call, result in zip(calls, results, strict=True):
        spec = specs.get(call.name)
        path = scoped_path(call, spec) if spec is not None and spec.kind is ToolKind.WRITER \
            else None
        if path is None:
            continue
        if result.is_error:
            ctx.state.failed_mutations[path] = call.name
        else:
            ctx.state.failed_mutations.pop(path, None)


async def _run_segment(
    ctx: TurnContext, segment: Segment, specs: dict[str, ToolSpec]
) -> tuple[ToolResult, ...]:
    """Dispatch the segment's calls that can run; answer the others in place (TOOL-2).

    The driver runs them within the turn's batch bounds (TOOL-5: workers, start gate,
    deadline) and hands the results back as they finished; each is put back in its
    call's place here, so the record keeps the model's order.
    """
    problems = {c.id: call_problem(c, specs) for c in segment.calls}
    dispatch = tuple(c for c in segment.calls if problems[c.id] is None)
    ran: dict[str, ToolResult] = {}
    if dispatch:
        try:
            results = await ExecuteTools(ctx.token, ctx.session_id, dispatch, segment.parallel,
                                         batch_bounds(ctx.limits))
        except TurnInterrupted:  # they may have run: their closing results must say unknown
            ctx.state.interrupted_calls.update(c.id for c in dispatch)
            raise
        ran = {r.call_id: r for r in results}
    return tuple(_answer(c, ran, problems[c.id]) for c in segment.calls)


def batch_bounds(limits: Limits) -> BatchBounds:
    """The turn's bounds for every batch it runs (TOOL-5)."""
    return BatchBounds(limits.tool_workers_max, limits.tool_batch_deadline_s,
                       limits.tool_start_gate_s)


def _answer(call: ToolCall, ran: dict[str, ToolResult], problem: str | None) -> ToolResult:
    if problem is not None:
        return error_result(call, problem)
    if call.id not in ran:  # TOOL-3 holds only if the driver answers every call it ran
        raise InvariantBroken(f"the tools returned no result for call {call.id}")
    return ran[call.id]


async def _all_invalid_round(ctx: TurnContext, assistant: Message,
                             specs: dict[str, ToolSpec]) -> bool:
    """TOOL-2: every call names a missing tool; answer each in place, count the round."""
    results = tuple(_answer(c, {}, call_problem(c, specs)) for c in assistant.tool_calls)
    if not await ctx.persist(tuple(_result_row(ctx, r) for r in results), Site.TOOL_RESULTS):
        return False
    ctx.state.invalid_tool_rounds += 1
    if ctx.state.invalid_tool_rounds >= ctx.limits.invalid_tool_rounds_max:
        names = ", ".join(c.name for c in assistant.tool_calls)
        ctx.finish(ExitReason.INVALID_TOOL_CALLS, f"model generated invalid tool calls: {names}",
                   failed=True)
        return False
    return True
