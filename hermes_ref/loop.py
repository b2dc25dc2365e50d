"""The main loop: call the model until it answers, the budget ends or something fails.

Theory of operation
-------------------
The loop runs while its iterations (``api_calls`` less the fallback hops, each of which
gives back the call it replaced: ``routes.fall_back``) stay under ``max_iterations`` and a
budget unit can be spent (LOOP-1).
The one grace call that LOOP-1 allows past that bound is made by the finalizer once the
loop has ended (FIN-1), so here it needs no flag. Each iteration spends one budget unit
and counts one API call (LOOP-2), but only for a request that is sent: when preflight
refuses one (CMP-7) the unit is given back and no call is counted. It builds the request
from the working transcript and calls the provider through ``call_with_retries``, which
classifies failures (LOOP-5):

* transient (429 honouring Retry-After, 5xx, timeout, a cut stream): back off on the
  virtual clock with seeded jitter and retry the same call, ``transient_retries_max`` times;
* auth: renew the credentials through the port (``RefreshCredentials``), once, then again;
* context overflow: back to preflight (``compaction.after_overflow``): a forced
  compaction pass, then the rebuilt request; one compaction cannot relieve fails the
  turn closed, and the refused request is never sent again (CMP-7);
* any other provider error: terminal;
* retries spent on a transient or auth error: the next provider of ``fallback_providers``
  (LOOP-6, ``routes``): the iteration starts over, so preflight and the request are
  rebuilt for it, and the spent call and its unit are refunded (LOOP-2); a turn's failed
  calls stop at ``outer_loop_errors_max`` whatever is left.

At the top of each iteration the user's corrections are taken in (LOOP-4, ``redirect``); a
correction that cut the call in flight starts the iteration over. A reply the engine cannot
process (``local_problem``) ends the turn ``local_processing_error`` at once, no retry.

A reply with tool calls goes to the tool round. A reply that promised tool calls but
carried none (``finish_reason=tool_calls``), even one that narrates the call it meant to
make, gets a marked re-prompt, at most ``dropped_toolcall_retries_max`` times in a row
(LOOP-7). A reply with nothing visible (reasoning-only ones too) walks the empty-reply
ladder, the ordered table ``ladder.RUNGS`` (LOOP-8). All of those synthetic messages are
scaffolding (SCAF-1). Anything else is the final answer, think blocks removed; with
``verify_before_answer`` the first one after a file change is held back while the model
verifies (FIN-1's gate). The answer joins the working list unpersisted and the finalizer
writes it.

Every exit records one reason from the closed set in ``outcomes.ExitReason`` (LOOP-3).
"""

from __future__ import annotations

import json

from hermes_ref import (
    compaction,
    ladder,
    preflight,
    redirect,
    reply_intake,
    routes,
    streaming,
    tool_round,
)
from hermes_ref.context import TurnContext
from hermes_ref.effects import CallProvider, Jitter, RefreshCredentials, Sleep
from hermes_ref.errors import (
    ContextOverflow,
    ProviderAuthError,
    ProviderError,
    RateLimited,
    Redirected,
    StreamCut,
    TurnInterrupted,
)
from hermes_ref.models import Message, ProviderReply, Role, ScaffoldFlag, ToolKind
from hermes_ref.outcomes import ExitReason
from hermes_ref.phases import Phase
from hermes_ref.scaffolding import (
    DROPPED_TOOLCALL_NUDGE,
    PRE_VERIFY_NUDGE,
    scaffold,
)
from hermes_ref.wire import ProviderRequest

TRUNCATED_TEXT = "Response truncated due to output length limit: the tool call was not run."


def build_request(ctx: TurnContext, *, with_tools: bool = True, purpose: str = "turn") -> ProviderRequest:
    """The next request: system prompt, then the working list (O(1) token bookkeeping)."""
    system = ctx.cache.system_message
    return ProviderRequest(
        model=ctx.limits.model,
        messages=(system, *ctx.transcript.visible()),  # LOOP-4: hidden rows stay off
        tools=ctx.tools if with_tools else (),
        prompt_tokens=routes.route_tokens(ctx, compaction.request_tokens(ctx)),
        max_tokens=ctx.limits.max_tokens,
        stream=ctx.limits.stream_replies,
        purpose=purpose,
    )


async def _backoff_s(ctx: TurnContext, attempt: int, error: ProviderError) -> float:
    """Retry-After when the provider gave one; else exponential with equal jitter: half the
    step is fixed, half is drawn, so retries of many sessions do not arrive in lockstep."""
    if isinstance(error, RateLimited) and error.retry_after_s is not None:
        return max(0.0, error.retry_after_s)
    step = min(ctx.limits.backoff_max_s, ctx.limits.backoff_base_s * (2.0 ** attempt))
    return step / 2 + step / 2 * await Jitter()


