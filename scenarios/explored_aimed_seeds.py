"""Stories the explorer found in worlds its aimed parts draw (``sim/explore/corrected.py``,
``sim/explore/lineage.py``) and in the sweeps that followed them: each a shrunk seed
(``hermes-ref explore --shrink SEED``) red before its fix, as each story says. The calls
are the explorer's own, so each replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.session import SessionSource
from scenarios._explored_common import calm as _calm
from scenarios._explored_common import world as _world
from sim.explore.edges import FlakySummarizer
from sim.explore.lanes import LaneWorld
from sim.explore.plan import FaultKind, ReplyFault
from sim.harness import Story, scenario

ALICE = SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                      participant="alice")
FRANK = SessionSource(platform="slack", chat_type="dm", participant="frank")
TG_42 = SessionSource(platform="telegram", chat_type="dm", chat_id="99", participant="42")
ERIN, DAVE = (SessionSource(platform="telegram", chat_type="group", chat_id="-1002285219667",
                            thread_id="17585", participant=who) for who in ("erin", "dave"))


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


@scenario("A turn routed straight to a child another process rotated to keeps its own "
          "process's block on compaction (explored seed 2708)",
          invariants=("CMP-4", "CMP-5"), stage="explore")
def turn_past_a_foreign_rotation_keeps_the_block(s: Story) -> None:
    """In a 250-token window with summaries 180 s late, frank's lane is served by two
    processes. On pid=2 his message compacts twice before its call, rotating the lane's
    session twice, and neither pass brings the request under the threshold: two
    ineffective passes in a row now block automatic compaction for pid=2. His message held
    for the rotation runs on pid=3, waits for the lease and compacts once more (pid=3 had
    made no pass), rotating a third time. His next message on pid=2 is routed straight to
    that newest child, which pid=2 held no cache of and had not rotated to itself, so it
    started with no compression memory and compacted again. The engine now finds the
    memory of a child it holds no cache of up the lineage: through the parent its own turn
    rotated to, as Hermes keeps the compressor on the agent it caches for the conversation."""
    model = _world(s, 2708, parts=9)
    s.limits(context_window_tokens=250)
    s.limits(session_reset_mode="none", session_idle_minutes=60, session_reset_at_hour=9,
             group_sessions_per_user=False, thread_sessions_per_user=False,
             session_prune_after_s=0.0, stuck_restart_threshold=3)
    model.summarizer.delay_s = 180.0  # every summary arrives this late
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one, two = s.main_process(), s.process()
    lanes = LaneWorld(s, [one, two], job_s=240.0)
    lanes.message(0, FRANK, "Say hello 5.", after_s=17045.9)
    lanes.message(0, FRANK, "Say hello 108.", after_s=17046.9, at_rotation=True)
    lanes.message(0, FRANK, "Write note 201 to lane-out-201.txt.", after_s=17111.0)
    lanes.message(0, FRANK, "Write note 202 to lane-out-202.txt.", after_s=17138.4)
    lanes.message(0, FRANK, "Read notes-1.txt.", after_s=17175.2)
    lanes.restart(0, graceful=False, after_s=17207.9)
    lanes.message(1, FRANK, "Say hello 6.", after_s=17611.6)
    lanes.message(1, FRANK, "Read notes-2.txt.", after_s=18412.6)
    _calm(s)


@scenario("A turn routed to a tip two rotations of another process past the session its "
          "process served still waits out that process's summary cooldown (explored seed 6426)",
          invariants=("CMP-4", "CMP-5"), stage="explore")
def turn_past_foreign_rotations_keeps_the_cooldown(s: Story) -> None:
    """Two processes serve one telegram thread in a 250-token window. On pid=2 a summary
    times out, and erin's next message there fails its summary outright: pid=2 may not ask
    for one for 600 s. A minute later erin's message on pid=1 compacts twice, rotating the
    session twice. Dave's message held for the rotation runs on pid=2, routed straight to
    the newest child, which pid=2 held no cache of, so it started with no cooldown and
    asked for a summary 64 s after its failure. The engine now walks up the lineage, past
    the two children pid=1 made, to the session pid=2 served, and takes its memory there."""
    model = _world(s, 6426, ReplyFault(call=6, kind=FaultKind.SHARED_CALL_IDS))
    s.limits(context_window_tokens=250)
    s.limits(session_reset_mode="daily", session_idle_minutes=60, session_reset_at_hour=4,
             group_sessions_per_user=True, thread_sessions_per_user=False,
             session_prune_after_s=43200.0, stuck_restart_threshold=3)
    model.summarizer = FlakySummarizer((2,), model, (1,))  # these summary requests fail, time out
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one, two = s.main_process(), s.process()
    lanes = LaneWorld(s, [one, two], job_s=240.0)
    lanes.message(0, ERIN, "Say hello 1.", after_s=2244.8)
    lanes.message(0, ERIN, "Say hello 2.", after_s=2304.0)
    lanes.message(1, DAVE, "Read notes-1.txt.", after_s=7869.5)
    lanes.message(1, DAVE, "Say hello 103.", after_s=7870.5, at_rotation=True)
    lanes.message(1, DAVE, "Write note 203 to lane-out-203.txt.", after_s=8000.0)
    lanes.message(1, ERIN, "Say hello 7.", after_s=10388.4)
    lanes.message(0, ERIN, "Say hello 8.", after_s=10452.8)
    _calm(s)


@scenario("A summary that fails after a slow pass starts its cooldown when it fails, not when "
          "the turn decided to compact (explored seed 7922)",
          invariants=("CMP-4",), stage="explore")
def cooldown_runs_from_a_late_failure(s: Story) -> None:
    """In a 250-token window with summaries 180 s late, a lane's turn resumed after an
    unclean restart compacts before its call: the first summary takes 180 s and rotates the
    session, and the second pass's summary fails at once. The engine started the cooldown
    at the instant the turn had decided to compact, 180 s before the failure, so the lane's
    next turn asked for a summary 430 s after the failure, within the 600 s cooldown. A
    failed summary now starts the cooldown at the clock of its failure."""
    model = _world(s, 7922)
    s.limits(context_window_tokens=250)
    s.limits(session_reset_mode="both", session_idle_minutes=240, session_reset_at_hour=6,
             group_sessions_per_user=True, thread_sessions_per_user=False,
             session_prune_after_s=43200.0, stuck_restart_threshold=3)
    model.summarizer = FlakySummarizer((3,), model)  # this summary request fails
    model.summarizer.delay_s = 180.0  # every summary arrives this late
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    lanes = LaneWorld(s, [one], job_s=400.0)
    lanes.message(0, ERIN, "Read notes-1.txt.", after_s=1084.4)
    lanes.message(0, ERIN, "Say hello 201.", after_s=1104.5)
    lanes.message(0, ERIN, "Read notes-1.txt.", after_s=1138.6)
    lanes.message(0, ERIN, "Write note 203 to lane-out-203.txt.", after_s=1169.3)
    lanes.restart(0, graceful=False, after_s=1283.3)
    lanes.message(0, DAVE, "Say hello 6.", after_s=1528.3)
    lanes.message(0, ERIN, "Read build.log.", after_s=2138.5)
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
    lanes.message(0, FRANK, "Say hello 2.", after_s=5248.3)
    lanes.message(0, FRANK, "Say hello 130.", after_s=5249.3, at_rotation=True)
    lanes.message(0, FRANK, "Say hello 200.", after_s=5280.3)
    lanes.message(0, FRANK, "Read notes-1.txt.", after_s=5324.4)
    lanes.message(0, FRANK, "Write note 3 to lane-out-3.txt.", after_s=5329.8)
    lanes.message(0, FRANK, "Read notes-1.txt.", after_s=5354.0)
    lanes.message(0, FRANK, "Read notes-2.txt.", after_s=5365.5)
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
    of the tip before that, started with no block and compacted again. A turn that holds
    the lease of a child now takes the compression memory of its lineage
    (``prologue._lineage_memory``), and the waiting turn fails closed without a summary."""
    _world(s, 824)
    s.limits(context_window_tokens=250)
    s.limits(session_reset_mode="none", session_idle_minutes=30, session_reset_at_hour=9,
             group_sessions_per_user=True, thread_sessions_per_user=True,
             session_prune_after_s=10800.0, stuck_restart_threshold=2)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    lanes = LaneWorld(s, [one], job_s=400.0)
    lanes.message(0, ALICE, "Say hello 1.", after_s=2168.9)
    lanes.message(0, ALICE, "Say hello 198.", after_s=2169.9, at_rotation=True)
    lanes.message(0, ALICE, "Say hello 200.", after_s=2208.0)
    lanes.message(0, ALICE, "Read notes-1.txt.", after_s=2235.3)
    lanes.message(0, ALICE, "Read notes-1.txt.", after_s=2267.5)
    lanes.message(0, ALICE, "Read notes-1.txt.", after_s=2284.2)
    _calm(s)


