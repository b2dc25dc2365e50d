"""A rule-based state machine over the simulated world; its invariants are the checkers.

Hypothesis chooses the steps: admit an input, drain one claim, fail the next write at a
site, crash the process inside its next drain and restart it, move the clock, reconcile
an unknown admission. After every step every checker must hold; at the end the calm phase
(faults off, recover, reconcile, drain) must leave no admission unfinished.

The default run keeps the budget small; ``nox -s explore_long`` (``HERMES_MACHINE_EXAMPLES``)
runs a large one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hermes_ref.admission import AdmissionStatus
from sim.explore.model import ExploreModel
from sim.explore.run import calm_phase
from sim.harness import Story

SESSIONS = ("s-1", "s-2")
TEXTS = ("Read notes-1.txt.", "Write note 1 to out-1.txt.", "Say hello 1.", "Read gone.txt.")
WRITE_SITES = ("user", "tool_calls", "tool_results", "final")
EXAMPLES = int(os.environ.get("HERMES_MACHINE_EXAMPLES", "12"))


class WorldMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory(prefix="hermes-ref-machine-")
        self.story = Story(store_kind="memory", workdir=Path(self._tmp.name), trace=False)
        self.story.use_provider(ExploreModel(()))
        self.story.files({"notes-1.txt": "one"})
        for session in SESSIONS:
            self.story.bind(f"p-{session}", session=session)
            self.story.bind(f"op-{session}", session=session, role="operator", kind="operator")
        self.requests = 0

    @rule(session=st.sampled_from(SESSIONS), text=st.sampled_from(TEXTS))
    def admit(self, session: str, text: str) -> None:
        self.requests += 1
        self.story.submit(f"p-{session}", f"r-{self.requests}", {"text": text}, session=session)

    @rule(session=st.sampled_from(SESSIONS))
    def drain_one(self, session: str) -> None:
        self.story.drain(session, steps=1)

    @rule(site=st.sampled_from(WRITE_SITES))
    def fail_next_write(self, site: str) -> None:
        self.story.faults(fail_writes={site: 1})

    @rule(session=st.sampled_from(SESSIONS), effects=st.integers(min_value=1, max_value=12))
    def crash_inside_a_drain(self, session: str, effects: int) -> None:
        self.story.faults(crash_at_effect=effects)
        self.story.drain(session, steps=1)
        self.story.faults()
        self.story.restart()
        self.story.recover()

    @rule(seconds=st.sampled_from((1.0, 61.0, 301.0, 4000.0)))
    def advance_clock(self, seconds: float) -> None:
        self.story.advance(seconds)

    @precondition(lambda self: any(r.status is AdmissionStatus.UNKNOWN
                                   for r in self.story.world.store.snapshot().admissions))
    @rule()
    def reconcile_unknown(self) -> None:
        row = next(r for r in self.story.world.store.snapshot().admissions
                   if r.status is AdmissionStatus.UNKNOWN)
        self.story.reconcile(f"op-{row.session_id}", row.admission_id, session=row.session_id)

    @invariant()
    def every_checker_holds(self) -> None:
        assert not self.story.violations, "\n".join(map(str, self.story.violations))

    def teardown(self) -> None:
        try:
            if self.story._world is not None:
                stuck = calm_phase(self.story)
                assert not self.story.violations, "\n".join(map(str, self.story.violations))
                assert not stuck, f"not terminal after the calm phase: {stuck}"
                self.story.world.store.close()
        finally:
            self._tmp.cleanup()


WorldMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=20, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
TestWorldMachine = WorldMachine.TestCase
