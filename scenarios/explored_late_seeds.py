"""Stories the explorer found in its later sweeps, each a shrunk seed (``hermes-ref explore
--shrink SEED``) red before its fix, on the engine or on a checker, as each story says. The
calls are the explorer's own (``sim.explore.run.stage``), so each replays the run it came
from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.limits import ProviderRoute
from hermes_ref.session import SessionSource
from scenarios._explored_common import calm as _calm
from scenarios._explored_common import world as _world
from sim.explore.lanes import LaneWorld
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import correct_at_a_moment, jump_clock
from sim.harness import Story, scenario

MEMORY = "memory: last week the user asked for every change to be written to its own file"
FIGURES = "memory: the user keeps the quarterly figures in notes-1.txt and prefers short answers"




@scenario("The request rebuilt after an overflow leaves the hidden row of a cut reply off "
          "the wire, as every other request does (explored seed 6138)",
          invariants=("LOOP-4", "CTX-2"), stage="explore")
def overflow_retry_leaves_hidden_rows_off(s: Story) -> None:
    """A correction cuts the first turn's first call before it shows anything, which leaves
    a hidden row: stored, but never sent (LOOP-4). Two turns later, in a 500-token window,
    the provider refuses a request as too long; the engine compacts (here by rotating to a
    child session) and sends the request again, rebuilt from the working list. That
    rebuild took every message of the list, the hidden row included, so the retry sent an
    empty assistant message the durable history does not show there (CTX-2's
    ``requests_match_record``). It now builds the list as the loop does
    (``Transcript.visible``), and counts its tokens as the active route does (LOOP-6)."""
    _world(s, 6138, ReplyFault(call=2, kind=FaultKind.UNKNOWN_TOOL),
           ReplyFault(call=3, kind=FaultKind.REFUSED_WRITE),
           ReplyFault(call=8, kind=FaultKind.OVERFLOW), parts=7)
    s.limits(context_window_tokens=500)
    s.bind("p-2", session="s-2")
    one = s.main_process()
    correct_at_a_moment(s, "Say hello 72 instead.", after_s=0.0, session="s-2", during="call",
                        slow_s=5.0)
    s.start_submit(one, "p-2", "r-d7cf3e", {"text": "Go through part-1.txt to part-7.txt in order."},
                   session="s-2", after_s=13.0)
    s.start_submit(one, "p-2", "r-bbc081", {"text": "Read notes-2.txt."}, session="s-2",
                   after_s=17.0)
    s.start_drain(one, "s-2", after_s=35.0)
    s.start_drain(one, "s-2", after_s=41.0)
    s.start_submit(one, "p-2", "r-256839", {"text": "Write note 3 to s-2-out-3.txt."},
                   session="s-2", after_s=51.0)
    s.start_drain(one, "s-2", after_s=63.0)
    s.run_all()
    s.world.moments.clear()  # a correction held for a moment not reached is no fault of the calm
    _calm(s)


@scenario("A turn whose lease is lost while its preflight compaction waits gets back the "
          "budget unit of the call it never sent (explored seed 6386)",
          invariants=("CTX-1", "LOOP-2"), stage="explore")
def lease_lost_in_preflight_refunds_the_unit(s: Story) -> None:
    """Process 1's turns on t-1 fill a 400-token window; process 2 starts the next turn
    after an idle gap, so its preflight compacts, and its summary call returns, but the
    compression lock's first holder freezes for 400 s. Its lease (TTL 300 s) is gone when
    it wakes: the rotation's write is fenced off, and so is the summary call it asks next,
    before it goes out. The turn ends interrupted with no call made, yet it kept the
    budget unit the loop had spent for the iteration: CTX-1's checker read "1 budget unit
    for 0 calls". A stop in preflight sends nothing, so the unit is given back, as for a
    request preflight refuses (LOOP-2)."""
    _world(s, 6386, parts=7)
    s.limits(context_window_tokens=400)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.limits(idle_compact_after_s=300.0)
    s.world.lock_stalls["t-1"] = 400.0  # its lock's first holder freezes
    s.bind("p-1", session="s-1")
    one, two = s.main_process(), s.process()
    s.stall(two, 900.0, after_s=20.0)
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=40.0)
    s.start_turn("Write note 3 to t-1-out-3.txt.", session="t-1", process=one, after_s=47.0)
    s.start_turn("Say hello 4. My card is 4417 2210 9932 0071.", session="t-1", process=two,
                 after_s=51.0,
                 injected="memory: the user signs notes as Ana and works from the Lisbon office")
    for after_s in (72.0, 75.0, 77.0):
        s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=after_s)
    s.run_all()
    s.world.lock_stalls.clear()  # a freeze not reached is no fault of the calm
    _calm(s)


@scenario("An answer recovered from a stream cut after its last delta can be held back for "
          "verification, and a budget exit delivers it (explored seed 7460)",
          invariants=("FIN-1", "FIN-2", "LOOP-3"), stage="explore")
def held_back_answer_from_a_cut_stream(s: Story) -> None:
    """With a budget of three and the verification gate on, a turn writes a note, meets an
    unknown tool, and its third call's stream is cut twice: after its first delta (asked
    again) and after its last (a whole answer, which the engine keeps: FIN-2). A writer
    ran this turn, so the gate holds that answer back and would ask the model to check;
    no budget is left, so the turn ends ``budget_exhausted`` and delivers the held answer
    instead of a grace summary (FIN-1). The checkers looked for a held answer only in a
    reply that arrived whole, so they read an answer no grace summary gave (FIN-1,
    LOOP-3); they now take a recovered stream's answer as the engine does."""
    _world(s, 7460, ReplyFault(call=2, kind=FaultKind.RATE_LIMIT, seconds=20.0),
           ReplyFault(call=3, kind=FaultKind.SERVER_ERROR),
           ReplyFault(call=5, kind=FaultKind.UNKNOWN_TOOL),
           ReplyFault(call=6, kind=FaultKind.STREAM_CUT, deltas=1),
           ReplyFault(call=7, kind=FaultKind.STREAM_CUT, deltas=99))
    s.limits(verify_before_answer=True)
    s.limits(iteration_budget=3)
    s.bind("p-1", session="s-1")
    one = s.main_process()
    s.world.stream_cuts[6] = 1
    s.world.stream_cuts[7] = 99
    s.start_submit(one, "p-1", "r-e05c42", {"text": "Say hello 2."}, session="s-1", after_s=20.0)
    s.start_drain(one, "s-1", after_s=44.0)
    s.start_submit(one, "p-1", "r-a69466", {"text": "Write note 3 to s-1-out-3.txt."},
                   session="s-1", after_s=48.0)
    s.start_drain(one, "s-1", after_s=69.0)
    s.run_all()
    s.world.stream_cuts.clear()  # a cut not reached is no fault of the calm
    _calm(s)


