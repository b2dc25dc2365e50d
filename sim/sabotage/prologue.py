"""Broken prologues: an aliased history, a session row before its prompt, a late user row,
a budget carried across turns, a refused turn that drops its input, a volatile prompt."""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import finalizer, loop, prologue
from hermes_ref.context import IterationBudget, TurnContext
from hermes_ref.models import Message, Role
from sim.sabotage.base import sabotage

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

# ---- LEASE-5: a refused turn drops its input ----------------------------------------------


def _drop_refused_input() -> list[AbstractContextManager[Any]]:
    original = prologue.refused_result

    def dropping(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs).model_copy(update={"carried_input": None})
    return [mock.patch.object(prologue, "refused_result", dropping)]


sabotage("refused_turn_drops_input", ("LEASE-5",),
         "a turn that cannot get the lease returns without the user's message")(_drop_refused_input)

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