@scenario("A turn that waited while another process rotated the session it asked for finds "
          "its own process's block up the lineage (explored seed 14792)",
          invariants=("CMP-4", "CMP-5"), stage="explore")
def waiter_past_a_rotation_reads_the_parent_again(s: Story) -> None:
    """In a 250-token window with summaries 180 s late, a telegram lane is served by two
    processes. pid=1's turns compact it twice past the threshold, rotating it to a child
    and leaving two ineffective passes in a row carried there. Hours later pid=2's turn on
    that child compacts and rotates it again, while pid=1's next turn, which asked for the
    child, waits for the lease. pid=1 holds no cache of the child, so once the lease is
    held it looks up its lineage's memory from the new tip. The walk took the child's row
    as it had read it when it asked, before the rotation, found the child not ended by
    compression and stopped there: the turn started with no memory and compacted a third
    time. The walk now reads each parent under the lease; the child, ended by compression
    since, leads to the memory pid=1 carried into it."""
    model = _world(s, 14792, ReplyFault(call=8, kind=FaultKind.EMPTY_REPLY),
                   ReplyFault(call=12, kind=FaultKind.OVERFLOW), parts=8)
    s.limits(context_window_tokens=250)
    s.limits(session_reset_mode="daily", session_idle_minutes=60, session_reset_at_hour=9,
             group_sessions_per_user=True, thread_sessions_per_user=False,
             session_prune_after_s=0.0, stuck_restart_threshold=3)
    s.files({"t-1-build.log": "build of t-1: ok"})
    model.summarizer = FlakySummarizer((1,), model)  # this summary request fails
    model.summarizer.delay_s = 180.0  # every summary arrives this late
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    one, two = s.main_process(), s.process()
    for text, process, after in (("Write note 2 to t-1-out-2.txt.", two, 3.0),
                                 ("Write note 4 to t-1-out-4.txt.", two, 11.0),
                                 ("Say hello 5.", one, 16.0), ("Read t-1-build.log.", two, 17.0),
                                 ("Write note 7 to t-1-out-7.txt.", one, 19.0)):
        s.start_turn(text, session="t-1", process=process, after_s=after)
    lanes = LaneWorld(s, [one, two], job_s=400.0)
    for slot, text, after in ((0, "Say hello 108.", 2622.6), (0, "Say hello 200.", 2649.5),
                              (1, "Read notes-1.txt.", 2675.6),
                              (0, "Write note 201 to lane-out-201.txt.", 2677.1),
                              (0, "Read notes-1.txt.", 2705.6), (0, "Say hello 203.", 2733.3),
                              (1, "Say hello 3.", 28757.1), (0, "Read notes-2.txt.", 28832.2)):
        lanes.message(slot, TG_42, text, after_s=after)
    _calm(s)


