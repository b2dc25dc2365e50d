"""Stories the explorer found in the loop under provider faults: empty and reasoning-only
replies, errors that are retried, the iteration budget and the grace call. Each is a shrunk
seed (``hermes-ref explore --shrink SEED``; seed 4850's cut by hand to its one session),
red before its fix. The calls are the explorer's own (``sim.explore.run.stage``), so each
replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.limits import ProviderRoute
from scenarios._explored_common import calm as _calm
from scenarios._explored_common import world as _world
from sim.explore.edges import handed_history
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import calm_phase, jump_clock
from sim.harness import Story, scenario


@scenario("A model that reasons the same words twice is prefilled twice into the same request "
          "(explored seed 1547)",
          invariants=("LOOP-8",), stage="explore")
def the_same_reasoning_prefilled_twice(s: Story) -> None:
    """Two replies in a row only reason, both "Thinking it over.". The first is handed back
    as a thinking prefill; the second is prefilled too, and its prefill takes the place of
    the first, so the third request is the second one again, byte for byte. LOOP-8's
    checker read a request sent again as a retry and demanded the prefill it could not
    see; the two rungs look alike here, and it now reads the request as the one due."""
    _world(s, 1547, ReplyFault(call=1, kind=FaultKind.REASONING_ONLY),
           ReplyFault(call=2, kind=FaultKind.REASONING_ONLY))
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    s.bind("q-1", session="s-1")
    one = s.main_process()
    s.start_submit(one, "q-1", "r-abf808", {"text": "Say hello abf808 from q-1."},
                   session="s-1", after_s=110.0)
    s.start_drain(one, "s-1", after_s=117.0)
    _calm(s)


@scenario("A user who stops a turn while its grace call waits out an outage stops the retries "
          "(explored seed 1060)",
          invariants=("LOOP-5",), stage="explore")
def interrupted_while_the_grace_call_backs_off(s: Story) -> None:
    """A budget of two: a rate limit, a dropped call, then a write round spends the second
    unit, and the grace call meets an outage. Between its third 503 and the next retry the
    user stops the turn, which ends ``pending_tool_result``: at the grace call the exit
    rests on the round's result (FIN-8). LOOP-5's checker excused an interrupt only when
    the exit said ``interrupted`` and called the stop a retry skipped; it now also excuses
    an interrupted turn whose last call was its grace call, as FIN-4's checker does."""
    _world(s, 1060, ReplyFault(call=2, kind=FaultKind.RATE_LIMIT, seconds=20.0),
           ReplyFault(call=3, kind=FaultKind.DROPPED_CALL), grace_outages=(1,))
    s.limits(iteration_budget=2)
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    one = s.main_process()
    s.faults(crash=None, crash_at_effect=None, fail_writes={"tool_results": 1})
    s.start_submit(one, "p-2", "r-a7a796", {"text": "Write note 2 to s-2-out-2.txt."},
                   session="s-2", after_s=39.0)
    s.start_drain(one, "s-2", after_s=51.0)
    s.start_submit(one, "p-2", "r-64368a", {"text": "Write note 3 to s-2-out-3.txt."},
                   session="s-2", after_s=56.0)
    s.start_drain(one, "s-2", after_s=66.0)
    s.interrupt(after_s=93.0, session="s-2")
    _calm(s)


@scenario("A turn whose lease is lost while it compacts after an overflow ends interrupted "
          "(explored seed 1369)",
          invariants=("LOOP-5",), stage="explore")
