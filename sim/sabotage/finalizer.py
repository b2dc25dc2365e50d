"""Broken finalizers: no tail closure, stored scaffolding, ad-hoc exit reasons, unguarded
writes, a wrong exit level, a wrong grace call, skipped boundary rows and guards, a
failed-write footer that is missing or lists writes a later write redid, an answer the
verification gate held back lost to context pressure."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import delivery, finalizer, loop, tool_round
from hermes_ref.context import TurnContext
from hermes_ref.effects import (
    AppendMessages,
    ClearInterrupt,
    CloseTurn,
    Emit,
    FlushEvents,
    ReleaseLease,
    Site,
    StopRefresher,
)
from hermes_ref.errors import PersistenceError
from hermes_ref.models import Closing, Event, Message
from hermes_ref.outcomes import CONTEXT_PRESSURE_EXITS, Completion, ExitLine, ExitReason
from hermes_ref.phases import Phase
from hermes_ref.tool_specs import path_argument
from sim.sabotage.base import edited_in_place, one_line_changed, sabotage

# ---- FIN-3: the final row is never written --------------------------------------------------


async def _skip_async(ctx: TurnContext) -> None:
    return None


sabotage("skip_tail_closure", ("FIN-3",),
         "the finalizer never closes the tail: no row is appended for an answer the durable "
         "tail lacks")(
    lambda: [mock.patch.object(finalizer, "_close_tail", _skip_async)])


# ---- SCAF-1: scaffolding written to the store ----------------------------------------------


def _persist_scaffolding() -> list[AbstractContextManager[Any]]:
    def keep_and_strip(self: Any) -> int:
        self._messages = [m.model_copy(update={"scaffold": None}) if m.scaffold else m
                          for m in self._messages]
        return 0
    return [mock.patch("hermes_ref.transcript.Transcript.drop_scaffolding", keep_and_strip)]


sabotage("persist_scaffolding", ("SCAF-1",),
         "the finalizer clears scaffold flags instead of dropping the messages, so they are written")(
    _persist_scaffolding)

# ---- LOOP-3 / FIN-6 / FIN-7 -----------------------------------------------------------------


def _every_exit_a_text_response() -> list[AbstractContextManager[Any]]:
    original = finalizer.exit_line

    def line(ctx: TurnContext, tail: Message | None = None) -> ExitLine:
        return original(ctx, tail).model_copy(update={"reason": ExitReason.TEXT_RESPONSE})
    return [mock.patch.object(finalizer, "exit_line", line)]


sabotage("every_exit_logged_as_text_response", ("LOOP-3",),
         "every turn's exit line says text_response, whatever ended it")(
    _every_exit_a_text_response)


def _unguarded_persist() -> list[AbstractContextManager[Any]]:
    original = TurnContext.persist

    async def persist(ctx: TurnContext, rows: tuple[Message, ...], site: Site) -> bool:
        if ctx.tracker.phase is not Phase.FINALIZE:
            return await original(ctx, rows, site)
        stored = await AppendMessages(ctx.token, ctx.session_id, rows, site)  # may raise
        ctx.transcript.absorb(stored)
        return True

    async def close_turn(ctx: TurnContext, closing: Closing) -> bool:
        closed = await CloseTurn(ctx.lease, closing)  # may raise
        ctx.transcript.absorb(closed.stored)
        return True
    return [mock.patch.object(TurnContext, "persist", persist),
            mock.patch.object(finalizer, "_close_turn", close_turn)]


sabotage("unguarded_final_persist", ("FIN-6",),
         "a failed write in the finalizer propagates and the answer is never delivered")(
    _unguarded_persist)


def _always_info() -> list[AbstractContextManager[Any]]:
    original = finalizer.exit_line

    def line(ctx: TurnContext, tail: Message | None = None) -> ExitLine:
        return original(ctx, tail).model_copy(update={"level": "INFO"})
    return [mock.patch.object(finalizer, "exit_line", line)]


sabotage("exit_line_always_info", ("FIN-7",),
         "the exit line is always INFO, even when the turn ends on a tool result")(_always_info)

def _tool_tail_always_warns() -> list[AbstractContextManager[Any]]:
    original = finalizer.exit_line

    def line(ctx: TurnContext, tail: Message | None = None) -> ExitLine:
        built = original(ctx, tail)
        return built.model_copy(update={"level": "WARNING"}) if built.last_role == "tool" else built
    return [mock.patch.object(finalizer, "exit_line", line)]


sabotage("interrupted_tool_tail_warns", ("FIN-7",),
         "the exit line is WARNING whenever the tail is a tool result, an interrupted turn's "
         "too")(_tool_tail_always_warns)


def _stripped_length() -> list[AbstractContextManager[Any]]:
    original = finalizer.exit_line

    def line(ctx: TurnContext, tail: Message | None = None) -> ExitLine:
        built = original(ctx, tail)
        return built.model_copy(update={"response_len": len((ctx.ending.answer or "").strip())})
    return [mock.patch.object(finalizer, "exit_line", line)]


sabotage("exit_line_counts_the_stripped_answer", ("FIN-7",),
         "the exit line's response_len counts the answer without its surrounding whitespace, "
         "not the answer delivered")(_stripped_length)


# ---- FIN-1: the grace call offers tools, or never happens ------------------------------------


def _grace_with_tools() -> list[AbstractContextManager[Any]]:
    def request(ctx: TurnContext, *, with_tools: bool = True, purpose: str = "turn") -> Any:
        return loop.build_request(ctx, purpose=purpose)
    return [mock.patch.object(finalizer, "build_request", request)]


sabotage("grace_call_offers_tools", ("FIN-1",),
         "the budget-exhaustion summary call is built with the tool list")(_grace_with_tools)


def _no_grace_call() -> list[AbstractContextManager[Any]]:
    async def never(ctx: TurnContext, request: Any) -> None:
        return None
    return [mock.patch.object(finalizer, "call_with_retries", never)]


sabotage("grace_call_skipped", ("FIN-1",),
         "budget exhaustion records its reason but never makes the summary call")(_no_grace_call)


# ---- FIN-5 / FIN-8: the finalizer skips a closing step ---------------------------------------


sabotage("skip_failure_boundary", ("FIN-5",),
         "a failed turn that ends on a user or tool row gets no boundary row")(
    lambda: [mock.patch.object(finalizer, "_failure_boundary", _skip_async)])

sabotage("truncated_call_counted_as_context_pressure", ("FIN-5",),
         "the finalizer's list of context-pressure exits also holds truncated_tool_call, so a "
         "turn cut off mid-call leaves its user row open with no boundary row")(
    lambda: [mock.patch.object(finalizer, "CONTEXT_PRESSURE_EXITS", frozenset(
        {*CONTEXT_PRESSURE_EXITS, ExitReason.TRUNCATED_TOOL_CALL}))])

sabotage("no_silent_stop_guard", ("FIN-8",),
         "a turn that stops on a tool result ends quietly, not as pending_tool_result")(
    lambda: [mock.patch.object(finalizer, "_silent_stop_guard", lambda ctx: None)])


# ---- TOOL-9: failed writes go unmentioned ---------------------------------------------------


def _no_footer() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(finalizer, "_mutation_footer", lambda ctx: None)]


sabotage("failed_writes_unmentioned", ("TOOL-9",),
         "the answer never says that a write or patch of the turn failed")(_no_footer)


def _redone_writes_kept() -> list[AbstractContextManager[Any]]:
    original = tool_round._track_mutations

    def keep_failures(ctx: TurnContext, calls: Any, results: Any, specs: Any) -> None:
        before = dict(ctx.state.failed_mutations)
        original(ctx, calls, results, specs)
        ctx.state.failed_mutations.update(before)  # a success no longer clears its path
    return [mock.patch.object(tool_round, "_track_mutations", keep_failures)]


sabotage("redone_writes_still_reported", ("TOOL-9",),
         "a write that failed stays in the footer after a later write to the same path "
         "succeeded")(_redone_writes_kept)


def _paths_as_written() -> list[AbstractContextManager[Any]]:
    def as_written(call: Any, spec: Any = None) -> str | None:
        return path_argument(call, spec)  # the string the model wrote, not normalized
    return [mock.patch.object(tool_round, "scoped_path", as_written)]


sabotage("failed_writes_keyed_as_written", ("TOOL-9",),
         "failed writes are remembered by the path string the model wrote, so a write "
         "redone under another spelling of the same file (./a.txt, a.txt) is still "
         "reported as failed")(_paths_as_written)


# ---- DEL-1: the completion goes out before the exit line -------------------------------------


def _completion_first() -> list[AbstractContextManager[Any]]:
    original = finalizer._ending

    def completion_then_ending(ctx: TurnContext, tail: Message | None = None) -> tuple[Event, ...]:
        early = Completion(final_response=ctx.ending.answer, failed=ctx.ending.failed)
        return (early.event(ctx.session_id, ctx.turn_id), *original(ctx, tail))
    return [mock.patch.object(finalizer, "_ending", completion_then_ending)]


sabotage("completion_before_exit_line", ("DEL-1",),
         "the client is told the turn completed before the exit line is written (and then again)")(
    _completion_first)


# ---- LOOP-3: a turn with nothing to say is delivered as a success -------------------------


def _no_answer_as_success() -> list[AbstractContextManager[Any]]:
    def guard(ctx: TurnContext) -> None:
        if ctx.ending.answer is None:
            ctx.ending.amend_answer(finalizer.NO_ANSWER_TEXT.format(reason=ctx.ending.reason_text))
    return [mock.patch.object(finalizer, "_no_answer_guard", guard)]


sabotage("no_answer_delivered_as_success", ("LOOP-3",),
         "a turn that ends with no answer delivers the explanation as if it were one")(
    _no_answer_as_success)


# ---- FIN-6: a failed release takes the turn's ending with it ------------------------------


def _release_without_flush() -> list[AbstractContextManager[Any]]:
    async def release(ctx: TurnContext, closing: Closing | None = None) -> bool:
        if ctx.refresher is not None:  # LEASE-6's order kept: only the ending's fate changes
            await StopRefresher(ctx.refresher)
            await ClearInterrupt()
            ctx.refresher = None
        if closing is not None:  # the rows in the release's commit, the ending left to the release
            closed = await CloseTurn(ctx.lease, closing.model_copy(update={"events": ()}))
            ctx.transcript.absorb(closed.stored)
            for event in closing.events:
                await Emit(event)
            if closed.release_failure is None:
                await FlushEvents()
            else:  # the ending stays pending, and is lost
                ctx.cleanup_errors.append(f"release: {closed.release_failure[0]}")
            return True
        try:
            await ReleaseLease(ctx.lease)
        except PersistenceError as error:  # the ending stays pending, and is lost
            ctx.cleanup_errors.append(f"release: {error.cause}: {error}")
        return True
    return [mock.patch.object(finalizer, "_release", release)]


sabotage("failed_release_loses_the_ending", ("FIN-6",),
         "a failed lease release leaves the exit line and completion pending, never committed")(
    _release_without_flush)


# ---- DEL-1: a closing that did not commit keeps the numbers it took ------------------------


def _closing_numbers_kept() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(delivery.TurnSeqs, "settle_closing",
                              lambda self, closing, committed: None)]


sabotage("failed_closing_keeps_its_numbers", ("DEL-1",),
         "when the final row's commit fails, the turn's event counter keeps the numbers its "
         "exit line and completion took, so the ending it then emits leaves a gap")(
    _closing_numbers_kept)


# ---- FIN-6: a result with cleanup errors loses the answer ------------------------------------


def _answer_dropped_on_cleanup_errors() -> list[AbstractContextManager[Any]]:
    broken = one_line_changed(
        finalizer, "_result", "final_response=ending.answer,",
        "final_response=None if ctx.cleanup_errors else ending.answer,")
    return [mock.patch.object(finalizer, "_result", broken)]


sabotage("result_drops_the_answer_after_cleanup_errors", ("FIN-6",),
         "a turn whose cleanup failed hands its caller a result without the answer, though "
         "its completion event carries it")(_answer_dropped_on_cleanup_errors)


# ---- FIN-6: context pressure loses the answer the verification gate held back ----------------


def _held_answer_lost_at_preflight() -> list[AbstractContextManager[Any]]:
    return [edited_in_place(finalizer, "_held_answer_stands", "held = ctx.state.withheld_answer",
                            "held = None  # \"a held answer is the budget's to reuse\"")]


sabotage("held_answer_lost_at_preflight", ("FIN-6",),
         "a turn that fails closed for context pressure while the verification gate holds "
         "the model's answer delivers the failure's explanation, and the answer is lost")(
    _held_answer_lost_at_preflight)


# ---- FIN-6: a check the provider or the model fails loses the held answer --------------------


def _held_answer_lost_to_a_failed_check() -> list[AbstractContextManager[Any]]:
    return [edited_in_place(finalizer, "_held_answer_stands",
                            "ctx.ending.reason not in CHECK_FAILURE_EXITS",
                            "ctx.ending.reason not in CONTEXT_PRESSURE_EXITS")]  # only the window


sabotage("held_answer_lost_to_a_failed_check", ("FIN-6",),
         "a turn whose check the provider refuses, or whose replies to it run the empty ladder "
         "out, delivers the failure's explanation while the verification gate holds the "
         "model's answer, and the answer is lost")(_held_answer_lost_to_a_failed_check)
