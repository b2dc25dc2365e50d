"""A correction taken in after a tool round, answered with nothing, one part drawn from a
sub-stream of its own ("corrected").

Explored seed 32677 found a real defect (LOOP-8): a correction the user sent during a tool
round set the empty-reply ladder's counters back to a fresh turn's, so when the model
answered the corrected request with nothing, the round was never nudged: the turn went
straight to blind retries. The fix leaves the counters as they were
(``hermes_ref.redirect.take_redirects``). Blind seeds seldom meet that world: it needs a
correction during a tool round of a turn the bounds let go on, then an empty reply to the
very next request, and the empty replies of the plan fall by call number, not by moment.
The hunt first met it at seed 1,388.

This part makes the moment on purpose: in a world in five with no tight bound (a round at
the bound is followed by the grace call, not by a request the ladder answers), the user
watches one session from a time before one of its drain claims and corrects its turn at
the first tool round from then on (``Redirect.during="tools"``), and the model answers the
first request after each correction taken in after a tool round with nothing
(``WorldPlan.empty_after_correction``, carried out by ``ExploreModel``): the engine owes
that round its one nudge.

It is drawn after every other part but ``sim/explore/lineage.py``, and a world that does
not draw it keeps its plan and its record byte for byte. Its kind is drawn nowhere else.
"""

from __future__ import annotations

import random

from sim.explore.plan import Drain, FaultKind, Redirect, WorldPlan

SHARE = 0.2  # of the worlds with no tight bound


def draw(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan) -> WorldPlan:
    """``plan`` with a correction during a tool round and the empty reply after it, in
    ``SHARE`` of the worlds with no tight bound (see the module docstring)."""
    drains = [s for s in plan.steps if isinstance(s, Drain)]
    if not {FaultKind.EMPTY_AFTER_CORRECTION, FaultKind.REDIRECT} <= kinds or not drains \
            or plan.max_iterations is not None or plan.iteration_budget is not None:
        return plan
    rng = random.Random(f"{seed}:corrected")
    if rng.random() >= SHARE:
        return plan
    drain = rng.choice(drains)
    correction = Redirect(at_s=round(rng.uniform(0.0, drain.at_s), 1), session=drain.session,
                          text=f"Say hello {rng.randint(10, 99)} instead.", during="tools")
    steps = sorted((*plan.steps, correction), key=lambda s: s.at_s)
    return plan.model_copy(update={"steps": tuple(steps), "empty_after_correction": True})
