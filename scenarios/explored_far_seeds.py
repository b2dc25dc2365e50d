"""Stories the explorer found in seeds 10,000-19,999, the first sweep past 9,999, each a
shrunk seed (``hermes-ref explore --shrink SEED``) red before its fix, on the engine or on a
checker, as each story says. The calls are the explorer's own, so each replays the run it
came from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.limits import ProviderRoute
from scenarios._explored_common import calm as _calm
from scenarios._explored_common import world as _world
from sim.explore.edges import handed_history
from sim.explore.plan import FaultKind, ReplyFault
from sim.harness import Story, scenario
from sim.interventions import correct_at_a_moment


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
