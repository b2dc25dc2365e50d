"""Stories the explorer found in seeds 20,000-49,999, the sweeps past 19,999, each a shrunk
seed (``hermes-ref explore --shrink SEED``) red before its fix, as each story says. The
calls are the explorer's own, so each replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.limits import ProviderRoute
from hermes_ref.session import SessionSource
from scenarios._explored_common import calm as _calm
from scenarios._explored_common import world as _world
from sim.explore.edges import handed_history
from sim.explore.lanes import LaneWorld
from sim.explore.plan import BIG_LOG_TEXT, FaultKind, ReplyFault
from sim.explore.run import jump_clock
from sim.explore.terminal import SECRET, redact_later
from sim.explore.watch import recover_later
from sim.harness import Story, scenario
from sim.interventions import correct_at_a_moment

FIGURES = "memory: the user keeps the quarterly figures in notes-1.txt and prefers short answers"
SIGNATURE = "memory: the user signs notes as Ana and works from the Lisbon office"
MEMORY = "memory: last week the user asked for every change to be written to its own file"


@scenario("A malformed reply a correction cuts is no try: the turn's next malformed reply "
          "is its first (explored seed 20352)",
          invariants=("LOOP-9", "LOOP-4"), stage="explore")
def cut_malformed_reply_is_no_try(s: Story) -> None:
    """Every reply of the long turn on s-1 has malformed arguments, and the user corrects it
    while a slow call is under way, which cuts that reply before the loop reads it (LOOP-4).
    The turn takes the correction in and asks again; the next malformed reply is its first
    try, and the iteration cap ends the turn before a third. LOOP-9's checker counted the
    cut reply as a try and demanded the third be recorded; it now counts only the replies
    the loop read."""
    _world(s, 20352, ReplyFault(call=9, kind=FaultKind.BAD_ARGUMENTS),
           ReplyFault(call=10, kind=FaultKind.BAD_ARGUMENTS),
           ReplyFault(call=11, kind=FaultKind.BAD_ARGUMENTS),
           parts=10, grace_outages=(1, 2, 3, 4, 5, 6, 7, 8))
    s.limits(max_iterations=3)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-720b42", {"text": "Say hello 6."}, session="s-1", after_s=0.0)
    s.start_submit(one, "p-1", "r-4f529c",
                   {"text": "Go through part-1.txt to part-10.txt in order."},
                   session="s-1", after_s=0.0)
    s.start_drain(one, "s-1", after_s=1.0)
    s.start_drain(one, "s-1", after_s=2.0)
    correct_at_a_moment(s, "Say hello 52 instead.", after_s=38.0, session="s-1", during="call",
                        slow_s=90.0)
    s.start_submit(one, "p-1", "r-4973bd", {"text": "Write note 2 to s-1-out-2.txt."},
                   session="s-1", after_s=45.0)
    s.start_drain(one, "s-1", after_s=151.0)
    s.run_all()
    s.world.moments.clear()  # a correction held for a moment not reached is no fault of the calm
    _calm(s)


@scenario("Three malformed replies after a correction are the turn's three tries, and the "
          "third is recorded with errors (explored seed 22162)",
          invariants=("LOOP-9", "LOOP-4"), stage="explore")
def three_tries_counted_after_a_correction(s: Story) -> None:
    """A correction cuts a slow call of the turn on s-1 whose reply, had it come, would have
    been malformed; the three replies after the correction are malformed too. The turn
    asks again twice and records the third try with error results, as LOOP-9 says. With
    the cut reply counted, LOOP-9's checker took the second try for the third and read its
    missing row as a finding; it now counts only the replies the loop read."""
    _world(s, 22162, ReplyFault(call=2, kind=FaultKind.OUTAGE),
           ReplyFault(call=11, kind=FaultKind.DEEP_ARGUMENTS),
           ReplyFault(call=12, kind=FaultKind.BAD_ARGUMENTS),
           ReplyFault(call=13, kind=FaultKind.BAD_ARGUMENTS), parts=6)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one, two = s.main_process(), s.process()
    s.faults(crash="before:user", crash_at_effect=None, fail_writes={})
    s.start_submit(two, "p-1", "r-7b72fd", {"text": "Say hello 5."}, session="s-1", after_s=15.1)
    s.start_turn("Read t-1-build.log.", session="t-1", process=two, after_s=15.7,
                 injected=SIGNATURE)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=20.2,
                 injected=FIGURES)
    s.start_turn("Write note 3 to t-1-out-3.txt.", session="t-1", process=one, after_s=20.7)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=27.2)
    s.start_drain(one, "s-1", after_s=32.6)
    correct_at_a_moment(s, "Say hello 46 instead.", after_s=33.1, session="s-1", during="call",
                        slow_s=5.0)
    s.start_submit(one, "p-1", "r-fbf8a7", {"text": "Write note 3 to s-1-out-3.txt."},
                   session="s-1", after_s=45.2)
    s.start_drain(one, "s-1", after_s=47.5)
    s.run_all()
    s.world.moments.clear()  # a correction held for a moment not reached is no fault of the calm
    _calm(s)


@scenario("A grace request refused for its length counts the nudge its working list still "
          "carries (explored seed 25062)",
          invariants=("FIN-1", "LOOP-8", "SCAF-1"), stage="explore")
def refused_grace_request_carries_its_nudge(s: Story) -> None:
    """In a 250-token window, a turn on s-1 reads a note and fails to write a file, and its
    third reply is empty: the ladder nudges after the tool round (LOOP-8: the empty
    sentinel and the nudge, scaffolding that is never stored), but the turn is out of
    iterations. Its grace request would hold the session's rows, the nudge pair and the
    summary prompt: over the window, so preflight refuses it. FIN-1's checker rebuilt the
    request from the record and the dropped-call re-prompts alone, found that it fit, and
    read the refusal as a skipped grace call; it now counts every piece of scaffolding the
    working list holds until the finalizer drops it, after the grace call."""
    _world(s, 25062, ReplyFault(call=3, kind=FaultKind.BAD_ARGUMENTS),
           ReplyFault(call=5, kind=FaultKind.MIXED_HOUSEKEEPING),
           ReplyFault(call=12, kind=FaultKind.REFUSED_WRITE),
           ReplyFault(call=13, kind=FaultKind.EMPTY_REPLY))
    s.limits(max_iterations=3)
    s.limits(context_window_tokens=250)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-2", "r-c69157", {"text": "Write note 2 to s-2-out-2.txt."},
                   session="s-2", after_s=11.0)
    s.start_submit(one, "p-1", "r-b2cf5c", {"text": "Say hello 3."}, session="s-1", after_s=22.0)
    s.start_drain(one, "s-1", after_s=24.0)
    s.start_submit(one, "p-2", "r-b2cf5c", {"text": "Write note 3 to s-2-out-3.txt."},
                   session="s-2", after_s=34.0)
    s.start_submit(one, "p-1", "r-c69157", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=34.0)
    s.start_drain(one, "s-2", after_s=36.0)
    s.start_drain(one, "s-2", after_s=39.0)
    s.start_drain(one, "s-1", after_s=51.0)
    s.start_submit(one, "p-1", "r-427461", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=86.0)
    s.start_turn("Say hello 80.", session="h-1", process=one, after_s=92.0,
                 history=handed_history(3))
    s.start_drain(one, "s-1", after_s=98.0)
    _calm(s)


@scenario("A pass that prunes and still summarizes, because a reasoning prefill keeps the "
          "pruned list over the threshold, is right to summarize (explored seed 28312)",
          invariants=("CMP-2", "LOOP-8", "SCAF-1"), stage="explore")
def prefill_keeps_a_pruned_list_over_the_threshold(s: Story) -> None:
    """A long turn in a 500-token window first gets a reply of reasoning alone, which the
    ladder hands back as a prefill (LOOP-8): scaffolding that stays in the working list and
    is never stored. Six reads later the request reaches the threshold (425 tokens); pruning
    the one old tool error saves 23 tokens, which would bring the rows alone under it but
    not the rows with the prefill, so the pass summarizes. CMP-2's checker measured the
    record alone and read a summary pruning would have spared; it now adds the scaffolding
    the turn's working list held, as the engine measures it."""
    _world(s, 28312, ReplyFault(call=1, kind=FaultKind.REASONING_ONLY),
           ReplyFault(call=7, kind=FaultKind.UNKNOWN_TOOL),
           ReplyFault(call=8, kind=FaultKind.TOOL_ERROR),
           ReplyFault(call=9, kind=FaultKind.MALFORMED_AGAIN),
           ReplyFault(call=14, kind=FaultKind.REFUSED_WRITE), parts=7)
    s.limits(context_window_tokens=500)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-b50153",
                   {"text": "Go through part-1.txt to part-7.txt in order."},
                   session="s-1", after_s=27.0)
    s.start_drain(one, "s-1", after_s=45.0)
    _calm(s)