@scenario("An answer the verification gate held back stands when the request that asks for "
          "the check does not fit the window (explored seed 1095)",
          invariants=("FIN-6", "CMP-7"), stage="explore")
def held_answer_stands_past_a_full_window(s: Story) -> None:
    """A 250-token window and the verification gate. Erin's turn writes a file and the model
    answers; the gate holds the answer back and asks the model to check its work. The
    request that asks, the answer and the nudge riding on the conversation, is 259 tokens:
    preflight fails the turn closed, and the user was told the conversation is too long,
    the answer lost (FIN-6). The held answer now stands, as it does when the budget ends
    while the model checks (FIN-1): delivered, under the exit reason preflight recorded.
    CMP-7's checker counted 212 tokens for the unsent request, as if it fit, until it
    learned the gate's two scaffolding messages."""
    _world(s, 1095, parts=7)
    s.limits(verify_before_answer=True)
    s.limits(context_window_tokens=250)
    s.limits(session_reset_mode="daily", session_idle_minutes=60, session_reset_at_hour=4,
             group_sessions_per_user=True, thread_sessions_per_user=False,
             session_prune_after_s=10800.0, stuck_restart_threshold=3)
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    lanes = LaneWorld(s, [s.main_process()], job_s=400.0)
    lanes.message(0, DAVE, "Write note 1 to lane-out-1.txt.", after_s=2389.1)
    lanes.message(0, ERIN, "Write note 404 to lane-out-404.txt.", after_s=5619.3)
    _calm(s)
    s.expect(any(r.answer == "Done: Write note 404 to lane-out-404.txt." for r in s.world.runs),
             "the answer the gate held back was delivered")


@scenario("After a compaction made while the verification gate held an answer, the idle floor "
          "rises by the request the engine measured, the gate's messages included "
          "(explored seed 27265)", invariants=("CTX-5",), stage="explore")
def idle_floor_counts_the_gates_messages(s: Story) -> None:
    """A 500-token window and the verification gate. A turn writes a file, the model answers,
    and the gate holds the answer back and asks for a check; the request that asks is over
    the threshold, and preflight compacts by rotation with the held answer and the nudge
    still in the working list. The engine raises the idle floor by what that request
    measured, scaffolding included, as it judges the pass by it (CMP-4). A turn reads a
    note; nine minutes after it a short turn begins past the idle gap, under that floor,
    and rightly does not compact. CTX-5's checker raised the floor by the stored rows
    alone, read the turn as above it, and called the silence a missed idle compaction; it
    now reads the floor as it reads the pass's verdict, with the scaffolding the next
    request carried."""
    _world(s, 27265, parts=8)
    s.limits(verify_before_answer=True)
    s.limits(context_window_tokens=500)
    s.limits(idle_compact_after_s=300.0)
    s.bind("p-3", session="s-3")
    s.bind("op-s-3", session="s-3", role="operator", kind="operator")
    one = s.main_process()
    for request, text, after in (
            ("r-511caf", "Go through part-1.txt to part-8.txt in order.", 6.0),
            ("r-7ec9f8", "Write note 2 to s-3-out-2.txt.", 15.0),
            ("r-49be77", "Read notes-1.txt.", 75.0), ("r-2f383a", "Say hello 43.", 655.0)):
        s.start_submit(one, "p-3", request, {"text": text}, session="s-3", after_s=after)
    for after in (12.0, 32.0, 95.0, 656.0):
        s.start_drain(one, "s-3", after_s=after)
    _calm(s)
    s.expect(len(s.world.summary_calls) == 1,
             "one compaction, made while the gate held the answer; none at the idle turn")
