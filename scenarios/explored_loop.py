"""Stories the explorer found on the main loop's edges: each a shrunk seed (``hermes-ref
explore --shrink SEED``, then cut by hand to the one turn that matters) on which a checker
read the record wrong, red on the checkers before their fix. The calls are the explorer's
own (``sim.explore.run``), so each replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import calm_phase
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
