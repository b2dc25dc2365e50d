"""Stories of the per-session turn lease: waiting, refusal and reclaim."""

from __future__ import annotations

from hermes_ref.errors import RateLimited
from hermes_ref.models import EventKind, ProviderReply
from hermes_ref.outcomes import ExitLine, ExitReason, TurnResult
from hermes_ref.wire import ProviderRequest
from sim.harness import Story, scenario
from sim.provider import FunctionProvider, text, tool_calls


@scenario("A turn that cannot get a busy session's lease hands the message back",
          invariants=("LEASE-5", "LEASE-1", "LOOP-3", "DEL-1"), stage="lease")
def busy_session_hands_the_message_back(s: Story) -> None:
    s.limits(lease_wait_s_max=3.0, lease_poll_s=1.0)
    s.script(text("Now I can answer."))
    world = s.world
    world.store.ensure_session(s.session_record("s-1"))
    other = world.store.acquire_lease("s-1", f"{world.holder}:turn=elsewhere:platform=cli",
                                      world.clock.now(), 300.0)
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
    record = s.world.store.snapshot()
    grants = [g for g in record.lease_grants if lost is not None and lost.turn_id in g.holder]
    s.expect(len(grants) == 1 and grants[0].end_reason == "released",
             "the failed turn held its own grant (only the row failed) and released it")
    s.expect(any(e.kind == "turn.started" and lost is not None and e.turn_id == lost.turn_id
                 for e in record.events), "and it logged that it started")
    s.faults()
    again = s.turn("Second question.")
    s.expect(again is not None and again.final_response == "Second answer.", "the retry runs")


# ---- a lease that is kept, lost and taken over ---------------------------------------------


@scenario("A 420 s tool batch keeps its lease: the refresher renews it every 60 s",
          invariants=("LEASE-2", "LEASE-6", "TOOL-3"), stage="lease")
def long_tool_batch_keeps_its_lease(s: Story) -> None:
    s.world.tools.hang("terminal")
    s.script(tool_calls(("terminal", {"command": "make everything"})),
             text("The build did not finish in time."))
    result = s.turn("Build everything.")
    s.expect(result is not None and result.final_response == "The build did not finish in time.",
             "the turn outlived its 300 s TTL and still answered")
    refreshes = [step for step in s.world.lease_log if step.what == "refreshed"]
    s.expect(len(refreshes) == 6, f"six refreshes (60 s to 360 s) in 420 s, got {len(refreshes)}")
    grant = s.world.store.snapshot().lease_grants[0]
    s.expect(grant.end_reason == "released" and grant.expires_at > grant.acquired_at + 420,
             "the grant was renewed past the batch and released at the end")


@scenario("A turn the user stops gives its lease back: the next message runs at once",
          invariants=("LEASE-6", "FIN-4"), stage="lease")
def stopped_turn_releases_its_lease(s: Story) -> None:
    s.limits(stream_replies=False, lease_wait_s_max=60.0, lease_poll_s=1.0)
    s.script(text("Too late."), text("Here now."))
    s.delay_reply(1, 30.0)
    s.interrupt(after_s=10.0)
    stopped = s.turn("Take your time.")
    s.expect(stopped is not None and stopped.exit_reason is ExitReason.INTERRUPTED,
             "the user stopped it")
    again = s.turn("Quickly, then.")
    s.expect(again is not None and again.final_response == "Here now.",
             "the next turn got the lease without waiting out the TTL")
    grants = s.world.store.snapshot().lease_grants
    s.expect(grants[0].end_reason == "released", "the stopped turn's grant was released")


@scenario("A lease that cannot be refreshed stops the turn at once: no call after the loss",
          invariants=("LEASE-4", "LOOP-3", "FIN-5"), stage="lease")
