"""The hunt (the first failure, and the first under the sabotage's own ids), and how a run
the engine broke is judged."""

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
        return RunReport(seed, Verdict.SAFETY if ids else Verdict.PASSED, invariants=ids,
                         violations=[f"{i} [a_checker] seed {seed}" for i in ids])

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
    assert found.causal_violation == "LOOP-2 [a_checker] seed 6"


def test_a_causal_first_failure_stops_the_hunt(monkeypatch: pytest.MonkeyPatch) -> None:
    _world(monkeypatch, {3: ["LOOP-2"], 5: ["CTX-1"]})
    found = hunt("fake", seeds_max=10, baseline=Baseline(FaultMix()))
    assert (found.found_at, found.causal, found.causal_at, found.seeds_tried) == (3, True, 3, 4)


def test_a_hunt_starts_at_its_first_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``seed_start`` moves the window of ``seeds_max`` seeds: a failure before it is unseen."""
    _world(monkeypatch, {3: ["LOOP-2"], 12: ["LOOP-2"]})
    found = hunt("fake", seeds_max=10, baseline=Baseline(FaultMix()), seed_start=5)
    assert (found.found_at, found.seeds_to_first, found.seeds_tried) == (12, 8, 8)
    assert hunt("fake", seeds_max=3, baseline=Baseline(FaultMix()), seed_start=5).found_at is None


def test_hunts_in_several_processes_report_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hunting processes give the hunts of one, in the order asked (two even on a
    one-core machine: the cap at the cores is what a user gets, not what this test needs)."""
    import scenarios  # noqa: F401

    monkeypatch.setattr(hunt_module.os, "cpu_count", lambda: 2)

    names = ["cooldown_runs_from_the_decision", "correction_restarts_the_ladder",
             "dead_holders_block_the_lease"]
    alone = hunt_module.hunt_all(names, seeds_max=3, seed_start=1)
    shared = hunt_module.hunt_all(names, seeds_max=3, seed_start=1, workers=2)
    assert [h.as_json() for h in shared] == [h.as_json() for h in alone]
    assert [h.sabotage for h in shared] == names and all(h.seeds_tried <= 3 for h in shared)


def test_other_ids_only_is_no_causal_credit(monkeypatch: pytest.MonkeyPatch) -> None:
    _world(monkeypatch, {0: ["CTX-1"]})
    found = hunt("fake", seeds_max=5, baseline=Baseline(FaultMix()))
    assert (found.found_at, found.causal, found.causal_at, found.seeds_tried) == (0, False, None, 5)
    assert found.as_json()["seeds_to_causal_failure"] is None


def test_an_engine_error_is_judged_as_a_crash_leaves_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run stops where the engine raised: its turns in flight are excused their
    endings as after a crash, and what the record does show is still found."""
    from hermes_ref import tool_round
    from sim.explore.plan import generate
    from sim.explore.run import run_plan

    original, calls = tool_round.run_tool_round, {"n": 0}

    async def breaks_on_the_third(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("a bug in the tool round")
        return await original(*args, **kwargs)

    monkeypatch.setattr(tool_round, "run_tool_round", breaks_on_the_third)
    report = run_plan(generate(0), trace=False)
    assert report.verdict is Verdict.ENGINE_CRASH and "a bug in the tool round" in (report.error or "")
    assert report.violations == []  # no missing ending, exit line or release is called a violation


def test_what_a_wrecked_record_shows_is_still_found() -> None:
    """A result stored twice trips the engine's own guard; the record still shows it."""
    import scenarios  # noqa: F401 - the sabotages register beside the scenarios
    from sim.explore.plan import generate
    from sim.explore.run import run_plan

    with SABOTAGES["duplicate_tool_result"].applied():
        wrecks = (r for r in (run_plan(generate(seed), trace=False) for seed in range(30))
                  if r.verdict is Verdict.ENGINE_CRASH)
        report = next(wrecks, None)
    assert report is not None, "no seed of 30 tripped the engine's guard"
    assert "TOOL-3" in report.invariants and not {"FIN-7", "LOOP-3", "DEL-1"} & set(report.invariants)


def test_a_store_error_that_escapes_a_turn_breaks_fin_6() -> None:
    """Under an unguarded final persist a fenced final write raises out of the turn; the
    run log keeps that turn as raised, and FIN-6 names the escaped store error."""
    import scenarios  # noqa: F401 - the sabotages register beside the scenarios
    from sim.explore.plan import generate
    from sim.explore.run import run_plan

    with SABOTAGES["unguarded_final_persist"].applied():
        wrecks = (r for r in (run_plan(generate(seed), trace=False) for seed in range(30))
                  if r.verdict is Verdict.ENGINE_CRASH)
        report = next(wrecks, None)
    assert report is not None, "no seed of 30 raised out of a turn"
    assert any(v.startswith("FIN-6 [store_errors_stay_in_the_result]") for v in report.violations)


def test_a_lease_carried_to_the_tip_and_released_there_is_released() -> None:
    """A turn granted a rotated session's own lease (the sabotage) after the tip's holder
    released the carried lease took nothing from a live holder: LEASE-3 stays quiet, and
    what is wrong (writes into the rotated parent) is CMP-5's."""
    import scenarios  # noqa: F401 - the sabotages register beside the scenarios
    from sim.explore.plan import generate
    from sim.explore.run import run_plan

    with SABOTAGES["lease_stays_on_the_rotated_parent"].applied():
        found = next((r for r in (run_plan(generate(seed), trace=False) for seed in range(20))
                      if "CMP-5" in r.invariants), None)
    assert found is not None and "LEASE-3" not in found.invariants
