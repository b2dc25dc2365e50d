"""A process frozen while its late tool call waits to begin, one part drawn from a
sub-stream of its own ("late").

Explored seed 39168 found a real defect (LEASE-4): a read scripted to begin 300 s after
its batch began (the "late" slow tool of ``plan._odder_world``) ran after its process had
been frozen 400 s, on a lease that had expired meanwhile, because the lease was vouched
for only as the batch began. The fix vouches for every call that begins after its
batch's first instant (``hermes_ref.tool_batch.vouch_again``). A sweep met that world
about once in 40,000 seeds: the stalls of ``_kills_and_stalls`` fall at a uniform moment
and seldom on the one process, at the one moment, that waits for a late call.

This part makes the moment on purpose: in a world whose plan holds a late tool call, the
``frozen_late_start`` fault sets that timing's ``stall_s``, so the process of the first
such call freezes for ``STALL_S`` (longer than the lease's time to live) as the call is
dispatched to wait out its delay (``sim/tool_batch.py`` carries it out, as a stall of
the world: the lease checkers excuse the lapse, and the timeline has a FAULT line). On
waking, the call is due and the lease is gone: the engine must not begin it.

It is drawn after the other parts but the two aimed ones (``sim/explore/corrected.py``,
``sim/explore/lineage.py``), and a world that does not draw it keeps its plan and its
record byte for byte. Its kind is drawn nowhere else.
"""

from __future__ import annotations

import random

from sim.explore.plan import FaultKind, WorldPlan

SHARE = 0.75  # of the worlds with a late tool call
STALL_S = 400.0  # past the lease's time to live (300 s), as in seed 39168


def draw(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan) -> WorldPlan:
    """``plan`` with its late tool call's process frozen as the call waits, in
    ``SHARE`` of the worlds that hold one (see the module docstring)."""
    late = [i for i, t in enumerate(plan.tool_timings) if t.start_delay_s > 0]
    if FaultKind.FROZEN_LATE_START not in kinds or not late:
        return plan
    rng = random.Random(f"{seed}:late")
    if rng.random() >= SHARE:
        return plan
    timings = list(plan.tool_timings)
    index = rng.choice(late)
    timings[index] = timings[index].model_copy(update={"stall_s": STALL_S})
    return plan.model_copy(update={"tool_timings": tuple(timings)})