@scenario("A grace request refused for its length is measured on the rows as they read "
          "then, before a later redaction shortened one (explored seed 35611)",
          invariants=("FIN-1", "WIRE-2"), stage="explore")
def refused_grace_request_before_a_redaction(s: Story) -> None:
    """In a 250-token window with one iteration a turn on t-1 gets a dropped call and is
    out of calls; its grace request (the session's rows, the first of them still holding a
    pasted card number, the re-prompt pair and the summary prompt) is over the window, so
    preflight refuses it. Five seconds later the user redacts the card number. FIN-1's
    checker rebuilt the request from the rows as redacted, found that it fit, and read the
    refusal as a skipped grace call; it now reads each row as it was at the turn's last
    call (``base.as_sent_at``), as the checkers of the summary requests do."""
    _world(s, 35611, ReplyFault(call=2, kind=FaultKind.BAD_ARGUMENTS),
           ReplyFault(call=6, kind=FaultKind.DROPPED_CALL), parts=10)
    s.limits(max_iterations=1)
    s.limits(context_window_tokens=250)
    s.limits(session_reset_mode="none", session_idle_minutes=60, session_reset_at_hour=6,
             group_sessions_per_user=True, thread_sessions_per_user=False,
             session_prune_after_s=10800.0, stuck_restart_threshold=3)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-2", "r-779b2a", {"text": "Go through part-1.txt to part-10.txt in order."},
                   session="s-2", after_s=2.0)
    s.start_turn(f"Say hello 1. {SECRET}", session="t-1", process=one, after_s=3.0)
    s.start_turn("Say hello 2.", session="t-1", process=one, after_s=13.0, injected=MEMORY)
    s.start_drain(one, "s-2", after_s=18.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=19.0,
                 injected="memory: the build log is long; the user wants only its last line")
    redact_later(s, SECRET, after_s=24.0, session="t-1")
    lanes = LaneWorld(s, [one], job_s=400.0)
    lanes.message(0, SessionSource(platform="telegram", chat_type="group", chat_id="-1002285219667",
                                   thread_id="17585", participant="erin"),
                  "Write note 5 to lane-out-5.txt.", after_s=31031.7)
    _calm(s)


