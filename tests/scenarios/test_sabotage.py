"""Every checker is non-vacuous: its sabotage turns at least one declaring scenario red."""

from __future__ import annotations

import pytest

import scenarios
from sim.coverage import verify_sabotage
from sim.sabotage import SABOTAGES

REGISTRY = scenarios.load_all()


@pytest.mark.parametrize("name", list(SABOTAGES))
def test_sabotage_is_caught_by_its_checker(name: str) -> None:
    """Under the sabotage, a scenario declaring its invariant fails through a deciding checker."""
    verdict = verify_sabotage(SABOTAGES[name], REGISTRY)
    assert verdict.scenarios, f"no scenario declares {verdict.invariants}"
    assert verdict.caught, (verdict.failed, verdict.evidence)


def test_sabotage_leaves_engine_intact() -> None:
    """After a sabotage block ends, every scenario passes again."""
    from sim.harness import run_scenario

    with SABOTAGES["execute_before_persist"].applied():
        pass
    for spec in REGISTRY.values():
        assert run_scenario(spec, trace=False).passed, spec.name
