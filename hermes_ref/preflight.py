"""Preflight: the check that runs before every model call (CMP-7).

Theory of operation
-------------------
Before each call the engine estimates the request's prompt tokens (a running total kept
by ``Transcript``, so this is O(1)) and compares it with the context window. Compaction
(CMP-2..CMP-6) plugs in here: a request that would overflow is compacted first, and when
compaction cannot bring it under the window the turn fails closed, without sending a
request the provider is known to refuse.

This module owns the decision; it performs no compaction of its own yet, so an
over-window request fails closed with a clear reason.
"""

from __future__ import annotations

from hermes_ref.context import TurnContext
from hermes_ref.outcomes import ExitReason


def request_tokens(ctx: TurnContext) -> int:
    return ctx.cache.system_message.tokens + ctx.transcript.tokens


async def check(ctx: TurnContext) -> bool:
    """True when the next request fits the window; otherwise the turn ends (fail closed)."""
    tokens = request_tokens(ctx)
    window = ctx.limits.context_window_tokens
    if tokens <= window:
        return True
    ctx.finish(
        ExitReason.TERMINAL_PROVIDER_ERROR,
        f"context_overflow: request of {tokens} tokens exceeds the {window}-token window "
        "and compaction cannot relieve it",
        failed=True,
    )
    return False
