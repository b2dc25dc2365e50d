"""The model's odder reply shapes (``sim.explore.shapes``): drawn last on a stream of their
own, moving nothing of the other parts; answered by the model; rendered and replayed."""

from __future__ import annotations

import pytest

from sim.explore.plan import FaultKind, FaultMix, generate
from sim.explore.render import render
from sim.explore.run import run_plan
from sim.explore.shapes import SHAPES
from tests.unit.explore_replay import replay_rendered, same_timeline


def test_the_shapes_are_drawn_last_and_move_nothing() -> None:
    """Without the shapes' kinds a plan is what the other parts drew: the shapes only add
    reply faults of their own kinds, at calls no other fault holds, and the bound on failed
    calls the 503s around an overflow come with."""
    fewer_kinds = FaultMix(kinds=FaultMix().kinds - set(SHAPES))
    drew = 0
    for seed in range(60):
        every, fewer = generate(seed), generate(seed, fewer_kinds)
        assert every.model_copy(update={"replies": fewer.replies, "errors_max": None}) == fewer
        around = any(r.kind is FaultKind.ERRORS_AROUND_OVERFLOW for r in every.replies)
        assert every.errors_max == (5 if around else None)  # the bound that shape comes with
        assert [r for r in every.replies if r.kind not in SHAPES] == list(fewer.replies)
        calls = [r.call for r in every.replies]
        assert len(calls) == len(set(calls))
        drew += every.replies != fewer.replies
    assert 3 <= drew <= 25, drew


@pytest.mark.parametrize("seed", [13, 51, 387])
def test_a_shaped_world_passes_renders_and_replays(seed: int) -> None:
    """Worlds that drew shapes pass on the intact engine, fire them, and their rendered
    scenario replays the run."""
    plan = generate(seed)
    assert any(r.kind in SHAPES for r in plan.replies)
    report = run_plan(plan)
    assert report.verdict.value == "passed", report.violations
    assert report.fired & set(SHAPES), report.fired
    source = render(plan, report)
    assert "FaultKind." + next(r.kind.name for r in plan.replies if r.kind in SHAPES) in source
    assert same_timeline(replay_rendered(plan, report, source), report)


def test_a_shape_kind_alone_is_drawn_only_by_its_part() -> None:
    """``--faults think_only`` draws think-only replies in some worlds and nothing else of
    the reply faults."""
    only = FaultMix.parse("think_only")
    plans = [generate(seed, only) for seed in range(60)]
    kinds = {r.kind for p in plans for r in p.replies}
    assert kinds == {FaultKind.THINK_ONLY}