@scenario("A pass an overflow forces runs though ineffective passes block automatic "
          "compaction: the provider proved the request cannot go (explored seed 3344)",
          invariants=("CMP-4", "LOOP-5"), stage="explore")
def overflow_forces_a_pass_past_the_block(s: Story) -> None:
    """In a 400-token window a terminal turn meets four dropped calls in a row; its passes
    find nothing to compact (ineffective, CMP-4), and the turn ends compression-exhausted
    with two in a row, which blocks automatic compaction. The next turn's first call is
    refused as too long (call 17): an overflow the provider proved, so the engine compacts
    anyway, as Hermes's preflight does ("unless provider-proven overflow"); a cooldown
    would still hold it. CMP-4's checker read that pass as automatic compaction after two
    ineffective passes; a pass forced by an overflow is now told apart by the turn's call
    before it, refused as too long."""
    _world(s, 3344, ReplyFault(call=3, kind=FaultKind.RATE_LIMIT, seconds=1.0),
           ReplyFault(call=5, kind=FaultKind.AUTH_ERROR),
           ReplyFault(call=10, kind=FaultKind.RATE_LIMIT, seconds=1.0),
           *(ReplyFault(call=c, kind=FaultKind.DROPPED_CALL) for c in (13, 14, 15, 16)),
           ReplyFault(call=17, kind=FaultKind.OVERFLOW))
    s.limits(context_window_tokens=400)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.bind("p-1", session="s-1")
    s.bind("p-2", session="s-2")
    one = s.main_process()
    s.faults(crash=None, crash_at_effect=None, fail_writes={"tool_results": 1})
    s.start_submit(one, "p-1", "r-99d794", {"text": "Write note 1 to s-1-out-1.txt."},
                   session="s-1", after_s=21.0)
    s.start_submit(one, "p-2", "r-897f5b", {"text": "Say hello 2."}, session="s-2", after_s=25.0)
    s.start_drain(one, "s-2", after_s=31.0)
    s.start_drain(one, "s-1", after_s=35.0)
    s.start_submit(one, "p-1", "r-200217", {"text": "Write note 4 to s-1-out-4.txt."},
                   session="s-1", after_s=36.0)
    s.start_drain(one, "s-1", after_s=48.0)
    memory = "memory: the user signs notes as Ana and works from the Lisbon office"
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=58.0, injected=memory)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=68.0, injected=memory)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=72.0,
                 injected="memory: the build log is long; the user wants only its last line")
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=77.0,
                 injected="memory: last week the user asked for every change to be written "
                          "to its own file")
    _calm(s)


