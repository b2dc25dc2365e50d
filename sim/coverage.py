"""The coverage matrix and the sabotage verification behind ``hermes-ref invariants``.

Theory of operation
-------------------
An invariant is *covered* only when three independent things line up:

1. a scenario that declares its id passes (on every store kind asked for);
2. a checker that decides it exists (``sim.checkers.CHECKERS``);
3. a sabotage aimed at it is *caught causally*: in a scenario that passes without the
   sabotage (on that store), the sabotaged run records a violation that carries *that*
   id, found by a checker registered for *that* id.

The third point is what keeps the proof honest. A scenario that merely fails under a
sabotage proves that something noticed; a violation of another id proves another rule; a
scenario that already fails without the sabotage proves nothing. Each sabotage is one
fault, so each credit says: this one break of this rule was seen by this rule's checker.
A sabotage that lists several ids is credited only for the ids it was caught under, and
a run in which the engine raised credits none of the ids that demand a turn's ending
(``ENDING_IDS``): a crash leaves every turn without one.

A catching run may break other ids as well (a turn that ends with the wrong reason also
logs the wrong exit line). Such collateral does not withhold the credit, but the run
proves less than one where the sabotage's own ids are the only ones that went red (and
the engine did not raise): the break shows by itself there. Those runs are kept apart
(``SabotageVerdict.alone``), and ``verify`` says of each sabotage that has none that it
is never seen alone. Most stories expect the rule's behaviour too, so a sabotage that
breaks the rule usually also fails an expectation, which stops the story there; a
collateral id that only later steps would show cannot appear then. The alone runs whose
story ran to its end are counted apart (``SabotageVerdict.whole``).

Anything less is ``partial``; no scenario, no checker and no sabotage is ``missing``. The
verdicts come from running things, never from a table someone keeps by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from hermes_ref.catalog import CATALOG
from sim.checkers import CHECKERS, Violation
from sim.harness import STORE_KINDS, ScenarioOutcome, ScenarioSpec, StoreKind, run_scenario
from sim.sabotage import SABOTAGES, Sabotage

Baseline = dict[tuple[str, StoreKind], ScenarioOutcome]

# The ids whose checkers demand a turn's ending (its exit line, completion and reason). A
# run in which the engine itself raised never reports an ending, so those findings follow
# from any crash: such a run cannot credit these ids, or any break that crashes the engine
# could be relabelled onto them.
ENDING_IDS = frozenset({"LOOP-3", "FIN-7", "DEL-1"})


@dataclass(frozen=True)
class Catch:
    """One causal catch: this sabotage, seen under this id, here, by this checker."""

    sabotage: str
    invariant: str
    scenario: str
    store: StoreKind
    checker: str
    violation: str

    def as_json(self) -> dict[str, str]:
        return {"sabotage": self.sabotage, "invariant": self.invariant, "scenario": self.scenario,
                "store": self.store, "checker": self.checker, "violation": self.violation}


@dataclass
class SabotageVerdict:
    name: str
    invariants: tuple[str, ...]
    description: str
    scenarios: list[str]
    failed: list[str] = field(default_factory=list)      # runs that went red, for any reason
    catches: list[Catch] = field(default_factory=list)   # the causal ones
    skipped: list[str] = field(default_factory=list)     # runs already red without the sabotage
    collateral: set[str] = field(default_factory=set)    # other ids its red runs violated
    alone: list[str] = field(default_factory=list)       # caught runs that broke its ids only
    whole: list[str] = field(default_factory=list)       # those of them whose story ran to its end
    evidence: str = ""                                   # why a red run did not count, if none did

    @property
    def caught_ids(self) -> set[str]:
        return {c.invariant for c in self.catches}

    @property
    def caught(self) -> bool:
        """Caught under every id it claims to break."""
        return bool(self.invariants) and set(self.invariants) <= self.caught_ids

    @property
    def first_catch(self) -> Catch | None:
        return self.catches[0] if self.catches else None


def deciders(invariant: str) -> set[str]:
    """The checkers registered for ``invariant``."""
    return {c.name for c in CHECKERS.values() if invariant in c.invariants}


def causal_hits(findings: Iterable[Violation], invariant: str) -> list[Violation]:
    """The findings that carry ``invariant`` and come from a checker that decides it."""
    allowed = deciders(invariant)
    return [v for v in findings if v.invariant == invariant and v.checker in allowed]


def run_baseline(registry: dict[str, ScenarioSpec],
                 store_kinds: tuple[StoreKind, ...] = STORE_KINDS) -> Baseline:
    """Every scenario on every store kind, without any sabotage."""
    return {(name, kind): run_scenario(spec, kind, trace=False)
            for name, spec in registry.items() for kind in store_kinds}


def verify_sabotage(sab: Sabotage, registry: dict[str, ScenarioSpec],
                    store_kinds: tuple[StoreKind, ...] = STORE_KINDS,
                    baseline: Baseline | None = None) -> SabotageVerdict:
    """Run the scenarios that declare one of the sabotage's ids, under it, on each store."""
    specs = [s for s in registry.values() if set(s.invariants) & set(sab.invariants)]
    verdict = SabotageVerdict(sab.name, sab.invariants, sab.description, [s.name for s in specs])
    clean = baseline if baseline is not None else run_baseline(
        {s.name: s for s in specs}, store_kinds)
    with sab.applied():
        for spec in specs:
            for kind in store_kinds:
                _judge_run(verdict, spec, kind, clean[(spec.name, kind)])
    return verdict


