"""A summary that fails right after a slow one, and the user back at the cooldown's edge:
one part drawn from a sub-stream of its own ("cooldown").

Explored seed 7922 found a real defect (CMP-4): in a small window with summaries 180 s
late, a turn compacted twice before its call. The first pass waited 180 s for its summary
and rotated the session; the second pass's summary failed at once. The engine started the
600 s cooldown at the instant the turn had decided to compact, 180 s before the failure,
so the lane's next turn, 430 s after the failure, asked for a summary the cooldown should
have refused. The fix reads the clock at the failure (``hermes_ref.compaction.run_pass``).
Blind seeds met that world about once in 8,000: it needs a failure in the very pass after
a slow one, and a turn of the same lineage in the 180 s the defect takes off the cooldown.

This part makes the moment on purpose, in the worlds ``sim/explore/lineage.py`` made
(a small window, a lane that chats past it, a message held for its rotation) that have
one process and whose summaries arrive late. (The cooldown it aims at is one process's
own memory; the lineage part's worlds with more processes, where one process's turn
meets a child another process rotated to, are left as they are.) There:

* the summarizer stumbles: a summary asked in the very instant its last late summary
  arrived fails (``WorldPlan.summary_stumbles``, ``edges.FlakySummarizer``), which is the
  pass after a slow pass in one preflight; no other summary fails (the world's numbered
  summary failures and timeouts go), so the failure the held message answers is that one;
* one more message of the chatting lane is held until a summary of its lane's session
  fails and arrives ``cooldown - delay * u`` seconds later, ``u`` drawn in ``RETURN_U``
  (``LaneMessage.after_failure_s``): inside the cooldown that runs from the failure, after
  the one that would run from the decision.

It is drawn after every other part, and a world that does not draw it keeps its plan and
its record byte for byte. Its kind is drawn nowhere else.
"""

from __future__ import annotations

import random

from hermes_ref.limits import Limits
from sim.explore.lanes import LaneMessage
from sim.explore.plan import FaultKind, WorldPlan

SHARE = 1.0  # of the worlds it takes (a share kept to tune by: every one, now)
RETURN_U = (0.2, 0.7)  # the user comes back this share of the summary's delay before the
COOLDOWN_S = Limits().compression_cooldown_s  # cooldown that runs from the failure ends


def draw(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan) -> WorldPlan:
    """``plan`` with a stumbling summarizer and a lane message held for its failure, in
    ``SHARE`` of the lineage part's one-process worlds with late summaries (see the module
    docstring)."""
    lanes, delay = plan.lanes, plan.summary_delay_s
    if FaultKind.COOLDOWN_EDGE not in kinds or lanes is None or delay is None \
            or plan.processes > 1:
        return plan
    held = next((e for e in lanes.events if isinstance(e, LaneMessage) and e.at_rotation), None)
    rng = random.Random(f"{seed}:cooldown")
    if held is None or rng.random() >= SHARE:
        return plan
    back = LaneMessage(at_s=round(held.at_s + 1.0, 1), process=held.process,
                       source=held.source, text=f"Say hello {rng.randint(300, 399)}.",
                       after_failure_s=round(COOLDOWN_S - delay * rng.uniform(*RETURN_U), 1))
    events = sorted((*lanes.events, back), key=lambda e: e.at_s)
    return plan.model_copy(update={
        "summary_stumbles": True, "summary_failures": (), "summary_timeouts": (),
        "lanes": lanes.model_copy(update={"events": tuple(events)})})