@scenario("A batch whose process froze before the deadline and was killed still frozen is "
          "closed as unknown by the next turn (explored seed 33201)",
          invariants=("TOOL-5", "TOOL-10"), stage="explore")
def batch_of_a_process_killed_frozen_closes_as_unknown(s: Story) -> None:
    """A turn on s-3 starts a 500 s read; seven seconds later its process freezes for 900 s
    and is killed at 959 s, before it ever thaws. Nothing of it ran at the batch's 420 s
    deadline, so nothing could close the call there; the next turn's prologue closes it as
    unknown (TOOL-10), its right result. TOOL-5's checker excused a freeze only when the
    frozen turn woke to a failed refresh, and read that closure as the late call's own
    result; a process that dies frozen has stopped at its freeze, and now counts so."""
    _world(s, 33201)
    s.world.tools.slow("read_file", 500.0, path="notes-2.txt", start_delay_s=0.0)
    s.limits(session_reset_mode="idle", session_idle_minutes=30, session_reset_at_hour=3,
             group_sessions_per_user=True, thread_sessions_per_user=False,
             session_prune_after_s=10800.0, stuck_restart_threshold=2)
    s.bind("p-3", session="s-3")
    s.bind("op-s-3", session="s-3", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-3", "r-64e3ac", {"text": "Read notes-2.txt."}, session="s-3",
                   after_s=25.0)
    s.start_submit(one, "p-3", "r-f35f95", {"text": "Write note 5 to s-3-out-5.txt."},
                   session="s-3", after_s=29.0)
    s.start_drain(one, "s-3", after_s=61.0)
    s.stall(one, 900.0, after_s=68.0)
    lanes = LaneWorld(s, [one], job_s=240.0)
    lanes.restart(0, graceful=False, after_s=959.1)
    _calm(s)


