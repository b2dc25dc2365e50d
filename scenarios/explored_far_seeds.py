"""Stories the explorer found in seeds 10,000-19,999, the first sweep past 9,999, each a
shrunk seed (``hermes-ref explore --shrink SEED``) red before its fix, on the engine or on a
checker, as each story says. The calls are the explorer's own, so each replays the run it
came from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.limits import ProviderRoute
from hermes_ref.session import SessionSource
from scenarios._explored_common import calm as _calm
from scenarios._explored_common import world as _world
from sim.explore.edges import FlakySummarizer, handed_history
from sim.explore.lanes import LaneWorld
from sim.explore.plan import BIG_LOG_TEXT, FaultKind, ReplyFault
from sim.explore.run import jump_clock, redirect_a_running_turn
from sim.explore.terminal import SECRET, redact_later
from sim.harness import Story, scenario
from sim.interventions import correct_at_a_moment

MEMORY = "memory: last week the user asked for every change to be written to its own file"
FIGURES = "memory: the user keeps the quarterly figures in notes-1.txt and prefers short answers"


@scenario("A patch that fails after its frozen process lost the lease leaves its call open "
          "for the next turn, whose prologue reports it unknown (explored seed 10294)",
          invariants=("TOOL-6", "LEASE-4", "TOOL-10"), stage="explore")
def failed_patch_of_a_fenced_turn_waits_open(s: Story) -> None:
    """The process freezes for 900 s while its turn's patch runs; the lease (TTL 300 s)
    expires meanwhile. The patch fails, and the turn that wakes writes nothing more: its
    error result and its boundary row are both fenced off (LEASE-4), so the call row stays
    the session's last row until the next turn's prologue reports the call unknown
    (TOOL-10). TOOL-6's checker excused a missing result only after a crash and read
    "failed and has no result row". It now also excuses a call whose turn lost its lease
    while the call is still open at its session's tail; once anything follows the call
    row, its result must be there."""
    _world(s, 10294, parts=7)
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    one = s.main_process()
    jump_clock(s, 3600.0, after_s=45.0)
    s.start_submit(one, "p-2", "r-3dca36",
                   {"text": "Patch note 93 into drafts/s-2-93.txt, or write it there."},
                   session="s-2", after_s=90.0)
    s.start_drain(one, "s-2", after_s=96.0)
    s.stall(one, 900.0, after_s=139.0)
    _calm(s)


@scenario("A read that fails while its process is frozen past the lease's expiry is closed "
          "by the next turn, not by the fenced one (explored seed 16293)",
          invariants=("TOOL-6", "LEASE-4", "TOOL-10"), stage="explore")
def failed_read_of_a_fenced_turn_waits_open(s: Story) -> None:
    """The same reading as seed 10294, in a busier world: a read on s-1 errs after a 900 s
    freeze, when its turn's lease has expired, so neither its result nor a boundary row
    can be written. The calm phase's first turn on s-1 writes the call's unknown result
    in its prologue. TOOL-6's checker now reads the open call as left by a lost lease."""
    _world(s, 16293, ReplyFault(call=2, kind=FaultKind.HUGE_READ),
           ReplyFault(call=6, kind=FaultKind.NARRATED_CALL),
           ReplyFault(call=8, kind=FaultKind.UNKNOWN_TOOL),
           ReplyFault(call=10, kind=FaultKind.TOOL_ERROR), parts=10)
    s.files({"big.log": BIG_LOG_TEXT})  # a log of 120,000 characters
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    s.bind("q-2", session="s-2")
    one = s.main_process()
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=50.0,
                 injected=FIGURES)
    s.start_submit(one, "p-1", "r-181555", {"text": "Say hello 2."}, session="s-1", after_s=53.0)
    s.start_turn("Say hello 4.", session="t-1", process=one, after_s=53.0, injected=FIGURES)
    s.start_submit(one, "p-2", "r-0a7633", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-2", after_s=55.0)
    s.start_drain(one, "s-2", after_s=59.0)
    jump_clock(s, 400.0, after_s=89.0)
    s.start_submit(one, "q-2", "r-5d8467", {"text": "Say hello 5d8467 from q-2."},
                   session="s-2", after_s=92.0)
    s.start_drain(one, "s-1", after_s=94.0)
    s.start_drain(one, "s-2", after_s=110.0)
    s.stall(one, 900.0, after_s=128.0)
    _calm(s)


@scenario("A slow read the deadline cuts, whose timed-out result then cannot be stored, is "
          "closed as unrecorded (explored seed 17969)",
          invariants=("TOOL-5", "TOOL-8"), stage="explore")
def deadline_cut_read_with_a_lost_result_write(s: Story) -> None:
    """A read that would take 500 s is cut at the 420 s batch deadline, and the write of
    its timed-out result fails. The turn ends session_persistence_failed, and the
    finalizer closes the call with "unknown: this call's result could not be recorded"
    (TOOL-8: it was never shown to the model). TOOL-5's checker demanded the timed-out
    text of every late call and read the closure as the call's own result. It now takes
    the unrecorded text for a late call when the world failed a write of its turn and the
    turn left its tool round by the deadline; a batch that waited out the call still
    breaks TOOL-5 here (``deadline_not_enforced``)."""
    _world(s, 17969)
    s.world.tools.slow("read_file", 500.0, path="notes-2.txt", start_delay_s=0.0)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.faults(crash=None, crash_at_effect=None, fail_writes={"tool_results": 1})
    s.start_submit(one, "p-1", "r-747298x", {"text": "Read notes-2.txt.", "role": "operator"},
                   session="s-1", after_s=32.0)
    s.start_drain(one, "s-1", after_s=38.0)
    _calm(s)


@scenario("The user's stop that cuts a model call before its cut-off tool call arrives ends "
          "the turn interrupted, not truncated (explored seed 14341)",
          invariants=("LOOP-9", "FIN-4"), stage="explore")
def stop_before_a_cut_off_call_arrives(s: Story) -> None:
    """A slow call on s-3 would answer with a tool call whose arguments were cut off by
    the length limit; the user stops the turn while that reply is still on its way. The
    stop cuts the call, so the turn never sees the reply and ends interrupted (FIN-4).
    LOOP-9's checker read the world's record of the reply as if the turn had received it
    and demanded the exit truncated_tool_call. It now excuses the turn's last call when
    the user or a lost lease stopped the turn after that call went out and the turn
    ended interrupted; a cut-off call recorded or run is still a finding."""
    _world(s, 14341, ReplyFault(call=12, kind=FaultKind.TRUNCATED_CALL),
           grace_outages=(1, 2, 3, 4, 5, 6, 7, 8))
    s.limits(max_iterations=1)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    s.bind("p-3", session="s-3")
    s.bind("op-s-3", session="s-3", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-08f94b", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=3.0)
    s.start_submit(one, "p-1", "r-a51c6d", {"text": "Write note 3 to s-1-out-3.txt."},
                   session="s-1", after_s=12.0)
    correct_at_a_moment(s, "Say hello 51 instead.", after_s=14.0, session="s-3", during="call",
                        slow_s=90.0)
    s.start_drain(one, "s-1", after_s=32.0)
    s.start_submit(one, "p-3", "r-a51c6d", {"text": "Say hello 3."}, session="s-3", after_s=32.0)
    s.start_drain(one, "s-3", after_s=47.0)
    s.start_drain(one, "s-1", after_s=47.0)
    s.start_submit(one, "p-3", "r-812c3a", {"text": "Say hello 5."}, session="s-3", after_s=84.0)
    s.start_drain(one, "s-3", after_s=93.0)
    s.interrupt(after_s=99.0, session="s-3")
    s.run_all()
    s.world.moments.clear()  # a correction held for a moment not reached is no fault of the calm
    _calm(s)


@scenario("A summary asked for before a redaction is measured on the row as it was then, "
          "card number and all (explored seed 17031)",
          invariants=("CMP-1",), stage="explore")
def summary_asked_before_a_redaction(s: Story) -> None:
    """In a 400-token window (threshold 340) a terminal turn pastes a card number, and the
    operator's tool waits for the session's lease to cut it. Meanwhile the next turn
    meets an unknown tool twice and an empty reply (whose nudge rides in the request, sent
    but never stored), and its preflight, at 346 tokens, asks for a summary, which fails.
    Only then is the card cut from the row. CMP-1's checker rebuilt the request from the
    record as it ended, with the shorter row, read 338 tokens and called the summary
    unasked; it now reads each row as it was when the summary was asked for (the
    rewrite's ``was``), as a request sent then carried it."""
    model = _world(s, 17031, ReplyFault(call=2, kind=FaultKind.NARRATED_CALL),
                   ReplyFault(call=7, kind=FaultKind.SERVER_ERROR),
                   ReplyFault(call=8, kind=FaultKind.UNKNOWN_TOOL),
                   ReplyFault(call=9, kind=FaultKind.EMPTY_REPLY),
                   ReplyFault(call=10, kind=FaultKind.UNKNOWN_TOOL), parts=9)
    s.world.tools.slow("read_file", 20.0, path="notes-2.txt", start_delay_s=0.0)
    s.limits(context_window_tokens=400)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.world.tools.slow("read_file", 5.0, path="t-1-build.log")
    model.summarizer = FlakySummarizer((1,), model)  # this summary request fails
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=26.0,
                 injected="memory: the build log is long; the user wants only its last line")
    s.start_submit(one, "p-1", "r-b0be94", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-1", after_s=28.0)
    s.start_turn(f"Say hello 2. {SECRET}", session="t-1", process=one, after_s=31.0)
    redact_later(s, SECRET, after_s=32.0, session="t-1")
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=32.0)
    s.start_drain(one, "s-1", after_s=36.0)
    _calm(s)


@scenario("An idle compaction asked for before a redaction is measured on the row as it "
          "was then (explored seed 12765)",
          invariants=("CTX-5",), stage="explore")
def idle_compaction_before_a_redaction(s: Story) -> None:
    """Idle compaction is on (300 s) in a 400-token window. A terminal turn pastes a card
    number; while the following turns hold the lease the operator's tool waits to cut it.
    A later turn's preflight finds the request at 361 tokens, over the threshold of 340,
    and asks for a summary (which fails); the card is cut after that turn. CTX-5's
    checker rebuilt the request from the record as it ended, read 327 tokens, under the
    threshold, and, the session not being idle, called the pass an idle compaction that
    was not due. It now reads each row as it was when the summary was asked for."""
    model = _world(s, 12765, ReplyFault(call=8, kind=FaultKind.TOOL_ERROR),
                   ReplyFault(call=14, kind=FaultKind.UNKNOWN_TOOL))
    s.limits(context_window_tokens=400)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.world.tools.slow("read_file", 20.0, path="t-1-build.log")
    s.limits(idle_compact_after_s=300.0)
    model.summarizer = FlakySummarizer((1,), model)  # this summary request fails
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    s.bind("p-3", session="s-3")
    s.bind("op-s-3", session="s-3", role="operator", kind="operator")
    one = s.main_process()
    s.faults(crash=None, crash_at_effect=None, fail_writes={"admit": 1})
    s.start_submit(one, "p-3", "r-0fb7ce", {"text": "Say hello 4."}, session="s-3", after_s=14.3)
    s.start_turn("Say hello 80.", session="h-1", process=one, after_s=51.0,
                 history=handed_history(1))
    s.start_submit(one, "p-1", "r-4c88e2", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=55.5)
    s.start_submit(one, "p-3", "r-4c88e2", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-3", after_s=56.2)
    s.start_drain(one, "s-1", after_s=60.7)
    s.start_submit(one, "p-1", "r-0fb7ce", {"text": "Write note 4 to s-1-out-4.txt."},
                   session="s-1", after_s=84.0)
    s.start_drain(one, "s-3", after_s=84.8)
    s.start_drain(one, "s-1", after_s=85.0)
    s.start_turn(f"Say hello 1. {SECRET}", session="t-1", process=one, after_s=87.0,
                 injected=MEMORY)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=91.8,
                 injected=MEMORY)
    redact_later(s, SECRET, after_s=97.8, session="t-1")
    s.start_turn("Say hello 3.", session="t-1", process=one, after_s=97.9)
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=103.0,
                 injected=FIGURES)
    s.start_submit(one, "p-1", "background:e-280780",
                   {"text": "Say hello 73: the background job is done."}, session="s-1",
                   after_s=114.7, kind="background")
    _calm(s)