@scenario("A dropped tool call whose re-prompt is refused because the lease lapsed ends "
          "the turn interrupted: no re-prompt is owed (explored seed 9552)",
          invariants=("LOOP-7", "LEASE-4"), stage="explore")
def dropped_call_of_a_stopped_turn(s: Story) -> None:
    """A turn's call comes back as a dropped tool call (``finish_reason=tool_calls`` and no
    call); before its re-prompt goes out the clock jumps an hour, the turn's lease lapses,
    and the re-prompt is refused before it is sent (LEASE-4): the turn ends interrupted,
    as it must. LOOP-7's checker excused a dropped call's silence only for the budget's
    end or preflight's refusal, and read this one as a turn that ended instead of
    re-prompting; an interrupted exit is excused too when the user or a lost lease stopped
    the turn, and only then."""
    model = _world(s, 9552, ReplyFault(call=2, kind=FaultKind.TOOL_ERROR),
                   ReplyFault(call=4, kind=FaultKind.BAD_ARGUMENTS),
                   ReplyFault(call=5, kind=FaultKind.UNKNOWN_TOOL),
                   ReplyFault(call=18, kind=FaultKind.TOOL_ERROR),
                   ReplyFault(call=22, kind=FaultKind.BAD_ARGUMENTS),
                   ReplyFault(call=24, kind=FaultKind.DROPPED_CALL),
                   ReplyFault(call=25, kind=FaultKind.SLOW_REPLY, seconds=5.0), grace_outages=(1,))
    s.limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=4000,
                                               token_ratio=1.25),))
    s.use_provider_for("fallback-small", model.for_fallback())
    s.limits(iteration_budget=3)
    for k in (1, 2, 3):
        s.bind(f"p-{k}", session=f"s-{k}")
    one = s.main_process()
    s.delay_reply(25, 5.0)
    s.faults(crash=None, crash_at_effect=None, fail_writes={"tool_calls": 1})
    s.start_submit(one, "p-2", "r-86bced", {"text": "Say hello 3."}, session="s-2", after_s=0.0)
    s.start_submit(one, "p-2", "r-6f1773", {"text": "Say hello 6."}, session="s-2", after_s=12.0)
    s.start_drain(one, "s-2", after_s=23.0)
    s.start_submit(one, "p-3", "r-de3092", {"text": "Say hello 4."}, session="s-3", after_s=30.0)
    s.start_submit(one, "p-2", "r-95f3da", {"text": "Read notes-2.txt."},
                   session="s-2", after_s=44.0)
    s.start_submit(one, "p-3", "r-95f3da", {"text": "Read notes-2.txt."},
                   session="s-3", after_s=46.0)
    s.start_drain(one, "s-3", after_s=48.0)
    s.start_drain(one, "s-3", after_s=51.0)
    s.start_drain(one, "s-2", after_s=60.0)
    s.start_submit(one, "p-1", "r-ae2f94", {"text": "Read notes-2.txt and rewrite it as note 70 "
                                                    "at /workspace/notes-2.txt."},
                   session="s-1", after_s=68.0)
    s.start_drain(one, "s-1", after_s=69.0)
    s.start_submit(one, "p-2", "r-246f51x", {"text": "Write note 2 to s-2-out-2.txt.",
                                             "role": "operator"}, session="s-2", after_s=75.0)
    s.start_drain(one, "s-2", after_s=79.0)
    s.start_submit(one, "p-2", "r-171532", {"text": "Write note 5 to s-2-out-5.txt."},
                   session="s-2", after_s=81.0)
    s.start_submit(one, "p-3", "r-86bced", {"text": "Read notes-1.txt."},
                   session="s-3", after_s=84.0)
    s.start_drain(one, "s-2", after_s=86.0)
    s.start_drain(one, "s-2", after_s=87.0)
    s.start_drain(one, "s-1", after_s=89.0)
    s.start_submit(one, "p-1", "r-86bced", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-1", after_s=89.0)
    s.start_drain(one, "s-3", after_s=95.0)
    jump_clock(s, 3600.0, after_s=99.0)
    s.start_drain(one, "s-1", after_s=109.0)
    s.start_submit(one, "p-1", "r-171532", {"text": "Read notes-1.txt."},
                   session="s-1", after_s=113.0)
    s.start_drain(one, "s-3", after_s=113.0)
    s.start_drain(one, "s-1", after_s=137.0)
    s.run_all()
    _calm(s)


@scenario("A pass judged on what the next request carries: the scaffolding of a re-prompt, "
          "sent but never stored, keeps it over the threshold (explored seed 8441)",
          invariants=("CMP-4", "CMP-1"), stage="explore")
def pass_judged_with_its_scaffolding(s: Story) -> None:
    """In a 400-token window a turn's replies are dropped calls, empty replies and bad
    arguments, so its working list holds re-prompts and recovery nudges: sent with every
    request, never stored (SCAF-1). Its passes compact the stored rows below the threshold,
    but the next request, with the nudges, is still over it, and the engine counts each
    such pass as ineffective, as Hermes judges a pass on the provider's next prompt (CMP-4).
    Two in a row block automatic compaction, and a later turn fails closed without a pass.
    The checkers judged a committed pass on the rows it wrote alone, read one ineffective
    pass where the engine had two, and called the block early; they now add the scaffolding
    the turn's next request carried (``tests/unit/test_compaction_streak.py`` compares the
    two readings pass for pass, seeds 8337 and 8441 among them)."""
    _world(s, 8441, ReplyFault(call=1, kind=FaultKind.BAD_ARGUMENTS),
           ReplyFault(call=2, kind=FaultKind.EMPTY_REPLY),
           ReplyFault(call=4, kind=FaultKind.AUTH_ERROR),
           ReplyFault(call=9, kind=FaultKind.SERVER_ERROR),
           ReplyFault(call=13, kind=FaultKind.RATE_LIMIT, seconds=1.0),
           ReplyFault(call=17, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=19, kind=FaultKind.BAD_ARGUMENTS),
           ReplyFault(call=20, kind=FaultKind.UNKNOWN_TOOL),
           ReplyFault(call=21, kind=FaultKind.DROPPED_CALL), parts=7)
    s.limits(context_window_tokens=400)
    s.limits(idle_compact_after_s=600.0)
    s.bind("p-1", session="s-1")
    s.bind("p-3", session="s-3")
    one = s.main_process()
    s.faults(crash=None, crash_at_effect=None, fail_writes={"tool_calls": 1})
    s.start_submit(one, "p-3", "r-8d02c0", {"text": "Write note 6 to s-3-out-6.txt."},
                   session="s-3", after_s=87.0)
    s.start_submit(one, "p-1", "r-bf7683", {"text": "Read notes-1.txt and rewrite it as note 70 "
                                                    "at /workspace/notes-1.txt."},
                   session="s-1", after_s=90.0)
    s.start_submit(one, "p-1", "r-8d02c0", {"text": "Read notes-2.txt."},
                   session="s-1", after_s=93.0)
    s.start_submit(one, "p-3", "r-fdc7dc", {"text": "Say hello 1."}, session="s-3", after_s=93.0)
    s.start_submit(one, "p-1", "r-a17f0e", {"text": "Write note 5 to s-1-out-5.txt."},
                   session="s-1", after_s=99.0)
    s.start_drain(one, "s-3", after_s=101.0)
    s.start_drain(one, "s-1", after_s=102.0)
    s.start_drain(one, "s-1", after_s=105.0)
    s.start_drain(one, "s-1", after_s=107.0)
    s.start_drain(one, "s-3", after_s=123.0)
    s.start_submit(one, "p-3", "r-afc606", {"text": "Write note 3 to s-3-out-3.txt."},
                   session="s-3", after_s=827.0)
    s.start_drain(one, "s-3", after_s=855.0)
    s.start_submit(one, "p-1", "r-03cb8d", {"text": "Write note 2 to s-1-out-2.txt."},
                   session="s-1", after_s=1206.0)
    s.start_drain(one, "s-1", after_s=1218.0)
    s.start_submit(one, "p-1", "r-fac4ad", {"text": "Go through part-1.txt to part-7.txt in "
                                                    "order."},
                   session="s-1", after_s=1282.0)
    s.start_drain(one, "s-1", after_s=1301.0)
    _calm(s)


@scenario("A turn the frozen holder of the compression lock refuses sends its request over "
          "the threshold: it tried to compact (explored seed 8479)",
          invariants=("CMP-1", "CMP-6"), stage="explore")
def refused_the_lock_then_sent_over_the_threshold(s: Story) -> None:
    """In a 600-token window the first holder granted t-1's compression lock freezes for
    600 s under a lock that lasts 900 s. A turn of the other process goes over the
    threshold, asks for the lock and is refused (CMP-6: one compressor at a time, the
    messages left unchanged), and sends its request as it is. CMP-1's checker counted
    only summary requests and committed compactions as tries, and read a request sent
    over the threshold without trying; a refused ask for the lock, which the store keeps
    (``compression_locks``), is a try too."""
    _world(s, 8479, ReplyFault(call=3, kind=FaultKind.RUN_CODE),
           ReplyFault(call=9, kind=FaultKind.OVERFLOW))
    s.world.tools.slow("read_file", 60.0, path="notes-2.txt", start_delay_s=0.0)
    s.limits(context_window_tokens=600)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.world.tools.slow("read_file", 5.0, path="t-1-build.log")
    s.limits(compression_lock_ttl_s=900.0)
    s.world.lock_stalls["t-1"] = 600.0  # its lock's first holder freezes
    s.bind("p-1", session="s-1")
    one, two = s.main_process(), s.process()
    s.start_submit(two, "p-1", "r-849af4", {"text": "Write note 3 to s-1-out-3.txt."},
                   session="s-1", after_s=13.2)
    s.start_drain(one, "s-1", after_s=17.7)
    s.start_turn("Say hello 1.", session="t-1", process=two, after_s=25.4,
                 injected=MEMORY)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=31.3)
    s.stall(one, 900.0, after_s=31.5)
    s.start_turn("Say hello 3.", session="t-1", process=one, after_s=37.0,
                 injected=MEMORY)
    s.start_turn("Write note 6 to t-1-out-6.txt.", session="t-1", process=two, after_s=62.8)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=70.9)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=74.5)
    s.start_turn("Say hello 9.", session="t-1", process=one, after_s=79.4)
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=85.8)
    s.start_turn("Read notes-2.txt.", session="t-1", process=two, after_s=88.8)
    s.run_all()
    s.world.lock_stalls.clear()  # a freeze not reached is no fault of the calm
    _calm(s)