def _judge_run(verdict: SabotageVerdict, spec: ScenarioSpec, kind: StoreKind,
               clean: ScenarioOutcome) -> None:
    where = f"{spec.name}[{kind}]"
    if not clean.passed:
        verdict.skipped.append(where)  # red already: it cannot witness this sabotage
        return
    outcome = run_scenario(spec, kind, trace=False)
    if outcome.passed:
        return
    verdict.failed.append(where)
    verdict.collateral.update(v.invariant for v in outcome.findings
                              if v.invariant not in verdict.invariants)
    hits = [(inv, v) for inv in spec.invariants if inv in verdict.invariants
            and not (outcome.raised and inv in ENDING_IDS)
            for v in causal_hits(outcome.findings, inv)]
    for invariant, violation in hits:
        verdict.catches.append(Catch(verdict.name, invariant, spec.name, kind, violation.checker,
                                     violation.message))
    if hits and not outcome.raised \
            and {v.invariant for v in outcome.findings} <= set(verdict.invariants):
        verdict.alone.append(where)  # no other id went red
        if outcome.error is None:  # nor did the story stop early, at a failed expectation
            verdict.whole.append(where)
    if not hits and not verdict.evidence:
        first = outcome.violations[0] if outcome.violations else (outcome.error or "").split("\n")[0]
        verdict.evidence = f"{where} went red, but not under {'/'.join(verdict.invariants)}: {first}"


def verify_all(registry: dict[str, ScenarioSpec],
               store_kinds: tuple[StoreKind, ...] = STORE_KINDS,
               baseline: Baseline | None = None) -> list[SabotageVerdict]:
    clean = baseline if baseline is not None else run_baseline(registry, store_kinds)
    return [verify_sabotage(s, registry, store_kinds, clean) for s in SABOTAGES.values()]


@dataclass
class MatrixRow:
    id: str
    group: str
    text: str
    scenarios: list[str]
    checker: list[str]
    sabotage: list[str]
    scenarios_passing: list[str]
    catches: list[Catch]
    status: str

    @property
    def sabotage_caught(self) -> list[str]:
        return sorted({c.sabotage for c in self.catches})

    def as_json(self) -> dict[str, object]:
        firsts: dict[tuple[str, str], Catch] = {}  # the first catch per sabotage and store
        for catch in self.catches:
            firsts.setdefault((catch.sabotage, catch.store), catch)
        return {
            "id": self.id, "group": self.group, "text": self.text,
            "scenarios": self.scenarios, "checker": self.checker, "sabotage": self.sabotage,
            "scenarios_passing": self.scenarios_passing, "sabotage_caught": self.sabotage_caught,
            "caught_by": [c.as_json() for c in firsts.values()], "status": self.status,
        }


def build_matrix(registry: dict[str, ScenarioSpec], baseline: Baseline,
                 verdicts: list[SabotageVerdict]) -> list[MatrixRow]:
    rows = []
    for inv in CATALOG:
        scen = [s.name for s in registry.values() if inv.id in s.invariants]
        passing = [n for n in scen
                   if all(o.passed for (name, _), o in baseline.items() if name == n)]
        checkers = sorted(deciders(inv.id))
        sabs = [v for v in verdicts if inv.id in v.invariants]
        catches = [c for v in sabs for c in v.catches if c.invariant == inv.id]
        if passing and checkers and catches:
            status = "covered"
        elif scen or checkers or sabs:
            status = "partial"
        else:
            status = "missing"
        rows.append(MatrixRow(inv.id, inv.group, inv.text, scen, checkers,
                              [v.name for v in sabs], passing, catches, status))
    return rows
