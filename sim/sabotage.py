"""Deliberately broken variants of the engine, kept here and never in the engine.

Theory of operation
-------------------
A checker is only real if a broken engine makes it fail. Each ``Sabotage`` swaps one
step of the engine for a plausible wrong version (the kind of change a hurried edit
makes: running tools before the write, forgetting a refund, writing the nudge to the
store) for the duration of a ``with`` block. ``hermes-ref invariants verify`` runs every
scenario that declares one of a sabotage's invariant ids under that sabotage and demands
that at least one of them fails; a sabotage nobody catches is a vacuous checker.

The engine reaches its steps through module attributes (``tool_round.run_tool_round``),
which is what makes the swap possible without touching engine code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

from hermes_ref import context, effects, finalizer, loop, prologue, tool_round
from hermes_ref.context import IterationBudget, TurnContext
from hermes_ref.effects import AppendMessages, ExecuteTools
from hermes_ref.errors import PersistenceError, ProviderError, ProviderServerError
from hermes_ref.models import Message, Role
from hermes_ref.outcomes import ExitReason
from hermes_ref.phases import Phase


@dataclass(frozen=True)
class Sabotage:
    name: str
    invariants: tuple[str, ...]
    description: str
    patches: Callable[[], list[AbstractContextManager[Any]]]

    @contextmanager
    def applied(self) -> Iterator[None]:
        with ExitStack() as stack:
            for patch in self.patches():
                stack.enter_context(patch)
            yield


SABOTAGES: dict[str, Sabotage] = {}


def sabotage(name: str, invariants: tuple[str, ...], description: str) -> Callable[
    [Callable[[], list[AbstractContextManager[Any]]]], Callable[[], list[AbstractContextManager[Any]]]
]:
    def register(fn: Callable[[], list[AbstractContextManager[Any]]]) -> Callable[
        [], list[AbstractContextManager[Any]]
    ]:
        SABOTAGES[name] = Sabotage(name, invariants, description, fn)
        return fn
    return register


# ---- TOOL-1: run first, write later --------------------------------------------------------


async def _execute_then_persist(ctx: TurnContext, assistant: Message) -> bool:
    ctx.enter(Phase.TOOL_ROUND)
    results = await ExecuteTools(ctx.token, ctx.session_id, assistant.tool_calls, False)
    stored = await AppendMessages(ctx.token, ctx.session_id, (assistant,), "tool_calls")
    ctx.transcript.extend(stored)
    rows = tuple(tool_round._result_row(ctx, r) for r in results)
    ctx.transcript.extend(await AppendMessages(ctx.token, ctx.session_id, rows, "tool_results"))
    ctx.state.last_round_had_tools = True
    return True


@sabotage("execute_before_persist", ("TOOL-1",),
          "the tool round runs the tools first and writes the assistant row afterwards")
def _p_execute_before_persist() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(tool_round, "run_tool_round", _execute_then_persist)]


# ---- TOOL-3: a result written twice --------------------------------------------------------


def _duplicate_results() -> list[AbstractContextManager[Any]]:
    original = tool_round._run_segment

    async def twice(ctx: TurnContext, segment: Any, specs: Any, known: Any) -> Any:
        results = await original(ctx, segment, specs, known)
        return results + results[:1]
    return [mock.patch.object(tool_round, "_run_segment", twice)]


sabotage("duplicate_tool_result", ("TOOL-3",),
         "the first result of every segment is written twice")(_duplicate_results)


# ---- TOOL-6: a tool error aborts the turn --------------------------------------------------


def _tool_error_aborts() -> list[AbstractContextManager[Any]]:
    original_round = tool_round.run_tool_round
    original_segment = tool_round._run_segment
    failed: list[bool] = []

    async def segment(ctx: TurnContext, seg: Any, specs: Any, known: Any) -> Any:
        results = await original_segment(ctx, seg, specs, known)
        failed.extend(r.is_error for r in results)
        return results

    async def aborting(ctx: TurnContext, assistant: Message) -> bool:
        failed.clear()
        ok = await original_round(ctx, assistant)
        if ok and any(failed):
            ctx.finish(ExitReason.LOCAL_PROCESSING_ERROR, "tool failed", failed=True)
            ctx.final_response = "A tool failed."
            return False
        return ok
    return [mock.patch.object(tool_round, "run_tool_round", aborting),
            mock.patch.object(tool_round, "_run_segment", segment)]


sabotage("tool_error_ends_turn", ("TOOL-6",),
         "a tool error result ends the turn as a failure instead of going back to the model")(
    _tool_error_aborts)


# ---- FIN-3: the final row is never written --------------------------------------------------


def _skip_final_row() -> list[AbstractContextManager[Any]]:
    async def no_close(ctx: TurnContext) -> None:
        return None
    return [
        mock.patch.object(finalizer, "_close_tail", no_close),
        mock.patch("hermes_ref.transcript.Transcript.pending", lambda self: ()),
    ]


sabotage("skip_tail_closure", ("FIN-3",),
         "the finalizer neither writes the pending final row nor closes the tail")(_skip_final_row)


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


# ---- WIRE-3: bookkeeping leaks onto the wire ------------------------------------------------


def _leak_keys() -> list[AbstractContextManager[Any]]:
    original = effects.ProviderRequest.wire

    def leaky(self: effects.ProviderRequest) -> dict[str, Any]:
        body = original(self)
        body["messages"] = [dict(m, _row_id=src.row_id, api_content=src.api_content)
                            for m, src in zip(body["messages"], self.messages, strict=True)]
        return body
    return [mock.patch.object(effects.ProviderRequest, "wire", leaky)]


sabotage("leak_private_keys", ("WIRE-3",),
         "request building copies _row_id and the api_content sidecar into wire messages")(_leak_keys)


# ---- CTX-2: the turn works on the cached history itself -------------------------------------


def _alias_history() -> list[AbstractContextManager[Any]]:
    def no_copy(self: Any) -> Any:
        return self

    def trust_cache(ctx: TurnContext) -> None:
        ctx.cache.last_lease_token = ctx.lease.token
    return [
        mock.patch("hermes_ref.transcript.Transcript.copy", no_copy),
        mock.patch.object(finalizer, "_update_cache", trust_cache),
    ]


sabotage("alias_history", ("CTX-2",),
         "the turn mutates the cached history in place and trusts it next turn")(_alias_history)


# ---- CTX-4: the session row is written before the system prompt -----------------------------


def _null_prompt() -> list[AbstractContextManager[Any]]:
    original = prologue.build_system_prompt

    def late_prompt(key: str, platform: str, tools: Any) -> str:
        return ""
    del original
    return [mock.patch.object(prologue, "build_system_prompt", late_prompt)]


sabotage("session_row_before_prompt", ("CTX-4",),
         "the session row is created before the system prompt exists (empty prompt stored)")(
    _null_prompt)


# ---- CTX-8: the user row is written at the end of the turn ----------------------------------


def _defer_user_row() -> list[AbstractContextManager[Any]]:
    async def defer(ctx: TurnContext, user: Message) -> bool:
        ctx.transcript.append(user)  # pending: the finalizer's flush will write it
        return True
    return [mock.patch.object(prologue, "_persist_user", defer)]


sabotage("user_row_written_late", ("CTX-8",),
         "the user row is only flushed by the finalizer, after the model calls")(_defer_user_row)


# ---- CTX-1: the budget is not rebuilt per turn -----------------------------------------------


def _shared_budget() -> list[AbstractContextManager[Any]]:
    shared: dict[str, IterationBudget] = {}

    def make(max_total: int) -> IterationBudget:
        if "b" not in shared:
            shared["b"] = IterationBudget(max_total)
        return shared["b"]
    return [mock.patch.object(prologue, "IterationBudget", make)]


sabotage("budget_not_reset", ("CTX-1",),
         "the iteration budget is created once and carried across turns")(_shared_budget)


# ---- LOOP-1 / LOOP-2 ------------------------------------------------------------------------


def _off_by_one() -> list[AbstractContextManager[Any]]:
    def may_continue(ctx: TurnContext) -> bool:
        state = ctx.state
        return state.api_calls <= ctx.limits.max_iterations
    return [
        mock.patch.object(loop, "_loop_may_continue", may_continue),
        mock.patch.object(context.IterationBudget, "consume", lambda self: True),
    ]


sabotage("loop_bound_off_by_one", ("LOOP-1",),
         "the loop condition uses <= and ignores the budget, allowing one call too many")(_off_by_one)


def _no_refund() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(context.IterationBudget, "refund", lambda self: None)]


sabotage("no_refund", ("LOOP-2",),
         "a round of refundable tools (execute_code) still spends its budget unit")(_no_refund)


# ---- LOOP-3 / FIN-6 / FIN-7 -----------------------------------------------------------------


def _reason_outside_set() -> list[AbstractContextManager[Any]]:
    original = finalizer.exit_fields

    def fields(ctx: TurnContext) -> dict[str, object]:
        out = original(ctx)
        if out["reason"] == ExitReason.TEXT_RESPONSE.value:
            out["reason"] = "done"
        return out
    return [mock.patch.object(finalizer, "exit_fields", fields)]


sabotage("exit_reason_outside_set", ("LOOP-3",),
         "a text answer is logged with the ad-hoc reason 'done' instead of text_response")(
    _reason_outside_set)


def _unguarded_persist() -> list[AbstractContextManager[Any]]:
    async def append(ctx: TurnContext, rows: tuple[Message, ...], label: str) -> bool:
        stored = await AppendMessages(ctx.token, ctx.session_id, rows, label)
        ctx.transcript.replace_pending(stored)
        return True
    return [mock.patch.object(finalizer, "_append", append)]


sabotage("unguarded_final_persist", ("FIN-6",),
         "a failed write in the finalizer propagates and the answer is never delivered")(
    _unguarded_persist)


def _always_info() -> list[AbstractContextManager[Any]]:
    original = finalizer.exit_fields

    def fields(ctx: TurnContext) -> dict[str, object]:
        out = original(ctx)
        out["level"] = "INFO"
        return out
    return [mock.patch.object(finalizer, "exit_fields", fields)]


sabotage("exit_line_always_info", ("FIN-7",),
         "the exit line is always INFO, even when the turn ends on a tool result")(_always_info)


# ---- LEASE-5: a refused turn drops its input ----------------------------------------------


def _drop_refused_input() -> list[AbstractContextManager[Any]]:
    original = prologue.refused_result

    def dropping(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs).model_copy(update={"carried_input": None})
    return [mock.patch.object(prologue, "refused_result", dropping)]


sabotage("refused_turn_drops_input", ("LEASE-5",),
         "a turn that cannot get the lease returns without the user's message")(_drop_refused_input)


# ---- TOOL-8: a result the store refused is shown to the model anyway --------------------


def _send_unrecorded_results() -> list[AbstractContextManager[Any]]:
    original = TurnContext.persist

    async def persist(ctx: TurnContext, rows: tuple[Message, ...], label: str) -> bool:
        if await original(ctx, rows, label) or label != "tool_results":
            return ctx.state.persistence_failed is False or label != "tool_results"
        ctx.state.persistence_failed = False
        ctx.transcript.extend(rows)  # the model will see results the record does not have
        return True
    return [mock.patch.object(TurnContext, "persist", persist)]


sabotage("send_unrecorded_results", ("TOOL-8",),
         "when the store refuses tool results, the turn goes on and shows them to the model")(
    _send_unrecorded_results)


# ---- TOOL-2: the stored row forgets the calls to missing tools -----------------------------


def _drop_invalid_calls() -> list[AbstractContextManager[Any]]:
    original = TurnContext.persist

    async def persist(ctx: TurnContext, rows: tuple[Message, ...], label: str) -> bool:
        if label == "tool_calls":
            names = {t.name for t in ctx.tools}
            rows = tuple(r.model_copy(update={"tool_calls": tuple(
                c for c in r.tool_calls if c.name in names)}) for r in rows)
        return await original(ctx, rows, label)
    return [mock.patch.object(TurnContext, "persist", persist)]


sabotage("drop_invalid_calls_from_row", ("TOOL-2",),
         "the assistant row is stored without the calls to tools that do not exist")(
    _drop_invalid_calls)


# ---- TOOL-10: recovery runs the open calls again ---------------------------------------------


def _rerun_open_calls() -> list[AbstractContextManager[Any]]:
    original = prologue._repair_tail

    async def rerun(ctx: TurnContext) -> bool:
        owner, missing = ctx.transcript.trailing_open_calls()
        if owner is not None:
            calls = tuple(c for c in owner.tool_calls if c.id in missing)
            results = await ExecuteTools(ctx.token, ctx.session_id, calls, False)
            rows = tuple(tool_round._result_row(ctx, r) for r in results)
            ctx.transcript.extend(await AppendMessages(ctx.token, ctx.session_id, rows, "recovery"))
        return await original(ctx)
    return [mock.patch.object(prologue, "_repair_tail", rerun)]


sabotage("recovery_reruns_open_calls", ("TOOL-10",),
         "after a restart, recovery executes recorded calls that have no result instead of "
         "reporting them unknown")(_rerun_open_calls)


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


async def _skip_async(ctx: TurnContext) -> None:
    return None


sabotage("skip_failure_boundary", ("FIN-5",),
         "a failed turn that ends on a user or tool row gets no boundary row")(
    lambda: [mock.patch.object(finalizer, "_failure_boundary", _skip_async)])

sabotage("no_silent_stop_guard", ("FIN-8",),
         "a turn that stops on a tool result ends quietly, not as pending_tool_result")(
    lambda: [mock.patch.object(finalizer, "_silent_stop_guard", lambda ctx: None)])


# ---- LOOP-5: Retry-After is ignored ------------------------------------------------------------


def _ignore_retry_after() -> list[AbstractContextManager[Any]]:
    original = loop._backoff_s

    def backoff(ctx: TurnContext, attempt: int, error: ProviderError) -> float:
        return original(ctx, attempt, ProviderServerError(str(error), status=error.status))
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
    compute = Message.__dict__["wire"].func

    def wire(self: Message) -> dict[str, Any]:
        body: dict[str, Any] = compute(self)
        if self.row_id is not None:
            body = {**body, "content": self.content}
        return body
    return [mock.patch.object(Message, "wire", property(wire))]


sabotage("stored_rows_lose_sidecar", ("WIRE-1",),
         "the wire form of a stored row sends its content column, not the api_content it was "
         "first sent with")(_stale_sidecar)


# ---- CTX-3: the system prompt is rebuilt for every request ----------------------------------


def _volatile_prompt() -> list[AbstractContextManager[Any]]:
    original = loop.build_request

    def rebuilt(ctx: TurnContext, *, with_tools: bool = True, purpose: str = "turn") -> Any:
        request = original(ctx, with_tools=with_tools, purpose=purpose)
        system = Message(role=Role.SYSTEM, content=f"{ctx.cache.system_prompt}\n\nTurn: {ctx.turn_id}")
        return dataclasses.replace(request, messages=(system, *request.messages[1:]))
    return [mock.patch.object(loop, "build_request", rebuilt)]


sabotage("volatile_system_prompt", ("CTX-3",),
         "each request rebuilds the system prompt with a volatile line (the turn id)")(_volatile_prompt)


__all__ = ["SABOTAGES", "PersistenceError", "Sabotage"]
