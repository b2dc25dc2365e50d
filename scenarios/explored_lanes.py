"""Stories the explorer found in its session lanes (``sim.explore.lanes``): each a shrunk seed
(``hermes-ref explore --shrink SEED``) red before its fix. The calls are the explorer's own
(``LaneWorld``), so each replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.session import SessionSource
from sim.explore.lanes import LaneWorld
from sim.explore.model import ExploreModel
from sim.explore.run import calm_phase, jump_clock
from sim.harness import Story, scenario


def _world(s: Story, seed: int) -> None:
    """The explored world of ``seed``: its seeded ids, its model, its notes, its bindings."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    s.use_provider(ExploreModel((), ids=s.world.chooser))
    s.files({f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)})
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")


def _calm(s: Story) -> None:
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("Two stop requests that reach one draining process stop it once, and count its "
          "running lane once (explored seed 3284)",
          invariants=("SES-7",), stage="explore")
def two_stops_of_one_draining_process(s: Story) -> None:
    """A clock jump delivers two graceful restarts to the process at one instant, while a
    lane's slow job runs in it. The world ran the shutdown pass twice in that one process,
    raising the lane's restart count to the threshold of two, and its second exit killed
    the successor process without any stop: the next start suspended a lane that had been
    running across one restart only. A process stops once; the second request during its
    drain now changes nothing, and an exit acts only on the process that was stopping."""
    _world(s, 3284)
    s.limits(session_reset_mode="idle", session_idle_minutes=30, session_reset_at_hour=9,
             group_sessions_per_user=False, thread_sessions_per_user=True,
             session_prune_after_s=43200.0, stuck_restart_threshold=2)
    one = s.main_process()
    jump_clock(s, 3600.0, after_s=132.0)
    lanes = LaneWorld(s, [one], job_s=400.0)
    lanes.message(0, SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                                   participant="carol"), "Read build.log.", after_s=2337.2)
    lanes.restart(0, graceful=True, after_s=2357.0)
    lanes.restart(0, graceful=True, after_s=3175.6)
    _calm(s)


@scenario("Three stop requests that reach one draining process stop it once (explored seed "
          "4363)", invariants=("SES-7",), stage="explore")
def three_stops_of_one_draining_process(s: Story) -> None:
    """As seed 3284, with three graceful restarts at one instant and a threshold of three:
    the world counted one running lane three times and the next start suspended it."""
    _world(s, 4363)
    s.limits(session_reset_mode="daily", session_idle_minutes=240, session_reset_at_hour=9,
             group_sessions_per_user=True, thread_sessions_per_user=True,
             session_prune_after_s=0.0, stuck_restart_threshold=3)
    one = s.main_process()
    jump_clock(s, 3600.0, after_s=55.0)
    lanes = LaneWorld(s, [one], job_s=240.0)
    lanes.message(0, SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                                   participant="bob"), "Read build.log.", after_s=2396.1)
    for after_s in (2410.2, 2838.4, 3597.0):
        lanes.restart(0, graceful=True, after_s=after_s)
    _calm(s)
