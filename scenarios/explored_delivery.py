"""Stories the explorer found on streaming, delivery and the delivered answer: each a shrunk
seed (``hermes-ref explore --shrink SEED``, then cut by hand to the one turn that matters).
One is an engine defect, red on the engine before its fix; the others are checkers that read
the record wrong, red on the checkers before theirs. The calls are the explorer's own
(``sim.explore.run``), so each replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import calm_phase, jump_clock, redirect_a_running_turn
from sim.harness import Story, scenario
from sim.stream_client import SimClient


def _world(s: Story, seed: int, *faults: ReplyFault) -> None:
    """The explored world of ``seed``: its seeded ids, its model, its notes, one member."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    s.use_provider(ExploreModel(faults, ids=s.world.chooser))
    s.files({f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)})
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")


def _one_turn(s: Story, text: str, *, submit_s: float = 2.0, drain_s: float = 4.0) -> None:
    """The member asks for ``text`` and a worker drains the session; then the calm phase."""
    one = s.main_process()
    s.start_submit(one, "p-1", "r-1", {"text": text}, session="s-1", after_s=submit_s)
    s.start_drain(one, "s-1", after_s=drain_s)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


# ---- FIN-1: the grace call -----------------------------------------------------------------


@scenario("An interrupt while the grace summary is being asked for ends the turn interrupted, "
          "not pending_tool_result (explored seeds 1505, 2109, 2204)",
          invariants=("FIN-1", "FIN-8", "LOOP-3", "DEL-1"), stage="explore")
def interrupt_during_the_grace_call_ends_the_turn_interrupted(s: Story) -> None:
    """A budget of one: the turn writes a file, and the budget is spent, so the finalizer asks
    for the grace summary, whose reply is slow (400 s). The user stops the turn 20 s in.
    The engine caught the interrupt in the grace call but kept the budget's exit, and then
    FIN-8's guard, which spares only an interrupted turn, named it ``pending_tool_result``:
    a turn the user stopped was reported as one that stopped silently on a tool result,
    and its summary's stream was owed to the log. An interrupt during the summary call
    ends the turn ``interrupted`` (FIN-1)."""
    _world(s, 1505, ReplyFault(call=2, kind=FaultKind.SLOW_REPLY, seconds=400.0))
    s.limits(iteration_budget=1)
    s.delay_reply(2, 400.0)
    s.interrupt(after_s=124.0, session="s-1")
    _one_turn(s, "Write note 3 to s-1-out-3.txt.", submit_s=75.0, drain_s=104.0)


@scenario("A correction that cuts the grace call is taken in by its turn, not by the session's "
          "next turn (explored seed 2311)",
          invariants=("LOOP-4", "CTX-8", "FIN-5"), stage="explore")
def correction_that_cuts_the_grace_call_is_taken_in(s: Story) -> None:
    """``max_iterations`` 1: the turn reads a file and its one call is spent, so the
    finalizer asks for the grace summary, whose reply is slow, and the user corrects the
    turn while it streams. The correction cut the call, but nothing took it in: it stayed
    queued, and the session's next turn took it in as a second user row of its own before
    its first call (CTX-8). The turn now takes in a correction that cut its grace call
    (LOOP-4); no call is left to answer it, so the turn ends without an answer, and FIN-5's
    boundary row closes it."""
    _world(s, 2311, ReplyFault(call=2, kind=FaultKind.SLOW_REPLY, seconds=90.0))
    s.limits(max_iterations=1)
    s.delay_reply(2, 90.0)
    one = s.main_process()
    s.start_submit(one, "p-1", "r-1", {"text": "Read notes-1.txt."}, session="s-1", after_s=2.0)
    s.start_drain(one, "s-1", after_s=4.0)
    redirect_a_running_turn(s, "Say hello 66 instead.", after_s=10.0, session="s-1")
    s.start_submit(one, "p-1", "r-2", {"text": "Say hello 1."}, session="s-1", after_s=120.0)
    s.start_drain(one, "s-1", after_s=122.0)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


# ---- the delivered answer: what the checkers must take for it -------------------------------


@scenario("A recovered streamed answer after a write that failed carries TOOL-9's note "
          "(explored seeds 1042, 1810)",
          invariants=("FIN-2", "TOOL-9"), stage="explore")
def recovered_stream_answer_with_the_failed_write_note(s: Story) -> None:
    """The model writes under a path that is a file, so the write fails and is not redone;
    its answer's stream is cut after two deltas, and the retry's stream breaks after its
    last delta, whole. The engine recovers that answer (FIN-2) and, as for any delivered
    answer, adds the note of the file changes that did not apply (TOOL-9). FIN-2's checker
    demanded the stored answer be the streamed text exactly, note and all."""
    _world(s, 1042, ReplyFault(call=1, kind=FaultKind.REFUSED_WRITE),
           ReplyFault(call=2, kind=FaultKind.STREAM_CUT, deltas=2),
           ReplyFault(call=3, kind=FaultKind.STREAM_CUT, deltas=99))
    s.world.stream_cuts[2] = 2
    s.world.stream_cuts[3] = 99
    _one_turn(s, "Read notes-1.txt.")


@scenario("A narrated dropped call on the budget's one unit, with no grace call, is no answer "
          "to deliver (explored seeds 1356, 1365, 1486)",
          invariants=("FIN-6", "LOOP-7"), stage="explore")
