"""Stories the explorer found in the loop under provider faults: empty and reasoning-only
replies, errors that are retried, the iteration budget and the grace call. Each is a shrunk
seed (``hermes-ref explore --shrink SEED``), red before its fix. The calls are the
explorer's own (``sim.explore.run.stage``), so each replays the run it came from, then the
calm phase.
"""

from __future__ import annotations

from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import calm_phase
from sim.harness import Story, scenario


def _world(s: Story, seed: int, *faults: ReplyFault,
           grace_outages: tuple[int, ...] = ()) -> ExploreModel:
    """The explored world of ``seed``: its seeded ids, its model and its notes files."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel(faults, ids=s.world.chooser, grace_outages=grace_outages)
    s.use_provider(model)
    s.files({f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)})
    return model


def _calm(s: Story) -> None:
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A model that reasons the same words twice is prefilled twice into the same request "
          "(explored seed 1547)",
          invariants=("LOOP-8",), stage="explore")
def the_same_reasoning_prefilled_twice(s: Story) -> None:
    """Two replies in a row only reason, both "Thinking it over.". The first is handed back
    as a thinking prefill; the second is prefilled too, and its prefill takes the place of
    the first, so the third request is the second one again, byte for byte. LOOP-8's
    checker read a request sent again as a retry and demanded the prefill it could not
    see; the two rungs look alike here, and it now reads the request as the one due."""
    _world(s, 1547, ReplyFault(call=1, kind=FaultKind.REASONING_ONLY),
           ReplyFault(call=2, kind=FaultKind.REASONING_ONLY))
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    s.bind("q-1", session="s-1")
    one = s.main_process()
    s.start_submit(one, "q-1", "r-abf808", {"text": "Say hello abf808 from q-1."},
                   session="s-1", after_s=110.0)
    s.start_drain(one, "s-1", after_s=117.0)
    _calm(s)