def unrefreshable_lease_interrupts_the_turn(s: Story) -> None:
    s.faults(fail_writes={"refresh": 10})

    def always_busy(request: ProviderRequest) -> ProviderReply:
        raise RateLimited("slow down", retry_after_s=100.0)
    s.use_provider(FunctionProvider(always_busy))
    result = s.turn("Summarise the report.")
    s.expect(result is not None and result.exit_reason is ExitReason.INTERRUPTED,
             "exit reason interrupted")
    s.expect(len(s.world.calls) == 1, "the first refresh failed at 60 s, during the first "
             "backoff: the model was not called again")
    rows = s.transcript()
    s.expect([r.role.value for r in rows] == ["user", "assistant"],
             "the user row and a boundary row: the tail is closed")


@scenario("A stalled holder loses its lease to another process and is fenced off when it wakes",
          invariants=("LEASE-1", "LEASE-4", "CTX-9", "FIN-5"), stage="lease")
def stalled_holder_is_fenced_off(s: Story) -> None:
    s.script(text("An answer from the stalled process."), text("An answer from the new one."))
    first = s.main_process()
    other = s.process()
    s.delay_reply(1, 30.0)
    stalled = s.start_turn("Question one.", process=first)
    s.stall(first, 400.0, after_s=10.0)
    taken = s.start_turn("Question two.", process=other, after_s=310.0)
    s.run_all()
    s.expect(taken.result is not None and taken.result.final_response == "An answer from the new one.",
             "the second process took the expired lease and answered")
    s.expect(stalled.result is not None and stalled.result.exit_reason is ExitReason.INTERRUPTED
             and not stalled.result.completed,
             "the stalled turn woke to a fenced write: interrupted, no answer delivered")
    grants = s.world.store.snapshot().lease_grants
    s.expect([g.end_reason for g in grants] == ["expired", "released"],
             "token 1 expired under the stall; token 2 was granted and released")
    turns = {r.turn_id for r in s.transcript()}
    s.expect(len(turns) == 2, "rows of two turns: the stalled one wrote nothing after its loss")


@scenario("A turn fenced off after its tool round rests on a tool result, and its exit line is "
          "INFO: it was interrupted, not silent", invariants=("FIN-7", "LEASE-4"), stage="lease")
def fenced_turn_on_a_tool_result_logs_info(s: Story) -> None:
    s.files({"notes.txt": "buy milk"})
    s.script(tool_calls(("read_file", {"path": "notes.txt"})), text("It says: buy milk."),
             text("An answer from the new one."))
    first = s.main_process()
    other = s.process()
    s.delay_reply(2, 30.0)
    stalled = s.start_turn("What is in my notes?", process=first)
    s.stall(first, 400.0, after_s=10.0)
    s.start_turn("Question two.", process=other, after_s=310.0)
    s.run_all()
    s.expect(stalled.result is not None and stalled.result.exit_reason is ExitReason.INTERRUPTED,
             "the stalled turn woke to a fenced write: interrupted")
    lines = [ExitLine.of(e) for e in s.world.store.snapshot().events
             if e.kind is EventKind.TURN_EXIT and stalled.result is not None
             and e.turn_id == stalled.result.turn_id]
    s.expect([(x.last_role, x.level) for x in lines] == [("tool", "INFO")],
             "its exit line names the tool tail, at INFO")


@scenario("A turn waiting in line recovers the open call of a holder that froze while its tool "
          "ran; the tool, started before the recovery, is its one run, not a second "
          "(explored seed 294)", invariants=("TOOL-10", "LEASE-1", "LEASE-4"), stage="lease")
