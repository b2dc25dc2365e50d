"""Compaction: the effectful step that runs a compression pass before a model call (CMP, CTX-5..7).

Theory of operation
-------------------
Preflight (``hermes_ref.preflight``) runs before every model call and hands over here
when the request needs relief. The decisions are ``hermes_ref.compression``'s; this
module performs them:

* before the turn's first call: a manual compaction if one was asked for (it ignores the
  cooldown), else an idle compaction if the session sat idle long enough (CTX-5); then up
  to ``compression_passes_max`` threshold passes, stopping at the first that is not a
  progress (CTX-6);
* before a later call: one pass while the request is over the threshold;
* after the provider proved an overflow (``ContextOverflow``): a forced pass, and the
  request is rebuilt from the compacted list; a pass that cannot relieve it fails the
  turn closed, so the refused request is never sent again (CMP-7, LOOP-5).

A pass prunes old tool outputs first (no model call); when that is not enough it asks an
auxiliary model for a summary of the middle through ``CallProvider`` with purpose
``"compression"`` (the simulator routes it to its summarizer), updating the previous
summary when there is one (CMP-2). The compacted list is repaired so that no tool call
loses its results or result its call (CMP-3), and the current user message is kept (CTX-7).
It becomes durable through ``rotation.commit_compaction`` (the lock, then one write); a
lock held elsewhere leaves the messages unchanged.

A summary call that fails or times out changes nothing, so no message is lost, and it
starts the cooldown (CMP-4). A pass never costs a budget unit or an API call: the unit the
loop spent is for the request that is sent after it (LOOP-2), which is what Hermes gets by
refunding the call a pass replaced. The exception handler keeps no effect in it: the
failure is recorded, and what follows runs after it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hermes_ref import compression, rotation, routes
from hermes_ref.compression import Budget, CompressionState, Plan
from hermes_ref.context import TurnContext
from hermes_ref.effects import CallProvider, Now
from hermes_ref.errors import InvariantBroken, ProviderError, ProviderTimeout
from hermes_ref.models import Message, Role
from hermes_ref.outcomes import ExitReason
from hermes_ref.phases import Phase
from hermes_ref.transcript import Transcript
from hermes_ref.wire import ProviderRequest

COMPRESSION_PURPOSE = "compression"
SUMMARIZER_PROMPT = (
    "You compress conversations. Write a short, faithful summary of the conversation you "
    "are given: what the user asked, what was done, what was found and what is still open. "
    "When a previous summary is given, update it with the new conversation; keep what it "
    "says unless the conversation contradicts it."
)
EXHAUSTED_TEXT = ("The conversation is too long for the model's context window, and compacting it "
                  "could not make the request fit. Nothing was lost; start a new conversation or "
                  "ask for a manual compaction.")
TIMEOUT_TEXT = ("Compacting the conversation timed out, and without it the request does not fit "
                "the model's context window. Nothing was lost; ask again in a moment.")


@dataclass(frozen=True, slots=True)
class PassOutcome:
    """What one pass did: the (messages, tokens) before and after, and why it stopped."""

    before: tuple[int, int]
    after: tuple[int, int]
    changed: bool = False
    summarized: bool = False
    failure: str | None = None  # the summary call failed (the cooldown started)
    timed_out: bool = False
    deferred: bool = False      # the lock is held elsewhere: nothing changed, nothing judged
    ratio: float = 0.95         # compression_progress_ratio: tokens must fall under this share

    @property
    def progress(self) -> bool:
        return self.changed and compression.made_progress(self.before, self.after, self.ratio)


def request_tokens(ctx: TurnContext) -> int:
    """The next request's tokens by this engine's count: the system message and the
    working list's total (hidden rows count for nothing)."""
    return ctx.cache.system_message.tokens + ctx.transcript.tokens


def _measure(ctx: TurnContext) -> tuple[int, int]:
    return len(ctx.transcript), request_tokens(ctx)


def _user_text(ctx: TurnContext) -> str | None:
    """This turn's text, from its user row, for re-location (CTX-7). A retry's nudge is a
    user message of the turn too, but scaffolding, not what the user wrote."""
    for message in reversed(ctx.transcript.messages()):
        if message.role is Role.USER and message.turn_id == ctx.turn_id \
                and message.scaffold is None and not compression.is_summary(message):
            return message.content
    return None


# ---- the summary request ----------------------------------------------------------------


def _render(message: Message) -> str:
    text = " ".join((message.content or "").split())
    if message.role is Role.TOOL:
        return f"[tool {message.tool_name or 'result'}#{message.tool_call_id}] {text}"
    if message.tool_calls:
        calls = ", ".join(f"{c.name}#{c.id}({c.arguments})" for c in message.tool_calls)
        return f"[{message.role.value} calls] {calls} {text}".rstrip()
    return f"[{message.role.value}] {text}"