@scenario("A tool call that would begin after its frozen process's lease expired never "
          "begins: the lease is vouched for again as the call begins (explored seed 39168)",
          invariants=("LEASE-4",), stage="explore")
def late_tool_call_is_vouched_for_again(s: Story) -> None:
    """A turn on s-2 reads two notes at once; the second waits 300 s to begin (an approval,
    a lock). Its process freezes for 400 s right after the batch began, so the lease
    expires at 300 s into its grant, and on waking the batch came before the refresher:
    the driver had asked the store about the lease only as the batch began, and the
    second read ran 400 s in, on a lease long gone (LEASE-4). Each call that begins after
    its batch did is now vouched for as it begins; the store refuses, the read never
    begins, and the turn ends interrupted."""
    _world(s, 39168)
    s.world.tools.slow("read_file", 1.0, path="notes-2.txt", start_delay_s=300.0)
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    s.bind("q-2", session="s-2")
    one = s.main_process()
    s.start_submit(one, "q-2", "r-cfd478", {"text": "Say hello cfd478 from q-2."},
                   session="s-2", after_s=10.0)
    s.start_submit(one, "p-2", "r-7f73e0", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-2", after_s=69.0)
    s.start_drain(one, "s-2", after_s=71.0)
    jump_clock(s, 60.0, after_s=95.0)
    s.start_drain(one, "s-2", after_s=110.0)
    s.stall(one, 400.0, after_s=125.0)
    _calm(s)


@scenario("An interrupted turn that read the huge log twice under one call id closed its "
          "sequence: each read has its one result (explored seed 36919)",
          invariants=("FIN-4", "TOOL-3", "TOOL-7"), stage="explore")
def huge_reads_under_one_id_each_answered(s: Story) -> None:
    """The provider numbers its calls per request, so the turn's two reads of the huge log,
    two rounds apart, arrive under one call id; each output is spilled and each call row
    gets its own result. The user then stops the turn during a wide batch, and the turn
    closes its open calls (FIN-4). FIN-4's checker counted results per id over the whole
    turn and read two results for one call; it now pairs each call with the results that
    follow its own row, as TOOL-3's checker does."""
    _world(s, 36919, ReplyFault(call=4, kind=FaultKind.HUGE_READ),
           ReplyFault(call=6, kind=FaultKind.HUGE_READ),
           ReplyFault(call=9, kind=FaultKind.WIDE_BATCH), parts=6, huge_reads_share_id=True)
    s.files({"big.log": BIG_LOG_TEXT})  # a log of 120,000 characters
    s.world.tools.slow("read_file", 60.0, path="notes-2.txt", start_delay_s=0.0)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-555a00",
                   {"text": "Go through part-1.txt to part-6.txt in order."},
                   session="s-1", after_s=2.0)
    s.start_drain(one, "s-1", after_s=27.0)
    s.interrupt(after_s=77.0, session="s-1")
    _calm(s)


@scenario("Two chat lanes that start at one instant interleave their writes, and the tool "
          "call still ran after its own turn's call row (explored seed 38455)",
          invariants=("TOOL-1",), stage="explore")
