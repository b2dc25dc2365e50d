"""The model's odder reply shapes, one part drawn from a sub-stream of its own ("shapes").

In a world in six, and in every world with a context window, one to three of these
shapes, each aimed at a model call of the faulty phase (``ReplyFault``, numbered by world
call like the other reply faults, at a call no other fault holds). A shape that needs a
moment of a turn (after a tool round, a round before it) begins at its call and goes on
with that turn's next requests, whoever else calls in between and over any fault the plan
holds for them (``ExploreModel`` keeps it by the turn's user row):

* ``cut_off_arguments``: a read whose arguments are cut off mid-value under
  ``finish_reason=tool_calls``: cut off all the same, so the turn ends as a truncated tool
  call, never asked again (LOOP-9);
* ``truncated_call``: the same under ``finish_reason=length``; the turn ends partial, its
  user row closed by a boundary row (FIN-5);
* ``malformed_again``: arguments that are not JSON, then a read whose arguments parse, then
  malformed arguments twice more: the round that parsed starts the count over, so the
  second run is asked again, not recorded (LOOP-9);
* ``think_only``: after a tool round, a reply that is only an inline think block (one the
  model never closed when the shape's call is odd: it runs to the end of the reply): its
  reasoning comes back as a prefill, not the nudge (LOOP-8);
* ``mixed_housekeeping``: a round of ``todo`` and a read, with text, then an empty reply:
  the round was not only housekeeping, so its text is no answer and the reply is nudged
  (LOOP-8);
* ``errors_around_overflow``: two 503s, a 400 saying the context is too long, two 503s,
  in one iteration: the request rebuilt after the overflow has retries of its own (LOOP-5).
  Only in a world with a context window, where it is drawn first, and in every such
  world: with no window a compaction finds no middle to summarize, the overflow fails
  closed and the rebuilt request is never made; and the sabotage of this rule is found
  only where a summary succeeds, the lock is free and the turn lives on, which is seldom
  (about one windowed world in sixteen). Aimed at one of the first four calls, it waits
  there for a request of 18 messages or more, the first of any turn (a shorter history
  seldom has a middle between its protected head and tail). A world that draws it
  lets a turn fail only five calls (``outer_loop_errors_max``, default 8): its four 503s
  stay within that bound, and only an overflow counted as a failed call would end the
  turn at its last 503 (LOOP-5);
* ``padded_answer``: the answer with whitespace at its edges, delivered as it came; the
  exit line counts what was delivered (FIN-7).

It is drawn after the parts of ``sim/explore/edges.py`` (only ``late``, ``corrected`` and
``lineage`` come after it), and a world that does not draw it keeps its plan and its record
byte for byte. Its kinds are drawn nowhere else.
"""

from __future__ import annotations

import random

from sim.explore.plan import FaultKind, ReplyFault, Submit, WorldPlan

SHAPES = (FaultKind.CUT_OFF_ARGUMENTS, FaultKind.TRUNCATED_CALL, FaultKind.MALFORMED_AGAIN,
          FaultKind.THINK_ONLY, FaultKind.MIXED_HOUSEKEEPING, FaultKind.ERRORS_AROUND_OVERFLOW,
          FaultKind.PADDED_ANSWER)
SHARE = 1 / 6  # of the worlds without a context window; every windowed world draws shapes
ERRORS_MAX = 5  # a turn's failed calls (``outer_loop_errors_max``) where ``around`` is drawn


def draw(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan) -> WorldPlan:
    """``plan`` with one to three reply shapes, in a world in six and in every windowed world
    (see the module docstring)."""
    rng = random.Random(f"{seed}:shapes")
    wanted = [k for k in SHAPES if k in kinds]
    windowed = plan.context_window is not None
    drawn = rng.random()  # drawn in every world, so the stream is the same in both kinds
    if not wanted or (not windowed and drawn >= SHARE):
        return plan
    around = FaultKind.ERRORS_AROUND_OVERFLOW
    calls = 2 * max(1, sum(isinstance(s, Submit) for s in plan.steps))
    taken = {r.call for r in plan.replies}
    added = []
    for n in range(rng.randint(1, 3)):
        call, kind = rng.randint(1, calls), rng.choice(wanted)
        if n == 0 and windowed and around in wanted:
            kind = around  # first of all, where a compaction can relieve an overflow; at
            call = rng.randint(1, 4)  # an early call, from which it waits for a long request
        elif kind is around and not windowed:
            continue  # no window: no middle to compact, so the overflow fails closed and
            # the rebuilt request the errors are about is never made (CMP-7)
        if call not in taken:
            taken.add(call)
            added.append(ReplyFault(call=call, kind=kind))
    if not added:
        return plan
    update: dict[str, object] = {"replies": tuple(sorted((*plan.replies, *added), key=lambda r: r.call))}
    if any(r.kind is around for r in added):
        update["errors_max"] = ERRORS_MAX
    return plan.model_copy(update=update)
