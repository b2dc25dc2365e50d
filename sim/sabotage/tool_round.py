"""Broken tool rounds: tools before the write, a round that goes on after its results were
refused, duplicate or dropped results, an invalid streak that ends a round late, errors
that end the turn, results shown before they are durable or closed as never run, overlap
tested one way, calls re-run or left open by recovery, progress that leaves out or
miscounts the calls that failed."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import closure, finalizer, prologue, tool_round
from hermes_ref.context import TurnContext
from hermes_ref.effects import AppendMessages, Emit, ExecuteTools, Site
from hermes_ref.models import Event, EventKind, Message, ToolCall
from hermes_ref.outcomes import Ending, ExitReason, ToolProgress
from hermes_ref.phases import Phase
from hermes_ref.transcript import Transcript
from sim.sabotage.base import sabotage

# ---- TOOL-1: run first, write later --------------------------------------------------------


async def _execute_then_persist(ctx: TurnContext, assistant: Message) -> bool:
    ctx.enter(Phase.TOOL_ROUND)
    results = await ExecuteTools(ctx.token, ctx.session_id, assistant.tool_calls, False)
    stored = await AppendMessages(ctx.token, ctx.session_id, (assistant,), Site.TOOL_CALLS)
    ctx.transcript.extend(stored)
    rows = tuple(tool_round._result_row(ctx, r) for r in results)
    ctx.transcript.extend(await AppendMessages(ctx.token, ctx.session_id, rows, Site.TOOL_RESULTS))
    ctx.state.last_round_had_tools = True
    return True


@sabotage("execute_before_persist", ("TOOL-1",),
          "the tool round runs the tools first and writes the assistant row afterwards")
def _p_execute_before_persist() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(tool_round, "run_tool_round", _execute_then_persist)]


async def _round_goes_on(ctx: TurnContext, assistant: Message) -> bool:
    """``run_tool_round`` whose failed result write skips to the next segment (``continue``)
    instead of ending the round: the turn still ends, but only after the rest ran."""
    ctx.enter(Phase.TOOL_ROUND)
    specs = ctx.specs
    if not await ctx.persist((assistant,), Site.TOOL_CALLS):
        return False
    valid = tuple(c for c in assistant.tool_calls if c.name in specs)
    if not valid:
        return await tool_round._all_invalid_round(ctx, assistant, specs)
    ctx.state.invalid_tool_rounds = 0
    resolved = await tool_round._resolve_paths(assistant.tool_calls, specs)
    if all(c.name in specs and specs[c.name].refundable for c in assistant.tool_calls):
        ctx.state.budget.refund()
    for segment in tool_round.plan_segments(assistant.tool_calls, specs, resolved):
        results = await tool_round._run_segment(ctx, segment, specs)
        rows = tuple(tool_round._result_row(ctx, r) for r in results)
        if not await ctx.persist(rows, Site.TOOL_RESULTS):
            ctx.state.unrecorded_calls.update(r.call_id for r in results)
            continue
        tool_round._track_mutations(ctx, segment.calls, results, specs)
        progress = ToolProgress(calls=[r.call_id for r in results], parallel=segment.parallel,
                                errors=sum(r.is_error for r in results))
        await Emit(progress.event(ctx.session_id, ctx.turn_id))
    ctx.state.last_round_had_tools = True
    return True


@sabotage("round_goes_on_after_lost_results", ("TOOL-1",),
          "a segment whose results the store refused is skipped over, so the round's later "
          "segments still run their tools before the turn ends")
def _p_round_goes_on() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(tool_round, "run_tool_round", _round_goes_on)]


# ---- TOOL-3: a result written twice --------------------------------------------------------


def _duplicate_results() -> list[AbstractContextManager[Any]]:
    original = tool_round._run_segment

    async def twice(ctx: TurnContext, segment: Any, specs: Any) -> Any:
        results = await original(ctx, segment, specs)
        return results + results[:1]
    return [mock.patch.object(tool_round, "_run_segment", twice)]


sabotage("duplicate_tool_result", ("TOOL-3",),
         "the first result of every segment is written twice")(_duplicate_results)


# ---- TOOL-6: a tool error aborts the turn --------------------------------------------------


def _tool_error_aborts() -> list[AbstractContextManager[Any]]:
    original = tool_round._run_segment

    async def aborting(ctx: TurnContext, seg: Any, specs: Any) -> Any:
        results = await original(ctx, seg, specs)
        if any(r.is_error for r in results):
            ctx.finish(ExitReason.LOCAL_PROCESSING_ERROR, "tool failed", answer="A tool failed.",
                       failed=True)
        return results
    return [mock.patch.object(tool_round, "_run_segment", aborting)]


sabotage("tool_error_ends_turn", ("TOOL-6",),
         "a tool error result ends the turn as a failure instead of going back to the model")(
    _tool_error_aborts)

# ---- TOOL-8: a result the store refused is shown to the model anyway --------------------


def _send_unrecorded_results() -> list[AbstractContextManager[Any]]:
    original = TurnContext.persist

    async def persist(ctx: TurnContext, rows: tuple[Message, ...], site: Site) -> bool:
        ok = await original(ctx, rows, site)
        if ok or site is not Site.TOOL_RESULTS:
            return ok
        ctx.state.persistence_failed = False
        ctx.ending = Ending()  # forget the exit the failed write recorded
        ctx.transcript.extend(rows)  # the model will see results the record does not have
        return True
    return [mock.patch.object(TurnContext, "persist", persist)]


sabotage("send_unrecorded_results", ("TOOL-8",),
         "when the store refuses tool results, the turn goes on and shows them to the model")(
    _send_unrecorded_results)


# ---- TOOL-8: a result the store refused is closed as never run ------------------------------


def _lost_results_not_run() -> list[AbstractContextManager[Any]]:
    original = finalizer._open_call_text

    def text_for(ctx: TurnContext) -> Callable[[str], str]:
        told = original(ctx)  # the unrecorded case forgotten: "own call, so it never started"
        return lambda cid: closure.NOT_RUN_TEXT if cid in ctx.state.unrecorded_calls else told(cid)
    return [mock.patch.object(finalizer, "_open_call_text", text_for)]


sabotage("lost_results_told_not_run", ("TOOL-8",),
         "a call whose result the store refused is closed with the not-run text, so the "
         "record says nothing happened where a tool did run")(_lost_results_not_run)


# ---- TOOL-2: the stored row forgets the calls to missing tools -----------------------------


def _drop_invalid_calls() -> list[AbstractContextManager[Any]]:
    original = TurnContext.persist

    async def persist(ctx: TurnContext, rows: tuple[Message, ...], site: Site) -> bool:
        if site is Site.TOOL_CALLS:
            names = {t.name for t in ctx.tools}
            rows = tuple(r.model_copy(update={"tool_calls": tuple(
                c for c in r.tool_calls if c.name in names)}) for r in rows)
        return await original(ctx, rows, site)
    return [mock.patch.object(TurnContext, "persist", persist)]


sabotage("drop_invalid_calls_from_row", ("TOOL-2",),
         "the assistant row is stored without the calls to tools that do not exist")(
    _drop_invalid_calls)


# ---- TOOL-2: the all-invalid streak ends the turn one round late --------------------------


def _streak_one_late() -> list[AbstractContextManager[Any]]:
    original = tool_round._all_invalid_round

    async def late(ctx: TurnContext, assistant: Message, specs: Any) -> bool:
        limits = ctx.limits  # the round compares with ``>`` where ``>=`` belongs
        ctx.limits = limits.model_copy(
            update={"invalid_tool_rounds_max": limits.invalid_tool_rounds_max + 1})
        try:
            return await original(ctx, assistant, specs)
        finally:
            ctx.limits = limits
    return [mock.patch.object(tool_round, "_all_invalid_round", late)]


sabotage("invalid_streak_one_late", ("TOOL-2",),
         "the turn ends invalid_tool_calls only after [3]+1 all-invalid rounds in a row, so "
         "the model is called again past the limit")(_streak_one_late)


# ---- TOOL-10: recovery runs the open calls again ---------------------------------------------


def _rerun_open_calls() -> list[AbstractContextManager[Any]]:
    original = prologue._repair_tail

    async def rerun(ctx: TurnContext) -> bool:
        owner, missing = ctx.transcript.trailing_open_calls()
        if owner is not None:
            calls = tuple(c for c in owner.tool_calls if c.id in missing)
            results = await ExecuteTools(ctx.token, ctx.session_id, calls, False)
            rows = tuple(tool_round._result_row(ctx, r) for r in results)
            ctx.transcript.extend(await AppendMessages(ctx.token, ctx.session_id, rows, Site.RECOVERY))
        return await original(ctx)
    return [mock.patch.object(prologue, "_repair_tail", rerun)]


sabotage("recovery_reruns_open_calls", ("TOOL-10",),
         "after a restart, recovery executes recorded calls that have no result instead of "
         "reporting them unknown")(_rerun_open_calls)


def _partly_answered_closed() -> list[AbstractContextManager[Any]]:
    original = Transcript.trailing_open_calls

    def trailing(self: Transcript) -> tuple[Message | None, list[str]]:
        owner, missing = original(self)
        if owner is not None and len(missing) < len(owner.tool_calls):
            return None, []  # "it has results, so the round finished"
        return owner, missing
    return [mock.patch.object(Transcript, "trailing_open_calls", trailing)]


sabotage("partly_answered_round_left_open", ("TOOL-3",),
         "recovery takes a call row with some results for a finished round, so the calls of "
         "a later segment that a crash cut off never get their unknown result")(
    _partly_answered_closed)


# ---- TOOL-4: every round is planned as one parallel segment ---------------------------------


def _everything_parallel() -> list[AbstractContextManager[Any]]:
    def one_segment(calls: tuple[ToolCall, ...], specs: Any, *_: Any) -> list[tool_round.Segment]:
        return [tool_round.Segment(calls, parallel=len(calls) > 1)] if calls else []
    return [mock.patch.object(tool_round, "plan_segments", one_segment)]


sabotage("everything_in_parallel", ("TOOL-4",),
         "the planner puts all of a round's calls in one parallel segment, writers included")(
    _everything_parallel)


def _overlap_one_way() -> list[AbstractContextManager[Any]]:
    def inside_only(a: str, b: str) -> bool:
        if a == "." or b == ".":
            return True
        return a == b or a.startswith(b + "/")  # "a inside b", the other way forgotten
    return [mock.patch.object(tool_round, "paths_overlap", inside_only)]


sabotage("overlap_checked_one_way", ("TOOL-4",),
         "the planner's overlap test asks only whether the new call's path lies inside an "
         "earlier one, so a search of a folder joins a write inside it")(_overlap_one_way)


# ---- SCAF-2: the working list is flushed whole, scaffolding included -----------------------


def _flush_scaffolding_with_rows() -> list[AbstractContextManager[Any]]:
    original = TurnContext.persist

    async def persist(ctx: TurnContext, rows: tuple[Message, ...], site: Site) -> bool:
        extra = tuple(m.model_copy(update={"scaffold": None}) for m in ctx.transcript
                      if m.scaffold is not None and m.row_id is None)
        return await original(ctx, extra + rows, site)
    return [mock.patch.object(TurnContext, "persist", persist)]


sabotage("scaffolding_flushed_with_rows", ("SCAF-2",),
         "every write also flushes the turn's scaffolding (flags stripped), so a restart replays it")(
    _flush_scaffolding_with_rows)


# ---- DEL-1: progress is announced before the results are recorded ---------------------------


def _progress_first() -> list[AbstractContextManager[Any]]:
    original = TurnContext.persist

    async def announce_then_persist(ctx: TurnContext, rows: tuple[Message, ...], site: Site) -> bool:
        if site is Site.TOOL_RESULTS:
            await Emit(Event(session_id=ctx.session_id, turn_id=ctx.turn_id,
                             kind=EventKind.TOOL_PROGRESS,
                             data={"calls": [r.tool_call_id for r in rows]}))
        return await original(ctx, rows, site)
    return [mock.patch.object(TurnContext, "persist", announce_then_persist)]


sabotage("progress_before_results_recorded", ("DEL-1",),
         "the stream reports a segment done before its results are durable, even if the write fails")(
    _progress_first)


def _errors_left_out() -> list[AbstractContextManager[Any]]:
    original = tool_round._track_mutations
    failed: set[str] = set()

    def track(ctx: TurnContext, calls: Any, results: Any, specs: Any) -> None:
        failed.clear()  # runs right before the segment's progress is built
        failed.update(r.call_id for r in results if r.is_error)
        original(ctx, calls, results, specs)

    def progress(*, calls: list[str], parallel: bool, errors: int) -> ToolProgress:
        # "progress is for what worked": a failed call is left out of the event
        return ToolProgress(calls=[c for c in calls if c not in failed], parallel=parallel,
                            errors=errors)
    return [mock.patch.object(tool_round, "_track_mutations", track),
            mock.patch.object(tool_round, "ToolProgress", progress)]


sabotage("failed_calls_left_out_of_progress", ("DEL-1",),
         "a segment's tool.progress event names only the calls that succeeded, so a client "
         "never hears of a call whose tool failed")(_errors_left_out)


def _no_errors_counted() -> list[AbstractContextManager[Any]]:
    def progress(*, calls: list[str], parallel: bool, errors: int) -> ToolProgress:
        return ToolProgress(calls=calls, parallel=parallel, errors=0)  # the count forgotten
    return [mock.patch.object(tool_round, "ToolProgress", progress)]


sabotage("progress_counts_no_errors", ("DEL-1",),
         "every tool.progress event says its segment had no errors, whatever failed")(
    _no_errors_counted)