def lanes_at_one_instant_keep_their_own_call_rows(s: Story) -> None:
    """Process two stalls for 900 s while alice asks for a note to be written and carol
    says hello in a group chat; both lanes start their turns when the stall ends, at one
    instant. Alice's turn commits its call row, carol's turn commits its final row, and
    only then does alice's write run: its call row was durable before it (TOOL-1). The
    checkers took the turn that ran a call from the store's last row when it ran, which
    was carol's; the ledger now names the session the batch ran for, and the checkers
    read that session's last row."""
    _world(s, 38455)
    s.limits(session_reset_mode="idle", session_idle_minutes=30, session_reset_at_hour=9,
             group_sessions_per_user=True, thread_sessions_per_user=False,
             session_prune_after_s=10800.0, stuck_restart_threshold=3)
    s.files({"t-1-build.log": "build of t-1: ok"})
    for n in (1, 2, 3):
        s.bind(f"p-{n}", session=f"s-{n}")
        s.bind(f"op-s-{n}", session=f"s-{n}", role="operator", kind="operator")
    one, two = s.main_process(), s.process()
    build = "memory: the build log is long; the user wants only its last line"
    s.start_submit(one, "p-2", "r-b9525d", {"text": "Write note 3 to s-2-out-3.txt."},
                   session="s-2", after_s=7.0)
    s.start_drain(two, "s-2", after_s=8.0)
    s.start_turn("Read notes-2.txt.", session="t-1", process=one, after_s=9.0, injected=build)
    s.start_turn("Read t-1-build.log.", session="t-1", process=two, after_s=15.0,
                 injected=build)
    s.start_submit(one, "p-1", "r-1c0f4c", {"text": "Say hello 1."}, session="s-1",
                   after_s=15.0)
    s.start_submit(two, "p-2", "r-1c0f4c", {"text": "Say hello 1."}, session="s-2",
                   after_s=16.0)
    s.start_submit(two, "p-3", "r-9153cc", {"text": "Write note 2 to s-3-out-2.txt."},
                   session="s-3", after_s=23.0)
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=23.0, injected=build)
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=24.0, injected=build)
    s.start_drain(two, "s-2", after_s=26.0)
    s.start_submit(two, "p-2", "r-ac0239",
                   {"text": "Read notes-2.txt and rewrite it as note 70 at /workspace/notes-2.txt."},
                   session="s-2", after_s=32.0)
    s.start_drain(one, "s-2", after_s=33.0)
    s.start_drain(one, "s-1", after_s=34.0)
    s.start_submit(one, "p-2", "r-9153cc", {"text": "Write note 2 to s-2-out-2.txt."},
                   session="s-2", after_s=39.0)
    s.start_submit(one, "p-1", "r-9153cc", {"text": "Read notes-2.txt."}, session="s-1",
                   after_s=46.0)
    s.start_submit(two, "p-3", "r-1c0f4c", {"text": "Say hello 1."}, session="s-3",
                   after_s=46.0)
    s.start_drain(two, "s-3", after_s=51.0)
    s.start_drain(one, "s-2", after_s=59.0)
    s.start_drain(two, "s-1", after_s=62.0)
    s.start_drain(one, "s-3", after_s=72.0)
    s.start_submit(one, "p-1", "r-35dada", {"text": "Say hello 51."}, session="s-1",
                   after_s=89.0)
    s.start_submit(one, "p-3", "r-605b5a", {"text": "Say hello 44."}, session="s-3",
                   after_s=93.0)
    s.start_drain(one, "s-1", after_s=93.0)
    s.start_drain(one, "s-3", after_s=95.0)
    s.stall(two, 900.0, after_s=99.0)
    lanes = LaneWorld(s, [one, two], job_s=240.0)
    group = SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                          participant="alice")
    lanes.message(1, group, "Write note 1 to lane-out-1.txt.", after_s=833.6)
    lanes.message(1, group.model_copy(update={"participant": "carol"}), "Say hello 3.",
                  after_s=974.1)
    _calm(s)


@scenario("A turn that waited behind two ineffective passes on a rotated lineage is still "
          "blocked from compacting (explored seed 44893)",
          invariants=("CMP-4", "CMP-5"), stage="explore")