def summary_request(ctx: TurnContext, layout: Plan, figures: Budget) -> ProviderRequest:
    """The auxiliary model's request: the previous summary, then the middle, one line each."""
    parts = []
    if layout.previous_summary is not None:
        parts.append("Previous summary:\n" + layout.previous_summary.strip())
    parts.append("Conversation:\n" + "\n".join(_render(m) for m in layout.summarizable))
    system = Message(role=Role.SYSTEM, content=SUMMARIZER_PROMPT)
    user = Message(role=Role.USER, content="\n\n".join(parts))
    return ProviderRequest(model=ctx.limits.model, messages=(system, user), tools=(),
                           prompt_tokens=system.tokens + user.tokens,
                           max_tokens=figures.summary_tokens, purpose=COMPRESSION_PURPOSE)


async def _summarize(ctx: TurnContext, layout: Plan, figures: Budget) -> str | ProviderError:
    """The summary text, or the error that stopped it (nothing awaited in the handler)."""
    try:
        reply = await CallProvider(summary_request(ctx, layout, figures), ctx.session_id,
                                   ctx.turn_id, ctx.token)  # vouched for like any call (LEASE-4)
    except ProviderError as error:
        return error
    text = (reply.content or "").strip()
    return text if text else ProviderError("the summarizer answered with no text")


# ---- one pass ---------------------------------------------------------------------------


async def run_pass(ctx: TurnContext, now: float, *, target_tokens: int) -> PassOutcome:
    """Prune, then summarize if still over ``target_tokens``; commit what changed."""
    figures, limits = compression.budget(ctx.limits), ctx.limits
    state = ctx.cache.compression
    state.passes += 1
    before = _measure(ctx)
    messages = ctx.transcript.messages()
    pruned = compression.prune(messages, figures, limits)
    system_tokens = ctx.cache.system_message.tokens
    if pruned != messages and system_tokens + compression.tokens_of(pruned) < target_tokens:
        return await _commit(ctx, pruned, before, summarized=False)
    layout = compression.plan(pruned, figures, limits, _user_text(ctx))
    if layout is None:
        if pruned != messages:
            return await _commit(ctx, pruned, before, summarized=False)
        state.judge(before[1], figures.threshold_tokens)
        return PassOutcome(before, before)
    summary = await _summarize(ctx, layout, figures)
    if isinstance(summary, ProviderError):
        # CMP-4: the cooldown runs from the failure. ``now`` is when the turn decided to
        # compact, before an earlier pass whose summary may have taken minutes.
        state.summary_failed(await Now(), limits)
        return PassOutcome(before, before, failure=f"{type(summary).__name__}: {summary}",
                           timed_out=isinstance(summary, ProviderTimeout))
    compacted = compression.compose(layout, summary, None)  # the summary is no turn's row
    return await _commit(ctx, compacted, before, summarized=True)


async def _commit(ctx: TurnContext, compacted: tuple[Message, ...], before: tuple[int, int],
                  *, summarized: bool) -> PassOutcome:
    """Make the compacted list durable and the turn's working list; scaffolding stays local."""
    scaffolding = {id(m) for m in compacted if m.scaffold is not None}
    durable = tuple(m for m in compacted if id(m) not in scaffolding)
    if not await rotation.commit_compaction(ctx, durable):
        return PassOutcome(before, before, deferred=True)
    stored = ctx.transcript.messages()
    if len(stored) != len(durable):
        raise InvariantBroken(f"compacted {len(durable)} messages, the store kept {len(stored)}")
    rows = iter(stored)
    merged = [m if id(m) in scaffolding else next(rows) for m in compacted]
    ctx.transcript = Transcript(merged)
    state, figures = ctx.cache.compression, compression.budget(ctx.limits)
    after = _measure(ctx)
    state.compactions += 1
    state.last_compacted_tokens = after[1]
    state.judge(after[1], figures.threshold_tokens)
    return PassOutcome(before, after, changed=True, summarized=summarized,
                       ratio=ctx.limits.compression_progress_ratio)


# ---- what preflight asks for ---------------------------------------------------------------


async def before_first_call(ctx: TurnContext, state: CompressionState) -> PassOutcome | None:
    """Manual, then idle (CTX-5), then up to ``compression_passes_max`` threshold passes
    (CTX-6). Returns the last pass run, or None when none ran."""
    limits, figures = ctx.limits, compression.budget(ctx.limits)
    tokens = request_tokens(ctx)
    idle_due = limits.idle_compact_after_s > 0 and limits.compression_enabled
    if not (state.manual_pending or idle_due or tokens >= figures.threshold_tokens):
        return None  # nothing to decide: no clock read, no effect
    now = await Now()
    last: PassOutcome | None = None
    if state.manual_pending:
        state.manual_pending = False
        last = await run_pass(ctx, now, target_tokens=figures.tail_tokens)
    elif idle_due and _idle(ctx, state, figures, now):
        last = await run_pass(ctx, now, target_tokens=figures.tail_tokens)
    while state.passes < limits.compression_passes_max \
            and compression.should_compress(request_tokens(ctx), figures, state, now, limits):
        last = await run_pass(ctx, now, target_tokens=figures.threshold_tokens)
        if not last.progress:
            break
    return last