@scenario("A reply that only reasons (a think block, nothing shown) on the last budget unit "
          "is no answer: the turn ends on its tool result (explored seed 51)",
          invariants=("FIN-6", "LOOP-3"), stage="explore")
def think_only_reply_is_no_answer(s: Story) -> None:
    """With a budget of two and no grace call, a terminal turn reads its build log and its
    next call comes back as an inline think block and nothing else (the ``think_only``
    shape). The loop's bound leaves no unit for the ladder, so the turn ends
    ``pending_tool_result`` (FIN-8), with no answer to deliver. FIN-6's and LOOP-3's
    checkers took any non-blank reply for a text answer and called the turn's ending
    wrong; they now read the text a reader is shown (``thoughts.shown``)."""
    _world(s, 51, ReplyFault(call=14, kind=FaultKind.THINK_ONLY))
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.world.tools.slow("read_file", 20.0, path="t-1-build.log")
    s.limits(iteration_budget=2, grace_call_enabled=False)
    s.bind("p-1", session="s-1")
    s.bind("p-2", session="s-2")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-f3e41e", {"text": "Write note 6 to s-1-out-6.txt."},
                   session="s-1", after_s=39.0)
    s.start_submit(one, "p-1", "r-dd1793", {"text": "Say hello 1."}, session="s-1", after_s=58.0)
    s.start_drain(one, "s-1", after_s=58.0)
    s.start_drain(one, "s-1", after_s=77.0)
    s.start_submit(one, "p-1", "r-e770e6", {"text": "Say hello 3."}, session="s-1", after_s=79.0)
    s.start_submit(one, "p-2", "r-acc004", {"text": "Read notes-2.txt."},
                   session="s-2", after_s=88.0)
    s.start_turn("Write note 1 to t-1-out-1.txt.", session="t-1", process=one, after_s=96.0,
                 injected=MEMORY)
    s.start_turn("Say hello 2. My card is 4417 2210 9932 0071.", session="t-1", process=one, after_s=104.0,
                 injected=FIGURES)
    s.start_drain(one, "s-1", after_s=105.0)
    s.start_submit(one, "p-2", "r-dd1793", {"text": "Say hello 1."}, session="s-2", after_s=107.0)
    s.start_drain(one, "s-2", after_s=109.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=113.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=118.0, injected=MEMORY)
    s.start_drain(one, "s-2", after_s=126.0)
    _calm(s)


