"""A lane's message that arrives as its session rotates, one part drawn from a sub-stream
of its own ("lineage").

Explored seed 44893 found a real defect (CMP-4 across CMP-5): in a small window a lane's
turn compacted twice before its call, rotating its session twice, and neither pass
brought the request under the threshold. The lane's next message arrived between the two
rotations, was routed to the first child and waited for the lease there. When it got the
lease it reached the tip with the compression memory it had built for the first child,
not the one the rotating turn carried, so it compacted a third time although two
ineffective passes in a row block automatic compaction. The fix hands such a turn the
memory of its lineage (``hermes_ref.prologue._lineage_memory``). Blind seeds seldom meet
that world: a lane's messages come 25-90 s apart, and the window between two rotations of
one turn is the summary's delay long and opens only where a pass is ineffective.

This part makes the moment on purpose. It takes every world with lanes that no process
dies in and that has a small window, or could have one as the context part draws it (one
process, no tight budget, no verification gate: ``plan.window_allowed``). There the window
is 250 tokens (the smallest the context part draws, where a pass seldom brings a request
under the threshold; the chat clients go, as a rotation moves a session's stream); in
half of them every summary arrives ``DELAY_S`` late (a delay the world has already stays);
one lane that has spoken gets ``CHATTER`` more messages, and one more message of it is
held until that lane's session rotates (``LaneMessage.at_rotation``): it arrives in the
rotation's instant, while the turn that compacted may still compact again, and waits for
the lease on the child. With the summaries late it arrives between two rotations and
asks for the first child; with them on time both rotations share one instant and it asks
for the tip itself (seed 153 found that path's defect).

It is drawn after every other part, and a world that does not draw it keeps its plan and
its record byte for byte. Its kind is drawn nowhere else.
"""

from __future__ import annotations

import random

from sim.explore.lanes import LaneMessage
from sim.explore.plan import FaultKind, Kill, WorldPlan, window_allowed

SHARE = 1.0  # of the worlds it takes (a share kept to tune by: every one, now)
WINDOW = 250  # tokens
DELAY_S = 180.0  # each summary arrives this late, as in seed 44893, in LATE_SHARE of them
LATE_SHARE = 0.5
CHATTER = 4  # more messages of the lane, 20-40 s apart, after its first
TEXTS = ("Say hello {n}.", "Read notes-1.txt.", "Write note {n} to lane-out-{n}.txt.")


def draw(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan) -> WorldPlan:
    """``plan`` with a lane message held for its lane's rotation, in ``SHARE`` of the worlds
    with a small window and lanes (see the module docstring)."""
    lanes = plan.lanes
    windowed = plan.context_window is not None or (  # or one as the context part draws it,
        window_allowed(kinds, plan.processes)  # with no tight budget and no gate beside it
        and plan.iteration_budget is None and not plan.verify_before_answer)
    if FaultKind.LANE_AT_ROTATION not in kinds or lanes is None or not windowed \
            or any(isinstance(s, Kill) for s in plan.steps) or plan.crash is not None \
            or plan.crash_at_effect is not None:
        return plan  # a dead process hands no lane anything
    spoken = [e for e in lanes.events if isinstance(e, LaneMessage)]
    rng = random.Random(f"{seed}:lineage")
    if not spoken or rng.random() >= SHARE:
        return plan
    source = rng.choice(spoken).source  # a lane that speaks most is likelier chosen
    first = next(e for e in spoken if e.source == source)
    at = first.at_s
    chatter = []
    for n in range(CHATTER):  # the lane's history grows past the window within minutes
        at = round(at + rng.uniform(20.0, 40.0), 1)
        chatter.append(LaneMessage(at_s=at, process=first.process, source=source,
                                   text=rng.choice(TEXTS).format(n=200 + n)))
    held = LaneMessage(at_s=round(first.at_s + 1.0, 1), process=first.process, source=source,
                       text=f"Say hello {rng.randint(100, 199)}.", at_rotation=True)
    events = sorted((*lanes.events, *chatter, held), key=lambda e: e.at_s)
    late = rng.random() < LATE_SHARE
    return plan.model_copy(update={
        "context_window": WINDOW, "clients": (),  # a client follows one session id
        "summary_delay_s": plan.summary_delay_s or (DELAY_S if late else None),
        "lanes": lanes.model_copy(update={"events": tuple(events)})})