def waiting_turn_keeps_the_ineffective_block(s: Story) -> None:
    """In a 250-token window a lane's turn, resumed after a graceful restart, compacts twice
    before its call (every summary arrives 180 s late), rotating its session twice, and
    neither pass brings the request under the threshold. The next message of the lane
    arrives between the two rotations and waits for the lease on the first child. When it
    got the lease it reached the tip with compression memory built before the wait, so it
    compacted a third time although two ineffective passes in a row block automatic
    compaction. The engine now hands a turn that reaches the tip that way the memory the
    rotating turn carried there."""
    model = _world(s, 44893)
    s.limits(context_window_tokens=250)
    s.limits(session_reset_mode="daily", session_idle_minutes=60, session_reset_at_hour=3,
             group_sessions_per_user=True, thread_sessions_per_user=True,
             session_prune_after_s=0.0, stuck_restart_threshold=3)
    model.summarizer.delay_s = 180.0  # every summary arrives this late
    s.bind("p-3", session="s-3")
    s.bind("op-s-3", session="s-3", role="operator", kind="operator")
    one = s.main_process()
    lanes = LaneWorld(s, [one], job_s=240.0)
    dm = SessionSource(platform="telegram", chat_type="dm", chat_id="99", participant="42")
    lanes.message(0, dm, "Say hello 3.", after_s=1920.6)
    lanes.message(0, dm, "Read build.log.", after_s=2315.6)
    lanes.message(0, dm, "Say hello 4.", after_s=2758.0)
    lanes.message(0, dm, "Read build.log.", after_s=2825.4)
    lanes.restart(0, graceful=True, after_s=2837.1)
    lanes.message(0, dm, "Say hello 6.", after_s=2874.2)
    lanes.message(0, dm, "Read notes-1.txt.", after_s=3056.6)
    _calm(s)


@scenario("A start pass whose process dies at its suspension owes the suspension no more "
          "(explored seed 44483)",
          invariants=("SES-7",), stage="explore")
def start_pass_cut_short_owes_no_suspension(s: Story) -> None:
    """With a stuck threshold of 2, a telegram lane is still running its turn at two
    graceful stops in a row. The second start marks the lane resume_pending and then dies
    at the write that would suspend it (a crash at that effect); no later start comes. SES-7's
    checker demanded the suspension of that start anyway; it now excuses a start pass its
    process did not live to finish the revisions it never wrote (the counts it left make
    the suspension the next start's), and still judges what the pass did write."""
    _world(s, 44483, ReplyFault(call=1, kind=FaultKind.RATE_LIMIT, seconds=1.0),
           ReplyFault(call=5, kind=FaultKind.SERVER_ERROR))
    s.limits(session_reset_mode="both", session_idle_minutes=60, session_reset_at_hour=9,
             group_sessions_per_user=True, thread_sessions_per_user=True,
             session_prune_after_s=0.0, stuck_restart_threshold=2)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    s.bind("q-1", session="s-1")
    one, two = s.main_process(), s.process()
    s.faults(crash="before:lease#2", crash_at_effect=278, fail_writes={"final": 1})
    s.start_submit(two, "p-2", "r-697944", {"text": "Write note 3 to s-2-out-3.txt."},
                   session="s-2", after_s=8.0)
    s.start_drain(two, "s-2", after_s=13.0)
    s.start_submit(two, "p-2", "r-231c38", {"text": "Say hello 1."}, session="s-2", after_s=18.0)
    s.start_submit(two, "p-2", "r-231c38", {"text": "Say hello 99."}, session="s-2", after_s=20.0)
    s.start_drain(two, "s-2", after_s=22.0)
    s.start_submit(two, "p-1", "r-697944", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=23.0)
    s.start_drain(one, "s-1", after_s=29.0)
    s.start_submit(one, "p-1", "r-dac59d", {"text": "Say hello 5."}, session="s-1", after_s=41.0)
    s.start_submit(one, "p-1", "r-8f204f", {"text": "Write note 6 to s-1-out-6.txt."},
                   session="s-1", after_s=46.0)
    recover_later(s, one, after_s=49.0)
    s.start_drain(one, "s-1", after_s=52.0)
    s.start_drain(one, "s-2", after_s=54.0)
    s.start_drain(two, "s-1", after_s=56.0)
    s.start_drain(two, "s-1", after_s=64.0)
    s.start_submit(one, "p-2", "r-105dc4", {"text": "Say hello 2."}, session="s-2", after_s=66.0)
    s.start_submit(one, "p-1", "r-231c38", {"text": "Say hello 1."}, session="s-1", after_s=87.0)
    s.start_drain(two, "s-2", after_s=89.0)
    s.start_submit(one, "q-1", "r-231c38", {"text": "Say hello 231c38 from q-1."},
                   session="s-1", after_s=89.0)
    s.start_submit(two, "p-1", "r-105dc4", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=101.0)
    s.start_submit(two, "p-1", "r-09303c", {"text": "Say hello 4."}, session="s-1", after_s=103.0)
    s.start_drain(one, "s-1", after_s=105.0)
    s.start_submit(two, "q-1", "r-105dc4", {"text": "Say hello 105dc4 from q-1."},
                   session="s-1", after_s=107.0)
    s.start_submit(two, "p-1", "r-105dc4", {"text": "Say hello 99."}, session="s-1",
                   after_s=109.0)
    s.start_submit(two, "p-2", "r-6866a1",
                   {"text": "Write note 85 to drafts/s-2-85.txt and search drafts for it."},
                   session="s-2", after_s=114.0)
    s.start_drain(two, "s-1", after_s=120.0)
    recover_later(s, one, after_s=125.0)
    s.start_drain(one, "s-1", after_s=126.0)
    s.start_drain(one, "s-2", after_s=128.0)
    s.start_drain(one, "s-2", after_s=130.0)
    s.start_drain(two, "s-1", after_s=133.0)
    lanes = LaneWorld(s, [one, two], job_s=400.0)
    erin = SessionSource(platform="telegram", chat_type="group", chat_id="-1002285219667",
                         thread_id="17585", participant="erin")
    lanes.message(0, erin, "Say hello 7.", after_s=9866.5)
    lanes.message(0, erin, "Read build.log.", after_s=10019.2)
    lanes.restart(0, graceful=True, after_s=10030.3)
    lanes.message(0, erin, "Read build.log.", after_s=10496.2)
    lanes.restart(0, graceful=True, after_s=10522.0)
    _calm(s)


