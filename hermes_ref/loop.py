"""The main loop: call the model until it answers, the budget ends or something fails.

Theory of operation
-------------------
The loop runs while ``api_calls < max_iterations`` and a budget unit can be spent (LOOP-1).
The one grace call that LOOP-1 allows past that bound is made by the finalizer once the
loop has ended (FIN-1), so here it needs no flag. Each iteration spends one budget unit
and counts one API call (LOOP-2), but only for a request that is sent: when preflight
refuses one (CMP-7) the unit is given back and no call is counted. It builds the request
from the working transcript and calls the provider through ``call_with_retries``, which
classifies failures (LOOP-5):

* transient (429 honouring Retry-After, 5xx, timeout): back off and retry the same call;
* auth: one more try (a credential refresh in a real deployment), then terminal;
* context overflow: the turn fails closed and the request is not sent again; once
  compaction exists (CMP-7) this is where it hands back to preflight;
* any other provider error: terminal.

A reply with tool calls goes to the tool round. A reply that promised tool calls but
carried none (``finish_reason=tool_calls``), even one that narrates the call it meant to
make, gets a marked re-prompt, at most ``dropped_toolcall_retries_max`` times in a row
(LOOP-7). An empty reply walks a short ladder: one nudge after a tool round, bounded
retries, then the ``(empty)`` sentinel and ``empty_response_exhausted`` (LOOP-8). All of
those synthetic messages are scaffolding (SCAF-1). Anything else is the final answer;
it joins the working list unpersisted and the finalizer writes it.

Every exit records one reason from the closed set in ``outcomes.ExitReason`` (LOOP-3).
"""

from __future__ import annotations

from hermes_ref import preflight, reply_intake, tool_round
from hermes_ref.context import TurnContext
from hermes_ref.effects import CallProvider, Jitter, Sleep
from hermes_ref.errors import (
    ContextOverflow,
    ProviderAuthError,
    ProviderError,
    RateLimited,
    TurnInterrupted,
)
from hermes_ref.models import Message, ProviderReply, Role, ScaffoldFlag
from hermes_ref.outcomes import ExitReason
from hermes_ref.phases import Phase
from hermes_ref.scaffolding import (
    DROPPED_TOOLCALL_NUDGE,
    EMPTY_AFTER_TOOLS_NUDGE,
    EMPTY_SENTINEL,
    scaffold,
)
from hermes_ref.wire import ProviderRequest

TRUNCATED_TEXT = "Response truncated due to output length limit: the tool call was not run."


def build_request(ctx: TurnContext, *, with_tools: bool = True, purpose: str = "turn") -> ProviderRequest:
    """The next request: system prompt, then the working list (O(1) token bookkeeping)."""
    system = ctx.cache.system_message
    return ProviderRequest(
        model=ctx.limits.model,
        messages=(system, *ctx.transcript),
        tools=ctx.tools if with_tools else (),
        prompt_tokens=system.tokens + ctx.transcript.tokens,
        max_tokens=ctx.limits.max_tokens,
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
    """One logical model call with LOOP-5 classification. None means the turn ended."""
    attempt = 0
    auth_refreshes = 0
    while True:
        failure: ProviderError | None = None
        try:
            reply = await CallProvider(request, ctx.session_id, ctx.turn_id)
        except ProviderError as error:
            failure = error
        else:  # every reply, grace summary included: text the store can keep, an id per call
            return reply_intake.admit_reply(reply)
        if isinstance(failure, ContextOverflow):
            ctx.finish(ExitReason.TERMINAL_PROVIDER_ERROR, f"context_overflow: {failure}", failed=True)
            return None
        if isinstance(failure, ProviderAuthError) and auth_refreshes < ctx.limits.auth_refreshes_max:
            auth_refreshes += 1
            continue
        if failure.transient and attempt < ctx.limits.transient_retries_max:
            await Sleep(await _backoff_s(ctx, attempt, failure))
            attempt += 1
            continue
        kind = type(failure).__name__
        ctx.finish(ExitReason.TERMINAL_PROVIDER_ERROR, f"{kind}: {failure}", failed=True)
        return None


def _loop_may_continue(ctx: TurnContext) -> bool:
    """LOOP-1's cap on calls; its budget half is spending a unit (``IterationBudget.consume``),
    so each bound is checked in exactly one place."""
    return ctx.state.api_calls < ctx.limits.max_iterations


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
        if not state.budget.consume():
            break
        ctx.enter(Phase.PREFLIGHT)
        if not await cleared_to_send(ctx):
            return
        ctx.enter(Phase.MODEL_CALL)
        reply = await call_with_retries(ctx, build_request(ctx))
        if reply is None:
            return
        await handle_reply(ctx, reply)


async def cleared_to_send(ctx: TurnContext) -> bool:
    """Preflight (CMP-7), then LOOP-2's charge: only a request that will be sent costs.

    The loop has already spent the iteration's budget unit, because spending it is how
    the budget half of LOOP-1 is checked (in exactly one place). When preflight refuses,
    the request is never sent, so the unit is given back and no API call is counted:
    the turn's figures stay equal to what the provider saw. (Hermes refunds the call and
    the unit the same way when a preflight compression pass replaces a call.)
    """
    if not await preflight.check(ctx):
        ctx.state.budget.refund()
        return False
    ctx.state.api_calls += 1
    return True


async def handle_reply(ctx: TurnContext, reply: ProviderReply) -> None:
    """Route one reply: tool round, dropped-call re-prompt, empty ladder or final answer."""
    if reply.tool_calls and not _arguments_usable(ctx, reply):
        return
    if reply.tool_calls:
        assistant = Message(
            role=Role.ASSISTANT, content=reply.content, tool_calls=reply.tool_calls,
            finish_reason=reply.finish_reason, turn_id=ctx.turn_id,
        )
        await tool_round.run_tool_round(ctx, assistant)
        return
    if dropped_call(reply) and _may_reprompt_dropped(ctx):
        _reprompt_dropped(ctx, reply)
        return
    if not (reply.content or "").strip():
        _handle_empty(ctx)
        return
    ctx.transcript.append(Message(
        role=Role.ASSISTANT, content=reply.content, finish_reason=reply.finish_reason,
        turn_id=ctx.turn_id,
    ))
    ctx.finish(ExitReason.TEXT_RESPONSE, f"finish_reason={reply.finish_reason}",
               answer=reply.content)


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


def _handle_empty(ctx: TurnContext) -> None:
    """LOOP-8, the rungs this engine implements: nudge once after tools, retry, sentinel."""
    state = ctx.state
    flag = ScaffoldFlag.EMPTY_RECOVERY
    if state.last_round_had_tools and not state.post_tool_nudged:
        state.post_tool_nudged = True
        ctx.transcript.append(scaffold(Role.ASSISTANT, EMPTY_SENTINEL, flag, ctx.turn_id))
        ctx.transcript.append(scaffold(Role.USER, EMPTY_AFTER_TOOLS_NUDGE, flag, ctx.turn_id))
        return
    if state.empty_retries < ctx.limits.empty_retries_max:
        state.empty_retries += 1
        return
    ctx.transcript.append(
        scaffold(Role.ASSISTANT, EMPTY_SENTINEL, ScaffoldFlag.EMPTY_TERMINAL_SENTINEL, ctx.turn_id)
    )
    ctx.finish(ExitReason.EMPTY_RESPONSE_EXHAUSTED, "", answer=EMPTY_SENTINEL, failed=True)