def frozen_holders_tool_is_no_rerun(s: Story) -> None:
    s.limits(lease_ttl_s=30.0, lease_refresh_s=10.0)  # a short lease: a short wait in line
    s.files({"slow.txt": "slow"})
    s.world.tools.slow("read_file", 60.0, path="slow.txt")
    s.script(tool_calls(("read_file", {"path": "slow.txt"})), text("Recovered and answered."))
    first = s.main_process()
    other = s.process()
    s.delay_reply(1, 10.0)  # the call comes back after the other turn began waiting
    stalled = s.start_turn("Read slow.txt.", process=first)
    waiting = s.start_turn("Are you there?", process=other, after_s=1.0)
    s.stall(first, 120.0, after_s=15.0)  # frozen while the read runs
    s.run_all()
    s.expect(waiting.result is not None and waiting.result.final_response == "Recovered and answered.",
             "the waiting turn took the expired lease, recovered the open call and answered")
    s.expect(len(s.world.tools.ledger) == 1, "the read ran once, for the turn that called it")
    s.expect(stalled.result is not None and not stalled.result.completed,
             "the frozen turn woke to a lost lease and delivered nothing")


@scenario("A dead holder's lease is taken at the next poll, not after its TTL",
          invariants=("LEASE-3", "CTX-9", "TOOL-10"), stage="lease")
def dead_holder_lease_is_reclaimed(s: Story) -> None:
    s.script(tool_calls(("write_file", {"path": "notes.txt", "content": "final"})),
             text("I can answer now."))
    first = s.main_process()
    other = s.process()
    s.delay_reply(1, 60.0)
    s.start_turn("Save the notes.", process=first)
    waiting = s.start_turn("Are you there?", process=other, after_s=5.0)
    s.kill(first, after_s=20.0)
    s.run_all()
    s.expect(waiting.result is not None and waiting.result.final_response == "I can answer now.",
             "the waiting turn ran")
    grants = s.world.store.snapshot().lease_grants
    s.expect(grants[1].acquired_at - grants[0].acquired_at <= 21.0,
             "taken one poll after the holder died, long before its 300 s TTL")
    s.expect(s.world.tools.ledger == [], "the dead turn's call never ran")


@scenario("Two sessions on two processes run side by side",
          invariants=("LEASE-1",), stage="lease")
def two_sessions_run_side_by_side(s: Story) -> None:
    s.script(text("First session answered."), text("Second session answered."))
    other = s.process()
    s.delay_reply(1, 30.0)
    s.delay_reply(2, 30.0)
    start = s.world.clock.now()
    one = s.start_turn("Hello from one.", session="s-1")
    two = s.start_turn("Hello from two.", session="s-2", process=other)
    s.run_all()
    s.expect(one.result is not None and two.result is not None
             and one.result.completed and two.result.completed, "both answered")
    s.expect(s.world.clock.now() - start < 40.0, "in about 30 s together, not 60 s one by one")


@scenario("A turn waiting for a busy session is served before a later turn of the holder",
          invariants=("LEASE-1", "LEASE-5"), stage="lease")
def waiters_are_served_in_order(s: Story) -> None:
    s.script(text("The first answer."), text("The waiting answer."), text("The second answer."))
    first = s.main_process()
    other = s.process()
    s.delay_reply(1, 10.0)
    s.start_turn("First question.", process=first)
    waiting = s.start_turn("A question from elsewhere.", process=other, after_s=2.5)
    second = s.start_turn("Second question.", process=first, after_s=10.2)
    s.run_all()
    s.expect(waiting.result is not None and waiting.result.final_response == "The waiting answer.",
             "the turn that had waited since 2.5 s ran next")
    s.expect(second.result is not None and second.result.final_response == "The second answer.",
             "the holder's next turn queued behind it and ran last")
    holders = [g.holder.split(":turn=")[1].split(":")[0]
               for g in s.world.store.snapshot().lease_grants]
    s.expect(holders == ["turn-1", "turn-2", "turn-3"], f"grants in asking order: {holders}")


@scenario("A lease lost during a tool batch stops the turn; the running call is reported unknown",
          invariants=("LEASE-4", "FIN-8", "TOOL-3", "FIN-5"), stage="lease")
