"""FIN-6 at the verification gate: an answer the gate held back stands when the check it
asked for fails (context pressure, a refusal, the empty ladder run out...), and CMP-7's
checker counts the gate's scaffolding in the request it refused (explored seed 1095,
``held_answer_stands_past_a_full_window``)."""

from __future__ import annotations

import re

import pytest

import scenarios
from hermes_ref import compaction, finalizer, loop, redirect
from hermes_ref.context import TurnContext
from hermes_ref.effects import CallProvider
from hermes_ref.limits import Limits
from hermes_ref.models import Message, ProviderReply, Role, ScaffoldFlag, ToolCall
from hermes_ref.outcomes import ExitReason
from hermes_ref.phases import Phase
from hermes_ref.scaffolding import EMPTY_SENTINEL, PRE_VERIFY_NUDGE
from sim.checkers.base import Observation
from sim.checkers.compaction_record import scaffolding_after
from sim.checkers.compaction_shape import unsent_tokens
from sim.harness import run_scenario
from tests.unit.observing import judged_observations
from tests.unit.test_mutants_rig import Rig, context

USER = Message(role=Role.USER, content="Write note 4 to out.txt.", row_id=1, turn_id="t")
CALL = Message(role=Role.ASSISTANT, row_id=2, turn_id="t", tool_calls=(
    ToolCall(id="c-1", name="write_file", arguments='{"path": "out.txt", "content": "4"}'),))
RESULT = Message(role=Role.TOOL, content="wrote 1 bytes to out.txt", tool_call_id="c-1",
                 row_id=3, turn_id="t")
ANSWER = "Done: wrote note 4."


def _held(limits: Limits | None = None) -> TurnContext:
    """A turn that wrote a file and answered, its answer held back by the gate."""
    ctx = context((USER, CALL, RESULT), limits=limits or Limits(verify_before_answer=True))
    ctx.state.files_changed = True
    assert loop._withheld_for_verification(ctx, ANSWER)
    return ctx


@pytest.mark.parametrize("reason", [ExitReason.COMPRESSION_EXHAUSTED,
                                    ExitReason.COMPRESSION_TIMEOUT])
def test_the_held_answer_stands_when_context_pressure_ends_the_turn(reason: ExitReason) -> None:
    """Delivered, not failed, the first reason kept and its detail amended; the answer is
    the turn's last row, and the gate's scaffolding is not stored."""
    ctx = _held()
    ctx.finish(reason, "the request exceeds the window", answer="too long", failed=True)
    rig = Rig()
    result = rig.run(finalizer.finalize(ctx))
    assert (result.completed, result.failed, result.final_response) == (True, False, ANSWER)
    assert result.exit_reason is reason
    assert result.exit_detail == "the request exceeds the window" + finalizer.HELD_BACK_NOTE
    written = rig.written()
    assert [(m.role, m.content) for m in written] == [(Role.ASSISTANT, ANSWER)]
    assert all(m.scaffold is None for m in written)


def test_preflight_refusing_the_check_leaves_the_held_answer_standing() -> None:
    """The seed's path: preflight finds the verification request over the window and fails
    the turn closed; the finalizer then delivers the answer the gate held."""
    ctx = _held(Limits(verify_before_answer=True, context_window_tokens=40))
    ctx.tracker.enter(Phase.PREFLIGHT)
    rig = Rig()
    assert rig.run(loop.cleared_to_send(ctx)) is False
    assert ctx.ending.reason is ExitReason.COMPRESSION_EXHAUSTED and ctx.ending.failed
    result = rig.run(finalizer.finalize(ctx))
    assert (result.completed, result.final_response) == (True, ANSWER)


def test_a_turn_that_lost_its_lease_delivers_nothing_though_an_answer_was_held() -> None:
    """LEASE-4 overrules: an interrupted turn is not a context-pressure exit, and the held
    answer is not delivered (the no-answer guard explains the failure)."""
    ctx = _held()
    compaction.fail_closed(ctx, "the request exceeds the window", None)
    ctx.ending.lose_lease("the lease was lost")
    result = Rig().run(finalizer.finalize(ctx))
    assert result.exit_reason is ExitReason.INTERRUPTED
    assert result.failed and result.final_response != ANSWER


