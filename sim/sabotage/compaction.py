"""Broken compaction: the wrong threshold, a summary that starts over, no pruning, a tail past
its budget, a split tool group, an ignored cooldown or block, a timed-out summary that
starts no cooldown, a cooldown that starts before the failure, an overflow resent or ended,
a preflight skipped, an idle gap ignored, passes that ignore progress, the wrong user
message kept."""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import compaction, compression, finalizer, preflight
from hermes_ref.compression import Budget, CompressionState, Plan, Shape
from hermes_ref.context import TurnContext
from hermes_ref.errors import ProviderError
from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role
from hermes_ref.outcomes import ExitReason
from hermes_ref.wire import ProviderRequest
from sim.sabotage.base import edited_in_place, sabotage

# ---- CMP-1: the 0.85 rule forgotten --------------------------------------------------------


def _window_as_threshold() -> list[AbstractContextManager[Any]]:
    def threshold(context_tokens: int, max_tokens: int | None, ratio: float) -> int:
        window = context_tokens - max_tokens if max_tokens and context_tokens - max_tokens > 0 \
            else context_tokens
        value = max(int(window * ratio), compression.MIN_CONTEXT_TOKENS)
        return window - 1 if value >= window else value  # 0.85 of the window forgotten
    return [mock.patch.object(compression, "threshold_tokens", threshold)]


sabotage("floor_reaching_the_window_uses_the_window", ("CMP-1",),
         "when the 64,000-token floor reaches a small window, the threshold becomes the window "
         "minus one instead of 85 % of it, so compaction starts too late")(_window_as_threshold)

# ---- CMP-2: the summary starts over; nothing is pruned first -------------------------------


def _summary_starts_over() -> list[AbstractContextManager[Any]]:
    original = compression.plan

    def plan(messages: tuple[Message, ...], figures: Budget, limits: Limits,
             user_text: str | None = None) -> Plan | None:
        layout = original(messages, figures, limits, user_text)
        if layout is None:
            return None
        return Plan(layout.head, layout.middle, layout.tail, layout.lifted, None)
    return [mock.patch.object(compression, "plan", plan)]


sabotage("summary_starts_over", ("CMP-2",),
         "a later compaction drops the earlier summary's text and summarizes from scratch")(
    _summary_starts_over)


def _never_prune() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(compression, "prune", lambda messages, figures, limits: messages)]


sabotage("tool_outputs_never_pruned", ("CMP-2",),
         "old tool outputs are never pruned, so every pass pays for a summary call")(_never_prune)


def _no_middle() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(compression, "plan", lambda *args, **kwargs: None)]


sabotage("planner_finds_no_middle", ("CMP-2",),
         "the planner never finds a middle to summarize, so a pass only prunes or is judged "
         "empty, and two such passes block compaction")(_no_middle)

# ---- CMP-3: the tail starts inside a tool group -------------------------------------------


def _split_groups() -> list[AbstractContextManager[Any]]:
    original = compression.shape

    def shape(messages: tuple[Message, ...], figures: Budget, limits: Limits,
              user_text: str | None = None) -> Shape:
        cut = original(messages, figures, limits, user_text)
        start = compression._tail_start(messages, figures.tail_tokens,
                                        limits.compression_tail_floor_messages)
        return Shape(cut.head_end, max(start, cut.head_end), cut.user_index)  # not moved back
    return [mock.patch.object(compression, "shape", shape)]


sabotage("tail_splits_tool_group", ("CMP-3",),
         "the tail's start is not moved back over tool results to their call, so a call is "
         "summarized while its first results are cut away")(_split_groups)

# ---- CMP-4: the cooldown and the anti-thrash block ignored ---------------------------------


def _cooldown_ignored() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(CompressionState, "cooling", lambda self, now: False)]


sabotage("cooldown_ignored", ("CMP-4",),
         "a failed summary starts no cooldown: the next turn over the threshold asks again")(
    _cooldown_ignored)