def lease_lost_during_a_tool_batch(s: Story) -> None:
    s.world.tools.hang("terminal")
    s.faults(fail_writes={"refresh": 10})
    s.script(tool_calls(("terminal", {"command": "make everything"})))
    result = s.turn("Build everything.")
    s.expect(result is not None and result.exit_reason is ExitReason.INTERRUPTED,
             "the failed refresh at 60 s interrupted the 420 s batch")
    rows = s.transcript()
    s.expect(rows[2].role.value == "tool" and (rows[2].content or "").startswith("unknown:"),
             "the call that was running is closed as unknown, not as never run")
    s.expect(len(s.world.calls) == 1, "the model was not called again after the interrupt")


def _lose_the_lease_after_a_tool_round(s: Story) -> TurnResult | None:
    """A turn reads a note; every refresh fails, and the model call after the read answers
    only at 90 s, past the first failed refresh at 60 s."""
    s.files({"notes.txt": "buy milk"})
    s.faults(fail_writes={"refresh": 10})
    s.script(tool_calls(("read_file", {"path": "notes.txt"})), text("It says: buy milk."))
    s.delay_reply(2, 90.0)
    return s.turn("What is in my notes?")


@scenario("A lease lost while a whole reply is awaited after a tool round ends the turn "
          "interrupted, not as a silent stop",
          invariants=("LOOP-3",), stage="lease")
def lease_lost_awaiting_a_whole_reply(s: Story) -> None:
    """Replies arrive whole here (no stream). The refresh fails while the model call after
    the tool round is out, so the turn stops: only a boundary row follows its tool result,
    as after a silent stop, yet the turn was stopped, not silent, and exits
    ``interrupted`` (LOOP-3). The reply that came back too late answered in text, so
    ``pending_tool_result`` would be a false account of it too. With no stream, no deltas
    of that reply are owed to the log (DEL-1 has nothing to say)."""
    s.limits(stream_replies=False)
    result = _lose_the_lease_after_a_tool_round(s)
    s.expect(result is not None and result.exit_reason is ExitReason.INTERRUPTED,
             "interrupted, though only a boundary row follows the tool result")


@scenario("A lease lost during the model call after a tool round ends the turn interrupted",
          invariants=("LEASE-4", "LOOP-3", "FIN-8", "FIN-5"), stage="lease")
def lease_lost_after_a_tool_round(s: Story) -> None:
    result = _lose_the_lease_after_a_tool_round(s)
    s.expect(result is not None and result.exit_reason is ExitReason.INTERRUPTED,
             "interrupted: not pending_tool_result, the turn did not stop quietly")
    s.expect(result is not None and result.final_response != "It says: buy milk.",
             "the reply that arrived after the interrupt was not delivered")
    s.expect(s.transcript()[-1].role.value == "assistant", "a boundary row closes the tail")


@scenario("A holder that wakes from a stall past its lease's expiry stops at the refresh that "
          "fails, not at the write that would be fenced off later", invariants=("LEASE-4",),
          stage="lease")
def woken_holder_stops_at_its_failed_refresh(s: Story) -> None:
    """The process freezes 10 s into a long model call and wakes at 410 s, past its
    lease's 300 s expiry. The first thing it does awake is the refresh that was due at
    60 s, and the store refuses it: the turn stops there (LEASE-4), though the reply is
    still 90 s away and nothing has been fenced off yet. The stall explains the missed
    refreshes (LEASE-2 excuses a gap its process spent frozen); only going on after the
    refused refresh is the engine's."""
    s.script(text("An answer too late to deliver."))
    s.delay_reply(1, 500.0)
    s.stall(s.main_process(), 400.0, after_s=10.0)
    result = s.turn("Summarise the report.")
    s.expect(result is not None and result.exit_reason is ExitReason.INTERRUPTED
             and not result.completed, "interrupted: the lease was gone when the process woke")
    snap = s.world.store.snapshot()
    start = snap.lease_grants[0].acquired_at
    exits = [e.at - start for e in snap.events if e.kind is EventKind.TURN_EXIT and e.at]
    s.expect(exits == [410.0], f"stopped on waking at 410 s, not when the reply came: {exits}")