@scenario("A forced pass that fails the turn closed is judged on the re-prompts it kept in "
          "its tail, so two such passes block the next (explored seed 11105)",
          invariants=("CMP-1", "CMP-4"), stage="explore")
def forced_pass_kept_its_reprompts(s: Story) -> None:
    """In a 400-token window (threshold 340) a turn meets an unknown tool, then three
    dropped calls: each re-prompt (the narration and a nudge, sent but never stored)
    stays in its working list. Its preflight compacts, yet with the re-prompts the
    request is still over the threshold (ineffective, one); the provider then refuses it
    as too long, the forced pass rotates again and leaves 370 tokens, re-prompts
    included (ineffective, two), and the turn fails closed. Two ineffective passes block
    automatic compaction (CMP-4), so a later turn of the lineage rightly sends 363 tokens
    without compacting. CMP-4's streak judged a pass with no later request on its rows
    alone, read the second pass as effective and the block as absent, and CMP-1's
    checker called the request a silence. Such a pass is now judged with the scaffolding
    the turn still held: what its last request carried, less what lay in the middle the
    pass summarized."""
    _world(s, 11105, ReplyFault(call=1, kind=FaultKind.ERRORS_AROUND_OVERFLOW),
           ReplyFault(call=2, kind=FaultKind.RATE_LIMIT, seconds=20.0),
           ReplyFault(call=4, kind=FaultKind.NARRATED_CALL),
           ReplyFault(call=6, kind=FaultKind.SERVER_ERROR),
           ReplyFault(call=9, kind=FaultKind.AUTH_ERROR),
           ReplyFault(call=10, kind=FaultKind.UNKNOWN_TOOL),
           ReplyFault(call=11, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=12, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=13, kind=FaultKind.DROPPED_CALL), parts=9)
    s.limits(context_window_tokens=400)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.faults(crash=None, crash_at_effect=None, fail_writes={"admit": 1})
    s.start_submit(one, "p-1", "r-504977",
                   {"text": "Go through part-1.txt to part-9.txt in order."}, session="s-1",
                   after_s=31.0)
    s.start_submit(one, "p-1", "r-5d0791", {"text": "Say hello 5."}, session="s-1", after_s=55.0)
    s.start_submit(one, "p-1", "r-299bfd", {"text": "Say hello 4."}, session="s-1", after_s=66.0)
    s.start_drain(one, "s-1", after_s=70.0)
    s.start_submit(one, "p-1", "r-9072ec", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=72.0)
    s.start_submit(one, "p-1", "r-7f9d17", {"text": "Read notes-2.txt."}, session="s-1",
                   after_s=78.0)
    s.start_drain(one, "s-1", after_s=79.0)
    s.start_drain(one, "s-1", after_s=89.0)
    s.start_submit(one, "p-1", "r-f064f6", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=94.0)
    s.start_drain(one, "s-1", after_s=97.0)
    s.start_submit(one, "p-1", "r-d39652", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=103.0)
    s.start_drain(one, "s-1", after_s=114.0)
    s.start_drain(one, "s-1", after_s=115.0)
    _calm(s)


