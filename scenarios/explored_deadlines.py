"""Stories the explorer found where a read slower than the batch deadline ran on a process
that froze mid-batch: each a shrunk seed (``hermes-ref explore --shrink SEED``) on which
the deadline's checker asked for what the engine may not do, red on that checker before
its fix. The frozen process wakes to find its turn's lease gone, so its writes are fenced
and the call stays open until the next turn's prologue closes it as unknown (TOOL-10).
The calls are the explorer's own (``sim.explore.run.stage``), so each replays the run it
came from, then the calm phase.
"""

from __future__ import annotations

from scenarios._explored_common import calm as _calm
from sim.explore.model import ExploreModel
from sim.explore.run import calm_phase
from sim.harness import Story, scenario


def _world(s: Story, seed: int) -> ExploreModel:
    """The explored world of ``seed``: its seeded ids, its model, its notes files, and the
    second notes file slower to read (500 s) than the batch deadline (420 s)."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel((), ids=s.world.chooser)
    s.use_provider(model)
    s.files({f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)})
    s.world.tools.slow("read_file", 500.0, path="notes-2.txt", start_delay_s=0.0)
    return model


@scenario("A read past the deadline on a process that froze mid-batch and lost its lease is "
          "closed as unknown by the next turn, and that is its right result (explored seed 4560)",
          invariants=("TOOL-3", "TOOL-5", "TOOL-10"), stage="explore")
def frozen_batch_closed_as_unknown(s: Story) -> None:
    """Two reads, one of them 500 s long, and the only process freezes for 400 s early in
    the batch. Its turn's lease lapses meanwhile; on waking it is interrupted and fenced, so
    neither the timed-out result nor a boundary can be written. The next turn's prologue
    closes both calls as unknown (TOOL-10). The deadline's checker first called the open
    call at the faulty phase's end "cut by the deadline and has no result", then called the
    unknown closing row "its own result"; neither is due from a process that stopped before
    the deadline, and the checker now excuses both when the world shows that stop."""
    _world(s, 4560)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-743b46", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-1", after_s=10.0)
    s.start_drain(one, "s-1", after_s=26.0)
    s.stall(one, 400.0, after_s=60.0)
    s.start_submit(one, "p-1", "r-e9ddc8",
                   {"text": "Read notes-2.txt and rewrite it as note 70 at ./notes-2.txt."},
                   session="s-1", after_s=62.0)
    _calm(s)


@scenario("A read past the deadline whose process froze holding a compression lock stays open "
          "until the next turn, and no result is due before (explored seed 3344)",
          invariants=("TOOL-3", "TOOL-5"), stage="explore")
def frozen_lock_holder_leaves_its_read_open(s: Story) -> None:
    """A 500 s read of s-3 starts, then the same process takes the terminal session's
    compression lock and freezes 600 s holding it (CMP-6). The read's turn loses its lease;
    on waking the process is fenced, and nobody claims s-3 again before the faulty phase
    ends, so the call row has no result then. The deadline's checker called that "cut by
    the deadline and has no result", as if a live process had reached the deadline; the
    calm phase's prologue closes it as unknown (TOOL-10)."""
    _world(s, 3344)
    s.limits(context_window_tokens=400)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.world.lock_stalls["t-1"] = 600.0  # its lock's first holder freezes
    s.bind("p-3", session="s-3")
    s.bind("op-s-3", session="s-3", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-3", "r-7d7ac1", {"text": "Read notes-2.txt."}, session="s-3",
                   after_s=21.0)
    s.start_drain(one, "s-3", after_s=25.0)
    memory = "memory: last week the user asked for every change to be written to its own file"
    s.start_turn("Write note 2 to t-1-out-2.txt.", session="t-1", process=one, after_s=61.0,
                 injected=memory)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=68.0,
                 injected="memory: the user signs notes as Ana and works from the Lisbon office")
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=72.0,
                 injected="memory: the build log is long; the user wants only its last line")
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=77.0, injected=memory)
    s.run_all()
    s.world.lock_stalls.clear()  # nor a freeze not reached
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")
