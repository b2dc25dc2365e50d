"""The finalizer: close the turn so the next one starts from a clean record.

Theory of operation
-------------------
Finalizing is a phase, not a ``finally`` block: a crash must be able to stop it, and it
performs effects, which the house rule forbids inside ``except``/``finally``. Steps, in
order, each guarded on its own so one failure never costs the user the answer (FIN-6):

1. Budget fallback (FIN-1): the loop ran out without an answer → the answer the
   verification gate held back, if there is one, else one tool-less grace call asks
   for a summary. A turn whose check failed while the gate held an answer (context
   pressure, a provider that refused the check, the empty ladder run out...) delivers
   that answer the same way (FIN-6).
2. Drop scaffolding from the working list (SCAF-1).
3. Silent-stop guard (FIN-8): no answer, not already failed, tail is a tool result →
   failed with ``pending_tool_result`` and an explanatory answer.
4. No-answer guard: a turn that still has no answer (an empty grace summary, say) is a
   failure with an explanation, so FIN-5 closes its tail instead of leaving a user row.
5. Failed-write footer (TOOL-9): a delivered answer lists the turn's writes that failed
   and were not redone, inside the pending final row.
6. Persist what is still pending (the final assistant row).
7. Tail closure (FIN-3): a delivered answer has a matching assistant row; a tail that is
   not an assistant row (the final write failed) gets one appended.
8. Failure boundary (FIN-5): a failed turn that leaves a user or tool tail gets an engine
   assistant row (not after context-pressure failures); open calls get a result first.
9. The turn-exit line and the completion event (FIN-7, DEL-1), then stop the lease's
   refresher, clear its interrupt and release the lease, in that order (LEASE-6).

When the delivered answer's row is all that step 6 has to write, steps 7 and 8 have
nothing to do, and steps 6 and 9 are one commit (``CloseTurn``): the refresher is stopped
and its interrupt cleared, then the final row, the exit line and the completion (built
for the tail that row will be) and the release commit together, the release in a
savepoint of its own, so that a release that fails still leaves the answer and the ending
durable (FIN-6). If the rows fail, nothing of that commit holds and the finalizer goes on
from step 7 as after any failed final write, with the ending that is then true. A
delivered tool-round turn so makes 4 commits: the grant with the user row, the call row,
the results, the final row with the release.
"""

from __future__ import annotations

from collections.abc import Callable

from hermes_ref import closure, preflight, redirect
from hermes_ref.context import TurnContext, check_stored
from hermes_ref.effects import (
    ClearInterrupt,
    CloseTurn,
    Emit,
    FlushEvents,
    ReleaseLease,
    Site,
    StopRefresher,
)
from hermes_ref.errors import InvariantBroken, PersistenceError, TurnInterrupted
from hermes_ref.loop import build_request, call_with_retries
from hermes_ref.models import Closing, Event, Message, ProviderReply, Role, ScaffoldFlag
from hermes_ref.outcomes import (
    CHECK_FAILURE_EXITS,
    CONTEXT_PRESSURE_EXITS,
    Completion,
    ExitLine,
    ExitReason,
    TurnResult,
)
from hermes_ref.phases import Phase
from hermes_ref.scaffolding import GRACE_SUMMARY_PROMPT, scaffold

NO_ANSWER_TEXT = "The turn ended without an answer ({reason}). Nothing was lost; ask again to continue."
MUTATION_FOOTER = "[These file changes did not apply:"
HELD_BACK_NOTE = "; the answer held back for verification"  # FIN-1: the exit detail says so
PENDING_TOOL_RESULT_TEXT = (
    "The turn stopped right after a tool result, before the model answered. "
    "The tool results are recorded; ask again to continue from them."
)


async def _budget_fallback(ctx: TurnContext) -> None:
    """FIN-1 / LOOP-2: out of budget without an answer → one tool-less summary call."""
    state = ctx.state
    at_max = state.iterations >= ctx.limits.max_iterations
    reason = ExitReason.MAX_ITERATIONS if at_max else ExitReason.BUDGET_EXHAUSTED
    ctx.finish(reason, f"{state.iterations}/{ctx.limits.max_iterations}")
    if ctx.ending.answer is None and state.withheld_answer is not None:
        _reuse_withheld(ctx, state.withheld_answer)
    if ctx.ending.answer is not None or not ctx.limits.grace_call_enabled:
        return
    ctx.transcript.append(
        scaffold(Role.USER, GRACE_SUMMARY_PROMPT, ScaffoldFlag.GRACE_SUMMARY, ctx.turn_id)
    )
    reply = await _grace_call(ctx)
    text = (reply.content or "").strip() if reply is not None else ""
    if text and reply is not None:
        ctx.ending.amend_answer(reply.content or "")
        ctx.transcript.append(Message(role=Role.ASSISTANT, content=reply.content,
                                      finish_reason=reply.finish_reason, turn_id=ctx.turn_id))