@scenario("An overflow on the last call the bound allows is compacted, and the grace call "
          "that follows is the finalizer's own request, not a resend (explored seed 635)",
          invariants=("LOOP-5", "FIN-1"), stage="explore")
def overflow_at_the_bound_then_the_grace_call(s: Story) -> None:
    """With ``max_iterations`` 3 in a 500-token window, a terminal turn's second call is
    refused as too long; the engine compacts (a rotation) and sends it again, smaller,
    and the provider refuses that too, on the turn's last call. The engine compacts
    again, has no call left to resend the request, and the finalizer makes its grace
    call (FIN-1). LOOP-5's checker took the grace request, which carries the grace
    prompt, for the overflowed request sent again without shrinking; after an overflow
    that compacted, a grace call is now read as the finalizer's, and an exit at the bound
    with nothing after it as the bound's (a reading the reply shapes found at seed 635)."""
    _world(s, 635, ReplyFault(call=3, kind=FaultKind.ERRORS_AROUND_OVERFLOW),
           ReplyFault(call=5, kind=FaultKind.EMPTY_REPLY),
           ReplyFault(call=13, kind=FaultKind.OVERFLOW), ReplyFault(call=14, kind=FaultKind.OVERFLOW),
           history_to_compact=12)  # as the shape waited when the seed was shrunk
    s.limits(max_iterations=3)
    s.limits(context_window_tokens=500)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.bind("p-1", session="s-1")
    one = s.main_process()
    s.start_turn("Read notes-2.txt.", session="t-1", process=one, after_s=12.0)
    s.start_turn("Read notes-2.txt.", session="t-1", process=one, after_s=22.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=30.0, injected=MEMORY)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=60.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=62.0)
    _calm(s)


