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


@scenario("A turn waiting for a lane's lease keeps its place in line when the session "
          "rotates, and the lease goes to it before a later message (explored seed 178)",
          invariants=("LEASE-1", "LEASE-3"), stage="explore")
def waiter_keeps_its_place_across_a_rotation(s: Story) -> None:
    """A Slack lane in a 250-token window, every summary 180 s late: the fifth message's
    turn compacts twice, rotating the lane's session twice, while two more messages wait
    for its lease. A held message arrives in the instant of the first rotation, is routed
    to the child and asks there. The rotation carried the lease to the child but left its
    line of waiters behind, so at the second rotation the held message, first to ask on
    the new tip, went ahead of a turn that had waited since before the first: that turn
    was refused a free lease (LEASE-3, LEASE-1 per lineage root). A rotation now carries the
    line with the lease (``sqlite_leases.carry_line``), and the lease checkers rank the
    waiters of one lineage in one line."""
    model = _world(s, 178)
    s.limits(context_window_tokens=250)
    s.limits(session_reset_mode="none", session_idle_minutes=60, session_reset_at_hour=9,
             group_sessions_per_user=True, thread_sessions_per_user=True,
             session_prune_after_s=43200.0, stuck_restart_threshold=3)
    model.summarizer.delay_s = 180.0  # every summary arrives this late
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    one = s.main_process()
    lanes = LaneWorld(s, [one], job_s=400.0)
    frank = SessionSource(platform="slack", chat_type="dm", participant="frank")
    lanes.message(0, frank, "Say hello 2.", after_s=5248.3)
    lanes.message(0, frank, "Say hello 130.", after_s=5249.3, at_rotation=True)
    lanes.message(0, frank, "Say hello 200.", after_s=5280.3)
    lanes.message(0, frank, "Read notes-1.txt.", after_s=5324.4)
    lanes.message(0, frank, "Write note 3 to lane-out-3.txt.", after_s=5329.8)
    lanes.message(0, frank, "Read notes-1.txt.", after_s=5354.0)
    lanes.message(0, frank, "Read notes-2.txt.", after_s=5365.5)
    _calm(s)


@scenario("A turn routed to a rotated child while the rotating turn still runs starts from "
          "the lineage's compression memory and does not compact again (explored seed 824)",
          invariants=("CMP-4",), stage="explore")
def child_turn_starts_from_the_rotating_memory(s: Story) -> None:
    """A Discord lane in a 250-token window: the fifth message's turn compacts twice in
    one instant, rotating the lane's session twice, and neither pass brings its request
    under the threshold, so automatic compaction is blocked (CMP-4). A held message
    arrives in that instant, is routed to the tip and waits there for the lease while the
    rotating turn runs its tool round. The engine entered its compression memory for a
    child only when the rotating turn ended, so the waiting turn, which had built its cache
    of the tip before that, started with no block and compacted again. A rotation now
    enters the memory for its child at once (``rotation.switch_to``), and the waiting turn
    fails closed without a summary."""
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
    lanes.message(0, alice, "Say hello 1.", after_s=2168.9)
    lanes.message(0, alice, "Say hello 198.", after_s=2169.9, at_rotation=True)
    lanes.message(0, alice, "Say hello 200.", after_s=2208.0)
    lanes.message(0, alice, "Read notes-1.txt.", after_s=2235.3)
    lanes.message(0, alice, "Read notes-1.txt.", after_s=2267.5)
    lanes.message(0, alice, "Read notes-1.txt.", after_s=2284.2)
    _calm(s)
