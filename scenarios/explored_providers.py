"""Stories the explorer found around the provider's errors, the session's lease and the
lanes' restarts: each a shrunk seed (``hermes-ref explore --shrink SEED``) on which a
checker asked for what the engine may not do, red on the checkers before their fix. The
calls are the explorer's own (``sim.explore.run.stage``), so each replays the run it came
from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.limits import ProviderRoute
from hermes_ref.session import SessionSource
from scenarios._explored_common import calm as _calm
from sim.explore.lanes import LaneWorld
from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import jump_clock
from sim.harness import Story, scenario


def _world(s: Story, seed: int, *faults: ReplyFault) -> ExploreModel:
    """The explored world of ``seed``: its seeded ids, its model, its notes and build log."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel(faults, ids=s.world.chooser)
    s.use_provider(model)
    s.files({f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)}
            | {"t-1-build.log": "build of t-1: ok"})
    return model


@scenario("A turn that rotated its session renews its credentials there after an auth error, "
          "and the renewal counts for the turn (explored seed 862)",
          invariants=("LOOP-5",), stage="explore")
def credentials_renewed_in_the_rotated_child(s: Story) -> None:
    """The terminal's seventh turn compacts before its call and rotates the session into a
    child; its call there gets a 401, the engine renews the credentials once and calls
    again. The world logs the renewal under the session the turn ran on then, the child,
    while the turn is keyed by its lineage's root (CMP-5). LOOP-5's checker looked for the
    renewal under the root, found none, and called the second call a retry without
    renewal; it now files each renewal under the root as it files the turn."""
    _world(s, 862, ReplyFault(call=11, kind=FaultKind.AUTH_ERROR))
    s.limits(context_window_tokens=400)
    one = s.main_process()
    for text, after, injected in (
            ("Read notes-1.txt.", 56.0,
             "memory: the user signs notes as Ana and works from the Lisbon office"),
            ("Read t-1-build.log.", 60.0,
             "memory: the user keeps the quarterly figures in notes-1.txt and prefers short answers"),
            ("Say hello 5.", 71.0, None), ("Read t-1-build.log.", 80.0, None),
            ("Read t-1-build.log.", 95.0, None), ("Say hello 10.", 104.0, None),
            ("Say hello 11.", 111.0, None)):
        s.start_turn(text, session="t-1", process=one, after_s=after, injected=injected)
    _calm(s)


@scenario("A turn whose primary is spent falls back, and loses its lease in the fallback's "
          "preflight: it sends nothing more, and the hop's refund stands (explored seed 668)",
          invariants=("LOOP-2", "LOOP-6"), stage="explore")
def fallback_preflight_loses_the_lease(s: Story) -> None:
    """The fourth turn's second request meets an outage: four 503s spend its retries, the
    turn falls back to ``fallback-small`` (the hop refunds the call's unit) and its
    preflight compacts for the small window; the process freezes 600 s holding the
    compression lock, the lease lapses, the rotation is fenced off and the turn ends
    interrupted with one unit spent for its first call. LOOP-6's checker excused a switch
    followed by no call only when preflight refused the request, and LOOP-2's gave back
    the hop's unit only then; a turn interrupted before its fallback's request went out
    is now excused by both, when the record shows the primary's retries spent."""
    model = _world(s, 668, ReplyFault(call=7, kind=FaultKind.OUTAGE))
    s.limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=120,
                                               token_ratio=1.25),))
    s.use_provider_for("fallback-small", model.for_fallback())
    s.world.lock_stalls["t-1"] = 600.0  # its lock's first holder freezes
    one = s.main_process()
    for text, after in (("Read t-1-build.log.", 92.0), ("Write note 2 to t-1-out-2.txt.", 97.0),
                        ("Say hello 3.", 102.0), ("Read t-1-build.log.", 114.0)):
        s.start_turn(text, session="t-1", process=one, after_s=after)
    s.run_all()
    s.world.lock_stalls.clear()  # nor a freeze not reached
    _calm(s)


@scenario("Turns waiting for a lease lose their places in line while their process is "
          "frozen, and rejoin in the order they ask again (explored seed 326)",
          invariants=("LEASE-1", "LEASE-2"), stage="explore")
def frozen_waiters_rejoin_the_line(s: Story) -> None:
    """Five terminal turns ask for ``t-1``'s lease; the second holds it reading the slow
    build log when the process freezes 400 s. Every waiter goes two polls without asking,
    so each loses its place; on waking, the turns ask again in a new order, and the store
    serves them in that order. LEASE-1's checker ranked each waiter by its first ask ever,
    and reported a turn served before one that had first asked earlier; it now ranks a
    waiter by the ask that gave it its present place."""
    _world(s, 326)
    s.world.tools.slow("read_file", 60.0, path="t-1-build.log")
    one = s.main_process()
    last_line = "memory: the build log is long; the user wants only its last line"
    for text, after, injected in (
            ("Read t-1-build.log.", 9.0, None), ("Read t-1-build.log.", 13.0, last_line),
            ("Read t-1-build.log.", 20.0, None),
            ("Read notes-2.txt.", 23.0,
             "memory: the user keeps the quarterly figures in notes-1.txt and prefers short answers"),
            ("Read t-1-build.log.", 32.0, last_line)):
        s.start_turn(text, session="t-1", process=one, after_s=after, injected=injected)
    s.stall(one, 400.0, after_s=128.0)
    _calm(s)


@scenario("A lane created at the instant of an unclean start, after its pass read the "
          "routes, owes no resume_pending mark (explored seed 427)",
          invariants=("SES-7",), stage="explore")
def lane_created_after_the_start_pass(s: Story) -> None:
    """The clock jumps an hour and the process dies without the clean-exit marker; its
    successor starts, runs the start pass (nothing to mark: no lane yet) and then routes
    a Telegram DM, creating its lane at the same virtual instant. SES-7's checker ordered
    the creation and the start by time alone, took the lane as active before the start
    and demanded its mark; it now orders revisions at the start's instant by the world's
    effect order, after the effect at which the pass read the routes."""
    _world(s, 427)
    s.limits(session_reset_mode="both", session_idle_minutes=60, session_reset_at_hour=3,
             group_sessions_per_user=True, thread_sessions_per_user=False,
             session_prune_after_s=43200.0, stuck_restart_threshold=3)
    one = s.main_process()
    jump_clock(s, 3600.0, after_s=116.0)
    lanes = LaneWorld(s, [one], job_s=400.0)
    lanes.restart(0, graceful=False, after_s=3445.0)
    lanes.message(0, SessionSource(platform="telegram", chat_type="dm", chat_id="99",
                                   participant="42"), "Say hello 4.", after_s=3614.9)
    _calm(s)
