"""Stories of the per-session turn lease: waiting, refusal and reclaim."""

from __future__ import annotations

from hermes_ref.outcomes import ExitReason
from sim.harness import Story, scenario
from sim.provider import text


@scenario("A turn that cannot get a busy session's lease hands the message back",
          invariants=("LEASE-5", "LOOP-3", "DEL-1"), stage="lease")
def busy_session_hands_the_message_back(s: Story) -> None:
    s.limits(lease_wait_s_max=3.0, lease_poll_s=1.0)
    s.script(text("Now I can answer."))
    world = s.world
    world.store.ensure_session(s.session_record("s-1"))
    other = world.store.acquire_lease("s-1", f"{world.holder}:turn=elsewhere", world.clock.now(), 300.0)
    s.expect(other is not None, "another turn of this process holds the lease")
    refused = s.turn("Are you free?")
    s.expect(refused is not None and refused.exit_reason is ExitReason.LEASE_TIMEOUT,
             "exit reason session_turn_lease_timeout after the bounded wait")
    s.expect(refused is not None and refused.carried_input is not None
             and refused.carried_input.content == "Are you free?", "the message came back")
    s.expect(refused is not None and refused.retryable, "the refusal is retryable")
    s.expect(s.transcript() == [], "nothing was written for the refused turn")
    assert other is not None
    world.store.release_lease(other)
    again = s.turn("Are you free?")
    s.expect(again is not None and again.final_response == "Now I can answer.", "the retry runs")


@scenario("A turn whose store fails before it begins hands the message back",
          invariants=("LEASE-5",), stage="lease")
def store_failure_before_the_turn_hands_the_message_back(s: Story) -> None:
    s.faults(fail_writes={"lease": 1})
    s.script(text("Hello again."))
    refused = s.turn("Hello?")
    s.expect(refused is not None and refused.exit_reason is ExitReason.PERSISTENCE_FAILED,
             "exit reason session_persistence_failed")
    s.expect(refused is not None and refused.carried_input is not None, "the message came back")
    again = s.turn("Hello?")
    s.expect(again is not None and again.final_response == "Hello again.", "the retry runs")


@scenario("A turn whose message cannot be recorded hands it back, even on a known session",
          invariants=("LEASE-5", "FIN-5"), stage="lease")
def unrecorded_message_is_handed_back(s: Story) -> None:
    s.script(text("First answer."), text("Second answer."))
    s.turn("First question.")
    s.faults(fail_writes={"user": 1})
    lost = s.turn("Second question.")
    s.expect(lost is not None and lost.exit_reason is ExitReason.PERSISTENCE_FAILED,
             "exit reason session_persistence_failed")
    s.expect(lost is not None and lost.carried_input is not None
             and lost.carried_input.content == "Second question." and lost.retryable,
             "the unrecorded message came back, retryable")
    s.faults()
    again = s.turn("Second question.")
    s.expect(again is not None and again.final_response == "Second answer.", "the retry runs")
