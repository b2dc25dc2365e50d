"""Stories the explorer found about the user's corrections (LOOP-4): a correction that cut
the grace call, one taken in by a turn whose lease was gone, one sent to a turn whose
session rotated mid-way, and the hidden row a correction left, counted against a
fallback's window. Each is a shrunk seed (``hermes-ref explore --shrink SEED``, the third
and the fourth trimmed by hand to their one session), red before its fix; the calls are
the explorer's own, so each replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.limits import ProviderRoute
from scenarios._explored_common import calm as _calm
from scenarios._explored_common import world as _world
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import redirect_a_running_turn
from sim.harness import Story, scenario


@scenario("A correction that cuts the grace call is taken in as a user row, and the turn "
          "ends saying it has no answer (explored seed 2857)",
          invariants=("LOOP-4", "FIN-6"), stage="explore")
def correction_cuts_the_grace_call(s: Story) -> None:
    """A budget of one: the second turn's only call reads a note, and its grace call, after
    the primary's outage, goes to the fallback, whose reply is slow; the user corrects the
    turn while it waits. The engine dropped the correction: the finalizer's grace call is
    made after the loop, where no iteration drains corrections, so the turn ended
    ``pending_tool_result`` and the user's word was neither stored nor answered (LOOP-4:
    the correction is a real user row). The finalizer now takes it in, the cut reply as its
    visible text, and the turn ends on its budget with no answer. FIN-6's checker also took
    the cut reply for the model's answer: a stream a correction cut is no answer."""
    model = _world(s, 2857, ReplyFault(call=1, kind=FaultKind.DEEP_ARGUMENTS),
                   ReplyFault(call=7, kind=FaultKind.SLOW_REPLY, seconds=400.0), grace_outages=(1,))
    s.limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=4000,
                                               token_ratio=1.25),))
    s.use_provider_for("fallback-small", model.for_fallback())
    s.limits(iteration_budget=1)
    s.bind("p-1", session="s-1")
    one = s.main_process()
    s.delay_reply(7, 400.0)
    s.start_submit(one, "p-1", "r-039b97", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-1", after_s=19.0)
    s.start_submit(one, "p-1", "r-2fe5d2", {"text": "Read notes-2.txt."}, session="s-1", after_s=20.0)
    s.start_drain(one, "s-1", after_s=32.0)
    s.start_drain(one, "s-1", after_s=35.0)
    redirect_a_running_turn(s, "Say hello 94 instead.", after_s=73.0, session="s-1")
    _calm(s)


@scenario("A turn whose lease went while it waited takes in a correction and stores "
          "nothing of it (explored seed 1582)", invariants=("LOOP-4", "LEASE-4"), stage="explore")
def correction_after_the_lease_went(s: Story) -> None:
    """The second turn waits on its last call when its process stalls for 900 s, past the
    lease's 300 s; the user's correction cuts the call. When the process wakes, the turn
    takes the correction in, and its write is fenced: the lease is gone, and the turn ends
    interrupted. LOOP-4's checker demanded a user row holding the correction, which LEASE-4
    forbids: the old holder writes nothing after the loss."""
    _world(s, 1582, ReplyFault(call=1, kind=FaultKind.RATE_LIMIT, seconds=1.0),
           ReplyFault(call=3, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=6, kind=FaultKind.SLOW_REPLY, seconds=5.0))
    s.bind("p-2", session="s-2")
    one, two = s.main_process(), s.process()
    s.delay_reply(6, 5.0)
    s.start_submit(one, "p-2", "r-0779db", {"text": "Read notes-2.txt."}, session="s-2", after_s=70.0)
    s.start_drain(two, "s-2", after_s=77.0)
    s.start_submit(two, "p-2", "r-4a15df", {"text": "Write note 4 to s-2-out-4.txt."},
                   session="s-2", after_s=80.0)
    s.start_drain(two, "s-2", after_s=83.0)
    s.stall(two, 900.0, after_s=86.0)
    redirect_a_running_turn(s, "Say hello 32 instead.", after_s=95.0, session="s-2")
    _calm(s)


@scenario("A correction reaches a turn whose session rotated mid-way (explored seed 1606)",
          invariants=("LOOP-4", "CMP-5"), stage="explore")
def correction_after_a_rotation(s: Story) -> None:
    """A nine-part chore in a window of 400 tokens: before its last call the turn compacts
    and rotates ``s-3`` to a child (CMP-5), and the user corrects it while that call is
    slow. The world queued the correction under ``s-3``, the session the user addressed,
    and the turn drained the child's queue: it never took the correction in. The world's
    queue was the session's and outlived processes too, so a correction a turn left could
    be taken in by a turn of another process (seed 1181). A correction is sent to the turn
    that runs, in its process: the world now queues it for that turn."""
    _world(s, 1606, ReplyFault(call=10, kind=FaultKind.SLOW_REPLY, seconds=90.0), parts=9)
    s.limits(context_window_tokens=400)
    s.bind("p-3", session="s-3")
    one = s.main_process()
    s.delay_reply(10, 90.0)
    s.start_submit(one, "p-3", "r-a24a2e", {"text": "Go through part-1.txt to part-9.txt in order."},
                   session="s-3", after_s=0.0)
    s.start_drain(one, "s-3", after_s=36.0)
    redirect_a_running_turn(s, "Say hello 18 instead.", after_s=66.0, session="s-3")
    _calm(s)


@scenario("A grace call that falls back after a correction is measured by what it sends: the "
          "hidden row the correction left costs no tokens (explored seed 3105)",
          invariants=("LOOP-6", "CMP-7", "LOOP-4"), stage="explore")
def hidden_row_costs_the_fallback_nothing(s: Story) -> None:
    """A budget of two: the turn's first call is slow, and the user's correction cuts it
    before it showed anything, so the cut reply is stored as a hidden row, then the user's
    row. The second call drops its tool call, and the grace call meets an outage on the
    primary: four 503s spend its retries and the turn falls back to ``fallback-small``
    (200 tokens, 160 in the engine's estimate). The request it would send comes to 159;
    preflight counted 163 and did not send it, for the transcript's running total still
    held the hidden row that ``build_request`` keeps off the wire. The total now counts
    only what a request carries, and the fallback sends the summary."""
    model = _world(s, 3105, ReplyFault(call=1, kind=FaultKind.SLOW_REPLY, seconds=400.0),
                   ReplyFault(call=2, kind=FaultKind.DROPPED_CALL), grace_outages=(1,))
    s.limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=200,
                                               token_ratio=1.25),))
    s.use_provider_for("fallback-small", model.for_fallback())
    s.limits(iteration_budget=2)
    s.bind("p-1", session="s-1")
    one = s.main_process()
    s.delay_reply(1, 400.0)
    s.start_submit(one, "p-1", "r-0a0850", {"text": "Read notes-2.txt."}, session="s-1", after_s=24.0)
    s.start_drain(one, "s-1", after_s=28.0)
    redirect_a_running_turn(s, "Say hello 59 instead.", after_s=66.0, session="s-1")
    _calm(s)