@scenario("A pass an overflow forced and that relieved the request ends the ineffective "
          "streak, so the turn's next automatic pass is not blocked (explored seed 14267)",
          invariants=("CMP-4",), stage="explore")
def forced_pass_ends_the_ineffective_streak(s: Story) -> None:
    """In a 400-token window, on t-1, one turn's compression lock freezes past its lease and
    the next turn compacts twice and still fails closed: three passes in a row leave the
    request over the threshold, which blocks automatic compaction (CMP-4). The following
    turn's first call is refused as too long, so the engine forces a pass (the provider
    proved the overflow) and that pass brings the request under the threshold: the streak
    ends, and a later preflight of the same turn compacts again, as it may. CMP-4's checker
    left the turn's own passes out of the streak it judged a summary request by, so it
    still counted the three ineffective passes before the turn and read the later pass as
    automatic compaction past the block; it now counts every pass judged before the
    request, the turn's own included, as the engine does."""
    _world(s, 14267, ReplyFault(call=1, kind=FaultKind.RATE_LIMIT, seconds=1.0),
           ReplyFault(call=5, kind=FaultKind.OVERFLOW),
           ReplyFault(call=6, kind=FaultKind.MIXED_HOUSEKEEPING),
           ReplyFault(call=15, kind=FaultKind.UNKNOWN_TOOL),
           ReplyFault(call=17, kind=FaultKind.BAD_ARGUMENTS),
           ReplyFault(call=18, kind=FaultKind.OVERFLOW),
           ReplyFault(call=19, kind=FaultKind.OVERFLOW))
    s.limits(context_window_tokens=400)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.world.tools.slow("read_file", 60.0, path="t-1-build.log")
    s.world.lock_stalls["t-1"] = 400.0  # its lock's first holder freezes
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    one, two, three = s.main_process(), s.process(), s.process()
    s.faults(crash="after:tool_calls#2", crash_at_effect=None, fail_writes={"tool_calls": 1})
    memory = "memory: the user signs notes as Ana and works from the Lisbon office"
    s.start_submit(two, "p-2", "r-4df65f", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-2", after_s=7.0)
    s.start_turn("Read notes-2.txt.", session="t-1", process=three, after_s=10.0)
    s.start_submit(one, "p-1", "r-e7b3a1", {"text": "Say hello 1."}, session="s-1", after_s=12.0)
    s.start_submit(two, "p-2", "r-1cbe3d", {"text": "Read notes-2.txt."}, session="s-2",
                   after_s=15.0)
    s.start_drain(three, "s-2", after_s=16.0)
    s.start_turn("Read notes-2.txt.", session="t-1", process=one, after_s=19.0, injected=memory)
    s.start_turn("Say hello 4.", session="t-1", process=one, after_s=25.0)
    s.start_drain(three, "s-2", after_s=25.0)
    s.start_drain(three, "s-1", after_s=26.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=three, after_s=35.0,
                 injected=memory)
    s.start_submit(two, "p-2", "r-e7b3a1", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-2", after_s=68.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=three, after_s=69.0)
    s.start_turn("Read notes-2.txt.", session="t-1", process=three, after_s=70.0)
    s.start_submit(three, "p-1", "r-6a3278",
                   {"text": "Patch note 94 into drafts/s-1-94.txt, or write it there."},
                   session="s-1", after_s=86.0)
    s.start_drain(three, "s-1", after_s=88.0)
    s.start_drain(three, "s-2", after_s=90.0)
    s.run_all()
    s.world.lock_stalls.clear()  # a freeze not reached is no fault of the calm
    _calm(s)


@scenario("After two ineffective passes a turn's overflow forces a pass that relieves the "
          "request, and its later automatic pass runs unblocked (explored seed 15983)",
          invariants=("CMP-4", "LOOP-5"), stage="explore")
def relieved_overflow_unblocks_the_turns_next_pass(s: Story) -> None:
    """On s-2, in a 400-token window with a 120-token fallback, earlier turns leave two
    ineffective passes in a row, so automatic compaction is blocked (CMP-4). A later
    turn's call meets 503s around an overflow: the overflow forces a pass, which brings
    the request under the threshold and so ends the streak; after a tool round the same
    turn is over the threshold again and compacts before its next call, unblocked. The
    checker judged that summary request by the streak without the turn's own passes,
    still two, and called it automatic compaction past the block; the streak now holds
    every pass judged before the request, as the engine's does."""
    model = _world(s, 15983, ReplyFault(call=2, kind=FaultKind.ERRORS_AROUND_OVERFLOW),
                   ReplyFault(call=4, kind=FaultKind.OUTAGE),
                   ReplyFault(call=21, kind=FaultKind.MIXED_HOUSEKEEPING))
    s.limits(context_window_tokens=400)
    s.limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=120,
                                               token_ratio=1.25),))
    s.use_provider_for("fallback-small", model.for_fallback())
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-2", "r-1439c3", {"text": "Write note 3 to s-2-out-3.txt."},
                   session="s-2", after_s=20.0)
    correct_at_a_moment(s, "Say hello 60 instead.", after_s=21.0, session="s-2", during="tools",
                        slow_s=0.0)
    s.start_submit(one, "p-1", "r-1439c3", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=22.0)
    s.start_turn("Say hello 80.", session="h-1", process=one, after_s=25.0,
                 history=handed_history(4))
    s.start_drain(one, "s-1", after_s=26.0)
    s.start_drain(one, "s-2", after_s=29.0)
    s.start_submit(one, "p-1", "r-cff7e1", {"text": "Write note 1 to s-1-out-1.txt."},
                   session="s-1", after_s=41.0)
    s.start_drain(one, "s-1", after_s=61.0)
    s.start_submit(one, "p-2", "r-1311b3",
                   {"text": "Read notes-1.txt and rewrite it as note 70 at notes-1.txt."},
                   session="s-2", after_s=65.0)
    s.start_drain(one, "s-2", after_s=68.0)
    s.start_submit(one, "p-2", "r-58a0e2", {"text": "Read notes-1.txt."}, session="s-2",
                   after_s=71.0)
    s.start_drain(one, "s-2", after_s=76.0)
    s.start_submit(one, "p-2", "r-cff7e1", {"text": "Say hello 1."}, session="s-2", after_s=95.0)
    s.start_submit(one, "p-1", "r-abe3b0", {"text": "Read notes-2.txt."}, session="s-1",
                   after_s=100.0)
    s.start_drain(one, "s-2", after_s=120.0)
    s.start_drain(one, "s-1", after_s=124.0)
    s.start_submit(one, "p-2", "r-e4d1d6", {"text": "Write note 3 to s-2-out-3.txt."},
                   session="s-2", after_s=640.0)
    s.start_drain(one, "s-2", after_s=656.0)
    s.run_all()
    s.world.moments.clear()  # a correction held for a moment not reached is no fault of the calm
    _calm(s)


