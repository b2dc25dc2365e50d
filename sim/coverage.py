"""The coverage matrix and the sabotage verification behind ``hermes-ref invariants``.

Theory of operation
-------------------
An invariant is *covered* only when three independent things line up:

1. a scenario that declares its id passes (on the store kinds asked for);
2. a checker that decides it exists (``sim.checkers.CHECKERS``);
3. a sabotage aimed at it makes at least one of those scenarios fail *through a checker
   that decides the id* — not merely through a crash or an expectation, which would
   prove the scenario noticed, not that the checker can.

Anything less is ``partial``; no scenario, no checker and no sabotage is ``missing``. The verdicts
come from running things, never from a table someone keeps by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from hermes_ref.catalog import CATALOG
from sim.checkers import CHECKERS
from sim.harness import ScenarioOutcome, ScenarioSpec, StoreKind, run_scenario
from sim.sabotage import SABOTAGES, Sabotage


@dataclass
class SabotageVerdict:
    name: str
    invariants: tuple[str, ...]
    description: str
    scenarios: list[str]
    failed: list[str] = field(default_factory=list)       # scenarios that went red
    by_checker: list[str] = field(default_factory=list)   # ... through a checker of the id
    evidence: str = ""

    @property
    def caught(self) -> bool:
        return bool(self.by_checker)


def _checker_names_for(invariants: Iterable[str]) -> set[str]:
    wanted = set(invariants)
    return {c.name for c in CHECKERS.values() if wanted & set(c.invariants)}


def verify_sabotage(sab: Sabotage, registry: dict[str, ScenarioSpec],
                    store_kinds: tuple[StoreKind, ...] = ("memory",)) -> SabotageVerdict:
    specs = [s for s in registry.values() if set(s.invariants) & set(sab.invariants)]
    verdict = SabotageVerdict(sab.name, sab.invariants, sab.description, [s.name for s in specs])
    deciders = _checker_names_for(sab.invariants)
    with sab.applied():
        for spec in specs:
            for kind in store_kinds:
                outcome = run_scenario(spec, kind, trace=False)
                if outcome.passed:
                    continue
                verdict.failed.append(f"{spec.name}[{kind}]")
                hits = [v for v in outcome.violations if v.split("[", 1)[-1].split("]")[0] in deciders]
                if hits:
                    verdict.by_checker.append(f"{spec.name}[{kind}]")
                    verdict.evidence = verdict.evidence or hits[0]
                elif not verdict.evidence and outcome.error:
                    verdict.evidence = outcome.error.splitlines()[0]
    return verdict


def verify_all(registry: dict[str, ScenarioSpec],
               store_kinds: tuple[StoreKind, ...] = ("memory",)) -> list[SabotageVerdict]:
    return [verify_sabotage(s, registry, store_kinds) for s in SABOTAGES.values()]


@dataclass
class MatrixRow:
    id: str
    group: str
    text: str
    scenarios: list[str]
    checker: list[str]
    sabotage: list[str]
    scenarios_passing: list[str]
    sabotage_caught: list[str]
    status: str

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.id, "group": self.group, "text": self.text,
            "scenarios": self.scenarios, "checker": self.checker, "sabotage": self.sabotage,
            "scenarios_passing": self.scenarios_passing,
            "sabotage_caught": self.sabotage_caught, "status": self.status,
        }


def run_everything(registry: dict[str, ScenarioSpec],
                   store_kinds: tuple[StoreKind, ...]) -> dict[str, list[ScenarioOutcome]]:
    return {name: [run_scenario(spec, kind, trace=False) for kind in store_kinds]
            for name, spec in registry.items()}


def build_matrix(registry: dict[str, ScenarioSpec], outcomes: dict[str, list[ScenarioOutcome]],
                 verdicts: list[SabotageVerdict]) -> list[MatrixRow]:
    rows = []
    for inv in CATALOG:
        scen = [s.name for s in registry.values() if inv.id in s.invariants]
        passing = [n for n in scen if all(o.passed for o in outcomes.get(n, []))]
        checkers = sorted(c.name for c in CHECKERS.values() if inv.id in c.invariants)
        sabs = [v for v in verdicts if inv.id in v.invariants]
        caught = [v.name for v in sabs if v.caught]
        if passing and checkers and caught:
            status = "covered"
        elif scen or checkers or sabs:
            status = "partial"
        else:
            status = "missing"
        rows.append(MatrixRow(inv.id, inv.group, inv.text, scen, checkers,
                              [v.name for v in sabs], passing, caught, status))
    return rows
