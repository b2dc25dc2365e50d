"""Stories the explorer found on the main loop's edges: each a shrunk seed (``hermes-ref
explore --shrink SEED``, then cut by hand to the one turn that matters) on which a checker
read the record wrong, red on the checkers before their fix. The calls are the explorer's
own (``sim.explore.run``), so each replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import calm_phase, redirect_a_running_turn
from sim.harness import Story, scenario


def _world(s: Story, seed: int, *faults: ReplyFault, grace_outages: tuple[int, ...] = ()) -> None:
    """The explored world of ``seed``: its seeded ids, its model, its notes, one member."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    s.use_provider(ExploreModel(faults, ids=s.world.chooser, grace_outages=grace_outages))
    s.files({f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)})
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")


def _one_turn(s: Story, text: str) -> None:
    """The member asks for ``text`` and a worker drains the session; then the calm phase."""
    one = s.main_process()
    s.start_submit(one, "p-1", "r-1", {"text": text}, session="s-1", after_s=2.0)
    s.start_drain(one, "s-1", after_s=4.0)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("An empty reply after a tool round on the last call max_iterations allows, with no "
          "grace call, ends the turn on its tool result as pending_tool_result (explored "
          "seed 279)", invariants=("LOOP-8", "FIN-8"), stage="explore")
def empty_reply_on_the_last_call_rests_on_the_tool_result(s: Story) -> None:
    """``max_iterations`` 2 and no grace call: the turn reads a file, and the model's second
    reply is empty. The ladder's rung is the nudge, but the nudge is a request, and the
    loop has no call left to send it; the finalizer finds the tail a tool result and names
    the budget's exit ``pending_tool_result`` (FIN-8). LOOP-8's checker excused a turn out
    of calls only under the budget's own exit reasons, and called this one's silence an
    unexplained rung (seeds 279, 376, 602)."""
    _world(s, 279, ReplyFault(call=2, kind=FaultKind.EMPTY_REPLY))
    s.limits(max_iterations=2)
    s.limits(grace_call_enabled=False)
    _one_turn(s, "Read notes-2.txt.")


@scenario("A narrated dropped call on the budget's last unit is re-prompted, not taken as the "
          "answer: with the grace call down, the turn ends pending_tool_result (explored seed 404)",
          invariants=("LOOP-3", "LOOP-7"), stage="explore")
def narrated_call_on_the_last_unit_is_no_answer(s: Story) -> None:
    """A budget of 2: the model calls a tool that does not exist, then says "Let me read
    notes-1.txt now." and stops with ``finish_reason=tool_calls`` and no call. That
    narration is a dropped call with re-prompts left, scaffolding (LOOP-7), but the budget
    is spent, the grace call meets an outage, and the turn rests on the tool's error
    result: ``pending_tool_result``. LOOP-3's checker took any reply in text for an answer
    the turn could have given, the narration included."""
    _world(s, 404, ReplyFault(call=1, kind=FaultKind.UNKNOWN_TOOL),
           ReplyFault(call=2, kind=FaultKind.NARRATED_CALL), grace_outages=(1,))
    s.limits(iteration_budget=2)
    _one_turn(s, "Say hello 6.")


@scenario("A text reply a correction cut is no answer: the corrected turn that ends on a tool "
          "result with its budget spent ends pending_tool_result (explored seed 465)",
          invariants=("LOOP-3", "LOOP-4"), stage="explore")
def reply_a_correction_cut_is_no_answer(s: Story) -> None:
    """A budget of 3: the turn writes a file, and the model's answer is slow (90 s). The
    user's correction arrives while it streams; the turn keeps the visible part as an
    assistant row, takes the correction in as a user row and starts the iteration over
    (LOOP-4). The model then calls a tool that does not exist, the budget is spent, the
    grace call meets an outage, and the turn rests on the error result:
    ``pending_tool_result``. LOOP-3's checker counted the cut reply as an answer the
    turn could have given."""
    _world(s, 465, ReplyFault(call=2, kind=FaultKind.SLOW_REPLY, seconds=90.0),
           ReplyFault(call=3, kind=FaultKind.UNKNOWN_TOOL), grace_outages=(1,))
    s.delay_reply(2, 90.0)
    s.limits(iteration_budget=3)
    redirect_a_running_turn(s, "Say hello 14 instead.", after_s=30.0, session="s-1")
    _one_turn(s, "Write note 2 to s-1-out-2.txt.")


@scenario("A grace summary whose stream broke after its last delta is recovered and delivered "
          "as the budget's answer (explored seed 714)",
          invariants=("LOOP-3", "FIN-8", "FIN-2"), stage="explore")
def grace_summary_recovered_from_its_stream(s: Story) -> None:
    """A budget of 1: the turn reads a file, and the grace call's stream is cut twice, the
    second time after its last delta, the whole summary and its finish delivered. The
    engine recovers that summary (FIN-2) and delivers it as the ``budget_exhausted``
    answer. LOOP-3's and FIN-8's checkers read a grace summary only from a reply that
    came whole, so they called the answer one no grace summary gave, and the turn a
    silent stop on its tool result."""
    _world(s, 714)
    s.world.stream_cuts[2] = 2
    s.world.stream_cuts[3] = 99
    s.limits(iteration_budget=1)
    _one_turn(s, "Read notes-1.txt.")