@scenario("After a correction, compaction keeps the correction as the turn's current "
          "message, and the message it superseded may be summarized (explored seed 11447)",
          invariants=("CTX-7", "LOOP-4"), stage="explore")
def correction_is_the_message_compaction_keeps(s: Story) -> None:
    """In a 600-token window a turn on s-2 runs a wide batch of reads, and the user sends
    "Say hello 96 instead." during its tool round: a correction, stored as a user row of
    the turn (LOOP-4). The next call is refused as too long; the forced pass re-locates
    the turn's current message, the last user row of the turn, which is the correction,
    and summarizes the message it superseded (CTX-7: the turn's text no row holds any
    longer, else the last user row). CTX-7's checker demanded the turn's first text in
    every later request; it now demands the text of the turn's current message at each
    call: its own until it takes a correction in, then the last correction."""
    _world(s, 11447, ReplyFault(call=1, kind=FaultKind.OUTAGE),
           ReplyFault(call=7, kind=FaultKind.TOOL_ERROR),
           ReplyFault(call=10, kind=FaultKind.OVERFLOW),
           ReplyFault(call=18, kind=FaultKind.WIDE_BATCH),
           ReplyFault(call=19, kind=FaultKind.OVERFLOW), parts=7)
    s.limits(context_window_tokens=600)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-2", "r-a869d7", {"text": "Write note 4 to s-2-out-4.txt."},
                   session="s-2", after_s=0.9)
    s.start_submit(one, "p-2", "r-a869d7x",
                   {"text": "Write note 4 to s-2-out-4.txt.", "role": "operator"},
                   session="s-2", after_s=2.2)
    s.start_submit(one, "p-1", "r-31893b", {"text": "Go through part-1.txt to part-7.txt in order."},
                   session="s-1", after_s=4.6)
    s.start_drain(one, "s-2", after_s=17.1)
    s.start_drain(one, "s-1", after_s=17.6)
    s.start_drain(one, "s-2", after_s=26.3)
    correct_at_a_moment(s, "Say hello 96 instead.", after_s=38.7, session="s-2", during="tools",
                        slow_s=0.0)
    s.start_submit(one, "p-2", "r-45aa01", {"text": "Write note 1 to s-2-out-1.txt."},
                   session="s-2", after_s=40.3)
    s.start_drain(one, "s-2", after_s=51.4)
    s.run_all()
    s.world.moments.clear()  # a correction held for a moment not reached is no fault of the calm
    _calm(s)


