"""Broken loops under fire: a ladder out of order or without a bound, a fallback that never
switches, an auth retry without renewal, a local bug retried, an interrupted turn left open,
a correction that keeps the reasoning or is never taken in, a held-back answer forgotten."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any
from unittest import mock

from hermes_ref import closure, finalizer, ladder, loop, redirect, routes, tool_round
from hermes_ref.context import TurnContext
from hermes_ref.effects import DrainRedirects, Site, Sleep
from hermes_ref.limits import ProviderRoute
from hermes_ref.models import Message, ProviderReply, Role
from hermes_ref.outcomes import ExitReason
from hermes_ref.wire import ProviderRequest
from sim.sabotage.base import one_line_changed, sabotage

# ---- LOOP-8: the empty-reply ladder ---------------------------------------------------------


def _rung(name: str) -> int:
    return next(i for i, r in enumerate(ladder.RUNGS) if r.name == name)


def _retry_before_prefill() -> list[AbstractContextManager[Any]]:
    rungs = list(ladder.RUNGS)
    prefill, retry = _rung("prefill"), _rung("retry")
    rungs[prefill], rungs[retry] = rungs[retry], rungs[prefill]
    return [mock.patch.object(ladder, "RUNGS", tuple(rungs))]


sabotage("ladder_retries_before_prefill", ("LOOP-8",),
         "the ladder's table lists the plain retry before the thinking prefill, so a model that "
         "only reasoned is asked again blind")(_retry_before_prefill)


def _gives_up_after_tools() -> list[AbstractContextManager[Any]]:
    # by the turn's own state, kept alive here so its id is never reused: turn ids repeat
    # from one story run to the next (counted ids), and one run must not stop the next
    gave_up: dict[int, object] = {}
    rungs = list(ladder.RUNGS)
    index = _rung("nudge")

    def give_up(ctx: TurnContext, reply: ProviderReply) -> None:
        ctx.state.post_tool_nudged = True  # "the tools ran: nothing more to ask"
        gave_up[id(ctx.state)] = ctx.state
    original = loop._loop_may_continue

    def may_continue(ctx: TurnContext) -> bool:
        return original(ctx) and id(ctx.state) not in gave_up
    rungs[index] = replace(rungs[index], act=give_up)
    return [mock.patch.object(ladder, "RUNGS", tuple(rungs)),
            mock.patch.object(loop, "_loop_may_continue", may_continue)]


sabotage("empty_after_tools_leaves_the_loop", ("LOOP-8",),
         "an empty reply after a tool round ends the loop instead of nudging, so the turn "
         "falls to the grace call long before its bound")(_gives_up_after_tools)


def _retries_never_spent() -> list[AbstractContextManager[Any]]:
    rungs = list(ladder.RUNGS)
    index = _rung("retry")
    rungs[index] = replace(rungs[index], act=lambda ctx, reply: None)
    return [mock.patch.object(ladder, "RUNGS", tuple(rungs))]


sabotage("empty_retries_never_counted", ("LOOP-8",),
         "the retry rung forgets to count its retry, so empty replies are retried until the "
         "budget ends")(_retries_never_spent)


def _nudged_once_per_turn() -> list[AbstractContextManager[Any]]:
    original = tool_round.run_tool_round

    async def run_round(ctx: TurnContext, assistant: Message) -> bool:
        nudged = ctx.state.post_tool_nudged
        landed = await original(ctx, assistant)
        ctx.state.post_tool_nudged = nudged  # a new round no longer re-arms the nudge
        return landed
    return [mock.patch.object(tool_round, "run_tool_round", run_round)]


sabotage("nudge_once_per_turn", ("LOOP-8",),
         "the nudge after a tool round is given once per turn, not once per tool round, so an "
         "empty reply after a later round is retried blind")(_nudged_once_per_turn)


def _nudge_over_reasoning() -> list[AbstractContextManager[Any]]:
    rungs = list(ladder.RUNGS)
    index = _rung("nudge")

    def due(ctx: TurnContext, reply: ProviderReply) -> bool:
        return ctx.state.last_round_had_tools and not ctx.state.post_tool_nudged
    rungs[index] = replace(rungs[index], applies=due)
    return [mock.patch.object(ladder, "RUNGS", tuple(rungs))]


sabotage("nudge_over_inline_reasoning", ("LOOP-8",),
         "an empty reply after a tool round is nudged even when it reasoned in a think block, "
         "so its reasoning never comes back as a prefill")(_nudge_over_reasoning)


def _any_housekeeping_round() -> list[AbstractContextManager[Any]]:
    def prior_round_text(ctx: TurnContext) -> str | None:
        if not ctx.state.last_round_had_tools:
            return None
        for message in reversed(ctx.transcript.current_turn()):
            if message.role is Role.TOOL or message.scaffold is not None:
                continue
            if message.role is Role.ASSISTANT and message.tool_calls:
                text = ladder.visible_text(message.content)
                names = {c.name for c in message.tool_calls}
                return text if text and names & ladder.HOUSEKEEPING_TOOLS else None
            return None
        return None
    return [mock.patch.object(ladder, "prior_round_text", prior_round_text)]


sabotage("prior_text_after_any_housekeeping", ("LOOP-8",),
         "an empty reply reuses the text of the round before when that round called any "
         "housekeeping tool, not only housekeeping tools")(_any_housekeeping_round)


def _closed_blocks_only() -> list[AbstractContextManager[Any]]:
    closed_only = re.compile(r"<(think|thinking|reasoning)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)
    return [mock.patch.object(ladder, "_THINK", closed_only)]


sabotage("unclosed_think_block_shown", ("LOOP-8", "LOOP-4"),
         "the pattern of think blocks needs a closing tag, so a block the model never closed "
         "is shown as the answer, reasoning and all")(_closed_blocks_only)


# ---- LOOP-6: fallback providers ---------------------------------------------------------------


def _route_without_switch() -> list[AbstractContextManager[Any]]:
    def fall_back(ctx: TurnContext, *, refund: bool = True) -> ProviderRoute:
        if refund:
            ctx.state.hops += 1
            ctx.state.budget.refund()
        ctx.state.route += 1  # the chain moves on, the turn's model and window do not
        return ctx.limits.fallback_providers[ctx.state.route - 1]
    return [mock.patch.object(routes, "fall_back", fall_back)]


sabotage("fallback_never_switches_the_request", ("LOOP-6",),
         "falling back advances the route index but leaves the turn's model and window as "
         "they were, so the next request goes to the primary again")(_route_without_switch)


def _hop_kept_on_the_count() -> list[AbstractContextManager[Any]]:
    original = routes.fall_back

    def fall_back(ctx: TurnContext, *, refund: bool = True) -> ProviderRoute:
        return original(ctx, refund=False)  # the replaced call still counts, its unit spent
    return [mock.patch.object(routes, "fall_back", fall_back)]


sabotage("fallback_hop_not_refunded", ("LOOP-2",),
         "a fallback hop keeps the call it replaced on the count and its budget unit spent, "
         "so a turn on its last iteration never calls the fallback")(_hop_kept_on_the_count)


def _every_hop_refunded() -> list[AbstractContextManager[Any]]:
    original = routes.fall_back

    def fall_back(ctx: TurnContext, *, refund: bool = True) -> ProviderRoute:
        return original(ctx)  # the grace call's hop too, though it spent no unit
    return [mock.patch.object(routes, "fall_back", fall_back)]


sabotage("grace_hop_refunded", ("LOOP-2",),
         "a grace call that falls back gives back a budget unit, though the grace call never "
         "spent one")(_every_hop_refunded)


def _switch_without_preflight() -> list[AbstractContextManager[Any]]:
    original = loop.call_with_retries

    async def hurried(ctx: TurnContext, request: ProviderRequest) -> ProviderReply | None:
        route = ctx.state.route
        reply = await original(ctx, request)
        if reply is None and not ctx.ended and ctx.state.route != route:
            ctx.state.budget.consume()  # charged like any call (LOOP-2 kept) ...
            ctx.state.api_calls += 1  # ... but straight to the fallback, past its preflight
            return await original(ctx, loop.build_request(ctx))
        return reply
    return [mock.patch.object(loop, "call_with_retries", hurried)]


sabotage("fallback_called_without_preflight", ("LOOP-6",),
         "after a switch the loop calls the fallback at once with a request built for it, "
         "without running preflight against the fallback's smaller window")(
    _switch_without_preflight)


def _hidden_row_counted() -> list[AbstractContextManager[Any]]:
    counted = property(lambda message: message.tokens)  # "every row of the list costs its tokens"
    return [mock.patch.object(Message, "sent_tokens", counted)]


sabotage("hidden_row_counted", ("LOOP-6",),
         "the request's token estimate counts the hidden row a correction left, which the request "
         "never carries, so preflight refuses a fallback a request that fits its window")(
    _hidden_row_counted)


# ---- LOOP-5: classification ----------------------------------------------------------------


def _auth_without_refresh() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(loop, "RefreshCredentials", lambda model, *_: Sleep(0.0))]


sabotage("auth_retried_without_refresh", ("LOOP-5",),
         "an auth error is retried at once with the same credentials, never renewing them "
         "through the port")(_auth_without_refresh)


def _local_bug_is_bad_json() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(loop, "local_problem", lambda reply: None)]


sabotage("local_bug_taken_for_bad_json", ("LOOP-5",),
         "arguments nested past the parser's limit are treated as malformed JSON and asked "
         "for again, spending budget on a reply that fails the same way every time")(
    _local_bug_is_bad_json)


# ---- FIN-4: an interrupted turn closes its tool sequence ---------------------------------------


def _interrupted_left_open() -> list[AbstractContextManager[Any]]:
    original = finalizer._failure_boundary

    async def boundary(ctx: TurnContext) -> None:
        if ctx.ending.reason is ExitReason.INTERRUPTED:
            return  # "an interrupt is not a failure": nothing is closed
        await original(ctx)
    return [mock.patch.object(finalizer, "_failure_boundary", boundary)]


sabotage("interrupted_turn_left_open", ("FIN-4",),
         "the finalizer closes the open tool sequence of failed turns only, so a turn the user "
         "interrupted mid-batch leaves calls without results")(_interrupted_left_open)


def _running_call_not_run() -> list[AbstractContextManager[Any]]:
    original = finalizer._open_call_text

    def text_of(ctx: TurnContext) -> Callable[[str], str]:
        told = original(ctx)
        interrupted = ctx.state.interrupted_calls  # "interrupted means it did not run"
        return lambda call_id: closure.NOT_RUN_TEXT if call_id in interrupted else told(call_id)
    return [mock.patch.object(finalizer, "_open_call_text", text_of)]


sabotage("interrupted_call_reported_not_run", ("TOOL-3",),
         "the finalizer closes every open call of an interrupted turn as not run, the call "
         "that was running when the user stopped it included")(_running_call_not_run)


# ---- LOOP-4: corrections ------------------------------------------------------------------


def _partial_kept_raw() -> list[AbstractContextManager[Any]]:
    def placeholder(ctx: TurnContext, partial: str | None) -> Message:
        return Message(role=Role.ASSISTANT, content=partial or "", turn_id=ctx.turn_id)
    return [mock.patch.object(redirect, "placeholder", placeholder)]


sabotage("cut_reply_keeps_its_reasoning", ("LOOP-4",),
         "the reply a correction cut is stored as the raw text streamed, think block and all")(
    _partial_kept_raw)


async def _correction_alone(ctx: TurnContext) -> None:
    """``redirect.take_redirects`` without the assistant row for the work that was cut."""
    corrections = await DrainRedirects(ctx.session_id, ctx.turn_id)
    ctx.state.cut_partial = None
    if not corrections:
        return
    ctx.state.withheld_answer = None
    ctx.transcript.drop_scaffolding()
    row = Message(role=Role.USER, content="\n\n".join(corrections), turn_id=ctx.turn_id)
    await ctx.persist((row,), Site.REDIRECT)


sabotage("cut_reply_left_out", ("LOOP-4",),
         "a correction is stored as a user row right after whatever came before it: the reply "
         "it cut, visible text and all, leaves no assistant row")(
    lambda: [mock.patch.object(redirect, "take_redirects", _correction_alone)])


def _ladder_restarted() -> list[AbstractContextManager[Any]]:
    broken = one_line_changed(
        redirect, "take_redirects", "await ctx.persist(tuple(rows), Site.REDIRECT)",
        "await ctx.persist(tuple(rows), Site.REDIRECT)\n"
        "    ctx.state.last_round_had_tools = ctx.state.post_tool_nudged = False\n"
        "    ctx.state.empty_retries = ctx.state.thinking_prefills = 0")
    return [mock.patch.object(redirect, "take_redirects", broken)]


sabotage("correction_restarts_the_ladder", ("LOOP-8",),
         "a correction sets the empty-reply ladder's counters back to a fresh turn's, so the "
         "tool round before it is never nudged and prefills and retries start over")(
    _ladder_restarted)


def _partial_always_hidden() -> list[AbstractContextManager[Any]]:
    def placeholder(ctx: TurnContext, partial: str | None) -> Message:
        return Message(role=Role.ASSISTANT, content="", hidden=True, turn_id=ctx.turn_id)
    return [mock.patch.object(redirect, "placeholder", placeholder)]


sabotage("cut_reply_always_hidden", ("LOOP-4",),
         "the reply a correction cut is always stored hidden, so the text the user already saw "
         "streamed is lost from the record")(_partial_always_hidden)


def _never_drained() -> list[AbstractContextManager[Any]]:
    async def take(ctx: TurnContext) -> None:
        ctx.state.cut_partial = None
    return [mock.patch.object(redirect, "take_redirects", take)]


sabotage("corrections_never_taken_in", ("LOOP-4",),
         "the loop no longer drains corrections at its top: a cut call is simply asked again")(
    _never_drained)


async def _only_a_cut_drained(ctx: TurnContext) -> None:
    if ctx.state.cut_partial is not None and not ctx.ended:
        await redirect.take_redirects(ctx)


sabotage("last_round_correction_left_queued", ("LOOP-4",),
         "leaving the loop at its bound takes in a correction only when one cut the last call, "
         "so one sent during the last tool round is never taken in")(
    lambda: [mock.patch.object(loop, "_take_in_a_last_cut", _only_a_cut_drained)])


async def _grace_cut_noted_only(ctx: TurnContext) -> None:
    ctx.ending.detail += "; grace call cut by a correction"


sabotage("grace_cut_correction_left_queued", ("LOOP-4",),
         "a correction that cuts the grace call is noted but never taken in")(
    lambda: [mock.patch.object(finalizer, "_take_in_a_grace_cut", _grace_cut_noted_only)])


# ---- FIN-1: the answer held back for verification ------------------------------------------


def _withheld_forgotten() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(finalizer, "_reuse_withheld", lambda ctx, answer: None)]


sabotage("withheld_answer_forgotten", ("FIN-1",),
         "the budget fallback ignores the answer the verification gate held back and asks for "
         "a summary instead")(_withheld_forgotten)


def _held_past_a_correction() -> list[AbstractContextManager[Any]]:
    kept = one_line_changed(redirect, "take_redirects", "ctx.state.withheld_answer = None",
                            "pass")  # "the held answer is still the model's answer"
    return [mock.patch.object(redirect, "take_redirects", kept)]


sabotage("correction_keeps_the_held_answer", ("FIN-1",),
         "a correction taken in while the model checks its work leaves the answer the gate "
         "held back in place, and the budget's end delivers it as the answer to the "
         "correction that overruled it")(_held_past_a_correction)
