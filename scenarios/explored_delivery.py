"""Stories the explorer found on streaming, delivery and the delivered answer: each a shrunk
seed (``hermes-ref explore --shrink SEED``, then cut by hand to the one turn that matters).
One is an engine defect, red on the engine before its fix; the others are checkers that read
the record wrong, red on the checkers before theirs. The calls are the explorer's own
(``sim.explore.run``), so each replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import calm_phase
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