def narrated_dropped_call_is_no_answer_to_deliver(s: Story) -> None:
    """A budget of one and no grace call: the model says "Let me read notes-1.txt now." and
    stops with ``finish_reason=tool_calls`` and no call. With re-prompts left that
    narration is scaffolding (LOOP-7), not an answer, and the budget is spent, so the turn
    ends without one. FIN-6's checker took the narration for the final answer the model
    gave and called the turn's explanation a different answer."""
    _world(s, 1356, ReplyFault(call=1, kind=FaultKind.NARRATED_CALL))
    s.limits(iteration_budget=1, grace_call_enabled=False)
    _one_turn(s, "Write note 13 to s-1-out-13.txt.")


@scenario("A client shown the answer the verification gate held is shown the durable answer, "
          "though later calls streamed too (explored seeds 2808, 2958)",
          invariants=("DEL-2", "FIN-1"), stage="explore")
def client_shown_the_held_answer(s: Story) -> None:
    """A budget of three and the verification gate: the turn writes a file, the model answers,
    and the gate holds the answer back; asked to check its work, the model, slow, streams a think
    block and reads the file with the last unit. FIN-1 delivers the held answer. DEL-2's
    checker compared it with the text the client was shown for the turn's last streamed
    call, the think block, not for the call that gave the answer."""
    _world(s, 2808, ReplyFault(call=3, kind=FaultKind.SLOW_REPLY, seconds=90.0))
    s.delay_reply(3, 90.0)
    s.limits(verify_before_answer=True)
    s.limits(iteration_budget=3)
    SimClient.join(s.world, "s-1", name="client-1")
    _one_turn(s, "Write note 1 to s-1-out-1.txt.")


@scenario("A client shown a slow answer's think block and text is shown the durable answer "
          "with TOOL-9's note (explored seed 2958)",
          invariants=("DEL-2", "TOOL-9", "DEL-1"), stage="explore")
def client_shown_a_think_block_before_the_noted_answer(s: Story) -> None:
    """The model writes under a path that is a file, so the write fails; its answer is slow
    and thinks aloud first, in an inline think block, and the engine adds the note of the
    file changes that did not apply (TOOL-9). DEL-2's checker folded the think block away
    or followed the note, never both, and called the client's text another answer."""
    _world(s, 2958, ReplyFault(call=1, kind=FaultKind.REFUSED_WRITE),
           ReplyFault(call=2, kind=FaultKind.SLOW_REPLY, seconds=90.0))
    s.delay_reply(2, 90.0)
    SimClient.join(s.world, "s-1", name="client-1")
    _one_turn(s, "Read notes-2.txt.")


# ---- a lost lease of a rotated session -----------------------------------------------------


@scenario("A turn whose lease is lost after its session rotated is one the lease loss stopped "
          "(explored seed 1748)",
          invariants=("LOOP-3", "FIN-6", "LEASE-4"), stage="explore")
def lease_lost_after_a_rotation_stops_the_turn(s: Story) -> None:
    """A window of 400 tokens: session s-2 compacts and rotates to a child (CMP-5). A later
    turn of it gets a 503, and the clock jumps 400 s during the backoff, so the lease is
    gone and the retry is fenced off: the turn ends ``interrupted`` (LEASE-4). The world's
    record names that lease by the child session, and the turn by the lineage's root, so
    the checkers' reading of lost leases missed it: LOOP-3's checker said nobody
    interrupted the turn, and FIN-6's asked for an answer a fenced-off turn may not
    deliver."""
    _world(s, 1748, ReplyFault(call=6, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=10, kind=FaultKind.TOOL_ERROR),
           ReplyFault(call=12, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=14, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=15, kind=FaultKind.SERVER_ERROR))
    s.files({f"part-{k}.txt": f"part {k} of seed 1748: in order" for k in range(1, 8)})
    s.limits(context_window_tokens=400)
    for user in ("p-2", "p-3", "q-3"):
        s.bind(user, session=f"s-{user[-1]}")
    for session in ("s-2", "s-3"):
        s.bind(f"op-{session}", session=session, role="operator", kind="operator")
    one = s.main_process()
    s.faults(crash=None, crash_at_effect=None, fail_writes={"tool_calls": 1})
    for user, request, text, session, submit_s, drain_s in (
            ("p-3", "r-bd9293", "Go through part-1.txt to part-7.txt in order.", "s-3", 3.7, 8.7),
            ("p-2", "r-f647c1", "Write note 5 to s-2-out-5.txt.", "s-2", 9.6, None),
            ("p-2", "r-c76507", "Read notes-2.txt and rewrite it as note 70 at notes-2.txt.", "s-2",
             9.6, 17.1),
            ("q-3", "r-602d2b", "Say hello 602d2b from q-3.", "s-3", 24.4, 26.5),
            ("p-2", "r-602d2b", "Read notes-2.txt.", "s-2", 27.5, 37.5),
            ("p-2", "r-c8fa63", "Say hello 6.", "s-2", 40.4, 41.0),
            (None, None, None, "s-2", None, 46.4),
            ("p-2", "r-b6b562", "Say hello 3.", "s-2", 46.8, 47.8),
            ("p-2", "r-0a61db", "Say hello 4.", "s-2", 51.5, 52.5)):
        if user is not None and request is not None and submit_s is not None:
            s.start_submit(one, user, request, {"text": text}, session=session, after_s=submit_s)
        if drain_s is not None:
            s.start_drain(one, session, after_s=drain_s)
    jump_clock(s, 400.0, after_s=52.9)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")
