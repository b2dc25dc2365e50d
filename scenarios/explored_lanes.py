"""Stories the explorer found in its session lanes (``sim.explore.lanes``): each a shrunk seed
(``hermes-ref explore --shrink SEED``) red before its fix. The calls are the explorer's own
(``LaneWorld``), so each replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.session import SessionSource
from scenarios._explored_common import calm as _calm
from sim.explore.lanes import LaneWorld
from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
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
    lanes.message(0, SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                                   participant="carol"), "Say hello 1.", after_s=6000.0)
    _calm(s)  # the last message's turn ends: its ending must be on record


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
    lanes.message(0, SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                                   participant="bob"), "Say hello 1.", after_s=3700.0)
    _calm(s)  # the last message's turn ends: its ending must be on record


@scenario("An idle pass that leaves as many messages as it found does not stop the threshold "
          "passes after it (explored seed 3695)",
          invariants=("CTX-5", "CTX-6"), stage="explore")
def idle_pass_without_progress_then_a_threshold_pass(s: Story) -> None:
    """A tool error and a slow build log keep the lanes busy; a turn that begins more than
    300 s after its session's previous user row compacts idle (down to the tail's budget)
    and its summary replaces one message with one, more tokens than before. Its request
    is still over the threshold, so preflight runs its first threshold pass, which does
    cut the messages. CTX-6 judges progress between threshold passes; its checker chained
    the idle pass into them and called the threshold pass one run after no progress."""
    s.seed = 3695  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    s.use_provider(ExploreModel((ReplyFault(call=12, kind=FaultKind.TOOL_ERROR),),
                                ids=s.world.chooser))
    s.files({f"notes-{k}.txt": f"note {k} of seed 3695" for k in (1, 2)})
    s.limits(context_window_tokens=320)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.world.tools.slow("read_file", 60.0, path="t-1-build.log")
    s.limits(idle_compact_after_s=300.0)
    for n in (1, 2):
        s.bind(f"p-{n}", session=f"s-{n}")
        s.bind(f"op-s-{n}", session=f"s-{n}", role="operator", kind="operator")
    s.bind("q-1", session="s-1")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-bef598", {"text": "Say hello 2."}, session="s-1", after_s=4.0)
    s.start_submit(one, "q-1", "r-bef598", {"text": "Say hello bef598 from q-1."}, session="s-1",
                   after_s=7.0)
    s.start_submit(one, "p-1", "r-61a1b3", {"text": "Read notes-2.txt and rewrite it as note 71 "
                                                   "at /workspace/notes-2.txt."},
                   session="s-1", after_s=7.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=10.0,
                 injected="memory: the user signs notes as Ana and works from the Lisbon office")
    s.start_turn("Say hello 2. My card is 4417 2210 9932 0071.", session="t-1", process=one,
                 after_s=12.0, injected="memory: the build log is long; the user wants only its "
                 "last line")
    s.start_drain(one, "s-1", after_s=12.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=13.0)
    s.start_drain(one, "s-1", after_s=16.0)
    s.start_submit(one, "p-2", "r-0d7c88", {"text": "Read notes-1.txt."}, session="s-2", after_s=42.0)
    s.start_drain(one, "s-2", after_s=61.0)
    s.start_submit(one, "p-2", "r-bef598", {"text": "Write note 2 to s-2-out-2.txt."}, session="s-2",
                   after_s=84.0)
    s.start_submit(one, "q-1", "r-cf59df", {"text": "Say hello cf59df from q-1."}, session="s-1",
                   after_s=90.0)
    s.start_drain(one, "s-2", after_s=94.0)
    s.start_drain(one, "s-1", after_s=111.0)
    s.start_submit(one, "p-2", "r-259dcc", {"text": "Read notes-1.txt."}, session="s-2", after_s=449.0)
    _calm(s)


@scenario("A turn that gave up waiting for the lease of a rotated session wrote no input, and "
          "none was owed (explored seed 4321)",
          invariants=("CMP-5", "LEASE-5"), stage="explore")
def lease_timeout_on_a_rotated_session(s: Story) -> None:
    """A compression lock holder freezes for 600 s and the clock jumps an hour: the turns
    queued on t-1 wait past their lease timeout while another rotates t-1 to a child. One
    of them exits ``session_turn_lease_timeout`` having written nothing, its input handed
    back (LEASE-5). CMP-5's checker excused a refused lease by the reason "lease_timeout",
    which no exit carries (the exit reason is "session_turn_lease_timeout"), so it called
    the turn's missing input lost."""
    s.seed = 4321  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    dropped = tuple(ReplyFault(call=n, kind=FaultKind.DROPPED_CALL) for n in (6, 7, 8))
    s.use_provider(ExploreModel((*dropped, ReplyFault(call=10, kind=FaultKind.WIDE_BATCH)),
                                ids=s.world.chooser))
    s.files({f"notes-{k}.txt": f"note {k} of seed 4321" for k in (1, 2)})
    s.limits(context_window_tokens=500)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.world.lock_stalls["t-1"] = 600.0  # its lock's first holder freezes
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one, two = s.main_process(), s.process()
    ana = "memory: the user signs notes as Ana and works from the Lisbon office"
    s.start_turn("Read notes-1.txt.", session="t-1", process=two, after_s=72.0)
    s.start_turn("Say hello 3. My card is 4417 2210 9932 0071.", session="t-1", process=one,
                 after_s=78.0, injected=ana)
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=95.0,
                 injected="memory: the build log is long; the user wants only its last line")
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=104.0, injected=ana)
    s.start_turn("Read t-1-build.log.", session="t-1", process=two, after_s=112.0)
    s.start_turn("Write note 8 to t-1-out-8.txt.", session="t-1", process=two, after_s=113.0)
    jump_clock(s, 3600.0, after_s=118.0)
    s.run_all()
    s.world.lock_stalls.clear()  # nor a freeze not reached
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")
