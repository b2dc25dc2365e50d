"""LOOP-6: the provider chain of a turn, the primary first, then ``fallback_providers``.

Theory of operation
-------------------
A turn starts on the primary: the model and window of its ``Limits``. When the primary
is spent (its retries used up on transient or auth errors, LOOP-5, or the empty-reply
ladder reached its ``fallback`` rung, LOOP-8), the turn falls back to the next route of
``fallback_providers``, in order. A fallback may have another window and count tokens
differently (``ProviderRoute.token_ratio``), so nothing of the primary's request is
reused: ``fall_back`` only switches the turn's limits to the route's model and window
(the window as this engine's estimate counts it), and the loop starts the iteration
over from the top, where preflight runs again against the new window and the request
is rebuilt from the transcript for the new model. The hop refunds the spent call and its
budget unit (LOOP-2), as a compaction pass that replaces a call does: the call on the
fallback is the same iteration's, not another one.

The switch lives in the turn's own ``TurnContext`` (its ``limits`` and ``state.route``),
never in the engine or the session cache, so the next turn starts on the primary again.
"""

from __future__ import annotations

import math

from hermes_ref.context import TurnContext
from hermes_ref.limits import ProviderRoute


def route_tokens(ctx: TurnContext, estimate: int) -> int:
    """A prompt of ``estimate`` tokens (this engine's count) as the active route counts it:
    the figure a request carries (``ProviderRequest.prompt_tokens``)."""
    ratio = token_ratio(ctx)
    return estimate if ratio == 1.0 else math.ceil(estimate * ratio)


def active(ctx: TurnContext) -> ProviderRoute | None:
    """The fallback route the turn is on, or None while it is on the primary."""
    index = ctx.state.route
    return ctx.limits.fallback_providers[index - 1] if index > 0 else None


def token_ratio(ctx: TurnContext) -> float:
    """The active route's tokens per token of this engine's estimate."""
    route = active(ctx)
    return route.token_ratio if route is not None else 1.0


def can_fall_back(ctx: TurnContext) -> bool:
    return ctx.state.route < len(ctx.limits.fallback_providers)


def fall_back(ctx: TurnContext, *, refund: bool = True) -> ProviderRoute:
    """Switch the turn to its next fallback route (``can_fall_back`` must hold).

    The hop gives back the call it replaces, and that call's budget unit (LOOP-2): the
    fallback's call takes its place in the same iteration, so a turn at its last
    iteration still makes it rather than ending on the spent primary. The grace call
    (``refund`` False) spent no unit and is past the bound already: it gives back nothing.
    """
    if refund:
        ctx.state.hops += 1
        ctx.state.budget.refund()
    ctx.state.route += 1
    route = ctx.limits.fallback_providers[ctx.state.route - 1]
    ctx.limits = ctx.limits.model_copy(update={
        "model": route.model, "context_window_tokens": route.window_in_estimate})
    return route