@scenario("A tool round the user corrected is still nudged once when the reply after the "
          "correction is empty (explored seed 32677)",
          invariants=("LOOP-8", "LOOP-4", "LOOP-2"), stage="explore")
def correction_after_a_round_keeps_its_nudge(s: Story) -> None:
    """The turn on s-1 reads and rewrites notes-2.txt; during its tool round the user
    corrects it, and the turn takes the correction in before its next call. The next four
    replies are empty. The engine set the ladder's counters back at the correction, as if
    the turn had just begun: no nudge for the round, three retries, then the fallback,
    whose rebuilt request preflight refused in its 200-token window. LOOP-8 counts the
    nudge once per tool round and the prefills and retries per turn and provider, and the
    agent it models keeps them across a correction; a correction now leaves them as they
    were, so the round is nudged, retried three times, and the fifth reply after the
    correction answers it. LOOP-8's checker stepped aside for every corrected turn and
    now judges them too; the budget checker, which walks the ladder to tell a refused
    fallback, was the one to see a unit refunded that its walk did not expect."""
    model = _world(s, 32677, ReplyFault(call=3, kind=FaultKind.EMPTY_REPLY),
                   ReplyFault(call=4, kind=FaultKind.EMPTY_REPLY),
                   ReplyFault(call=5, kind=FaultKind.EMPTY_REPLY),
                   ReplyFault(call=6, kind=FaultKind.EMPTY_REPLY), parts=6)
    s.limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=200,
                                               token_ratio=1.25),))
    s.use_provider_for("fallback-small", model.for_fallback())
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.faults(crash=None, crash_at_effect=None, fail_writes={"tool_calls": 1})
    s.start_submit(one, "p-1", "r-adfde1", {"text": "Write note 6 to s-1-out-6.txt."},
                   session="s-1", after_s=7.0)
    correct_at_a_moment(s, "Say hello 71 instead.", after_s=28.0, session="s-1", during="tools",
                        slow_s=0.0)
    s.start_drain(one, "s-1", after_s=68.0)
    s.start_submit(one, "p-1", "r-8b1a59",
                   {"text": "Read notes-2.txt and rewrite it as note 70 at ./notes-2.txt."},
                   session="s-1", after_s=73.0)
    s.start_drain(one, "s-1", after_s=80.0)
    s.run_all()
    s.world.moments.clear()  # a correction held for a moment not reached is no fault of the calm
    _calm(s)


