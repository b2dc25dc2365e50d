"""Stories the explorer found in seeds 20,000-29,999, the first sweep past 19,999, each a
shrunk seed (``hermes-ref explore --shrink SEED``) red before its fix, as each story says.
The calls are the explorer's own, so each replays the run it came from, then the calm
phase.
"""

from __future__ import annotations

from hermes_ref.limits import ProviderRoute
from scenarios._explored_common import calm as _calm
from scenarios._explored_common import world as _world
from sim.explore.edges import handed_history
from sim.explore.plan import FaultKind, ReplyFault
from sim.harness import Story, scenario
from sim.interventions import correct_at_a_moment

FIGURES = "memory: the user keeps the quarterly figures in notes-1.txt and prefers short answers"
SIGNATURE = "memory: the user signs notes as Ana and works from the Lisbon office"


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
