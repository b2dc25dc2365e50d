"""Every scenario passes on both stores, tells the same story on both, and matches its snapshot."""

from __future__ import annotations

import pytest
from syrupy.assertion import SnapshotAssertion

import scenarios
from sim.harness import STORE_KINDS, run_scenario
from tests.scenarios.conftest import fail_keeping_snapshot

REGISTRY = scenarios.load_all()


@pytest.mark.parametrize("name", list(REGISTRY))
def test_scenario_holds_on_every_store(name: str, snapshot: SnapshotAssertion,
                                       request: pytest.FixtureRequest) -> None:
    """The scenario passes on memory and SQLite, with identical timeline and transcript."""
    spec = REGISTRY[name]
    outcomes = [run_scenario(spec, kind) for kind in STORE_KINDS]
    for outcome in outcomes:
        if not outcome.passed:
            fail_keeping_snapshot(request.config, f"{name}[{outcome.store_kind}]: "
                                  f"{outcome.error or outcome.violations}\n{outcome.timeline}")
    first, *others = outcomes
    for other in others:
        if (other.timeline, other.transcript) != (first.timeline, first.transcript):
            fail_keeping_snapshot(request.config, f"{name}: the stores tell different stories")
    assert f"{spec.title}\n\n{first.timeline}\n{first.transcript}" == snapshot


def test_there_are_enough_scenarios() -> None:
    """The suite tells at least twelve stories, each declaring catalog ids."""
    from hermes_ref.catalog import BY_ID

    assert len(REGISTRY) >= 12
    for spec in REGISTRY.values():
        assert spec.invariants, spec.name
        assert all(i in BY_ID for i in spec.invariants), spec.name


def test_scenario_replays_exactly() -> None:
    """Running a story twice with the same seed gives the same timeline, byte for byte."""
    spec = REGISTRY["crash_after_tool_ran"]
    assert run_scenario(spec, seed=7).timeline == run_scenario(spec, seed=7).timeline
