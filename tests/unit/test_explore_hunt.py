"""The hunt: the first failure, and the first that breaks one of the sabotage's own ids."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest

from sim.explore import hunt as hunt_module
from sim.explore.hunt import Baseline, hunt
from sim.explore.plan import FaultMix, WorldPlan
from sim.explore.run import RunReport, Verdict
from sim.sabotage import SABOTAGES
from sim.sabotage.base import Sabotage


def _world(monkeypatch: pytest.MonkeyPatch, broken: dict[int, list[str]],
           intact_fails: frozenset[int] = frozenset()) -> None:
    """Seeds of a fake world: the intact engine fails ``intact_fails``; the sabotaged one
    breaks ``broken[seed]``'s ids (none: it passes)."""
    applied = {"on": False}

    @contextmanager
    def on() -> Iterator[None]:
        applied["on"] = True
        try:
            yield
        finally:
            applied["on"] = False

    def patches() -> list[AbstractContextManager[Any]]:
        return [on()]

    def run_plan(plan: WorldPlan, **_: Any) -> RunReport:
        seed = plan.seed
        if seed in intact_fails:
            return RunReport(seed, Verdict.SAFETY, invariants=["ADM-1"])
        ids = broken.get(seed, []) if applied["on"] else []
        return RunReport(seed, Verdict.SAFETY if ids else Verdict.PASSED, invariants=ids)

    monkeypatch.setitem(SABOTAGES, "fake", Sabotage("fake", ("LOOP-2",), "a fake", patches))
    monkeypatch.setattr(hunt_module, "run_plan", run_plan)
    monkeypatch.setattr(hunt_module, "generate",
                        lambda seed, mix: WorldPlan(seed=seed, processes=1, sessions={"s-1": "p-1"}))


def test_a_first_failure_under_other_ids_goes_on_to_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    _world(monkeypatch, {2: ["CTX-1"], 4: ["CTX-1"], 6: ["CTX-1", "LOOP-2"]},
           intact_fails=frozenset({1}))
    found = hunt("fake", seeds_max=10, baseline=Baseline(FaultMix()))
    assert (found.found_at, found.seeds_to_first, found.broke, found.causal) == (2, 2, ["CTX-1"], False)
    assert (found.causal_at, found.seeds_to_causal) == (6, 6)  # seed 1 fails intact: not tried
    assert found.as_json()["seeds_to_causal_failure"] == 6


def test_a_causal_first_failure_stops_the_hunt(monkeypatch: pytest.MonkeyPatch) -> None:
    _world(monkeypatch, {3: ["LOOP-2"], 5: ["CTX-1"]})
    found = hunt("fake", seeds_max=10, baseline=Baseline(FaultMix()))
    assert (found.found_at, found.causal, found.causal_at, found.seeds_tried) == (3, True, 3, 4)


def test_other_ids_only_is_no_causal_credit(monkeypatch: pytest.MonkeyPatch) -> None:
    _world(monkeypatch, {0: ["CTX-1"]})
    found = hunt("fake", seeds_max=5, baseline=Baseline(FaultMix()))
    assert (found.found_at, found.causal, found.causal_at, found.seeds_tried) == (0, False, None, 5)
    assert found.as_json()["seeds_to_causal_failure"] is None
