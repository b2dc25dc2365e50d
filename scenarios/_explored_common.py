"""What the explored stories share (a module whose name starts with ``_`` holds no stories)."""

from __future__ import annotations

from sim.explore.model import HISTORY_TO_COMPACT, ExploreModel
from sim.explore.plan import ReplyFault
from sim.explore.run import calm_phase
from sim.harness import Story


def world(s: Story, seed: int, *faults: ReplyFault, parts: int = 0,
          grace_outages: tuple[int, ...] = (),
          history_to_compact: int = HISTORY_TO_COMPACT,
          huge_reads_share_id: bool = False,
          empty_after_correction: bool = False,
          refuse_the_check: bool = False) -> ExploreModel:
    """The explored world of ``seed``: its seeded ids, its model, its notes and chore files
    (``history_to_compact``: the request length the 503s around an overflow wait for, for a
    story shrunk when that was shorter; ``huge_reads_share_id``: every read of the huge log
    under one call id, as a provider that numbers calls per request sends them;
    ``empty_after_correction``: nothing in answer to the first request after a correction
    taken in after a tool round; ``refuse_the_check``: a 400 to each request that asks the
    model to verify its work)."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel(faults, ids=s.world.chooser, grace_outages=grace_outages,
                         history_to_compact=history_to_compact,
                         huge_reads_share_id=huge_reads_share_id,
                         empty_after_correction=empty_after_correction,
                         refuse_the_check=refuse_the_check)
    s.use_provider(model)
    s.files({f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)}
            | {f"part-{k}.txt": f"part {k} of seed {seed}: in order" for k in range(1, parts + 1)})
    return model


def calm(s: Story) -> None:
    """Run the story's actors out, then the explorer's calm phase (faults off: recover,
    reconcile, drain until done), and demand that every admission reached a terminal state."""
    s.run_all()
    stuck = calm_phase(s)
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")