def _target_ratio_floor_high() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(compression, "TARGET_RATIO_MIN", 0.40)]  # 0.40 for 0.10


sabotage("target_ratio_clamped_at_0_40", ("CMP-2",),
         "the target ratio's lower clamp is 0.40 instead of 0.10, so the default 0.20 keeps "
         "a tail of twice its budget and summarizes too little")(_target_ratio_floor_high)


def _timeout_not_a_failure() -> list[AbstractContextManager[Any]]:
    original = compaction.run_pass

    async def run_pass(ctx: TurnContext, now: float, *, target_tokens: int) -> Any:
        state = ctx.cache.compression
        before = state.cooldown_until
        outcome = await original(ctx, now, target_tokens=target_tokens)
        if outcome.timed_out:  # "a slow summarizer is not a broken one: try again next time"
            state.cooldown_until = before
        return outcome
    return [mock.patch.object(compaction, "run_pass", run_pass)]


sabotage("summary_timeout_starts_no_cooldown", ("CMP-4",),
         "a summary that times out starts no cooldown, only one that fails outright")(
    _timeout_not_a_failure)


def _cooldown_from_the_decision() -> list[AbstractContextManager[Any]]:
    return [edited_in_place(compaction, "run_pass", "state.summary_failed(await Now(), limits)",
                            "state.summary_failed(now, limits)  # \"the pass began just now\"")]


sabotage("cooldown_runs_from_the_decision", ("CMP-4",),
         "a failed summary starts the cooldown at the instant the turn decided to compact, not "
         "at the failure, so after a slow earlier pass the cooldown ends minutes early")(
    _cooldown_from_the_decision)


def _ineffective_never_counted() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(CompressionState, "judge",
                              lambda self, tokens_after, threshold: None)]


sabotage("ineffective_passes_never_block", ("CMP-4",),
         "passes that leave the request over the threshold are not counted, so automatic "
         "compaction never stops thrashing")(_ineffective_never_counted)


def _blocked_one_pass_early() -> list[AbstractContextManager[Any]]:
    original = CompressionState.blocked

    def blocked(self: CompressionState, now: float, limits: Limits, *,
                manual: bool = False) -> str | None:
        ahead = dataclasses.replace(self, ineffective=self.ineffective + 1)  # the next pass counted too
        return original(ahead, now, limits, manual=manual)
    return [mock.patch.object(CompressionState, "blocked", blocked)]


sabotage("ineffective_passes_block_after_one", ("CMP-4",),
         "the block counts the pass it is asked about as already ineffective, so automatic "
         "compaction stops after one ineffective pass instead of two")(_blocked_one_pass_early)

# ---- CMP-7 and LOOP-5: the overflow branch and preflight ------------------------------------


def _resend_refused() -> list[AbstractContextManager[Any]]:
    async def resend(ctx: TurnContext, request: ProviderRequest,
                     error: ProviderError) -> ProviderRequest | None:
        return request  # the same request, as it was refused
    return [mock.patch.object(compaction, "after_overflow", resend)]


sabotage("overflow_request_resent", ("CMP-7",),
         "a request the provider refused as too long is retried as it is")(_resend_refused)


def _overflow_is_terminal() -> list[AbstractContextManager[Any]]:
    async def terminal(ctx: TurnContext, request: ProviderRequest,
                       error: ProviderError) -> ProviderRequest | None:
        ctx.finish(ExitReason.TERMINAL_PROVIDER_ERROR, f"context_overflow: {error}", failed=True)
        return None
    return [mock.patch.object(compaction, "after_overflow", terminal)]


sabotage("overflow_ends_the_turn", ("LOOP-5",),
         "a provider-proven overflow ends the turn as a terminal error instead of going back "
         "to preflight")(_overflow_is_terminal)


def _preflight_once() -> list[AbstractContextManager[Any]]:
    original = preflight.check

    async def check(ctx: TurnContext) -> bool:
        if ctx.state.api_calls > 0:
            return True  # only the turn's first request is measured
        return await original(ctx)
    return [mock.patch.object(preflight, "check", check)]


