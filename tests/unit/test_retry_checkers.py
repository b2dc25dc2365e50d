"""LOOP-2's reading of a turn that failed closed: a refused fallback hop, or a refused re-prompt."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

import scenarios
from hermes_ref import ladder
from hermes_ref.context import TurnContext
from hermes_ref.limits import Limits, ProviderRoute
from hermes_ref.models import Message, ProviderReply, Role, ToolCall
from hermes_ref.outcomes import ExitLine, ExitReason
from hermes_ref.ports import DurableRecord, StoredMessage
from hermes_ref.wire import ProviderRequest
from sim.checkers.base import Observation, TurnView
from sim.checkers.turn import _refused_hop
from sim.harness import run_scenario
from sim.world import CallRecord

LIMITS = Limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=120),))
WRITE = ToolCall(id="call_1", name="write_file", arguments='{"path": "out.txt", "content": "x"}')


def _request(model: str = LIMITS.model) -> ProviderRequest:
    return ProviderRequest(model=model, messages=(Message(role=Role.USER, content="hi"),),
                           tools=(), prompt_tokens=1)


def _call(seq: int, reply: ProviderReply, request: ProviderRequest | None = None) -> CallRecord:
    request = request if request is not None else _request()
    return CallRecord(seq, "s-1", "turn-1", request, reply, None, 0, 0.0, None, request.wire_body())


def _view(*calls: CallRecord) -> TurnView:
    """The turn failed closed on context pressure after ``calls``."""
    line = ExitLine(level="INFO", reason=ExitReason.COMPRESSION_EXHAUSTED, detail="",
                    api_calls=len({id(c.request) for c in calls}), max_iterations=90,
                    budget_used=len(calls), budget_max=90, last_role="tool", response_len=0,
                    cleanup_errors=0)
    return TurnView("s-1", "turn-1", None, calls=list(calls), exits=[line])


def _obs(*rows: Message) -> Observation:
    record = DurableRecord(messages=tuple(StoredMessage(session_id="s-1", message=m) for m in rows))
    return Observation(record=record, ledger=(), calls=(), crash_seqs=(), limits=LIMITS)


def _write_round() -> tuple[CallRecord, Message]:
    """A reply that wrote a file, and the durable result that makes its round land."""
    result = Message(role=Role.TOOL, content="wrote 1 byte to out.txt", tool_call_id=WRITE.id,
                     turn_id="turn-1", row_id=2)
    return _call(1, ProviderReply(finish_reason="tool_calls", tool_calls=(WRITE,))), result


def test_a_refused_re_prompt_of_a_dropped_call_is_no_refused_hop() -> None:
    """Seed 2055: an empty reply, then a dropped call on the primary, and preflight refused
    the re-prompt (LOOP-7 re-prompts on the same route). No hop was made, so no unit came
    back; the checker took the dropped call for an empty reply the ladder fell back after."""
    view = _view(_call(1, ProviderReply(content="")),
                 _call(2, ProviderReply(finish_reason="tool_calls")))
    assert _refused_hop(_obs(), view) == 0


def test_a_refused_hop_after_the_empty_retries_is_still_one() -> None:
    """An empty reply asked again until the retries were spent, whose ladder then fell back
    to a route whose preflight refused the rebuilt request: the hop refunded that call
    (LOOP-2)."""
    asked = _request()
    view = _view(*(_call(n, ProviderReply(content=""), asked)
                   for n in range(1, LIMITS.empty_retries_max + 2)))
    assert _refused_hop(_obs(), view) == 1


def test_a_refused_nudge_after_a_tool_round_is_no_refused_hop() -> None:
    """Seed 4850: a write round, then an empty reply. The rung due is the nudge after a tool
    round (LOOP-8), on the same route; preflight refused the nudged request and the turn
    failed closed. No hop was made, so the empty reply keeps its unit: two calls, two
    units. The checker took every empty reply on a route with a fallback for one whose
    ladder fell back, and called the engine's second unit one kept of a refund."""
    wrote, result = _write_round()
    assert _refused_hop(_obs(result), _view(wrote, _call(2, ProviderReply(content="")))) == 0


def test_an_empty_reply_refunded_with_its_refused_nudge_is_caught() -> None:
    """The engine bug the reading must see, which the old reading passed: a nudge that gives
    the empty reply's unit back, as if it replaced the call. The turn of seed 4850 then
    reports one unit for its two calls (LOOP-2)."""
    rungs = list(ladder.RUNGS)
    index = next(i for i, r in enumerate(rungs) if r.name == "nudge")

    def nudge_and_refund(ctx: TurnContext, reply: ProviderReply) -> None:
        ctx.state.budget.refund()
        original(ctx, reply)
    original = rungs[index].act
    rungs[index] = replace(rungs[index], act=nudge_and_refund)
    spec = scenarios.load_all()["refused_nudge_after_a_write_keeps_its_unit"]
    with mock.patch.object(ladder, "RUNGS", tuple(rungs)):
        outcome = run_scenario(spec, "memory", trace=False)
    assert [v.invariant for v in outcome.findings if v.checker == "budget_accounting"] == ["LOOP-2"]
