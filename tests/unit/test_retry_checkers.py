"""LOOP-2's reading of a turn that failed closed: a refused fallback hop, or a refused re-prompt."""

from __future__ import annotations

from hermes_ref.limits import Limits, ProviderRoute
from hermes_ref.models import Message, ProviderReply, Role
from hermes_ref.outcomes import ExitLine, ExitReason
from hermes_ref.wire import ProviderRequest
from sim.checkers.base import TurnView
from sim.checkers.turn import _refused_hop
from sim.world import CallRecord

LIMITS = Limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=120),))


def _call(seq: int, reply: ProviderReply, model: str) -> CallRecord:
    request = ProviderRequest(model=model, messages=(Message(role=Role.USER, content="hi"),),
                              tools=(), prompt_tokens=1)
    return CallRecord(seq, "s-1", "turn-1", request, reply, None, 0, 0.0, None, request.wire_body())


def _view(*replies: ProviderReply, model: str) -> TurnView:
    line = ExitLine(level="INFO", reason=ExitReason.COMPRESSION_EXHAUSTED, detail="",
                    api_calls=len(replies), max_iterations=90, budget_used=len(replies),
                    budget_max=90, last_role="user", response_len=0, cleanup_errors=0)
    return TurnView("s-1", "turn-1", None, calls=[_call(n, r, model) for n, r in enumerate(replies, 1)],
                    exits=[line])


def test_a_refused_re_prompt_of_a_dropped_call_is_no_refused_hop() -> None:
    """Seed 2055: an empty reply, then a dropped call on the primary, and preflight refused
    the re-prompt (LOOP-7 re-prompts on the same route). No hop was made, so no unit came
    back; the checker took the dropped call for an empty reply the ladder fell back after."""
    view = _view(ProviderReply(content=""), ProviderReply(finish_reason="tool_calls"), model=LIMITS.model)
    assert _refused_hop(LIMITS, view) == 0


def test_a_refused_hop_after_an_empty_reply_is_still_one() -> None:
    """An empty reply whose ladder fell back to a route whose preflight refused it: the
    hop refunded that call (LOOP-2)."""
    view = _view(ProviderReply(content=""), model=LIMITS.model)
    assert _refused_hop(LIMITS, view) == 1