sabotage("preflight_only_before_the_first_call", ("CMP-7",),
         "preflight measures only the turn's first request, so a later one is sent however "
         "large it grew")(_preflight_once)

# ---- CTX-5: the idle gap ignored ----------------------------------------------------------


def _idle_gap_ignored() -> list[AbstractContextManager[Any]]:
    def idle(*, enabled: bool, idle_after_s: float, gap_s: float, tokens: int,
             floor_tokens: int, cooldown_active: bool) -> bool:
        return enabled and idle_after_s > 0 and not cooldown_active and tokens > floor_tokens
    return [mock.patch.object(compression, "should_idle_compact", idle)]


sabotage("idle_gap_ignored", ("CTX-5",),
         "idle compaction fires at every turn once enabled, however short the gap")(
    _idle_gap_ignored)

# ---- CTX-6: passes that ignore progress ---------------------------------------------------


def _progress_always() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(compaction.PassOutcome, "progress",
                              property(lambda self: self.changed))]


sabotage("passes_ignore_progress", ("CTX-6",),
         "any pass that changed the list counts as progress, so the passes go on after one "
         "that removed nothing")(_progress_always)

# ---- CTX-7: the first matching user row is taken for the turn's own ---------------------


def _first_match() -> list[AbstractContextManager[Any]]:
    def relocate(messages: tuple[Message, ...], text: str | None) -> int | None:
        users = [i for i, m in enumerate(messages)
                 if m.role is Role.USER and not compression.is_summary(m)]
        for index in users:  # from the start: an earlier turn's equal text wins
            if text is not None and messages[index].content == text:
                return index
        return users[-1] if users else None
    return [mock.patch.object(compression, "relocate_user", relocate)]


sabotage("relocation_takes_the_first_match", ("CTX-7",),
         "the current user message is re-located as the first user row with its text, not the "
         "last, so an earlier turn's equal message is kept and the turn's own is summarized")(
    _first_match)


# ---- LOOP-2: a pass charged as a call --------------------------------------------------------


def _pass_charged() -> list[AbstractContextManager[Any]]:
    original = compaction.run_pass

    async def charged(ctx: TurnContext, now: float, *, target_tokens: int) -> Any:
        ctx.state.budget.consume()  # the pass never reached the provider, yet it costs a unit
        return await original(ctx, now, target_tokens=target_tokens)
    return [mock.patch.object(compaction, "run_pass", charged)]


sabotage("compaction_pass_not_refunded", ("LOOP-2",),
         "a compaction pass spends a budget unit, though it replaced no model call")(_pass_charged)


# ---- FIN-5: the new context-pressure exit left out of the exemption ------------------------


def _exemption_forgotten() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(finalizer, "CONTEXT_PRESSURE_EXITS",
                              frozenset({ExitReason.COMPRESSION_TIMEOUT}))]


sabotage("exhausted_context_gets_a_boundary_row", ("FIN-5",),
         "the finalizer's context-pressure exemption lists only the timeout, so a turn that "
         "failed closed is closed with a boundary row")(_exemption_forgotten)


# ---- LOOP-4: the request rebuilt after an overflow carries the hidden rows --------------------


def _hidden_rows_resent() -> list[AbstractContextManager[Any]]:
    def rebuilt(ctx: TurnContext, request: ProviderRequest) -> ProviderRequest:
        system = ctx.cache.system_message  # "the whole working list": hidden rows too
        return dataclasses.replace(request, messages=(system, *ctx.transcript),
                                   prompt_tokens=system.tokens + ctx.transcript.tokens)
    return [mock.patch.object(compaction, "rebuilt", rebuilt)]


sabotage("hidden_row_sent_after_an_overflow", ("LOOP-4",),
         "the request rebuilt after an overflow is made of the whole working list, so the "
         "hidden row a correction left goes out as an empty assistant message")(
    _hidden_rows_resent)