async def call_with_retries(ctx: TurnContext, request: ProviderRequest) -> ProviderReply | None:
    """One logical model call with LOOP-5 classification.

    None means the turn ended (``ctx.ended``) or the iteration must start over: the turn
    fell back to another provider (LOOP-6), or a correction cut the call (LOOP-4).
    """
    attempt = 0
    auth_refreshes = 0
    sent = False  # whether this request went out once (a retry of it costs nothing more)
    while True:
        failure: ProviderError | None = None
        try:
            reply = await CallProvider(request, ctx.session_id, ctx.turn_id, ctx.token)
        except TurnInterrupted as stop:
            if stop.unsent and not sent:
                _never_sent(ctx, request)
            raise
        except StreamCut as broken:  # FIN-2: a stream that already held a whole answer is kept
            recovered = streaming.recover(broken)
            failure = broken if recovered is None else None
            reply = recovered if recovered is not None else ProviderReply()
        except ProviderError as error:
            failure = error
        except Redirected as cut:  # LOOP-4: the loop takes the correction in at its top
            ctx.state.cut_partial = cut.partial
            return None
        sent = True
        if failure is None:  # every reply, grace summary included: text the store can keep,
            reply = reply_intake.admit_reply(reply)  # an id per call; then its deltas (DEL-1)
            await streaming.publish(ctx.session_id, ctx.turn_id, ctx.state.api_calls, reply)
            return reply
        if isinstance(failure, ContextOverflow):  # LOOP-5: back to preflight (CMP-7)
            rebuilt = await compaction.after_overflow(ctx, request, failure)
            if rebuilt is None:  # failed closed: the refused request is never sent again
                return None
            request, attempt, sent = rebuilt, 0, False  # a new request, charged anew
            continue
        kind = type(failure).__name__
        ctx.state.provider_errors += 1
        if ctx.state.provider_errors >= ctx.limits.outer_loop_errors_max:
            ctx.finish(ExitReason.TERMINAL_PROVIDER_ERROR, f"{kind}: {failure} (the turn's "
                       f"{ctx.state.provider_errors}th failed call: outer_loop_errors_max)",
                       failed=True)
            return None
        auth = isinstance(failure, ProviderAuthError)
        if auth and auth_refreshes < ctx.limits.auth_refreshes_max:
            auth_refreshes += 1
            # once, through the port, then again
            await RefreshCredentials(request.model, ctx.session_id, ctx.turn_id)
            continue
        if failure.transient and attempt < ctx.limits.transient_retries_max:
            await Sleep(await _backoff_s(ctx, attempt, failure))
            attempt += 1
            continue
        if (auth or failure.transient) and routes.can_fall_back(ctx):  # LOOP-6: retries spent
            routes.fall_back(ctx, refund=request.purpose != "grace")
            return None  # the iteration starts over: preflight and the request, for the fallback
        ctx.finish(ExitReason.TERMINAL_PROVIDER_ERROR, f"{kind}: {failure}", failed=True)
        return None


def _loop_may_continue(ctx: TurnContext) -> bool:
    """LOOP-1's cap on calls (a fallback hop's call refunded); its budget half is spending
    a unit (``IterationBudget.consume``), so each bound is checked in exactly one place."""
    return ctx.state.iterations < ctx.limits.max_iterations


async def run_loop(ctx: TurnContext) -> None:
    """Iterate until an exit reason is recorded or the budget ends (the finalizer handles that).

    A hard interrupt (the lease was lost: LEASE-4) surfaces as ``TurnInterrupted`` from the
    model call, tool batch or sleep the turn was in, and ends the turn ``interrupted``.
    """
    try:
        await _iterate(ctx)
    except TurnInterrupted as stop:
        ctx.finish(ExitReason.INTERRUPTED, stop.reason)


async def _iterate(ctx: TurnContext) -> None:
    state = ctx.state
    while not ctx.ended and _loop_may_continue(ctx):
        await redirect.take_redirects(ctx)  # LOOP-4: corrections first, at the top
        if ctx.ended:
            return
        if not state.budget.consume():
            break
        ctx.enter(Phase.PREFLIGHT)
        if not await cleared_to_send(ctx):
            return
        ctx.enter(Phase.MODEL_CALL)
        reply = await call_with_retries(ctx, build_request(ctx))
        if reply is None:
            continue  # ended, or starts over (a fallback, a correction): the loop condition says
        await handle_reply(ctx, reply)
    await _take_in_a_last_cut(ctx)


