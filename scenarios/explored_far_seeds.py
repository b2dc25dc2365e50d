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
from sim.explore.lanes import LaneWorld
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import redirect_a_running_turn
from sim.harness import Story, scenario


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
