"""The model's odder reply shapes, one part drawn from a sub-stream of its own ("shapes").

In a world in six, one to three of these shapes, each aimed at a model call of the faulty
phase (``ReplyFault``, numbered by world call like the other reply faults, at a call no
other fault holds). A shape that needs a moment of a turn (after a tool round, a round
before it) begins at its call and goes on with that turn's next requests, whoever else
calls in between (``ExploreModel`` keeps it by the turn's user row):

* ``cut_off_arguments``: a read whose arguments are cut off mid-value under
  ``finish_reason=tool_calls``: cut off all the same, so the turn ends as a truncated tool
  call, never asked again (LOOP-9);
* ``truncated_call``: the same under ``finish_reason=length``; the turn ends partial, its
  user row closed by a boundary row (FIN-5);
* ``malformed_again``: arguments that are not JSON, then a read whose arguments parse, then
  malformed arguments twice more: the round that parsed starts the count over, so the
  second run is asked again, not recorded (LOOP-9);
* ``think_only``: after a tool round, a reply that is only an inline think block: its
  reasoning comes back as a prefill, not the nudge (LOOP-8);
* ``mixed_housekeeping``: a round of ``todo`` and a read, with text, then an empty reply:
  the round was not only housekeeping, so its text is no answer and the reply is nudged
  (LOOP-8);
* ``errors_around_overflow``: two 503s, a 400 saying the context is too long, two 503s,
  in one iteration: the request rebuilt after the overflow has retries of its own (LOOP-5);
* ``padded_answer``: the answer with whitespace at its edges, delivered as it came; the
  exit line counts what was delivered (FIN-7).

It is drawn after every other part, and a world that does not draw it keeps its plan and
its record byte for byte. Its kinds are drawn nowhere else.
"""

from __future__ import annotations

import random

from sim.explore.plan import FaultKind, ReplyFault, Submit, WorldPlan

SHAPES = (FaultKind.CUT_OFF_ARGUMENTS, FaultKind.TRUNCATED_CALL, FaultKind.MALFORMED_AGAIN,
          FaultKind.THINK_ONLY, FaultKind.MIXED_HOUSEKEEPING, FaultKind.ERRORS_AROUND_OVERFLOW,
          FaultKind.PADDED_ANSWER)
SHARE = 1 / 6  # of the worlds


def draw(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan) -> WorldPlan:
    """``plan`` with one to three reply shapes, in a world in six (see the module docstring)."""
    rng = random.Random(f"{seed}:shapes")
    wanted = [k for k in SHAPES if k in kinds]
    if not wanted or rng.random() >= SHARE:
        return plan
    calls = 2 * max(1, sum(isinstance(s, Submit) for s in plan.steps))
    taken = {r.call for r in plan.replies}
    added = []
    for _ in range(rng.randint(1, 3)):
        call, kind = rng.randint(1, calls), rng.choice(wanted)
        if call not in taken:
            taken.add(call)
            added.append(ReplyFault(call=call, kind=kind))
    if not added:
        return plan
    return plan.model_copy(update={"replies": tuple(sorted(
        (*plan.replies, *added), key=lambda r: r.call))})