async def _take_in_a_last_cut(ctx: TurnContext) -> None:
    """LOOP-4 at the loop's bound: a correction queued when the loop leaves (one that cut
    the last call it could make, or one sent during its last tool round) is this turn's to
    take in, before the finalizer's grace call, as Hermes drains corrections at the top of
    the grace call's iteration (LOOP-1 counts a pending grace call as one). A correction
    the turn leaves untaken ends with it: the queue is the turn's. An empty queue takes in
    nothing. With an answer the verification gate holds back, the correction is taken in
    too: it overrules that answer (``take_redirects`` clears it), and the finalizer then
    asks for a summary instead of delivering what the user corrected (FIN-1). With neither
    a grace call enabled nor an answer held there is no such iteration, and only a
    correction that cut a call is taken in."""
    state = ctx.state
    # a grace call will answer it, or it overrules the answer the gate holds back
    matters = ctx.limits.grace_call_enabled or state.withheld_answer is not None
    if not ctx.ended and (state.cut_partial is not None or matters):
        await redirect.take_redirects(ctx)


def _never_sent(ctx: TurnContext, request: ProviderRequest) -> None:
    """LOOP-2: the turn was stopped before ``request`` went out (the user's interrupt, or
    the loss of the lease, was known before the call), so it costs nothing: its call is
    not counted, and the unit it was charged is given back, as for a request preflight
    refused. A grace call was charged no unit (LOOP-1 counts it past the bound)."""
    ctx.state.api_calls -= 1
    if request.purpose != "grace":
        ctx.state.budget.refund()


async def cleared_to_send(ctx: TurnContext) -> bool:
    """Preflight (CMP-7), then LOOP-2's charge: only a request that will be sent costs.

    The loop has already spent the iteration's budget unit, because spending it is how
    the budget half of LOOP-1 is checked (in exactly one place). When preflight refuses,
    the request is never sent, so the unit is given back and no API call is counted:
    the turn's figures stay equal to what the provider saw. (Hermes refunds the call and
    the unit the same way when a preflight compression pass replaces a call.) A turn
    stopped during preflight (its lease lost while a compaction ran, say) sent nothing
    either, and gets its unit back the same way.
    """
    try:
        cleared = await preflight.check(ctx)
    except TurnInterrupted:  # stopped in preflight (a lost lease, the user): nothing was sent
        ctx.state.budget.refund()
        raise
    if not cleared:
        ctx.state.budget.refund()
        return False
    ctx.state.api_calls += 1
    return True


async def handle_reply(ctx: TurnContext, reply: ProviderReply) -> None:
    """Route one reply: tool round, dropped-call re-prompt, empty ladder or final answer."""
    if not _processable(ctx, reply):
        return
    if reply.tool_calls and not _arguments_usable(ctx, reply):
        return
    if reply.tool_calls:
        assistant = Message(
            role=Role.ASSISTANT, content=ladder.without_reasoning(reply.content),
            tool_calls=reply.tool_calls, finish_reason=reply.finish_reason, turn_id=ctx.turn_id,
        )
        specs = ctx.specs
        if await tool_round.run_tool_round(ctx, assistant):
            ctx.state.files_changed |= any(
                c.name in specs and specs[c.name].kind is ToolKind.WRITER for c in reply.tool_calls)
        return
    if dropped_call(reply) and _may_reprompt_dropped(ctx):
        _reprompt_dropped(ctx, reply)
        return
    if ladder.is_empty(reply):  # LOOP-8: nothing visible, reasoning-only replies included
        ladder.walk(ctx, reply)
        return
    text = ladder.without_reasoning(reply.content) or ""  # raw reasoning is never stored (LOOP-4)
    if _withheld_for_verification(ctx, text):
        return
    ctx.transcript.append(Message(
        role=Role.ASSISTANT, content=text, finish_reason=reply.finish_reason,
        turn_id=ctx.turn_id,
    ))
    ctx.finish(ExitReason.TEXT_RESPONSE, f"finish_reason={reply.finish_reason}", answer=text)


LOCAL_ERROR_TEXT = (
    "This reply could not be processed here (a fault of this engine, not of the model); "
    "the turn stopped without retrying it."
)