@scenario("A slow tool the user's interrupt closed before the batch deadline keeps the "
          "interrupted text, though the tool ran on past the deadline (explored seed 3147)",
          invariants=("TOOL-5", "FIN-4"), stage="explore")
def interrupt_closes_a_slow_batch_before_its_deadline(s: Story) -> None:
    """A terminal turn's round of reads (its calls under shared ids) holds one that takes
    500 s, past the 420 s batch deadline. The user stops the turn 39 s into the batch: the
    engine closes the open call with the interrupted text (FIN-4) and the turn ends; the
    simulated tool itself runs on to its 500 s. TOOL-5's checker saw a call that ended
    past the deadline with a result other than the timed-out one, and called it the
    call's own late result; a call the user's interrupt closed before the deadline (the
    world's log of interrupts) has the interrupted text as its right result."""
    _world(s, 3147, ReplyFault(call=1, kind=FaultKind.SHARED_CALL_IDS), parts=9)
    s.world.tools.slow("read_file", 500.0, path="notes-2.txt", start_delay_s=0.0)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.bind("p-2", session="s-2")
    one = s.main_process()
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=121.0, injected=FIGURES)
    s.interrupt(after_s=160.0, session="t-1")
    _calm(s)


@scenario("An overflow between two pairs of 503s is no failed call: the turn's count of "
          "failures leaves it out, as the engine does (explored seed 5963)",
          invariants=("LOOP-5",), stage="explore")
def overflow_is_not_a_failed_call(s: Story) -> None:
    """A long turn in a 500-token window gets two 503s, then an overflow; the engine
    compacts, rebuilds the request and goes on, and more 503s and a 429 come later in
    the same turn. ``outer_loop_errors_max`` counts a turn's failed calls, but an overflow
    goes back to preflight before any count (compaction bounds those, CMP-7). LOOP-5's
    checker counted the overflow as one, so it judged the 429 the turn's last allowed
    failure, which must end it, and called the retry after it a violation. Its count now
    leaves out overflows and cut streams whose whole answer was kept, as the engine's does
    (a reading the `errors_around_overflow` shape found once every windowed world drew it)."""
    _world(s, 5963, ReplyFault(call=4, kind=FaultKind.ERRORS_AROUND_OVERFLOW),
           ReplyFault(call=8, kind=FaultKind.EMPTY_REPLY),
           ReplyFault(call=11, kind=FaultKind.SLOW_REPLY, seconds=400.0),
           ReplyFault(call=13, kind=FaultKind.REFUSED_WRITE),
           ReplyFault(call=15, kind=FaultKind.SERVER_ERROR),
           ReplyFault(call=16, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=20, kind=FaultKind.SERVER_ERROR),
           ReplyFault(call=21, kind=FaultKind.EMPTY_REPLY),
           ReplyFault(call=22, kind=FaultKind.RATE_LIMIT, seconds=1.0), parts=9)
    s.limits(context_window_tokens=500)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    one = s.main_process()
    s.delay_reply(11, 400.0)
    s.start_submit(one, "p-2", "r-7ae3cb", {"text": "Go through part-1.txt to part-9.txt in order."},
                   session="s-2", after_s=0.0)
    s.start_drain(one, "s-2", after_s=11.0)
    s.start_turn("Write note 1 to t-1-out-1.txt.", session="t-1", process=one, after_s=15.0,
                 injected="memory: the user signs notes as Ana and works from the Lisbon office")
    _calm(s)


