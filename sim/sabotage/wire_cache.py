"""Broken replays that a provider's prompt cache pays for (a restarted engine that replays the
prompt it has just built instead of the stored one; earlier turns' rows sent without the
sidecar they were first sent with; an injection stored in the row's content instead of its
sidecar), and rewrites that keep a stale sidecar (WIRE-2)."""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import loop, prologue
from hermes_ref.context import SessionCache, TurnContext
from hermes_ref.models import Message, Role
from hermes_ref.wire import ProviderRequest
from sim.sabotage.base import sabotage

# ---- CTX-3: the prompt a restarted engine replays is the one it built, not the stored one ----


def _built_prompt_after_restart() -> list[AbstractContextManager[Any]]:
    original = prologue._take_lease

    async def built(inp: prologue.TurnInput, deps: Any, cache: SessionCache | None,
                    holder: str, now: float, opening: Any = None) -> Any:
        fresh = cache is None
        taken = await original(inp, deps, cache, holder, now, opening)
        if fresh:  # "we just built it anyway": the row's prompt is dropped for today's
            prompt = prologue.session_record(inp, deps.tools, now).system_prompt
            taken.cache.system_prompt = prompt
            taken.cache.system_message = Message(role=Role.SYSTEM, content=prompt)
        return taken
    return [mock.patch.object(prologue, "_take_lease", built)]


sabotage("restart_replays_a_rebuilt_prompt", ("CTX-3",),
         "an engine that opens a session it has no cache for replays the prompt it has just "
         "built (with today's clock) instead of the one the session row stored")(
    _built_prompt_after_restart)


# ---- WIRE-1: only the current turn's row is sent with its sidecar -----------------------------


def _sidecar_only_this_turn() -> list[AbstractContextManager[Any]]:
    original = loop.build_request

    def per_turn(ctx: TurnContext, *, with_tools: bool = True,
                 purpose: str = "turn") -> ProviderRequest:
        request = original(ctx, with_tools=with_tools, purpose=purpose)
        # "the injection belongs to its turn": earlier turns' rows go out as stored text
        messages = tuple(m.model_copy(update={"api_content": None})
                         if m.api_content is not None and m.turn_id != ctx.turn_id else m
                         for m in request.messages)
        return dataclasses.replace(request, messages=messages,
                                   prompt_tokens=sum(m.tokens for m in messages))
    return [mock.patch.object(loop, "build_request", per_turn)]


sabotage("sidecar_dropped_on_replay", ("WIRE-1",),
         "a row's api_content is sent only in the turn that injected it; later turns replay "
         "the row's bare content, so the bytes before it no longer repeat")(
    _sidecar_only_this_turn)


# ---- WIRE-1: the injection goes into the stored row itself -----------------------------------


def _injection_in_content() -> list[AbstractContextManager[Any]]:
    original = prologue.build_turn_context

    async def folded(inp: prologue.TurnInput, deps: prologue.PrologueDeps) -> Any:
        if inp.injected_context:  # "one text is simpler than a text and its sidecar"
            text = prologue.compose_api_content(inp.text, inp.injected_context) or inp.text
            inp = dataclasses.replace(inp, text=text, injected_context=None)
        return await original(inp, deps)
    return [mock.patch.object(prologue, "build_turn_context", folded)]


sabotage("injection_stored_as_content", ("WIRE-1",),
         "the user row is built with the per-turn injection folded into its content and no "
         "sidecar, so the record keeps what only the API copy may carry")(_injection_in_content)


# ---- WIRE-2: a rewrite keeps the old sidecar -------------------------------------------------


def _helper_keeps_sidecar() -> list[AbstractContextManager[Any]]:
    def keeping(self: Message, content: str | None, **changes: Any) -> Message:
        return self.model_copy(update={**changes, "content": content})  # "only the text changed"
    return [mock.patch.object(Message, "rewritten", keeping)]


sabotage("rewrite_keeps_the_sidecar", ("WIRE-2",),
         "Message.rewritten, the one way to change a row's text (both stores' rewrite goes "
         "through it), writes the new content and keeps the api_content of the old one")(
    _helper_keeps_sidecar)

