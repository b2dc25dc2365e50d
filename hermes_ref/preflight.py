"""Preflight: the check that runs before every model call (CMP-7).

Theory of operation
-------------------
Before each call the engine estimates the request's prompt tokens (a running total kept
by ``Transcript``, so this is O(1)) and decides whether it needs relief. Compaction
(``hermes_ref.compaction``) runs when the request is over the compression threshold
(``compression.budget``): before the turn's first call up to ``compression_passes_max``
passes (and a manual or idle compaction first), before a later call one pass. A request
that still does not fit the context window after that fails the turn closed, without
being sent: the provider is known to refuse it. A request over the threshold but within
the window is sent.

This module owns the decision to send; ``compaction`` owns the passes. A request that
needs nothing costs no effect at all here. The finalizer's grace call is measured but not
compacted for: a compaction there could lose the lease mid-summary with no loop left to
take the interrupt, and a grace call that does not fit is simply not sent.
"""

from __future__ import annotations

from hermes_ref import compaction
from hermes_ref.compaction import request_tokens  # the one count of a request's tokens
from hermes_ref.context import TurnContext
from hermes_ref.phases import Phase


async def check(ctx: TurnContext) -> bool:
    """True when the next request fits the window; otherwise the turn ends (fail closed)."""
    state = ctx.cache.compression
    state.begin(ctx.turn_id)
    last = None
    if ctx.tracker.phase is not Phase.FINALIZE:  # the grace call is measured, not compacted for
        if ctx.state.api_calls == 0:
            last = await compaction.before_first_call(ctx, state)
        else:
            last = await compaction.before_later_call(ctx, state)
        if ctx.ended:
            return False  # the compaction's write was fenced off: the lease is gone (LEASE-4)
    tokens = request_tokens(ctx)
    window = ctx.limits.context_window_tokens
    if tokens <= window:
        return True
    compaction.fail_closed(
        ctx, f"context_overflow: request of {tokens} tokens exceeds the {window}-token window "
        "and compaction cannot relieve it", last)
    return False