@scenario("A grace request refused for its window counts the dropped-call re-prompts it "
          "still carries after a landed tool round (explored seed 14046)",
          invariants=("FIN-1", "LOOP-7", "CMP-7"), stage="explore")
def refused_grace_counts_earlier_reprompts(s: Story) -> None:
    """With ``max_iterations=3`` a turn's first two calls drop their tool calls and are
    re-prompted (LOOP-7); the third hits an outage, falls back to a 200-token route and
    reads a file there. The loop is at its bound, and the grace request, which still
    carries both re-prompt pairs (scaffolding is dropped only by the finalizer), does not
    fit the fallback's window, so preflight refuses it (CMP-7) and the turn ends
    ``pending_tool_result``. FIN-1's checker rebuilt that request from the record and
    counted a re-prompt pair only when the last reply was itself a dropped call, so it
    found a request that fits and demanded a grace call; it now counts every pair the
    last request carried, and agrees with the engine to the token."""
    model = _world(s, 14046, ReplyFault(call=1, kind=FaultKind.DROPPED_CALL),
                   ReplyFault(call=2, kind=FaultKind.DROPPED_CALL),
                   ReplyFault(call=3, kind=FaultKind.OUTAGE))
    s.limits(max_iterations=3)
    s.limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=200,
                                               token_ratio=1.25),))
    s.use_provider_for("fallback-small", model.for_fallback())
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one, two = s.main_process(), s.process()
    s.start_submit(one, "p-1", "r-55bf60", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=22.0)
    s.start_drain(two, "s-1", after_s=22.0)
    _calm(s)


