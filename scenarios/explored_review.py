"""Stories from an independent review of the correction path at the loop's bound, each red
on the checkers before its fix. The calls are the explorer's own (``sim.explore.run``), so
each runs the explorer's world with its calm phase; the correction is sent while a tool
runs, which a user may do, and the explored world now does too (its `corrections` part).
"""

from __future__ import annotations

from sim.explore.model import ExploreModel
from sim.explore.run import calm_phase
from sim.harness import Story, scenario


@scenario("A correction during the last tool round at the loop's bound is taken in by its turn, "
          "not by the session's next turn",
          invariants=("LOOP-4", "LOOP-1", "CTX-8"), stage="explore")
def correction_during_the_last_tool_round_is_taken_in(s: Story) -> None:
    """``max_iterations`` 1: the turn's one call asks for a slow read_file, and the user
    corrects the turn while the tool runs. No call is left for the loop, so it left without
    draining the queue (it drained only when a correction had cut a call), and the session's
    next turn took the correction in as a second user row before its first call (CTX-8).
    Hermes drains corrections at the head of every iteration, and the pending grace call
    counts as one (LOOP-1, LOOP-4): the turn now takes the correction in on leaving at the
    bound, and the grace call answers it."""
    s.seed = 0
    s.world.id_style = "seeded"
    s.use_provider(ExploreModel((), ids=s.world.chooser))
    s.files({f"notes-{k}.txt": f"note {k}" for k in (1, 2)})
    s.world.tools.slow("read_file", 30.0, path="notes-1.txt")
    s.limits(max_iterations=1)
    s.bind("p-1", session="s-1")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-1", {"text": "Read notes-1.txt."}, session="s-1", after_s=2.0)
    s.start_drain(one, "s-1", after_s=4.0)
    s.redirect("Say hello 66 instead.", after_s=10.0, session="s-1")  # while read_file runs
    s.start_submit(one, "p-1", "r-2", {"text": "Say hello 1."}, session="s-1", after_s=120.0)
    s.start_drain(one, "s-1", after_s=122.0)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")