@scenario("A third malformed try that nests past the parser's limit is a local bug, not a "
          "try to record: the turn stops at once (explored seed 4821)",
          invariants=("LOOP-9", "LOOP-5"), stage="explore")
def unprocessable_third_try_stops_the_turn(s: Story) -> None:
    """In a group thread's lane, a turn gets malformed arguments, then a read that parses,
    then malformed arguments twice; the third reply of that run nests its arguments past
    the JSON parser's depth. LOOP-9 records the last malformed try with errors, but a reply
    no retry can make processable is a deterministic local bug, and LOOP-5 stops the turn
    at once as ``local_processing_error``, recording nothing. LOOP-9's checker counted
    that reply as the third malformed try and demanded it recorded; it now leaves such a
    reply to ``local_bug_stops_at_once``."""
    _world(s, 4821, ReplyFault(call=14, kind=FaultKind.MALFORMED_AGAIN),
           ReplyFault(call=18, kind=FaultKind.DEEP_ARGUMENTS))
    s.limits(session_reset_mode="idle", session_idle_minutes=240, session_reset_at_hour=9,
             group_sessions_per_user=False, thread_sessions_per_user=False,
             session_prune_after_s=0.0, stuck_restart_threshold=3)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    lanes = LaneWorld(s, [one], job_s=400.0)
    dm = SessionSource(platform="telegram", chat_type="dm", chat_id="99", participant="42")
    guild = SessionSource(platform="discord", chat_type="group", chat_id="guild-123", participant="bob")
    thread = {"platform": "telegram", "chat_type": "group", "chat_id": "-1002285219667",
              "thread_id": "17585"}
    lanes.message(0, dm, "Write note 1 to lane-out-1.txt.", after_s=2634.3)
    lanes.message(0, dm, "Read notes-1.txt.", after_s=2689.5)
    lanes.message(0, guild, "Write note 3 to lane-out-3.txt.", after_s=12732.1)
    lanes.message(0, guild, "Write note 4 to lane-out-4.txt.", after_s=12765.4)
    lanes.message(0, guild, "Read notes-1.txt.", after_s=12825.9)
    lanes.message(0, SessionSource(**thread, participant="erin"), "Say hello 9.", after_s=41326.4)
    lanes.message(0, SessionSource(**thread, participant="dave"), "Say hello 12.", after_s=60133.6)
    lanes.message(0, SessionSource(**thread, participant="erin"), "Read notes-2.txt.", after_s=60172.2)
    _calm(s)


@scenario("A child session's lease, carried over a compaction, keeps its parent's expiry: "
          "LEASE-2 reads the child's grant as the parent's (explored seed 5565)",
          invariants=("LEASE-2",), stage="explore")
def rotated_child_keeps_the_parents_expiry(s: Story) -> None:
    """A long turn in a 500-token window compacts by rotating to a child session; its
    summaries arrive 30 s late. The lease moves to the child with its token and its
    expiry as they were (the holder's grant did not start again), so the child's row
    shows an expiry less than a TTL after the moment of the rotation. LEASE-2's checker
    took the child's row as a grant made at its own start and called the shorter expiry
    a lease not kept alive; it now reads a carried lease as dated from the parent's last
    grant or refresh (one of four readings the sweep of 5,000-9,999 found, with 8029 and
    8499)."""
    model = _world(s, 5565, ReplyFault(call=7, kind=FaultKind.DROPPED_CALL),
                   ReplyFault(call=8, kind=FaultKind.UNKNOWN_TOOL),
                   ReplyFault(call=9, kind=FaultKind.DROPPED_CALL), parts=9)
    s.limits(context_window_tokens=500)
    model.summarizer.delay_s = 30.0  # every summary arrives this late
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.faults(crash=None, crash_at_effect=None, fail_writes={"admit": 1})
    s.start_submit(one, "p-1", "r-247ae6", {"text": "Write note 5 to s-1-out-5.txt."},
                   session="s-1", after_s=107.0)
    s.start_submit(one, "p-1", "r-247ae6x",
                   {"text": "Write note 5 to s-1-out-5.txt.", "role": "operator"},
                   session="s-1", after_s=125.0)
    s.start_drain(one, "s-1", after_s=194.0)
    s.start_submit(one, "p-1", "r-4c0acc", {"text": "Go through part-1.txt to part-9.txt in order."},
                   session="s-1", after_s=1568.0)
    s.start_drain(one, "s-1", after_s=1587.0)
    _calm(s)


@scenario("An answer held back for verification with whitespace at its edges is the answer "
          "the finalizer delivers when the budget runs out (explored seed 6212)",
          invariants=("FIN-1", "FIN-8", "LOOP-3"), stage="explore")