def local_problem(reply: ProviderReply) -> str | None:
    """LOOP-5: why this engine cannot process ``reply``, deterministically, or None.

    The one such failure known: tool-call arguments nested deeper than the JSON parser's
    recursion limit. The same reply would fail the same way on every retry.
    """
    for call in reply.tool_calls:
        try:
            json.loads(call.arguments)
        except RecursionError:
            return f"the arguments of {call.name} ({call.id}) nest too deeply to parse"
        except ValueError:
            continue  # malformed or cut off: LOOP-9 decides
    return None


def _processable(ctx: TurnContext, reply: ProviderReply) -> bool:
    """LOOP-5: a local processing bug stops the turn at once, without a retry."""
    problem = local_problem(reply)
    if problem is None:
        return True
    ctx.finish(ExitReason.LOCAL_PROCESSING_ERROR, problem[:80], answer=LOCAL_ERROR_TEXT,
               failed=True)
    return False


def _withheld_for_verification(ctx: TurnContext, text: str) -> bool:
    """FIN-1's gate: after file changes, the first answer is held back while the model
    checks its work (``verify_before_answer``). The answer waits in the turn's state; the
    finalizer delivers it if the budget runs out, or the check fails, before the model
    answers again. The gate holds one answer per turn, even when a correction has since
    overruled it (``redirect.take_redirects``)."""
    state = ctx.state
    if not (ctx.limits.verify_before_answer and state.files_changed) or state.gate_spent:
        return False
    state.gate_spent, state.withheld_answer = True, text
    ctx.transcript.append(scaffold(Role.ASSISTANT, text, ScaffoldFlag.VERIFICATION_STOP,
                                   ctx.turn_id))
    ctx.transcript.append(scaffold(Role.USER, PRE_VERIFY_NUDGE, ScaffoldFlag.PRE_VERIFY,
                                   ctx.turn_id))
    return True


def dropped_call(reply: ProviderReply) -> bool:
    """LOOP-7: the reply promised tool calls and carried none, whatever text it narrated.

    Only the finish reason decides: a reply that says "Let me read a.txt now." and stops
    with ``tool_calls`` dropped its call exactly as an empty one did.
    """
    return reply.finish_reason == "tool_calls" and not reply.tool_calls


def _may_reprompt_dropped(ctx: TurnContext) -> bool:
    """LOOP-7's bound: at most ``dropped_toolcall_retries_max`` re-prompts in a row."""
    return ctx.state.dropped_toolcall_retries < ctx.limits.dropped_toolcall_retries_max


def _reprompt_dropped(ctx: TurnContext, reply: ProviderReply) -> None:
    """LOOP-7: the reply promised tool calls (``finish_reason=tool_calls``) and made none.

    Narration such as "Let me read a.txt now." is not an answer: the model meant to act
    and did not. As Hermes does, the reply is kept as it came, narration included, in a
    scaffolding assistant message, followed by a scaffolding nudge; the model sees what
    it said and is asked for the call itself. Both are dropped before anything is stored
    (SCAF-1). Past the bound the reply is taken as it is: text becomes the answer, an
    empty reply walks the empty ladder.
    """
    ctx.state.dropped_toolcall_retries += 1
    flag = ScaffoldFlag.DROPPED_TOOLCALL_NUDGE
    ctx.transcript.append(scaffold(Role.ASSISTANT, reply.content or "", flag, ctx.turn_id))
    ctx.transcript.append(scaffold(Role.USER, DROPPED_TOOLCALL_NUDGE, flag, ctx.turn_id))


def _looks_truncated(arguments: str) -> bool:
    """Arguments cut off by the output limit: they do not end where a JSON value ends."""
    tail = arguments.rstrip()
    return bool(tail) and tail[-1] not in "}]"


def _arguments_usable(ctx: TurnContext, reply: ProviderReply) -> bool:
    """LOOP-9: decide what to do with tool calls whose arguments are not a JSON object.

    Cut off by the length limit → the turn ends as partial (``truncated_tool_call``), the
    calls never recorded and never run. Otherwise malformed → the call is made again
    without recording anything, up to ``invalid_json_retries_max`` times in a row; on the
    last try the round is recorded and the bad calls are answered with errors in place.
    """
    bad = [c for c in reply.tool_calls if c.arguments_object is None]
    if not bad:
        ctx.state.invalid_json_retries = 0
        return True
    if reply.finish_reason == "length" or any(_looks_truncated(c.arguments) for c in bad):
        ctx.finish(ExitReason.TRUNCATED_TOOL_CALL,
                   f"arguments of {', '.join(c.name for c in bad)} were cut off",
                   answer=TRUNCATED_TEXT, failed=True)
        return False
    ctx.state.invalid_json_retries += 1
    return ctx.state.invalid_json_retries >= ctx.limits.invalid_json_retries_max