def lease_lost_while_compacting_after_an_overflow(s: Story) -> None:
    """On a window of 500 tokens the terminal's last turn reads its build log, and its next
    request overflows. Back in preflight it compacts, and its process freezes for 400 s
    holding the session's compression lock; the lease lapses, the rotation's write is
    fenced, and the turn ends ``interrupted``, as a turn whose lease is gone does
    (LEASE-4). LOOP-5's checker demanded preflight's fail-closed exit after the overflow;
    it now excuses a turn stopped from outside, by the user or the loss of its lease."""
    _world(s, 1369, ReplyFault(call=5, kind=FaultKind.REASONING_ONLY),
           ReplyFault(call=7, kind=FaultKind.EMPTY_REPLY), ReplyFault(call=18, kind=FaultKind.OVERFLOW))
    s.world.tools.slow("read_file", 60.0, path="notes-1.txt", start_delay_s=0.0)
    s.limits(context_window_tokens=500)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.world.lock_stalls["t-1"] = 400.0  # its lock's first holder freezes
    for k in (1, 2, 3):
        s.bind(f"p-{k}", session=f"s-{k}")
        s.bind(f"op-s-{k}", session=f"s-{k}", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-11ad60", {"text": "Say hello 3."}, session="s-1", after_s=12.0)
    s.start_submit(one, "p-2", "r-d0a533", {"text": "Say hello 2."}, session="s-2", after_s=13.0)
    s.start_drain(one, "s-2", after_s=30.0)
    s.start_submit(one, "p-3", "r-d0a533", {"text": "Read notes-2.txt."}, session="s-3", after_s=31.0)
    s.start_submit(one, "p-2", "r-11ad60", {"text": "Say hello 3."}, session="s-2", after_s=33.0)
    s.start_drain(one, "s-3", after_s=34.0)
    s.start_submit(one, "p-3", "r-01e22d", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-3", after_s=38.0)
    s.start_drain(one, "s-1", after_s=39.0)
    s.start_drain(one, "s-2", after_s=40.0)
    s.start_submit(one, "p-1", "r-7306d7", {"text": "Say hello 5."}, session="s-1", after_s=41.0)
    s.start_drain(one, "s-1", after_s=43.0)
    s.start_drain(one, "s-3", after_s=44.0)
    s.start_turn("Say hello 1. My card is 4417 2210 9932 0071.", session="t-1", process=one,
                 after_s=51.0, injected="memory: last week the user asked for every change to be "
                 "written to its own file")
    s.start_turn("Write note 2 to t-1-out-2.txt.", session="t-1", process=one, after_s=60.0,
                 injected="memory: the user keeps the quarterly figures in notes-1.txt and prefers "
                 "short answers")
    s.start_submit(one, "p-1", "r-4906a4x", {"text": "Write note 4 to s-1-out-4.txt.", "role": "operator"},
                   session="s-1", after_s=68.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=71.0,
                 injected="memory: last week the user asked for every change to be written to its "
                 "own file")
    s.start_drain(one, "s-1", after_s=97.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=98.0)
    s.run_all()
    s.world.lock_stalls.clear()  # nor a freeze not reached
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A round of execute_code the user stops while it runs costs no budget unit "
          "(explored seed 2710)",
          invariants=("LOOP-2",), stage="explore")
def execute_code_round_interrupted_is_refunded(s: Story) -> None:
    """The clock jumps 400 s; the turn's one reply runs ``execute_code``, and the user stops
    the turn while the code runs. The round's row is stored and called only a refundable
    tool, yet the turn ended with its unit spent (1/1): the refund waited for the round
    to finish, and the interrupt ended it first. LOOP-2 refunds a round that used only
    refundable tools, whatever becomes of it once recorded; the engine now refunds when
    the round's row is durable."""
    _world(s, 2710, ReplyFault(call=1, kind=FaultKind.RUN_CODE))
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    jump_clock(s, 400.0, after_s=38.0)
    s.start_submit(one, "p-1", "r-41cd28", {"text": "Write note 2 to s-1-out-2.txt."},
                   session="s-1", after_s=46.0)
    s.start_drain(one, "s-1", after_s=76.0)
    s.interrupt(after_s=91.0, session="s-1")
    _calm(s)


@scenario("A dropped call whose re-prompt preflight refuses ends the turn failed closed "
          "(explored seed 2055)",
          invariants=("LOOP-7",), stage="explore")
def dropped_call_whose_re_prompt_does_not_fit(s: Story) -> None:
    """A window of 320 tokens, a ten-part chore that fills it, and a later turn whose first
    reply is empty and whose second is a dropped call. The re-prompt adds its scaffolding
    pair, preflight can compact no further, and the turn ends
    ``context_compression_exhausted`` with the re-prompt unsent (CMP-7). LOOP-7's checker
    counted only the budget's end and a terminal error as stopping a re-prompt from
    outside; a preflight refusal does too. (With a fallback route, as in the seed, LOOP-2's
    checker also took the dropped call for an empty reply whose ladder fell back, and
    looked for the refund of a hop never made: ``tests/unit/test_retry_checkers.py``.)"""
    _world(s, 2055, ReplyFault(call=3, kind=FaultKind.UNKNOWN_TOOL),
           ReplyFault(call=5, kind=FaultKind.EMPTY_REPLY),
           ReplyFault(call=6, kind=FaultKind.BAD_ARGUMENTS), ReplyFault(call=8, kind=FaultKind.OUTAGE),
           ReplyFault(call=13, kind=FaultKind.EMPTY_REPLY),
           ReplyFault(call=14, kind=FaultKind.DROPPED_CALL), parts=10)
    s.limits(context_window_tokens=320)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-800889", {"text": "Go through part-1.txt to part-10.txt in order."},
                   session="s-1", after_s=0.0)
    s.start_drain(one, "s-1", after_s=13.0)
    s.start_submit(one, "p-1", "r-76ca79", {"text": "Say hello 99."}, session="s-1", after_s=16.0)
    s.start_turn("Say hello 80.", session="h-1", process=one, after_s=25.0, history=handed_history(3))
    s.start_drain(one, "s-1", after_s=28.0)
    _calm(s)


