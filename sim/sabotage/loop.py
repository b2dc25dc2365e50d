"""Broken loops and wires: an off-by-one bound, missing refunds, ignored Retry-After, endless
dropped-call re-prompts, bookkeeping on the wire (in the messages, the body or its tool
definitions), stored rows sent without their sidecar."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import context, finalizer, loop, preflight, wire
from hermes_ref.context import TurnContext
from hermes_ref.errors import ProviderError, ProviderServerError, TurnInterrupted
from hermes_ref.models import Message, ProviderReply, ToolSpec
from sim.sabotage.base import one_line_changed, sabotage

# ---- WIRE-3: bookkeeping leaks onto the wire ------------------------------------------------


def _leak_keys() -> list[AbstractContextManager[Any]]:
    original = wire.ProviderRequest.wire_body

    def leaky(self: wire.ProviderRequest) -> wire.WireBody:
        body = json.loads(bytes(original(self)))
        body["messages"] = [dict(m, _row_id=src.row_id, api_content=src.api_content)
                            for m, src in zip(body["messages"], self.messages, strict=True)]
        return wire.WireBody(json.dumps(body).encode("utf-8"))
    return [mock.patch.object(wire.ProviderRequest, "wire_body", leaky)]


sabotage("leak_private_keys", ("WIRE-3",),
         "request building copies _row_id and the api_content sidecar into the messages of "
         "the body it sends")(_leak_keys)


def _leak_in_cached_bytes() -> list[AbstractContextManager[Any]]:
    compute = Message.__dict__["wire_json"].fn

    def wire_json(self: Message) -> bytes:
        raw: bytes = compute(self)
        if self.row_id is None:
            return raw
        return raw[:-1] + b', "_row_id": ' + str(self.row_id).encode("ascii") + b"}"
    return [mock.patch.object(Message, "wire_json", property(wire_json))]


sabotage("cached_wire_json_leaks_row_id", ("WIRE-3",),
         "a stored message's cached wire JSON, the bytes every request body joins, carries "
         "its _row_id")(_leak_in_cached_bytes)


def _leak_purpose() -> list[AbstractContextManager[Any]]:
    original = wire.ProviderRequest._head

    def head(self: wire.ProviderRequest) -> bytes:
        rest: bytes = original(self)  # "the body says what the request is for"
        return rest[:-1] + b', "purpose": ' + json.dumps(self.purpose).encode("utf-8") + b"}"
    return [mock.patch.object(wire.ProviderRequest, "_head", head)]


sabotage("request_purpose_on_the_wire", ("WIRE-3",),
         "the request body carries the engine's own purpose field (turn or grace) beside "
         "the model and the tools")(_leak_purpose)


def _leak_tool_kind() -> list[AbstractContextManager[Any]]:
    original = ToolSpec.wire

    def tool_wire(self: ToolSpec) -> dict[str, Any]:
        out = original(self)
        return {**out, "function": {**out["function"], "_kind": self.kind.value}}
    return [mock.patch.object(ToolSpec, "wire", tool_wire),
            mock.patch.dict(wire._HEADS, clear=True)]  # heads built before carry no kind


sabotage("tool_kind_on_the_wire", ("WIRE-3",),
         "each tool definition sent carries the planner's _kind of the tool (reader, writer, "
         "...) in its function")(_leak_tool_kind)

# ---- LOOP-1 / LOOP-2 ------------------------------------------------------------------------


def _off_by_one() -> list[AbstractContextManager[Any]]:
    def may_continue(ctx: TurnContext) -> bool:
        state = ctx.state
        return state.api_calls <= ctx.limits.max_iterations
    return [mock.patch.object(loop, "_loop_may_continue", may_continue)]


sabotage("loop_bound_off_by_one", ("LOOP-1",),
         "the loop condition compares api_calls with <=, allowing one call too many")(_off_by_one)


def _budget_never_refuses() -> list[AbstractContextManager[Any]]:
    def consume(self: context.IterationBudget) -> bool:
        self.used += 1  # counts the unit, but never says the budget is spent
        return True
    return [mock.patch.object(context.IterationBudget, "consume", consume)]


sabotage("budget_never_refuses", ("LOOP-1",),
         "spending a budget unit always succeeds, so the loop runs past the iteration budget")(
    _budget_never_refuses)


def _no_refund() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(context.IterationBudget, "refund", lambda self: None)]


sabotage("no_refund", ("LOOP-2",),
         "a round of refundable tools (execute_code) still spends its budget unit")(_no_refund)

# ---- LOOP-5: Retry-After is ignored ------------------------------------------------------------


def _ignore_retry_after() -> list[AbstractContextManager[Any]]:
    original = loop._backoff_s

    async def backoff(ctx: TurnContext, attempt: int, error: ProviderError) -> float:
        return await original(ctx, attempt, ProviderServerError(str(error), status=error.status))
    return [mock.patch.object(loop, "_backoff_s", backoff)]


sabotage("ignore_retry_after", ("LOOP-5",),
         "a rate limit is retried after the exponential backoff, not after its Retry-After")(
    _ignore_retry_after)


# ---- LOOP-7: dropped tool calls are re-prompted without limit -----------------------------------


def _unlimited_reprompts() -> list[AbstractContextManager[Any]]:
    original = loop.handle_reply

    async def forgetful(ctx: TurnContext, reply: Any) -> None:
        ctx.state.dropped_toolcall_retries = 0
        await original(ctx, reply)
    return [mock.patch.object(loop, "handle_reply", forgetful)]


sabotage("dropped_call_limit_ignored", ("LOOP-7",),
         "the dropped-tool-call counter is never consulted, so re-prompts go on forever")(
    _unlimited_reprompts)


# ---- WIRE-1: stored rows are sent without their sidecar ----------------------------------------


def _stale_sidecar() -> list[AbstractContextManager[Any]]:
    compute = Message.__dict__["wire"].fn

    def wire(self: Message) -> dict[str, Any]:
        body: dict[str, Any] = compute(self)
        if self.row_id is not None:
            body = {**body, "content": self.content}
        return body
    return [mock.patch.object(Message, "wire", property(wire))]


sabotage("stored_rows_lose_sidecar", ("WIRE-1",),
         "the wire form of a stored row sends its content column, not the api_content it was "
         "first sent with")(_stale_sidecar)


# ---- LOOP-9: calls with unusable arguments are taken as they come ---------------------------


def _accept_any_arguments() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(loop, "_arguments_usable", lambda ctx, reply: True)]


sabotage("unusable_arguments_accepted", ("LOOP-9",),
         "malformed or cut-off tool-call arguments are recorded at once, never asked for again")(
    _accept_any_arguments)


# ---- LOOP-7: a dropped call that narrates is taken as the answer ---------------------------


def _narration_answers() -> list[AbstractContextManager[Any]]:
    def only_if_silent(reply: ProviderReply) -> bool:
        return (reply.finish_reason == "tool_calls" and not reply.tool_calls
                and not (reply.content or "").strip())
    return [mock.patch.object(loop, "dropped_call", only_if_silent)]


sabotage("narrated_dropped_call_answers", ("LOOP-7",),
         "only an empty finish_reason=tool_calls reply counts as a dropped call, so one that "
         "narrates the call it meant to make is returned as the final answer")(_narration_answers)


# ---- LOOP-2: an interrupted call that went out is given back as if it never had ------------


def _interrupts_all_unsent() -> list[AbstractContextManager[Any]]:
    told = TurnInterrupted.__init__

    def unsent(self: TurnInterrupted, reason: str, *, unsent: bool = False) -> None:
        told(self, reason, unsent=True)  # every interrupt taken as known before the call
    return [mock.patch.object(TurnInterrupted, "__init__", unsent)]


sabotage("interrupted_call_given_back", ("LOOP-2",),
         "every interrupt is told as one that came before its call went out, so a model call "
         "the provider received and the user then stopped costs no call and no unit")(
    _interrupts_all_unsent)


# ---- LOOP-2: a request preflight refuses is charged as if it were sent ---------------------


def _charge_refused_requests() -> list[AbstractContextManager[Any]]:
    async def charged(ctx: TurnContext) -> bool:
        ctx.state.api_calls += 1  # counted, and its unit kept, before preflight has decided
        return await preflight.check(ctx)
    return [mock.patch.object(loop, "cleared_to_send", charged)]


sabotage("refused_request_charged", ("LOOP-2",),
         "the loop counts the API call and keeps the budget unit before preflight decides, so "
         "a request that is never sent costs a unit and an API call")(_charge_refused_requests)


# ---- LOOP-2: a turn stopped in preflight keeps the unit of a call it never sent -----------------


def _stop_in_preflight_keeps_the_unit() -> list[AbstractContextManager[Any]]:
    async def kept(ctx: TurnContext) -> bool:
        if not await preflight.check(ctx):  # an interrupt here leaves the unit spent
            ctx.state.budget.refund()
            return False
        ctx.state.api_calls += 1
        return True
    return [mock.patch.object(loop, "cleared_to_send", kept)]


sabotage("stop_in_preflight_keeps_the_unit", ("LOOP-2",),
         "a turn stopped during preflight (its lease lost while a compaction ran) keeps the "
         "budget unit of the iteration, though no call went out")(_stop_in_preflight_keeps_the_unit)


# ---- LOOP-9: arguments cut off are told apart only by the finish reason --------------------


sabotage("cut_off_arguments_taken_for_malformed", ("LOOP-9",),
         "arguments cut off mid-value count as truncated only when the provider says "
         "finish_reason=length, so a cut-off call under finish_reason=tool_calls is asked "
         "for again, then recorded")(
    lambda: [mock.patch.object(loop, "_looks_truncated", lambda arguments: False)])


# ---- LOOP-9: the count of malformed tries never starts over --------------------------------


def _malformed_count_kept() -> list[AbstractContextManager[Any]]:
    original = loop._arguments_usable

    def usable(ctx: TurnContext, reply: ProviderReply) -> bool:
        tries = ctx.state.invalid_json_retries
        fine = original(ctx, reply)
        if fine and all(c.arguments_object is not None for c in reply.tool_calls):
            ctx.state.invalid_json_retries = tries  # a parsed round no longer resets it
        return fine
    return [mock.patch.object(loop, "_arguments_usable", usable)]


sabotage("malformed_count_never_restarts", ("LOOP-9",),
         "a round whose arguments all parse leaves the count of malformed tries where it was, "
         "so a later malformed reply is recorded before its third try")(_malformed_count_kept)


# ---- LOOP-5: the request rebuilt after an overflow inherits the retries already spent --------


def _retries_changed(old: str, new: str) -> list[AbstractContextManager[Any]]:
    """``call_with_retries`` with one line changed, for the loop and for the grace call."""
    broken = one_line_changed(loop, "call_with_retries", old, new)
    return [mock.patch.object(loop, "call_with_retries", broken),
            mock.patch.object(finalizer, "call_with_retries", broken)]


def _retries_inherited() -> list[AbstractContextManager[Any]]:
    return _retries_changed("request, attempt, sent = rebuilt, 0, False",
                            "request, sent = rebuilt, False")


sabotage("rebuilt_request_inherits_retries", ("LOOP-5",),
         "the request rebuilt after an overflow keeps the transient-retry count of the one it "
         "replaced, so it is given up on before its own retries are spent")(_retries_inherited)


# ---- LOOP-5: an overflow counted among the turn's failed calls --------------------------------


def _overflow_counted() -> list[AbstractContextManager[Any]]:
    return _retries_changed("        if isinstance(failure, ContextOverflow):  # LOOP-5",
                            "        ctx.state.provider_errors += isinstance(failure, ContextOverflow)\n"
                            "        if isinstance(failure, ContextOverflow):  # LOOP-5")


sabotage("overflow_counted_as_a_failed_call", ("LOOP-5",),
         "an overflow counts against outer_loop_errors_max, so a turn whose compactions relieved "
         "its overflows ends terminal_provider_error with retries its count still allowed")(_overflow_counted)