async def _grace_call(ctx: TurnContext) -> ProviderReply | None:
    """The one tool-less summary call; when its retries are spent on the primary and the
    turn falls back (LOOP-6), the same call once more on the fallback, preflighted and
    built for that route. None when nothing answered.

    A correction that cuts it is the turn's to take in (LOOP-4), as at the loop's top: left
    queued, the session's next turn would take it in as a second user row of its own. The
    budget has no call left to answer it, so the turn ends without an answer (FIN-5 closes
    the user row with a boundary row)."""
    state = ctx.state
    while True:
        if not await preflight.check(ctx):  # the grace call is a model call too (CMP-7)
            ctx.ending.detail += "; grace call not sent: the request exceeds the context window"
            return None
        state.api_calls += 1
        route = state.route
        try:
            reply = await call_with_retries(ctx, build_request(ctx, with_tools=False,
                                                               purpose="grace"))
        except TurnInterrupted as stop:  # the user or a lost lease stopped the summary call
            ctx.ending.interrupt_summary(stop.reason)
            return None
        if state.cut_partial is not None:
            await _take_in_a_grace_cut(ctx)
            return None
        if reply is not None or state.route == route:
            return reply


async def _take_in_a_grace_cut(ctx: TurnContext) -> None:
    """LOOP-4: a correction that cut the grace call is the user's word all the same, and a
    real user row of this turn: it is taken in (the cut reply as its visible text, or
    hidden), and the turn, with no call left to answer it, ends saying it has no answer.
    Left queued, it would be lost, or taken in by the session's next turn as its own."""
    await redirect.take_redirects(ctx)
    ctx.ending.detail += "; grace call cut by a correction"


def _reuse_withheld(ctx: TurnContext, answer: str) -> None:
    """FIN-1: the verification gate held this answer back, and the budget ran out while the
    model checked its work: the answer it gave stands, with no summary call."""
    ctx.ending.amend_answer(answer)
    ctx.ending.detail += HELD_BACK_NOTE
    ctx.transcript.append(Message(role=Role.ASSISTANT, content=answer, turn_id=ctx.turn_id))


def _held_answer_stands(ctx: TurnContext) -> None:
    """FIN-6, FIN-1: the check failed while the gate held an answer back.

    The model had answered; the gate held the answer back to ask for a check, and the
    check failed: the request that asks could not be sent (preflight found it over the
    window, or compaction could not relieve it), the provider refused it or kept failing,
    or the model's replies to it were no use (empty to the end of the ladder, impossible to
    process, a tool call cut off, rounds of tools that do not exist). None of that is a
    reason to lose the answer the user waits for: it stands exactly as at the budget's
    end, delivered and not failed, under the exit reason already recorded (the first
    reason wins; the detail says the answer was held back), in place of the failure's own
    text. A turn that was interrupted, or lost its lease, ended ``interrupted`` and is not
    touched; nor is one whose write failed (``outcomes.CHECK_FAILURE_EXITS`` says why).
    """
    held = ctx.state.withheld_answer
    if held is None or ctx.ending.reason not in CHECK_FAILURE_EXITS:
        return
    ctx.ending.keep_held_answer()
    _reuse_withheld(ctx, held)


def _silent_stop_guard(ctx: TurnContext) -> None:
    """FIN-8: never end quietly on a tool result (an interrupted turn is not quiet: it says so).

    A turn the loop already ended as a failure (a terminal provider error, invalid tool
    calls) keeps its own reason: it is not silent, and FIN-5 closes its tail. Otherwise
    this guard deliberately *replaces* the recorded reason (a budget exit, say): ending on
    an unanswered tool result is the more specific truth, so it overrules the
    first-reason-wins rule on purpose (``Ending.replace``).
    """
    tail = ctx.transcript.tail()
    if ctx.ending.answer is None and not ctx.ending.failed \
            and ctx.ending.reason is not ExitReason.INTERRUPTED \
            and tail is not None and tail.role is Role.TOOL:
        ctx.ending.replace(ExitReason.PENDING_TOOL_RESULT, PENDING_TOOL_RESULT_TEXT, failed=True)


def _no_answer_guard(ctx: TurnContext) -> None:
    """A turn that ends with no answer at all is a failure the user is told about.

    This reaches the budget exits whose grace call also came back empty: without it the
    transcript would rest on an unanswered user row and no boundary row would close it.
    """
    if ctx.ending.answer is None:
        ctx.ending.fail_unanswered(NO_ANSWER_TEXT.format(reason=ctx.ending.reason_text))


