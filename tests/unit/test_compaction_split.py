"""The split of a list by the spec's arithmetic (``sim.checkers.compaction_split``) against the
engine's planner: the same answer on every list a run plans, and a planner that finds no
middle where there is one is a CMP-2 finding."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from hermes_ref import compression
from hermes_ref.compression import Budget
from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role
from sim.checkers.compaction_split import has_work, middle, prunable
from sim.explore.plan import generate
from sim.explore.run import run_plan

# seeds that plan over hidden rows (201), retries' scaffolding (4850), fallback routes
# (146, 3313), idle passes (3, 2966) and lists with no middle (0, 19, 262)
SEEDS = (0, 1, 3, 19, 146, 201, 262, 2966, 3313, 4850)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_split_answers_as_the_planner_on_every_list_planned(seed: int) -> None:
    """Every list the engine (or a checker) plans over: the planner finds a middle exactly
    where the spec's arithmetic does, and prunes exactly where it finds old outputs."""
    plan, prune = compression.plan, compression.prune
    seen: list[tuple[str, bool, bool]] = []

    def planned(messages: tuple[Message, ...], figures: Budget, limits: Limits,
                user_text: str | None = None) -> Any:
        out = plan(messages, figures, limits, user_text)
        seen.append(("plan", out is not None, bool(middle(messages, limits, user_text))))
        return out

    def pruned(messages: tuple[Message, ...], figures: Budget, limits: Limits) -> Any:
        out = prune(messages, figures, limits)
        seen.append(("prune", out != messages, bool(prunable(messages, limits))))
        return out

    with mock.patch.object(compression, "plan", planned), \
            mock.patch.object(compression, "prune", pruned):
        run_plan(generate(seed), trace=False)
    assert seen, "the seed plans nothing: it proves nothing"
    assert [s for s in seen if s[1] != s[2]] == []


def _chat(count: int, **more: Any) -> tuple[Message, ...]:
    return tuple(Message(role=Role.USER if k % 2 == 0 else Role.ASSISTANT,
                         content=f"message {k}", row_id=k + 1, turn_id="turn-0", **more)
                 for k in range(count))


def test_a_hidden_row_costs_the_tail_nothing() -> None:
    """The tail's budget is of request tokens: a hidden row is kept where it lies and costs
    nothing, in the engine's planner and in the spec's split alike."""
    limits = Limits(context_window_tokens=250)
    figures = compression.budget(limits)
    long = "x" * 400
    rows = (*_chat(12), Message(role=Role.ASSISTANT, content=long, row_id=13, hidden=True),
            *(_chat(4)))
    layout = compression.plan(rows, figures, limits)
    assert layout is not None
    assert len(layout.middle) == len(middle(rows, limits, None))
    assert has_work(rows, limits, None)
