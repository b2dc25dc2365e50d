"""Preflight's decision, pinned where mutation testing found it unobserved (CMP-7).

No scenario yet builds a request over the window, so these tests do: the check passes a
request that exactly fits and fails the turn closed, before any call, when it does not.
See docs/mutation.md.
"""

from __future__ import annotations

from hermes_ref import compaction, compression, loop, preflight
from hermes_ref import effects as fx
from hermes_ref.errors import ProviderServerError
from hermes_ref.limits import Limits
from hermes_ref.models import Message, ProviderReply, Role
from hermes_ref.outcomes import ExitReason
from hermes_ref.phases import Phase
from tests.unit.test_mutants_rig import Rig, context

USER = Message(role=Role.USER, content="x" * 40, row_id=1, turn_id="t")


def test_the_request_size_is_the_system_prompt_plus_the_working_list() -> None:
    """The estimate adds the system message's tokens to the transcript's."""
    ctx = context((USER,))
    assert preflight.request_tokens(ctx) == ctx.cache.system_message.tokens + USER.tokens


def test_a_request_that_exactly_fits_is_sent() -> None:
    """A request of exactly the window's size passes and the model is called."""
    ctx = context((USER,), phase=Phase.PROLOGUE)
    size = preflight.request_tokens(ctx)
    ctx = context((USER,), phase=Phase.PROLOGUE, limits=Limits(context_window_tokens=size))
    rig = Rig([ProviderReply(content="ok")])
    rig.run(loop.run_loop(ctx))
    assert len(rig.of(fx.CallProvider)) == 1


def test_a_request_over_the_window_fails_the_turn_closed() -> None:
    """One token over, nothing to compact: no call, a failed context-pressure exit that says
    the sizes."""
    ctx = context((USER,), phase=Phase.PROLOGUE)
    size = preflight.request_tokens(ctx)
    ctx = context((USER,), phase=Phase.PROLOGUE, limits=Limits(context_window_tokens=size - 1))
    rig = Rig([ProviderReply(content="never sent")])
    assert rig.run(preflight.check(ctx)) is False
    assert rig.of(fx.CallProvider) == []
    assert (ctx.ending.reason, ctx.ending.failed) == (ExitReason.COMPRESSION_EXHAUSTED, True)
    assert ctx.ending.detail == (
        f"context_overflow: request of {size} tokens exceeds the {size - 1}-token window "
        "and compaction cannot relieve it")


def test_a_failed_summary_starts_the_cooldown_when_it_fails() -> None:
    """CMP-4: the cooldown runs from the failure, not from the instant the turn decided to
    compact (an earlier pass's summary may have taken minutes in between)."""
    limits = Limits(context_window_tokens=250)
    chat = [Message(role=Role.USER if k % 2 == 0 else Role.ASSISTANT, content=f"message {k}")
            for k in range(40)]
    ctx = context(chat, limits=limits)
    rig = Rig([ProviderServerError("503")], Now=lambda e: 280.0)  # the failure's clock
    outcome = rig.run(compaction.run_pass(ctx, 100.0,  # the decision's clock
                                          target_tokens=compression.budget(limits).threshold_tokens))
    assert outcome.failure is not None and not outcome.changed
    assert ctx.cache.compression.cooldown_until == 280.0 + limits.compression_cooldown_s