def _mutation_footer(ctx: TurnContext) -> None:
    """TOOL-9: a delivered answer says which file changes did not apply.

    The footer goes into the pending final row itself, so the durable answer and the
    delivered one stay the same text (FIN-3).
    """
    failed = ctx.state.failed_mutations
    tail = ctx.transcript.tail()
    if not failed or not ctx.ending.delivered or tail is None \
            or tail.row_id is not None or tail.role is not Role.ASSISTANT:
        return
    listed = ", ".join(f"{path} ({tool})" for path, tool in sorted(failed.items()))
    text = f"{ctx.ending.answer}\n\n{MUTATION_FOOTER} {listed}]"
    ctx.ending.amend_answer(text)
    ctx.transcript.replace_last(tail.rewritten(text))  # WIRE-2: never with an old sidecar


async def _persist_pending(ctx: TurnContext) -> None:
    """Write what the working list still holds unstored: the final assistant row."""
    pending = ctx.transcript.pending()
    if pending:
        await ctx.persist(pending, Site.FINAL)


async def _close_tail(ctx: TurnContext) -> None:
    """FIN-3: the delivered answer must be the durable tail's visible text.

    After the flush the durable tail is the answer's own row, or, when that write failed,
    the last row stored before it: the turn's user row or a tool result. It is never an
    assistant row other than the answer's, because every assistant row the loop stores
    is a tool-call row whose results are stored next, or the turn fails (and a failed
    turn delivers nothing); answers always carry visible text, and scaffolding is never
    stored. The one hidden row, a reply a correction cut with nothing visible (LOOP-4), is
    stored in one write with the correction's user row, which follows it; an answer
    recovered from a failed stream (FIN-2) is an answer like any other. So the one repair
    is to append the answer. FIN-3's other case, an assistant tail without visible text
    that the answer fills in place, cannot arise here, and there is no such branch.
    """
    answer = ctx.ending.answer
    if not ctx.ending.delivered or answer is None:
        return
    tail = ctx.transcript.durable_tail()
    if tail is None or tail.role is not Role.ASSISTANT:
        row = Message(role=Role.ASSISTANT, content=answer, turn_id=ctx.turn_id)
        ctx.transcript.append(row)
        await ctx.persist((row,), Site.TAIL_CLOSURE)


def _open_call_text(ctx: TurnContext) -> Callable[[str], str]:
    """What an open call's closing result says, by whose call it is and what became of it.

    A call of this turn ran and lost its result, or never started; a call still open from
    a crashed earlier turn (its repair write failed) may have run: it is reported unknown.
    """
    own = {c.id for m in ctx.transcript.current_turn() if m.turn_id == ctx.turn_id
           for c in m.tool_calls}

    def text(call_id: str) -> str:
        if call_id in ctx.state.unrecorded_calls:
            return closure.UNRECORDED_RESULT_TEXT
        if call_id in ctx.state.interrupted_calls:
            return closure.INTERRUPTED_CALL_TEXT
        return closure.NOT_RUN_TEXT if call_id in own else closure.RECOVERED_CALL_TEXT
    return text


async def _failure_boundary(ctx: TurnContext) -> None:
    """FIN-5: a failed turn leaves no open user or tool tail (context pressure excepted).

    Calls whose results could not be recorded get an ``unknown`` result first, so the
    sequence is closed too (TOOL-3); those results were never shown to the model (TOOL-8).
    """
    if not ctx.ending.failed or ctx.ending.reason in CONTEXT_PRESSURE_EXITS:
        return
    rows = closure.closing_rows(ctx.transcript, ctx.turn_id, result_text=_open_call_text(ctx),
                                boundary_text=f"[turn ended without an answer: {ctx.ending.reason_text}]")
    if rows:
        ctx.transcript.extend(rows)
        await ctx.persist(tuple(rows), Site.BOUNDARY)


def exit_line(ctx: TurnContext, tail: Message | None = None) -> ExitLine:
    """FIN-7: the one turn-exit line, from the durable tail the finalizer leaves (``tail``:
    the row that will be that tail once the commit the line rides with holds it)."""
    state = ctx.state
    return ExitLine.build(ctx.ending, api_calls=state.api_calls,
                          max_iterations=ctx.limits.max_iterations, budget_used=state.budget.used,
                          budget_max=state.budget.max_total,
                          tail=ctx.transcript.durable_tail() if tail is None else tail,
                          cleanup_errors=len(ctx.cleanup_errors))


def _ending(ctx: TurnContext, tail: Message | None = None) -> tuple[Event, ...]:
    """FIN-7, DEL-1: the turn's last events, the exit line and then the completion."""
    carried = ctx.carried_input.content if ctx.carried_input is not None else None
    completion = Completion(final_response=ctx.ending.answer, failed=ctx.ending.failed,
                            carried_input=carried)
    return (exit_line(ctx, tail).event(ctx.session_id, ctx.turn_id),
            completion.event(ctx.session_id, ctx.turn_id))


