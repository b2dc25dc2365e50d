"""The verification gate beside a small context window, one part drawn from a sub-stream of
its own ("gated").

A world drawn with the gate and a 250-token window (seed 1095) found an engine defect
(FIN-6): a turn wrote a file, the model answered, the gate held the answer back while the
model checked its work (FIN-1's gate), and the request that asked for the check, the held
answer and the nudge riding in it, did not fit the window. Preflight failed the turn
closed (CMP-7) and the answer the model had given was lost: the user was told the
conversation was too long. The fix lets the held answer stand on a context-pressure exit,
as it stands when the budget ends (``hermes_ref.finalizer._held_answer_stands``); CMP-7's
checker now counts the gate's two messages in the refused request. The default plan kept
the two apart (the edges draw the gate only with a tight budget, which never comes with a
small window, and the parts that draw windows skip gated worlds), so a blind sweep could
not meet the moment.

This part draws it: in ``SHARE`` of the worlds the context part gave a small window (one
process), with no chat lanes (the lane parts' worlds are kept as they are), no tight
budget or call cap, no fallback route and no gate yet, it turns the gate on
(``WorldPlan.verify_before_answer``). The first answer after a file change then waits for
a check, and in a window of 250-400 tokens the request that asks for it often does not
fit.

The window is one way the check fails; the provider is another. The held answer was lost
as well when the provider refused the request that asks for the check, when the model's
replies to it ran the empty ladder out, or named tools that do not exist (FIN-6, found at
seeds 2269 and 2772 once the checker read every such failure). Blind seeds meet that
seldom: a reply fault must fall on the one request the gate adds. So in ``CHECK_SHARE``
of the worlds with the gate on (this part's, and the edges' budget worlds of 2 units),
drawn from a sub-stream of its own ("check"), the provider refuses each request that asks
for the check with a 400 (``WorldPlan.refuse_the_check``, carried out by
``ExploreModel``): a terminal error, after which the held answer must stand.

In the edges' budget worlds of 3 units the request that asks for the check is the last
one the budget allows (a write, the answer the gate holds, the check). There the user of
each session whose turns change files corrects its turn during that call
(``Redirect.during="check"``, slow to stream and cut halfway): the held answer answered
what the user asked before, so the correction overrules it, and the budget's end owes a
summary, not the held answer (FIN-1).

It is drawn after every other part, and a world that does not draw it keeps its plan and
its record byte for byte.
"""

from __future__ import annotations

import random

from sim.explore.plan import FaultKind, Redirect, Submit, WorldPlan

SHARE = 1.0  # of the worlds it takes (a share kept to tune by: every one, now)
CHECK_SHARE = 0.5  # of the worlds with the gate on and no budget of 3: the check refused
CHECK_LAST = 3  # the budget whose last call asks for the check: there, a correction during it
WRITES = ("Write note", "Patch note")  # the submissions whose turns change a file


def draw(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan) -> WorldPlan:
    """``plan`` with the verification gate on, in ``SHARE`` of the one-process worlds with a
    small window and nothing that keeps the gate away; in the worlds with the gate, the
    check corrected (a budget of 3) or refused (``CHECK_SHARE`` of the others; see the
    module docstring)."""
    plan = _gate(seed, kinds, plan)
    if not plan.verify_before_answer or FaultKind.CHECK_REFUSED not in kinds:
        return plan
    rng = random.Random(f"{seed}:check")
    if plan.iteration_budget == CHECK_LAST:
        return _corrected(rng, kinds, plan)
    if rng.random() < CHECK_SHARE:
        return plan.model_copy(update={"refuse_the_check": True})
    return plan


def _corrected(rng: random.Random, kinds: frozenset[FaultKind], plan: WorldPlan) -> WorldPlan:
    """A correction during the check of each session whose turns change files, the user
    watching from a time before the first such turn is submitted."""
    first: dict[str, float] = {}
    for step in plan.steps:
        if isinstance(step, Submit) and step.text.startswith(WRITES):
            first[step.session] = min(step.at_s, first.get(step.session, step.at_s))
    if FaultKind.REDIRECT not in kinds or not first:
        return plan
    corrections = [Redirect(at_s=round(rng.uniform(0.0, at_s), 1), session=session,
                            text=f"Say hello {rng.randint(10, 99)} instead.", during="check",
                            slow_s=30.0) for session, at_s in sorted(first.items())]
    steps = sorted((*plan.steps, *corrections), key=lambda s: s.at_s)
    return plan.model_copy(update={"steps": tuple(steps)})


def _gate(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan) -> WorldPlan:
    """The gate on in ``SHARE`` of the one-process small-window worlds nothing keeps it from."""
    if FaultKind.SMALL_WINDOW not in kinds or plan.context_window is None \
            or plan.processes > 1 or plan.lanes is not None or plan.verify_before_answer \
            or plan.iteration_budget is not None or plan.max_iterations is not None \
            or plan.fallback_window is not None:
        return plan
    if random.Random(f"{seed}:gated").random() >= SHARE:
        return plan
    return plan.model_copy(update={"verify_before_answer": True})
