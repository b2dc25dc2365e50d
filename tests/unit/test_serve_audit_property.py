"""Property: whatever the served provider does, an engine turn leaves a record the audit passes."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx
from hypothesis import given, settings

from hermes_ref.limits import Limits
from hermes_ref.outcomes import CONTEXT_PRESSURE_EXITS, TurnResult
from hermes_ref.shell.runtime import open_runtime
from sim.audit.cli import audit
from sim.audit.record import OPEN
from sim.serve import script as script_file
from sim.serve.server import Simulator
from sim.serve.strategies import scripts

FAST = Limits(backoff_base_s=0.001, backoff_max_s=0.002)


async def turn(steps: list[dict[str, Any]], folder: Path) -> TurnResult:
    simulator = Simulator(script_file.parse({
        "steps": steps, "when_exhausted": {"text": "the script ran out"}}))
    (folder / "notes.txt").write_text("buy milk")
    async with httpx.AsyncClient(transport=simulator.transport()) as client, \
            await open_runtime(str(folder / "agent.db"), base_url="http://sim.test/v1",
                               workspace=str(folder), http_client=client,
                               limits=FAST) as runtime:
        return await runtime.run_turn("session-1", "What is in notes.txt?")


@settings(max_examples=int(os.environ.get("HERMES_REF_PROPERTY_EXAMPLES", "40")), deadline=None)
@given(scripts(max_faults=4))
def test_any_fault_script_leaves_a_record_without_violations(steps: list[dict[str, Any]]) -> None:
    """No fault of the catalogue makes a turn leave a violation or an open turn behind; a turn
    that failed closed on context pressure leaves its user row open, as FIN-5 allows."""
    with tempfile.TemporaryDirectory() as tmp:
        ended = asyncio.run(turn(steps, Path(tmp)))
        result = audit(Path(tmp) / "agent.db")
        allowed = ended.exit_reason in CONTEXT_PRESSURE_EXITS
        findings = [f for f in result.findings
                    if not (allowed and f.kind == OPEN and f.invariant == "FIN-5")]
        assert findings == [], [f.line() for f in findings]
