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
