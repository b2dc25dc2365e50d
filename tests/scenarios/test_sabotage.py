"""Every checker is non-vacuous: its sabotage turns a declaring scenario red under its own id."""

from __future__ import annotations

import pytest

import scenarios
from sim.coverage import Baseline, run_baseline, verify_sabotage
from sim.sabotage import SABOTAGES

REGISTRY = scenarios.load_all()


@pytest.fixture(scope="module")
def baseline() -> Baseline:
    """Every scenario on both stores without a sabotage, run once for the whole module."""
    return run_baseline(REGISTRY)


@pytest.mark.parametrize("name", list(SABOTAGES))
def test_sabotage_is_caught_by_its_checker(name: str, baseline: Baseline) -> None:
    """Under the sabotage, a scenario that passes without it fails with a violation of its id."""
    verdict = verify_sabotage(SABOTAGES[name], REGISTRY, baseline=baseline)
    assert verdict.scenarios, f"no scenario declares {verdict.invariants}"
    assert verdict.caught, (verdict.failed, verdict.evidence)


def test_sabotage_leaves_engine_intact() -> None:
    """After a sabotage block ends, every scenario passes again."""
    from sim.harness import run_scenario

    with SABOTAGES["execute_before_persist"].applied():
        pass
    for spec in REGISTRY.values():
        assert run_scenario(spec, trace=False).passed, spec.name


def test_a_relabelled_sabotage_is_not_credited() -> None:
    """A sabotage caught under CTX-3 earns nothing when it claims to break CTX-4 instead."""
    from sim.sabotage import Sabotage

    real = SABOTAGES["volatile_system_prompt"]
    assert verify_sabotage(real, REGISTRY).caught
    relabelled = Sabotage("relabelled", ("CTX-4",), real.description, real.patches)
    verdict = verify_sabotage(relabelled, REGISTRY)
    assert not verdict.caught and not verdict.catches
    assert verdict.failed, "the break still turns scenarios red, only not under CTX-4"


def test_a_scenario_red_without_the_sabotage_witnesses_nothing() -> None:
    """A run that already fails on the intact engine is skipped, never counted as a catch."""
    from sim.harness import ScenarioSpec, Story
    from sim.provider import tool_calls
    from sim.sabotage import Sabotage

    def broken(s: Story) -> None:
        s.script(tool_calls(("read_file", {"path": "a.txt"})))  # the script ends too early
        s.turn("hi")

    spec = ScenarioSpec("always_red", "A story that fails by itself", ("TOOL-1",), "test", broken,
                        __name__)
    sab = SABOTAGES["execute_before_persist"]
    verdict = verify_sabotage(Sabotage(sab.name, sab.invariants, sab.description, sab.patches),
                              {spec.name: spec})
    assert verdict.skipped == ["always_red[memory]", "always_red[sqlite]"]
    assert not verdict.caught and not verdict.catches


def test_a_sabotage_is_credited_only_for_the_ids_it_was_caught_under() -> None:
    """Listing a second id the break does not violate leaves the verdict uncaught."""
    from sim.sabotage import Sabotage

    real = SABOTAGES["execute_before_persist"]
    both = Sabotage("two_ids", ("TOOL-1", "CTX-4"), real.description, real.patches)
    verdict = verify_sabotage(both, REGISTRY)
    assert verdict.caught_ids == {"TOOL-1"} and not verdict.caught


def test_an_engine_that_never_reports_its_ending_fails_every_scenario() -> None:
    """With no exit line and no completion emitted, no scenario passes: silence is a finding."""
    from collections.abc import Generator
    from typing import Any
    from unittest import mock

    from hermes_ref import finalizer, prologue
    from hermes_ref.effects import Emit
    from hermes_ref.models import Event, EventKind
    from sim.harness import run_scenario

    class Quiet:
        """Stands in for Emit and drops the two events that report a turn's ending."""

        def __init__(self, event: Event) -> None:
            self.event = event

        def __await__(self) -> Generator[Any, Any, None]:
            if self.event.kind not in (EventKind.TURN_EXIT, EventKind.TURN_COMPLETED):
                yield from Emit(self.event).__await__()

    def no_ending(ctx: Any, tail: Any = None) -> tuple[Event, ...]:
        return ()  # nor rides the final row's commit (CloseTurn)

    with mock.patch.object(finalizer, "Emit", Quiet), mock.patch.object(prologue, "Emit", Quiet), \
            mock.patch.object(finalizer, "_ending", no_ending):
        passing = [name for name, spec in REGISTRY.items()
                   if run_scenario(spec, "memory", trace=False).passed]
    assert passing == []


def test_a_crash_earns_no_credit_for_the_ids_that_demand_an_ending() -> None:
    """A break that makes the engine raise is not credited under LOOP-3, FIN-7 or DEL-1."""
    from sim.sabotage import Sabotage

    real = SABOTAGES["duplicate_tool_result"]  # the engine raises once the record disagrees
    assert verify_sabotage(real, REGISTRY).caught
    for invariant in ("LOOP-3", "FIN-7", "DEL-1"):
        relabelled = Sabotage("relabelled", (invariant,), real.description, real.patches)
        assert not verify_sabotage(relabelled, REGISTRY).caught, invariant


def test_a_run_that_breaks_other_ids_too_is_not_alone() -> None:
    """A catch with collateral keeps its credit, but only a run whose sole red ids are the
    sabotage's own counts as the break seen alone (``SabotageVerdict.alone``)."""
    # losing the exit line and the completion is this sabotage itself: LOOP-3, FIN-7 and
    # DEL-1, which demand both, go red in every run that catches it under FIN-6
    with_collateral = verify_sabotage(SABOTAGES["failed_release_loses_the_ending"], REGISTRY,
                                      ("memory",))
    assert with_collateral.caught and {"DEL-1", "FIN-7", "LOOP-3"} <= with_collateral.collateral
    assert with_collateral.alone == []
    by_itself = verify_sabotage(SABOTAGES["budget_not_reset"], REGISTRY, ("memory",))
    assert by_itself.caught and "caller_history_seeds_a_new_session[memory]" in by_itself.alone


def test_an_alone_run_that_stopped_at_an_expectation_is_not_whole() -> None:
    """The story a split tool group is shown alone in expects the pair kept, so under the
    sabotage it stops there: alone, but not a story that ran to its end."""
    verdict = verify_sabotage(SABOTAGES["tail_splits_tool_group"], REGISTRY, ("memory",))
    where = "tail_budget_spent_inside_a_tool_group[memory]"
    assert where in verdict.alone and where not in verdict.whole
