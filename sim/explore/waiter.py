"""A lane turn that waits out another process's rotation of its lane, one part drawn from a
sub-stream of its own ("waiter").

Explored seed 14792 met a world the fix of seed 44893 left open (CMP-4 across CMP-5). Two
processes served one telegram lane in a 250-token window with summaries 180 s late. pid=1's
turn compacted the lane twice, neither pass bringing the request under the threshold, so it
ended on a child it had rotated to, carrying two ineffective passes in a row and no cache of
that child. pid=2's turn was next on the child, compacted it and rotated it again; meanwhile
pid=1's next turn asked for the child and waited for its lease. Once it held the lease, at
the new tip, pid=1 looked its lineage's memory up (``hermes_ref.prologue._lineage_memory``)
and must read the child's row again: as it read it when it asked, the child had not ended
by compression, the walk stopped there and the turn compacted a third time. Blind seeds met
that world three times in 50,000: it needs pid=1 to serve the lane last with the rotating
turn, another process to be next, and pid=1 to come back within the other's compaction.

This part makes the moment on purpose (with the small window's kind in the mix too, as
the window is a small window's), in worlds with lanes and two or three processes
that no process dies in or restarts, with no window yet (``sim/explore/lineage.py`` takes
the windowed ones), no tight budget and no verification gate (as ``plan.window_allowed``
keeps them from small windows). The window is 250 tokens and every summary arrives
``DELAY_S`` late (a delay the world has already stays: ``delay`` below); the chat clients
go, as a rotation moves a session's stream, and so do the world's summary failures, whose
cooldown would keep both processes from compacting, and a lease wait shorter than a pass.
One lane that has spoken gets ``CHATTER`` more messages on the process of its first (A),
each ``SPACING`` delays after the last, and its chat's other messages and resets meanwhile
go: A's turns run one at a time, and a turn that compacts, and another process's pass after
it, are over before A's next message comes, so A has none waiting when its rotating turn
ends. In a 250-token window that turn's passes seldom bring the request under the
threshold: either it rotates twice, or it rotates once and its next pass finds nothing to
compact, and either way it ends on the child with two ineffective passes in a row. Two
more messages of the lane are held from the instant after its first:

* one on another process (B) until the lane's session rotates, arriving ``NUDGE_S`` later
  (``LaneMessage.after_rotation_s``), while A's turn may compact again, and it waits for
  the lease. When A's turn ends it is the only turn waiting, so B serves the child A's turn
  ended on, of which B remembers nothing: over the threshold, B compacts it, and its pass
  waits ``delay`` seconds for the summary under the lease;
* one on A until a process other than A asks for a summary of the lane's session
  (``LaneMessage.at_pass_elsewhere``): B's pass. A asks for the child its own turn ended
  on, of which it holds no cache, only the memory it carried there, and waits for the
  lease while B rotates that child.

The kind counts as fired when a lane turn waited for a session's lease as it rotated, on a
process with no cache of it and with a memory of its lineage (``LaneWorld._waits_past``).
It is drawn after every other part, and a world that does not draw it keeps its plan and
its record byte for byte. Its kind is drawn nowhere else.
"""

from __future__ import annotations

import random

from hermes_ref.session import SessionSource
from sim.explore.lanes import LaneMessage, LaneReset
from sim.explore.plan import FaultKind, Kill, WorldPlan

SHARE = 1.0  # of the worlds it takes (a share kept to tune by: every one, now)
WINDOW = 250  # tokens, as in ``sim/explore/lineage.py``
DELAY_S = 180.0  # each summary arrives this late, unless the world has a delay already
CHATTER = 6  # more messages of the lane on A, after its first
SPACING = (3.2, 3.8)  # delays between two of them: two passes of A's and one of B's fit
NUDGE_S = 1.0  # B's message arrives this long after the rotation
TEXTS = ("Say hello {n}.", "Read notes-1.txt.", "Write note {n} to lane-out-{n}.txt.")


def draw(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan) -> WorldPlan:
    """``plan`` with a lane that chats on one process, a message on another held for its
    rotation and one back on the first held for the other's pass, in ``SHARE`` of the worlds
    with lanes and more than one process that no process dies in (see the module
    docstring)."""
    lanes = plan.lanes
    if not {FaultKind.WAIT_PAST_ROTATION, FaultKind.SMALL_WINDOW} <= kinds or lanes is None \
            or plan.processes < 2 \
            or plan.context_window is not None or lanes.restarts \
            or any(isinstance(s, Kill) for s in plan.steps) or plan.crash is not None \
            or plan.crash_at_effect is not None \
            or plan.iteration_budget is not None or plan.verify_before_answer:
        return plan  # a dead process remembers nothing; the other aimed parts keep theirs;
    # and a small window takes no tight budget or gate beside it (``plan.window_allowed``)
    spoken = [e for e in lanes.events if isinstance(e, LaneMessage)]
    rng = random.Random(f"{seed}:waiter")
    if not spoken or rng.random() >= SHARE:
        return plan
    source = rng.choice(spoken).source  # a lane that speaks most is likelier chosen
    first = next(e for e in spoken if e.source == source)
    other = rng.choice([p for p in range(plan.processes) if p != first.process])
    delay = plan.summary_delay_s or DELAY_S
    at, added = first.at_s, list[LaneMessage]()
    for n in range(CHATTER):  # the lane's history grows past the window, one turn at a time
        at = round(at + delay * rng.uniform(*SPACING), 1)
        added.append(LaneMessage(at_s=at, process=first.process, source=source,
                                 text=rng.choice(TEXTS).format(n=400 + n)))
    until = at + 3 * delay  # the lane's own talk, and its resets, go meanwhile: the
    kept = [e for e in lanes.events  # part's messages are all it says then
            if not (isinstance(e, LaneMessage | LaneReset) and _chat(e.source) == _chat(source)
                    and first.at_s < e.at_s <= until)]
    held = round(first.at_s + 1.0, 1)
    added.append(LaneMessage(at_s=held, process=other, source=source,
                             text=f"Say hello {rng.randint(500, 599)}.", after_rotation_s=NUDGE_S))
    added.append(LaneMessage(at_s=held, process=first.process, source=source,
                             text=f"Say hello {rng.randint(600, 699)}.", at_pass_elsewhere=True))
    events = sorted((*kept, *added), key=lambda e: e.at_s)
    wait = plan.lease_wait_s  # a waiter must outlast B's pass
    return plan.model_copy(update={
        "context_window": WINDOW, "clients": (),  # a client follows one session id
        "summary_delay_s": delay, "summary_failures": (), "summary_timeouts": (),
        "lease_wait_s": wait if wait is None or wait >= 3 * delay else None,
        "lanes": lanes.model_copy(update={"events": tuple(events)})})


def _chat(source: SessionSource) -> tuple[str, str, str | None, str | None]:
    """The chat a source speaks in: its lane, or the lane it shares with the chat's others."""
    return source.platform, source.chat_type, source.chat_id, source.thread_id
