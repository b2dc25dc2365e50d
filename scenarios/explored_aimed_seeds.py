"""Stories the explorer found in worlds its aimed parts draw (``sim/explore/corrected.py``,
``sim/explore/lineage.py``): each a shrunk seed (``hermes-ref explore --shrink SEED``) red
before its fix, as each story says. The calls are the explorer's own, so each replays the
run it came from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.session import SessionSource
from scenarios._explored_common import calm as _calm
from scenarios._explored_common import world as _world
from sim.explore.lanes import LaneWorld
from sim.harness import Story, scenario

ALICE = SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                      participant="alice")
FRANK = SessionSource(platform="slack", chat_type="dm", participant="frank")


@scenario("A lane message that asks for the rotated child itself, and waits behind the turn "
          "that rotated there, keeps that turn's block on compaction (explored seed 153)",
          invariants=("CMP-4", "CMP-5"), stage="explore")
def child_waiter_keeps_the_carried_block(s: Story) -> None:
    """In a 250-token window alice's fifth message in a few minutes compacts twice before its
    call, in one instant (the summaries come at once), rotating the lane's session twice;
    neither pass brings the request under the threshold. Her next message was held for the
    rotation: it is routed to the tip, finds the lease busy and waits. It had built its
    compression memory before the wait, for a child this process held no cache of, and
    went on with it, so it compacted a third time although two ineffective passes in a row
    block automatic compaction. A turn that waited now takes the memory the rotating turn
    carried into the child, as a turn that reaches the tip through the parent does
    (seed 44893, ``waiting_turn_keeps_the_ineffective_block``)."""
    _world(s, 153)
    s.limits(context_window_tokens=250)
    s.limits(session_reset_mode="none", session_idle_minutes=30, session_reset_at_hour=3,
             group_sessions_per_user=True, thread_sessions_per_user=True,
             session_prune_after_s=10800.0, stuck_restart_threshold=2)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    lanes = LaneWorld(s, [one], job_s=240.0)
    lanes.message(0, ALICE, "Say hello 2.", after_s=26953.2)
    lanes.message(0, ALICE, "Say hello 175.", after_s=26954.2, at_rotation=True)
    lanes.message(0, ALICE, "Read notes-1.txt.", after_s=26975.3)
    lanes.message(0, ALICE, "Say hello 201.", after_s=27006.6)
    lanes.message(0, ALICE, "Write note 202 to lane-out-202.txt.", after_s=27043.3)
    lanes.message(0, ALICE, "Read notes-1.txt.", after_s=27067.5)
    _calm(s)


@scenario("A refresher started again after a compaction keeps its lease's cadence, so the "
          "lease is refreshed every minute through the compaction (explored seed 1783)",
          invariants=("LEASE-2",), stage="explore")
def restarted_refresher_keeps_the_cadence(s: Story) -> None:
    """In a 250-token window frank's fifth message in a minute and a half compacts before
    its call, and the summary takes 180 s; meanwhile his agent is evicted, which ends the
    session. The lease is refreshed at 60 s and 120 s; when the summary comes, the rotation
    stops the refresher and is refused on the ended session, and the refresher starts again.
    It waited a whole interval from its own start, so the lease went 120 s without a
    refresh (LEASE-2), and a turn compacting more often than once a minute would never
    refresh it. A refresher started again now keeps the lease's cadence: its first refresh
    is due an interval after the lease's last grant or refresh
    (``hermes_ref.lease.first_refresh_in``)."""
    model = _world(s, 1783, parts=8)
    s.limits(context_window_tokens=250)
    s.limits(session_reset_mode="idle", session_idle_minutes=60, session_reset_at_hour=6,
             group_sessions_per_user=True, thread_sessions_per_user=False,
             session_prune_after_s=10800.0, stuck_restart_threshold=3)
    model.summarizer.delay_s = 180.0  # every summary arrives this late
    s.bind("p-3", session="s-3")
    s.bind("op-s-3", session="s-3", role="operator", kind="operator")
    one = s.main_process()
    lanes = LaneWorld(s, [one], job_s=400.0)
    for text, after in (("Say hello 200.", 2876.1), ("Read notes-1.txt.", 2899.3),
                        ("Write note 202 to lane-out-202.txt.", 2919.3),
                        ("Say hello 2.", 2923.9),
                        ("Write note 203 to lane-out-203.txt.", 2958.8)):
        lanes.message(0, FRANK, text, after_s=after)
    lanes.evict(FRANK, after_s=3006.6)
    _calm(s)