def padded_held_answer_is_the_answer(s: Story) -> None:
    """With ``verify_before_answer`` on and a budget of three calls, a turn's answer comes
    with whitespace at its edges, and the engine holds it back to verify the file it
    wrote; the budget then runs out, and the finalizer delivers the held answer as it
    came. FIN-1, FIN-8 and LOOP-3's checkers compared the delivered answer to the held one
    stripped, found no match, and so read a turn that ended without an answer or grace
    call; they now match a held answer with or without its edges (with 8168)."""
    _world(s, 6212, ReplyFault(call=10, kind=FaultKind.UNKNOWN_TOOL),
           ReplyFault(call=12, kind=FaultKind.PADDED_ANSWER))
    s.limits(verify_before_answer=True)
    s.world.tools.slow("read_file", 500.0, path="notes-2.txt", start_delay_s=0.0)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.limits(iteration_budget=3)
    for principal, session in (("p-1", "s-1"), ("p-3", "s-3")):
        s.bind(principal, session=session)
        s.bind(f"op-{session}", session=session, role="operator", kind="operator")
    s.bind("q-1", session="s-1")
    one = s.main_process()
    s.start_submit(one, "p-3", "r-d2fad8", {"text": "Write note 1 to s-3-out-1.txt."},
                   session="s-3", after_s=5.0)
    s.start_turn("Read notes-2.txt.", session="t-1", process=one, after_s=6.0,
                 injected="memory: the user signs notes as Ana and works from the Lisbon office")
    s.start_submit(one, "p-1", "r-d2fad8", {"text": "Write note 1 to s-1-out-1.txt."},
                   session="s-1", after_s=14.0)
    s.start_submit(one, "q-1", "r-d2fad8", {"text": "Say hello d2fad8 from q-1."},
                   session="s-1", after_s=17.0)
    s.start_drain(one, "s-1", after_s=21.0)
    s.start_drain(one, "s-1", after_s=49.0)
    s.start_drain(one, "s-3", after_s=72.0)
    s.start_submit(one, "p-1", "r-0172d3",
                   {"text": "Read notes-2.txt and rewrite it as note 71 at /workspace/notes-2.txt."},
                   session="s-1", after_s=104.0)
    s.start_drain(one, "s-1", after_s=107.0)
    _calm(s)


@scenario("A cut-off call a correction cut never reached the loop: the turn takes the "
          "correction in and goes on (explored seed 9526)",
          invariants=("LOOP-9", "LOOP-4"), stage="explore")
def corrected_cut_off_call_is_not_judged(s: Story) -> None:
    """The user corrects a turn while its model call is on its way, and the reply the
    correction cut carried a call whose arguments were cut off. The cut reply never
    reaches the loop (LOOP-4): the iteration starts over with the correction, and the turn
    goes on until ``max_iterations``. LOOP-9's checker judged the cut-off call anyway and
    demanded the turn end truncated; it now leaves a reply a correction cut out, as it
    already did for malformed ones."""
    _world(s, 9526, ReplyFault(call=3, kind=FaultKind.SLOW_REPLY, seconds=400.0),
           ReplyFault(call=6, kind=FaultKind.CUT_OFF_ARGUMENTS), parts=7)
    s.limits(max_iterations=2)
    s.limits(grace_call_enabled=False)
    for principal, session in (("p-1", "s-1"), ("p-2", "s-2")):
        s.bind(principal, session=session)
        s.bind(f"op-{session}", session=session, role="operator", kind="operator")
    one = s.main_process()
    s.delay_reply(3, 400.0)
    s.start_submit(one, "p-2", "r-1b773e", {"text": "Go through part-1.txt to part-7.txt in order."},
                   session="s-2", after_s=1.0)
    correct_at_a_moment(s, "Say hello 71 instead.", after_s=18.0, session="s-1", during="call",
                        slow_s=5.0)
    s.start_submit(one, "p-1", "r-0b1925",
                   {"text": "Read notes-2.txt and rewrite it as note 70 at link-notes-2.txt."},
                   session="s-1", after_s=53.0)
    s.start_drain(one, "s-2", after_s=55.0)
    s.start_submit(one, "p-2", "r-fd974b",
                   {"text": "Write note 83 to drafts/s-2-83.txt and search drafts for it."},
                   session="s-2", after_s=95.0)
    s.start_drain(one, "s-1", after_s=102.0)
    s.start_drain(one, "s-2", after_s=104.0)
    s.run_all()
    s.world.moments.clear()  # nor a correction held for a moment not reached
    _calm(s)