def _idle(ctx: TurnContext, state: CompressionState, figures: Budget, now: float) -> bool:
    """CTX-5, over the gap from the session's previous user row to this turn's own: when the
    user wrote it, not when the turn got the lease (a turn that waited in line for a busy
    session did not come after an idle one). An idle compaction is automatic, so whatever
    blocks automatic compaction blocks it (CMP-4): the cooldown and the ineffective passes."""
    earlier: list[float] = []
    own: list[float] = []
    for m in ctx.transcript.messages():
        if m.role is Role.USER and m.created_at is not None:
            (own if m.turn_id == ctx.turn_id else earlier).append(m.created_at)
    if not earlier:
        return False
    came = own[0] if own else now
    return compression.should_idle_compact(
        enabled=ctx.limits.compression_enabled, idle_after_s=ctx.limits.idle_compact_after_s,
        gap_s=came - earlier[-1], tokens=request_tokens(ctx),
        floor_tokens=compression.idle_floor_tokens(figures, state.last_compacted_tokens),
        cooldown_active=state.blocked(now, ctx.limits) is not None)


async def before_later_call(ctx: TurnContext, state: CompressionState) -> PassOutcome | None:
    """One threshold pass before a call after the first, within the turn's pass cap."""
    limits, figures = ctx.limits, compression.budget(ctx.limits)
    if request_tokens(ctx) < figures.threshold_tokens \
            or state.passes >= limits.compression_passes_max:
        return None
    now = await Now()
    if not compression.should_compress(request_tokens(ctx), figures, state, now, limits):
        return None
    return await run_pass(ctx, now, target_tokens=figures.threshold_tokens)


def fail_closed(ctx: TurnContext, detail: str, last: PassOutcome | None) -> None:
    """The request cannot be made to fit: end the turn without sending it (CMP-7).

    A context-pressure exit: the finalizer adds no boundary row (FIN-5).
    """
    if last is not None and last.timed_out:
        ctx.finish(ExitReason.COMPRESSION_TIMEOUT, detail, answer=TIMEOUT_TEXT, failed=True)
        return
    ctx.finish(ExitReason.COMPRESSION_EXHAUSTED, detail, answer=EXHAUSTED_TEXT, failed=True)


async def after_overflow(ctx: TurnContext, request: ProviderRequest,
                         error: ProviderError) -> ProviderRequest | None:
    """LOOP-5's overflow branch: back to preflight, compact, and rebuild the request.

    The provider proved the request does not fit, so the pass is forced (the threshold
    and the anti-thrash block do not apply; a cooldown does: the summarizer just failed).
    None means the turn stops: it failed closed, or the retry has no budget left (the
    finalizer then takes over as for any exhausted budget). The rebuilt request is a new
    call and is charged as one; like every request it carries the list without its hidden
    rows (``rebuilt``, LOOP-4).
    """
    if ctx.tracker.phase is Phase.FINALIZE:
        return None  # the grace call overflowed: no summary, and nothing is sent again
    state, limits = ctx.cache.compression, ctx.limits
    state.begin(ctx.turn_id)
    state.overflows += 1
    in_loop = ctx.tracker.phase is Phase.MODEL_CALL
    if in_loop:
        ctx.enter(Phase.PREFLIGHT)
    tokens = request.prompt_tokens  # as the route counted what it refused (LOOP-6)
    estimate = request_tokens(ctx)  # the same request by this engine's count, as preflight's
    now = await Now()
    if state.cooling(now) or state.overflows > limits.compression_passes_max:
        why = "the summarizer is cooling down" if state.cooling(now) else "no recovery left"
        fail_closed(ctx, f"context_overflow: {error}; {why}; the request of {tokens} tokens "
                    "was not sent again", None)
        return None
    figures = compression.budget(limits)
    last = await run_pass(ctx, now, target_tokens=min(figures.threshold_tokens, estimate * 19 // 20))
    if not last.progress or request_tokens(ctx) >= estimate:
        fail_closed(ctx, f"context_overflow: {error}; compaction could not relieve the request "
                    f"of {tokens} tokens, which was not sent again", last)
        return None
    if request.purpose != "grace" and (ctx.state.iterations >= limits.max_iterations
                                       or not ctx.state.budget.consume()):
        return None
    ctx.state.api_calls += 1
    if in_loop:
        ctx.enter(Phase.MODEL_CALL)
    return rebuilt(ctx, request)


def rebuilt(ctx: TurnContext, request: ProviderRequest) -> ProviderRequest:
    """``request`` again from the compacted working list, as the loop builds one: the
    hidden rows stay off (LOOP-4), the tokens as the active route counts them (LOOP-6)."""
    system = ctx.cache.system_message
    return dataclasses.replace(request, messages=(system, *ctx.transcript.visible()),
                               prompt_tokens=routes.route_tokens(ctx, request_tokens(ctx)))