@scenario("An answer held back for verification that ended in a lone surrogate is "
          "delivered as the engine took it in, U+FFFD and all (explored seed 15401)",
          invariants=("FIN-1", "LOOP-3"), stage="explore")
def held_answer_with_a_lone_surrogate(s: Story) -> None:
    """With ``verify_before_answer`` on and a budget of two calls, a lane's turn writes a
    file and answers with text that ends in a lone surrogate, which the engine takes in as
    U+FFFD. The gate holds that answer back, the budget runs out, and the finalizer
    delivers the held answer with no summary call, as FIN-1 asks. FIN-1's and LOOP-3's
    checkers compared the delivered text with the raw reply, surrogate and all, found no
    match, and read a held answer replaced by one no summary gave; they now read the held
    answer as the engine took it in, as they already read a grace summary."""
    _world(s, 15401, ReplyFault(call=7, kind=FaultKind.BAD_ARGUMENTS),
           ReplyFault(call=10, kind=FaultKind.LONE_SURROGATE))
    s.limits(verify_before_answer=True)
    s.limits(session_reset_mode="both", session_idle_minutes=240, session_reset_at_hour=6,
             group_sessions_per_user=True, thread_sessions_per_user=True,
             session_prune_after_s=10800.0, stuck_restart_threshold=3)
    s.limits(iteration_budget=2)
    for principal, session in (("p-1", "s-1"), ("p-2", "s-2")):
        s.bind(principal, session=session)
        s.bind(f"op-{session}", session=session, role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-2", "r-365987", {"text": "Read notes-1.txt."}, session="s-2",
                   after_s=34.0)
    s.start_submit(one, "p-1", "r-365987", {"text": "Say hello 3."}, session="s-1", after_s=37.0)
    s.start_submit(one, "p-2", "r-fb70bf", {"text": "Write note 1 to s-2-out-1.txt."},
                   session="s-2", after_s=55.0)
    s.start_drain(one, "s-1", after_s=56.0)
    s.start_drain(one, "s-2", after_s=70.0)
    s.start_submit(one, "p-1", "r-32eb07", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=75.0)
    s.start_drain(one, "s-1", after_s=90.0)
    s.start_drain(one, "s-2", after_s=91.0)
    lanes = LaneWorld(s, [one], job_s=240.0)
    lanes.message(0, SessionSource(platform="telegram", chat_type="group", chat_id="-1002285219667",
                                   thread_id="17585", participant="dave"),
                  "Write note 7 to lane-out-7.txt.", after_s=19826.3)
    _calm(s)


