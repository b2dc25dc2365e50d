"""Broken prologues: the caller's history used in place, a session row before its prompt, a
late user row, a budget carried across turns, nudge counters reset per turn or never
hydrated, a refused turn that drops its input or forbids a retry, a volatile prompt, a
prompt rebuilt per turn."""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import loop, prologue
from hermes_ref.context import IterationBudget, NudgeCounters, SessionCache, TurnContext
from hermes_ref.models import Message, Role
from hermes_ref.transcript import Transcript
from sim.sabotage.base import sabotage

# ---- CTX-2: the turn works on the caller's own list -----------------------------------------


def _caller_history_in_place() -> list[AbstractContextManager[Any]]:
    def in_place(history: Any) -> Transcript | None:
        if history is None:
            return None
        work = Transcript()
        work._messages = history  # "no need to copy": the working list is the caller's list
        work._tokens = sum(m.tokens for m in history)
        work._hidden = sum(m.hidden for m in history)
        return work
    return [mock.patch.object(prologue, "adopt_history", in_place)]


sabotage("caller_history_in_place", ("CTX-2",),
         "the prologue works on the caller's history list itself instead of a copy")(
    _caller_history_in_place)


# ---- CTX-4: the session row is written before the system prompt -----------------------------


def _null_prompt() -> list[AbstractContextManager[Any]]:
    original = prologue.build_system_prompt

    def late_prompt(key: str, platform: str, tools: Any, started_at: float) -> str:
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
    return [mock.patch.object(prologue, "_persist_user", defer),
            mock.patch.object(prologue, "_opening", lambda *args: None)]


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

# ---- CTX-1: the nudge counters treated as per-turn state, or never hydrated -----------------


def _nudges_per_turn() -> list[AbstractContextManager[Any]]:
    original = prologue._count_user_turn

    def fresh_each_turn(cache: SessionCache, deps: Any) -> bool:
        cache.nudges = NudgeCounters()  # reset with the rest of the per-turn state
        return original(cache, deps)
    return [mock.patch.object(prologue, "_count_user_turn", fresh_each_turn)]


sabotage("nudge_counters_reset_per_turn", ("CTX-1",),
         "the memory and skill nudge counters are reset at every turn like the retry "
         "counters")(_nudges_per_turn)


def _nudges_not_hydrated() -> list[AbstractContextManager[Any]]:
    def skip(cache: SessionCache, history: Transcript, limits: Any) -> None:
        return None
    return [mock.patch.object(prologue, "_hydrate_nudges", skip)]


sabotage("nudge_counters_not_hydrated", ("CTX-1",),
         "a restarted process starts its nudge counters at zero instead of deriving them "
         "from the history")(_nudges_not_hydrated)

# ---- LEASE-5: a refused turn drops its input ----------------------------------------------


def _drop_refused_input() -> list[AbstractContextManager[Any]]:
    original = prologue.refused_result

    def dropping(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs).model_copy(update={"carried_input": None})
    return [mock.patch.object(prologue, "refused_result", dropping)]


sabotage("refused_turn_drops_input", ("LEASE-5",),
         "a turn that cannot get the lease returns without the user's message")(_drop_refused_input)



def _refusal_not_retryable() -> list[AbstractContextManager[Any]]:
    original = prologue.refused_result

    def final(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs).model_copy(update={"retryable": False})
    return [mock.patch.object(prologue, "refused_result", final)]


sabotage("refused_turn_not_retryable", ("LEASE-5",),
         "a turn that cannot begin hands its message back but tells its caller not to "
         "retry it")(_refusal_not_retryable)

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


def _prompt_per_turn() -> list[AbstractContextManager[Any]]:
    original = prologue._take_lease

    async def rebuilding(inp: prologue.TurnInput, deps: Any, cache: SessionCache | None,
                         holder: str, now: float, opening: Any = None) -> Any:
        taken = await original(inp, deps, cache, holder, now, opening)
        prompt = prologue.build_system_prompt(inp.session_key, inp.platform, deps.tools, now)
        taken.cache.system_prompt = prompt
        taken.cache.system_message = Message(role=Role.SYSTEM, content=prompt)
        return taken
    return [mock.patch.object(prologue, "_take_lease", rebuilding)]


sabotage("prompt_rebuilt_each_turn", ("CTX-3",),
         "each turn builds the system prompt from its own inputs (platform, tools) instead "
         "of replaying the session's")(_prompt_per_turn)


# ---- FIN-5: the user row rides the grant even over a tail left open ----------------------


def _opening_over_open_tail() -> list[AbstractContextManager[Any]]:
    original = prologue._opening

    def eager(inp: prologue.TurnInput, deps: Any, cache: SessionCache | None, user: Message,
              now: float) -> Any:
        with mock.patch.object(prologue, "unfinished_turn", lambda history: None):
            return original(inp, deps, cache, user, now)  # "the cache is ours: it is current"
    return [mock.patch.object(prologue, "_opening", eager)]


sabotage("opening_over_an_open_tail", ("FIN-5",),
         "a served session offers its user row with the grant even when its cached history "
         "ends open, so the earlier turn's tail is never closed")(_opening_over_open_tail)