@pytest.mark.parametrize("reason, text", [
    (ExitReason.TERMINAL_PROVIDER_ERROR, None),
    (ExitReason.EMPTY_RESPONSE_EXHAUSTED, EMPTY_SENTINEL),
    (ExitReason.LOCAL_PROCESSING_ERROR, loop.LOCAL_ERROR_TEXT),
    (ExitReason.TRUNCATED_TOOL_CALL, loop.TRUNCATED_TEXT),
    (ExitReason.INVALID_TOOL_CALLS, None),
])
def test_the_held_answer_stands_when_the_check_fails(reason: ExitReason,
                                                     text: str | None) -> None:
    """The provider refused the check or the model's replies to it were no use: the held
    answer replaces the failure's own text (the sentinel, say), delivered and not failed,
    under the reason the failure recorded."""
    ctx = _held()
    ctx.finish(reason, "the check failed", answer=text, failed=True)
    rig = Rig()
    result = rig.run(finalizer.finalize(ctx))
    assert (result.completed, result.failed, result.final_response) == (True, False, ANSWER)
    assert result.exit_reason is reason
    assert result.exit_detail == "the check failed" + finalizer.HELD_BACK_NOTE
    assert [(m.role, m.content) for m in rig.written()] == [(Role.ASSISTANT, ANSWER)]


def test_a_failed_write_does_not_deliver_the_held_answer() -> None:
    """A write that failed is the store's failure, not the check's: its rows may leave a
    call open that only the failure boundary closes, so the turn fails as it would have."""
    ctx = _held()
    ctx.finish(ExitReason.PERSISTENCE_FAILED, "the store failed", answer="", failed=True)
    result = Rig().run(finalizer.finalize(ctx))
    assert result.failed and result.exit_reason is ExitReason.PERSISTENCE_FAILED
    assert result.final_response != ANSWER


def test_a_correction_overrules_the_held_answer_and_the_gate_holds_once() -> None:
    """A correction taken in while the answer is held clears it (it answered what the user
    asked before), and the gate holds no second answer in the same turn."""
    ctx = _held()
    rig = Rig(DrainRedirects=lambda e: ("Make it 43.",))
    rig.run(redirect.take_redirects(ctx))
    assert ctx.state.withheld_answer is None and ctx.state.gate_spent
    assert not loop._withheld_for_verification(ctx, "Saved 43.")
    assert ctx.transcript.tail() is not None and ctx.transcript.tail().content == "Make it 43."


def test_a_budget_end_after_an_overruling_correction_asks_for_a_summary() -> None:
    """With the held answer overruled the budget's end makes its grace call, and the
    summary, not the held answer, is delivered."""
    ctx = _held(Limits(verify_before_answer=True, max_iterations=3, iteration_budget=3))
    ctx.state.api_calls = 3
    Rig(DrainRedirects=lambda e: ("Make it 43.",)).run(redirect.take_redirects(ctx))
    rig = Rig([ProviderReply(content="Saved 43, as corrected.")])
    result = rig.run(finalizer.finalize(ctx))
    assert result.final_response == "Saved 43, as corrected." and not result.failed
    assert [e.request.purpose for e in rig.effects if isinstance(e, CallProvider)] == ["grace"]


def test_a_pressure_exit_with_nothing_held_still_fails() -> None:
    """Without a held answer the failure and its explanation stand."""
    ctx = context((USER,), limits=Limits(verify_before_answer=True))
    compaction.fail_closed(ctx, "the request exceeds the window", None)
    result = Rig().run(finalizer.finalize(ctx))
    assert result.failed and result.final_response == compaction.EXHAUSTED_TEXT


def _seed_1095() -> Observation:
    """The story of seed 1095 run on the memory store, and the observation judged last."""
    spec = scenarios.load_all()["held_answer_stands_past_a_full_window"]
    with judged_observations() as seen:
        outcome = run_scenario(spec, trace=False)
    assert outcome.passed, outcome.violations
    return seen[-1]


def test_the_checker_counts_the_refused_request_as_preflight_measured_it() -> None:
    """CMP-7's count of the request preflight refused carries the gate's pair after the
    held answer (the answer, then the pre-verify nudge), and leaves out the answer's row
    the finalizer wrote after: it equals the engine's own measurement, 259 tokens."""
    obs = _seed_1095()
    (view,) = [v for v in obs.turns.values() if v.exit is not None
               and v.exit.reason is ExitReason.COMPRESSION_EXHAUSTED]
    assert view.exit is not None
    measured = re.search(r"request of (\d+) tokens", view.exit.detail)
    assert measured is not None and int(measured.group(1)) == 259
    pair = scaffolding_after(obs, view.calls, view.calls[-1])
    assert [(m.role, m.content, m.scaffold) for m in pair] == [
        (Role.ASSISTANT, "Done: Write note 404 to lane-out-404.txt.", ScaffoldFlag.VERIFICATION_STOP),
        (Role.USER, PRE_VERIFY_NUDGE, ScaffoldFlag.PRE_VERIFY)]
    assert unsent_tokens(obs, view) == 259
