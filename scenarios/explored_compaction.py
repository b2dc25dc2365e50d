"""Stories the explorer found in compacting worlds: each a shrunk seed (``hermes-ref explore
--shrink SEED``) red before its fix, on the engine or on a checker, as each story says. The
calls are the explorer's own (``sim.explore.run.stage``), so each replays the run it came
from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.session import SessionSource
from scenarios._explored_common import calm as _calm
from sim.explore.lanes import LaneWorld
from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import redirect_a_running_turn
from sim.harness import Story, scenario


def _world(s: Story, seed: int, *faults: ReplyFault) -> ExploreModel:
    """The explored world of ``seed``: its seeded ids, its model and its notes files."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel(faults, ids=s.world.chooser)
    s.use_provider(model)
    s.files({f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)})
    return model


@scenario("Passes that find nothing to compact are ineffective too, and two of them block "
          "the next turn's compaction (explored seed 201)",
          invariants=("CMP-1", "CMP-4"), stage="explore")
def passes_with_nothing_to_compact_block(s: Story) -> None:
    """A write's turn in a 245-token window runs into a bad-arguments reply, a dropped call
    and a reply that only reasoned: before each of its next two calls the request is over
    the threshold of 208 tokens (208 and 217), but its 13 and 14 messages leave no middle
    between the head and the tail's floor of 8 (the retries' scaffolding does not count
    toward it), so each pass finds nothing to compact and writes nothing. The engine counts
    both as ineffective (CMP-4), and the next turn's first request, 236 tokens, goes out
    with compaction blocked. CMP-1's checker counted only committed passes toward the block
    and called that request one sent over the threshold without trying to compact; it now
    counts the passes a preflight ran that left no record, as the engine does. The seed
    drew a window of 250 (threshold 212), where the first request reached it only while the
    engine counted the hidden row an earlier correction left, which no request carries
    (seed 3105); 245 keeps both passes."""
    _world(s, 201, ReplyFault(call=3, kind=FaultKind.SLOW_REPLY, seconds=400.0),
           ReplyFault(call=5, kind=FaultKind.TOOL_ERROR),
           ReplyFault(call=7, kind=FaultKind.BAD_ARGUMENTS),
           ReplyFault(call=8, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=9, kind=FaultKind.REASONING_ONLY))
    s.world.tools.slow("read_file", 1.0, path="notes-1.txt", start_delay_s=300.0)
    s.limits(context_window_tokens=245)
    for user in ("1", "2"):
        s.bind(f"p-{user}", session=f"s-{user}")
        s.bind(f"op-s-{user}", session=f"s-{user}", role="operator", kind="operator")
    one = s.main_process()
    s.delay_reply(3, 400.0)
    s.start_submit(one, "p-1", "r-7ac715", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-1", after_s=15.0)
    s.start_submit(one, "p-2", "r-4df27f", {"text": "Say hello 1."}, session="s-2", after_s=38.0)
    s.start_drain(one, "s-1", after_s=41.0)
    s.start_submit(one, "p-2", "r-8295a4", {"text": "Read notes-1.txt."}, session="s-2",
                   after_s=42.0)
    s.start_drain(one, "s-2", after_s=43.0)
    s.start_drain(one, "s-2", after_s=51.0)
    s.start_submit(one, "p-2", "r-d86bd3", {"text": "Say hello 3."}, session="s-2", after_s=74.0)
    s.start_submit(one, "p-2", "r-7ac715", {"text": "Write note 2 to s-2-out-2.txt."},
                   session="s-2", after_s=76.0)
    s.start_drain(one, "s-2", after_s=90.0)
    s.start_submit(one, "p-2", "r-fd4b25", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-2", after_s=95.0)
    s.start_drain(one, "s-2", after_s=103.0)
    s.start_drain(one, "s-2", after_s=116.0)
    redirect_a_running_turn(s, "Say hello 23 instead.", after_s=145.0, session="s-2")
    _calm(s)


@scenario("A lane's rotated child keeps the block its parent's ineffective passes set, and "
          "its next turn does not compact again (explored seed 824)",
          invariants=("CMP-4",), stage="explore")
def rotated_child_keeps_the_anti_thrash_block(s: Story) -> None:
    """A Discord lane in a 250-token window: the fifth message's turn compacts twice, each
    pass rotating the lane into a child and leaving the request over the threshold, so
    automatic compaction is blocked (CMP-4); its write's results then fail it closed. The
    lane router sends the next message straight to the tip, a session the engine had no
    cache of, and the fresh cache it built there had no block: the turn compacted again.
    The rotating turn now carries its compression memory into each child it rotates to
    (``rotation.switch_to``), and the next turn fails closed without a summary."""
    _world(s, 824)
    s.limits(context_window_tokens=250)
    s.limits(session_reset_mode="none", session_idle_minutes=30, session_reset_at_hour=9,
             group_sessions_per_user=True, thread_sessions_per_user=True,
             session_prune_after_s=10800.0, stuck_restart_threshold=2)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    lanes = LaneWorld(s, [one], job_s=400.0)
    alice = SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                          participant="alice")
    for text, after in (("Say hello 2.", 2233.6), ("Read notes-1.txt.", 2284.2),
                        ("Say hello 7.", 35157.6), ("Read build.log.", 36766.4),
                        ("Write note 12 to lane-out-12.txt.", 39545.5),
                        ("Read notes-2.txt.", 39580.8)):
        lanes.message(0, alice, text, after_s=after)
    _calm(s)


@scenario("A correction that cuts the last call the loop may make is taken in by its turn, "
          "before the grace call (explored seed 719)",
          invariants=("LOOP-4", "CTX-8"), stage="explore")
def correction_at_the_last_iteration_is_taken_in(s: Story) -> None:
    """With ``max_iterations`` 1, the turn's only call waits on a slow reply, and the user
    corrects it: the correction cuts the call, and the loop has no iteration left, so the
    turn went to its grace call without taking the correction in. It stayed queued, and
    the session's next turn took it in as a second user row of its own before its first
    call (CTX-8). The turn now takes in a correction that cut its last call before the
    finalizer's grace call, as the top of the grace call's iteration does in Hermes."""
    _world(s, 719, ReplyFault(call=3, kind=FaultKind.SLOW_REPLY, seconds=90.0))
    s.limits(max_iterations=1)
    for user in ("1", "2"):
        s.bind(f"p-{user}", session=f"s-{user}")
        s.bind(f"op-s-{user}", session=f"s-{user}", role="operator", kind="operator")
    one = s.main_process()
    s.delay_reply(3, 90.0)
    s.start_submit(one, "p-2", "r-16d146", {"text": "Write note 1 to s-2-out-1.txt."},
                   session="s-2", after_s=37.0)
    s.start_drain(one, "s-2", after_s=48.0)
    s.start_submit(one, "p-1", "r-60d8e5", {"text": "Write note 4 to s-1-out-4.txt."},
                   session="s-1", after_s=57.0)
    s.start_submit(one, "p-1", "r-7d0005", {"text": "Read notes-2.txt."}, session="s-1",
                   after_s=58.0)
    s.start_drain(one, "s-1", after_s=74.0)
    redirect_a_running_turn(s, "Say hello 80 instead.", after_s=78.0, session="s-1")
    _calm(s)


@scenario("A correction the user sends as the turn's process dies is not delivered, and no "
          "later turn takes it in (explored seed 385)",
          invariants=("CTX-8", "LOOP-4"), stage="explore")
def correction_to_a_turn_that_died_is_not_sent(s: Story) -> None:
    """The user sees the turn waiting on a slow reply and corrects it; the correction
    arrives an instant later, and the process dies in that instant. The explored world
    queued it all the same, for no running turn, and the calm phase's first turn of the
    session took it in as a second user row before its first call (CTX-8). A real user's
    message to a session with no running turn is a new message, not a correction: the
    world now delivers a correction only if the turn still waits on its call when it
    arrives (``run.redirect_a_running_turn``)."""
    _world(s, 385, ReplyFault(call=1, kind=FaultKind.SLOW_REPLY, seconds=90.0))
    for user in ("1", "2"):
        s.bind(f"p-{user}", session=f"s-{user}")
        s.bind(f"op-s-{user}", session=f"s-{user}", role="operator", kind="operator")
    one, two = s.main_process(), s.process()
    s.delay_reply(1, 90.0)
    s.start_submit(one, "p-1", "r-60d8e5", {"text": "Write note 4 to s-1-out-4.txt."},
                   session="s-1", after_s=1.0)
    s.start_submit(one, "p-1", "r-7d0005", {"text": "Read notes-2.txt."}, session="s-1",
                   after_s=2.0)
    s.start_drain(one, "s-1", after_s=3.0)
    s.start_submit(two, "p-2", "r-4df27f", {"text": "Say hello 1."}, session="s-2", after_s=20.0)
    redirect_a_running_turn(s, "Say hello 59 instead.", after_s=10.0, session="s-1")
    s.kill(one, after_s=10.0)  # at the same instant, between the user's look and the arrival
    _calm(s)