@scenario("An empty reply after a write round keeps its budget unit when preflight refuses its "
          "nudge: the nudge is no fallback hop (explored seed 4850)",
          invariants=("LOOP-2", "LOOP-8"), stage="explore")
def refused_nudge_after_a_write_keeps_its_unit(s: Story) -> None:
    """A window of 250 tokens and a fallback route: the third turn writes a note, and the
    reply after its write round is empty. The ladder's rung due is the nudge after a tool
    round (LOOP-8), on the same route; the nudged request does not fit and preflight fails
    the turn closed, two calls made, two units spent (LOOP-2: one unit per model call).
    LOOP-2's checker took every refused request after an empty reply on a route with a
    fallback for the ladder's fallback, whose hop gives back the empty call's unit, and
    counted one unit too many; it now asks the ladder which rung was due."""
    model = _world(s, 4850, ReplyFault(call=6, kind=FaultKind.EMPTY_REPLY))
    s.limits(context_window_tokens=250)
    s.limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=200,
                                               token_ratio=1.25),))
    s.use_provider_for("fallback-small", model.for_fallback())
    s.bind("p-1", session="s-1")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-34bf82", {"text": "Read notes-2.txt."}, session="s-1", after_s=4.0)
    s.start_submit(one, "p-1", "r-022592", {"text": "Write note 5 to s-1-out-5.txt."},
                   session="s-1", after_s=21.0)
    s.start_submit(one, "p-1", "r-cd9be7", {"text": "Write note 2 to s-1-out-2.txt."},
                   session="s-1", after_s=21.0)
    for after_s in (28.0, 38.0, 42.0):
        s.start_drain(one, "s-1", after_s=after_s)
    _calm(s)


@scenario("A dropped call at the last allowed call leaves its re-prompt in the grace request, "
          "which then does not fit (explored seed 1438)",
          invariants=("FIN-1", "LOOP-7"), stage="explore")
def grace_request_carries_the_dropped_call_re_prompt(s: Story) -> None:
    """``max_iterations`` 2 and a window of 250 tokens: a turn's second call is a dropped
    call. The loop re-prompts it (the reply and a nudge, scaffolding in the working list)
    and reaches its bound, so the finalizer asks for the grace summary with that pair
    still in the request, as Hermes does; the request is over the window and is not sent
    (CMP-7), and the turn ends on its tool result (FIN-8). FIN-1's and LOOP-7's checkers
    rebuilt the grace request from the stored rows alone, found it fitted, and demanded a
    grace call; they now count the re-prompt pair the dropped call left."""
    _world(s, 1438, ReplyFault(call=1, kind=FaultKind.SERVER_ERROR),
           ReplyFault(call=4, kind=FaultKind.RATE_LIMIT, seconds=20.0),
           ReplyFault(call=9, kind=FaultKind.SERVER_ERROR), ReplyFault(call=13, kind=FaultKind.SERVER_ERROR),
           ReplyFault(call=15, kind=FaultKind.DROPPED_CALL))
    s.limits(max_iterations=2)
    s.limits(context_window_tokens=250)
    for k in (1, 2, 3):
        s.bind(f"p-{k}", session=f"s-{k}")
        s.bind(f"op-s-{k}", session=f"s-{k}", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-2", "r-859ec2",
                   {"text": "Read notes-2.txt and rewrite it as note 71 at notes-2.txt."},
                   session="s-2", after_s=17.8)
    s.start_submit(one, "p-1", "r-a59beb",
                   {"text": "Read notes-2.txt and rewrite it as note 70 at /workspace/notes-2.txt."},
                   session="s-1", after_s=26.7)
    s.start_drain(one, "s-1", after_s=31.1)
    s.start_submit(one, "p-1", "r-48e6da", {"text": "Say hello 99."}, session="s-1", after_s=67.1)
    s.start_drain(one, "s-1", after_s=67.6)
    s.start_submit(one, "p-3", "r-48e6da", {"text": "Read notes-2.txt."}, session="s-3", after_s=86.0)
    s.start_drain(one, "s-3", after_s=89.3)
    s.start_drain(one, "s-2", after_s=90.5)
    s.start_submit(one, "p-3", "r-674ee8", {"text": "Write note 1 to s-3-out-1.txt."},
                   session="s-3", after_s=96.0)
    s.start_drain(one, "s-3", after_s=100.7)
    s.start_submit(one, "p-2", "r-4a88f5", {"text": "Read notes-2.txt."}, session="s-2", after_s=104.1)
    s.start_drain(one, "s-2", after_s=104.2)
    _calm(s)
