"""Running a rendered explored scenario the way `scenarios/` runs it, for the explore tests."""

from __future__ import annotations

from sim.explore.plan import WorldPlan
from sim.explore.render import render, scenario_name
from sim.explore.run import RunReport
from sim.harness import REGISTRY, ScenarioOutcome, run_scenario


def replay_rendered(plan: WorldPlan, report: RunReport, source: str | None = None,
                    seed: int | None = None) -> ScenarioOutcome:
    """Register the scenario ``render`` writes for ``plan`` (or ``source``), run it once on
    the memory store, and take it out of the registry again."""
    namespace: dict[str, object] = {"__name__": f"explored_{scenario_name(plan)}"}
    exec(compile(source if source is not None else render(plan, report), "explored.py", "exec"),
         namespace)
    try:
        if seed is None:
            return run_scenario(REGISTRY[scenario_name(plan)])  # its seed is in the file
        return run_scenario(REGISTRY[scenario_name(plan)], seed=seed)
    finally:
        REGISTRY.pop(scenario_name(plan), None)


def same_timeline(outcome: ScenarioOutcome, report: RunReport) -> bool:
    """The scenario's timeline begins with the run's, line for line."""
    ran = report.timeline.splitlines()
    return outcome.timeline.splitlines()[:len(ran)] == ran