@scenario("A dropped tool call a correction cut at the loop's bound leaves the grace call "
          "to answer, with no re-prompt owed (explored seed 15441)",
          invariants=("LOOP-7", "LOOP-4", "FIN-1"), stage="explore")
def corrected_dropped_call_at_the_bound(s: Story) -> None:
    """With ``max_iterations=3`` a turn's third call, after a read that failed, comes back
    as a dropped tool call (``finish_reason=tool_calls`` and no call) just as the user's
    correction arrives and cuts it. The cut reply never reaches the loop (LOOP-4): the
    engine stores the hidden partial and the correction, and, at its bound, makes the
    grace call (FIN-1; here it fails on an outage, and the turn closes with a boundary
    row). LOOP-7's checker read the cut reply as a dropped call that the grace request
    owed a re-prompt; it now leaves out a reply a correction cut, on the request that
    follows it and at a turn's end alike (with 17372)."""
    model = _world(s, 15441, ReplyFault(call=4, kind=FaultKind.BAD_ARGUMENTS),
                   ReplyFault(call=5, kind=FaultKind.SLOW_REPLY, seconds=5.0),
                   ReplyFault(call=7, kind=FaultKind.TOOL_ERROR),
                   ReplyFault(call=9, kind=FaultKind.EMPTY_REPLY),
                   ReplyFault(call=10, kind=FaultKind.DROPPED_CALL),
                   ReplyFault(call=11, kind=FaultKind.EMPTY_REPLY),
                   ReplyFault(call=18, kind=FaultKind.TOOL_ERROR),
                   ReplyFault(call=19, kind=FaultKind.DROPPED_CALL),
                   ReplyFault(call=20, kind=FaultKind.SLOW_REPLY, seconds=5.0),
                   grace_outages=(1, 2, 3, 4, 5, 6, 7, 8))
    s.limits(max_iterations=3)
    s.limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=256,
                                               token_ratio=1.25),))
    s.use_provider_for("fallback-small", model.for_fallback())
    s.files({"t-1-build.log": "build of t-1: ok"})
    for principal, session in (("p-1", "s-1"), ("p-2", "s-2"), ("p-3", "s-3")):
        s.bind(principal, session=session)
        s.bind(f"op-{session}", session=session, role="operator", kind="operator")
    s.bind("q-3", session="s-3")
    one = s.main_process()
    s.delay_reply(5, 5.0)
    s.delay_reply(20, 5.0)
    s.start_submit(one, "p-2", "r-3ed33b", {"text": "Write note 3 to s-2-out-3.txt."},
                   session="s-2", after_s=26.5)
    s.start_submit(one, "p-1", "r-3ed33b", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=43.0)
    s.start_drain(one, "s-1", after_s=44.8)
    s.start_turn("Say hello 1.", session="t-1", process=one, after_s=48.4)
    s.start_drain(one, "s-2", after_s=55.5)
    s.start_submit(one, "q-3", "r-ad1997", {"text": "Say hello ad1997 from q-3."}, session="s-3",
                   after_s=55.7)
    s.start_submit(one, "p-2", "r-ff5d9c", {"text": "Read notes-2.txt."}, session="s-2",
                   after_s=56.9)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=57.9,
                 injected="memory: the build log is long; the user wants only its last line")
    s.start_drain(one, "s-3", after_s=59.5)
    s.start_drain(one, "s-2", after_s=68.9)
    redirect_a_running_turn(s, "Say hello 74 instead.", after_s=69.0, session="s-2")
    _calm(s)