async def finalize(ctx: TurnContext) -> TurnResult:
    ctx.enter(Phase.FINALIZE)
    if not ctx.ended:
        await _budget_fallback(ctx)
    _held_answer_stands(ctx)
    ctx.transcript.drop_scaffolding()
    _silent_stop_guard(ctx)
    _no_answer_guard(ctx)
    _mutation_footer(ctx)
    closing = _closing(ctx)
    if not (closing is not None and await _release(ctx, closing)):
        if closing is None:  # (a closing whose rows failed was that write: not retried here)
            await _persist_pending(ctx)
        await _close_tail(ctx)
        await _failure_boundary(ctx)
        for event in _ending(ctx):
            await Emit(event)
        await _release(ctx)
    _update_cache(ctx)
    ctx.enter(Phase.DONE)
    return _result(ctx)


def _closing(ctx: TurnContext) -> Closing | None:
    """The final rows and the ending that is true once they are durable (``Closing``), when
    the delivered answer's own row is all that is left to write: then it, the ending and the
    release are one commit (``CloseTurn``), with no tail to close and no boundary to add."""
    pending = ctx.transcript.pending()
    if not pending or not ctx.ending.delivered or pending[-1].role is not Role.ASSISTANT:
        return None
    return Closing(rows=pending, events=_ending(ctx, tail=pending[-1]))


async def _release(ctx: TurnContext, closing: Closing | None = None) -> bool:
    """LEASE-6: stop the refresher and join it, clear this lease's interrupt, release.

    In that order: a refresher still running after the release could refresh nothing but
    could still miss, and a miss would interrupt whatever runs next; an interrupt cleared
    before the join could be raised again by a refresh already in flight. The release
    happens whatever post-processing did, and it also commits the turn's ending (its exit
    line and completion ride with it). A release that fails leaves the lease to expire on
    its own, and the ending is then committed by itself, so a turn never loses the record
    of how it ended to a failed release (FIN-6).

    With ``closing`` the final rows and the ending are written in the release's commit
    (``CloseTurn``), the release still last. False when those rows failed: nothing of the
    commit holds, the lease is still the turn's, and the finalizer ends the turn as one
    whose final write failed (the refresher stays stopped; nothing long runs after).
    Whether the refresher had lost the lease is not asked: the fence decides, since a
    write under a lost lease is refused (``LeaseLost``) and the turn ends interrupted."""
    if ctx.refresher is not None:
        await StopRefresher(ctx.refresher)
        await ClearInterrupt()
        ctx.refresher = None
    if closing is not None:
        return await _close_turn(ctx, closing)
    try:
        await ReleaseLease(ctx.lease)
        return True
    except PersistenceError as error:
        ctx.cleanup_errors.append(f"release: {error.cause}: {error}")
    try:
        await FlushEvents()
    except PersistenceError as error:
        ctx.cleanup_errors.append(f"events: {error.cause}: {error}")
    return True


async def _close_turn(ctx: TurnContext, closing: Closing) -> bool:
    """FIN-6: the one commit of the final rows, the ending and the release, each failure
    guarded on its own: rows that fail are the final write's failure (False), a release
    that fails is a cleanup error of a turn whose answer and ending are durable."""
    try:
        closed = await CloseTurn(ctx.lease, closing)
    except PersistenceError as error:
        ctx.write_failed(Site.FINAL, error)
        return False
    check_stored(closing.rows, closed.stored)
    ctx.transcript.absorb(closed.stored)
    if closed.release_failure is not None:
        cause, message = closed.release_failure
        ctx.cleanup_errors.append(f"release: {cause}: {message}")
    return True


def _update_cache(ctx: TurnContext) -> None:
    """Keep the transcript for the next turn only if everything in it is durable."""
    cache = ctx.cache
    if ctx.transcript.pending() or ctx.cleanup_errors or ctx.state.persistence_failed:
        cache.last_lease_token = 0  # force a reload from the durable record
        return
    ctx.transcript.settle()
    cache.history = ctx.transcript
    cache.last_lease_token = ctx.lease.token


def _result(ctx: TurnContext) -> TurnResult:
    ending = ctx.ending
    reason = ending.reason
    if reason is None:  # exit_line already refused this; keep the type honest
        raise InvariantBroken("a turn finished without an exit reason")
    failure = f"{reason.value}:{ending.detail}" if ending.failed else None
    return TurnResult(
        session_id=ctx.session_id, turn_id=ctx.turn_id, final_response=ending.answer,
        exit_reason=reason, exit_detail=ending.detail, api_calls=ctx.state.api_calls,
        budget_used=ctx.state.budget.used,
        completed=ending.answer is not None and not ending.failed,
        failed=ending.failed, failure_reason=failure,
        cleanup_errors=tuple(ctx.cleanup_errors), carried_input=ctx.carried_input,
        retryable=ctx.carried_input is not None,
    )