@scenario("A batch whose process froze past the deadline and woke with its grant expired is "
          "closed as unknown by the next turn (explored seed 46178)",
          invariants=("TOOL-5", "TOOL-10", "LEASE-4"), stage="explore")
def batch_waking_on_an_expired_grant_closes_as_unknown(s: Story) -> None:
    """A 500 s read begins; its process freezes at 57 s for 900 s, so its turn's grant
    expires during the freeze, and the user's stop at 355 s finds it frozen too. The turn
    wakes past the 420 s deadline, takes the stop and ends before its refresher tries
    again: its writes are fenced, and the next turn's prologue closes the read as unknown
    (TOOL-10).
    TOOL-5's checker took that closure for the late call's own result unless the lease log
    showed a failed refresh; it now also reads the durable grant, which shows the lease
    lapsed inside the freeze (40598 failed the same way)."""
    _world(s, 46178, parts=8)
    s.world.tools.slow("read_file", 500.0, path="notes-2.txt", start_delay_s=0.0)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-c1b178",
                   {"text": "Read notes-2.txt and rewrite it as note 70 at link-notes-2.txt."},
                   session="s-1", after_s=1.0)
    s.start_drain(one, "s-1", after_s=50.0)
    s.stall(one, 900.0, after_s=57.0)
    s.start_submit(one, "p-1", "r-575050",
                   {"text": "Write note 88 to drafts/s-1-88.txt and search drafts for it."},
                   session="s-1", after_s=75.0)
    s.start_drain(one, "s-1", after_s=76.0)
    s.interrupt(after_s=355.0, session="s-1")
    _calm(s)


@scenario("A turn whose session a reset ended under it tried to compact: the store compacts "
          "no ended session, and the turn sends what it holds (explored seed 30408)",
          invariants=("CMP-1", "CMP-6"), stage="explore")
def compaction_of_an_ended_session_is_tried(s: Story) -> None:
    """A read on frank's slack lane waits 300 s to begin and its process freezes 400 s. On
    waking, the lane routes the queued notes to the old session, and the reset queued with
    them ends it. The turn that writes note 7 runs on, crosses the 320-token window's
    threshold after its tool round, takes the compression lock, and the store refuses to
    compact a session that has ended, so the messages stay as they are and the request is
    sent over the threshold. CMP-1's checker saw a lock granted and given back with no row
    and read a turn that never tried; a lock granted on a session already ended now counts
    as a try put off, as a lock refused does (CMP-6)."""
    _world(s, 30408)
    s.world.tools.slow("read_file", 1.0, path="notes-2.txt", start_delay_s=300.0, stall_s=400.0)
    s.limits(context_window_tokens=320)
    s.limits(session_reset_mode="daily", session_idle_minutes=30, session_reset_at_hour=4,
             group_sessions_per_user=False, thread_sessions_per_user=True,
             session_prune_after_s=10800.0, stuck_restart_threshold=2)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    frank = SessionSource(platform="slack", chat_type="dm", participant="frank")
    lanes = LaneWorld(s, [one], job_s=240.0)
    lanes.message(0, frank, "Say hello 2.", after_s=2690.8)
    lanes.message(0, frank, "Read notes-2.txt.", after_s=4881.0)
    lanes.reset(0, frank, after_s=4887.4)
    lanes.message(0, frank, "Write note 6 to lane-out-6.txt.", after_s=4939.2)
    lanes.message(0, frank, "Write note 7 to lane-out-7.txt.", after_s=5002.8)
    lanes.message(0, SessionSource(platform="telegram", chat_type="dm", chat_id="99",
                                   participant="42"), "Say hello 16.", after_s=5211.9)
    _calm(s)