@scenario("A dropped tool call whose reply a correction cut is not re-prompted: the turn "
          "takes the correction in and answers it (explored seed 17372)",
          invariants=("LOOP-7", "LOOP-4"), stage="explore")
def corrected_dropped_call_is_not_reprompted(s: Story) -> None:
    """The same reading as seed 15441, in the middle of a turn: after a read that failed,
    a slow call comes back as a dropped tool call as the user's correction cuts it. The
    engine takes the correction in, and its next request answers it, with no re-prompt,
    as LOOP-4 asks. LOOP-7's checker read that request as one that failed to re-prompt
    the cut reply."""
    model = _world(s, 17372, ReplyFault(call=1, kind=FaultKind.OUTAGE),
                   ReplyFault(call=6, kind=FaultKind.TOOL_ERROR),
                   ReplyFault(call=7, kind=FaultKind.DROPPED_CALL),
                   ReplyFault(call=8, kind=FaultKind.SLOW_REPLY, seconds=90.0))
    s.limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=120,
                                               token_ratio=1.25),))
    s.use_provider_for("fallback-small", model.for_fallback())
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    one = s.main_process()
    s.delay_reply(8, 90.0)
    s.start_submit(one, "p-2", "r-51dbd2",
                   {"text": "Read notes-2.txt and rewrite it as note 70 at link-notes-2.txt."},
                   session="s-2", after_s=11.0)
    s.start_drain(one, "s-2", after_s=22.0)
    s.start_submit(one, "p-2", "r-05fb20", {"text": "Write note 1 to s-2-out-1.txt."},
                   session="s-2", after_s=35.0)
    s.start_drain(one, "s-2", after_s=47.0)
    redirect_a_running_turn(s, "Say hello 21 instead.", after_s=84.0, session="s-2")
    _calm(s)
