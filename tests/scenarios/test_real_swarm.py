"""Real processes on one SQLite file: four workers, one SIGKILLed mid-turn, the others finish."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_ref.admission import AdmissionStatus, Move, Outcome
from hermes_ref.closure import RECOVERED_CALL_TEXT
from hermes_ref.lease import holder_fields
from hermes_ref.models import Role
from sim.realcrash import read_jsonl
from sim.realswarm import DB_FILE, SwarmPlan, run_swarm
from sim.sqlite_store import SqliteStore
from sim.swarm_check import KILLS_FILE, load


@pytest.mark.realcrash
@pytest.mark.parametrize("when", ["after", "before"])
def test_a_holder_killed_mid_turn_loses_nothing_and_runs_nothing_twice(when: str,
                                                                       tmp_path: Path) -> None:
    """SIGKILL a holder after (or before) its tool's effect: nothing lost, overlapped or rerun."""
    plan = SwarmPlan(hold_when=when)
    report = run_swarm(tmp_path, plan)
    assert report.swarm == [], report.swarm
    assert report.checkers == [], report.checkers
    fig = report.figures
    assert fig["processes"] == plan.processes + 1 and fig["kills"] == 1
    assert fig["unknown_now"] == 0 and fig["reconciled_unknown"] == 1
    assert fig["completed"] == fig["admissions"] - 1
    # the checks had something to judge: resubmissions, a tool run and two calls per turn
    assert fig["submissions"] > fig["admissions"] > plan.sessions
    assert fig["tool_runs"] >= fig["completed"] and fig["model_calls"] >= 2 * fig["completed"]
    assert fig["wall_s"] < plan.timeout_s

    rec = load(tmp_path / DB_FILE, tmp_path)
    (kill,) = rec.kills
    (seen,) = read_jsonl(tmp_path / KILLS_FILE)  # the file just before the SIGKILL
    assert (seen["lease_held"], seen["call_row"], seen["result_row"]) == (True, True, False)
    (unknown,) = [r for r in rec.admissions if r.unknown_tick is not None]
    assert unknown.session_id == kill.session_id and unknown.claims == 1
    assert (unknown.status, unknown.outcome, unknown.settled_via) == (
        AdmissionStatus.TERMINAL, Outcome.INTERRUPTED, Move.RECONCILE)
    # the held call ran once, in the killed process (or not at all), and never again
    ran = [r.pid for r in rec.runs if r.call_id == kill.call_id]
    assert ran == ([kill.pid] if when == "after" else [])
    # a survivor found the dead process and made its admission unknown; the operator
    # reconciled it; a survivor took the lease back through the liveness probe, unexpired
    survivors = {str(s["pid"]) for s in fig["workers_summary"]}
    (orphaned,) = [d for d in rec.door if d["kind"] == "orphaned"]
    assert str(orphaned["pid"]) in survivors and orphaned["admission_id"] == unknown.admission_id
    grants = sorted((g for g in rec.grants if g.session_id == kill.session_id),
                    key=lambda g: g.token)
    (dead,) = [i for i, g in enumerate(grants) if holder_fields(g.holder)["turn"] == kill.turn_id]
    assert grants[dead].end_reason == "holder_dead"
    assert (grants[dead].ended_at or 0) < grants[dead].expires_at
    assert holder_fields(grants[dead + 1].holder)["pid"] in survivors
    store = SqliteStore(tmp_path / DB_FILE)
    try:
        rows = store.snapshot().transcript(kill.session_id)
    finally:
        store.close()
    (result,) = [m for m in rows if m.role is Role.TOOL and m.tool_call_id == kill.call_id]
    assert result.content == RECOVERED_CALL_TEXT and result.turn_id != kill.turn_id


@pytest.mark.realcrash
def test_survivors_that_rerun_the_held_call_are_caught(tmp_path: Path) -> None:
    """Under recovery_reruns_open_calls a survivor runs the killed turn's call again: caught."""
    report = run_swarm(tmp_path, SwarmPlan(sabotage="recovery_reruns_open_calls"))
    (kill,) = load(tmp_path / DB_FILE, tmp_path).kills
    twice = [v for v in report.swarm if v.startswith(f"{kill.call_id} of {kill.session_id}")]
    assert any("ran 2 times" in v for v in twice), report.swarm
    assert any("held by killed pid" in v for v in twice), report.swarm
    assert any("TOOL-10 [recovered_calls_not_rerun]" in v for v in report.checkers), report.checkers


@pytest.mark.realcrash
@pytest.mark.slow
def test_a_larger_swarm_killed_late_still_loses_nothing(tmp_path: Path) -> None:
    """Six workers, twelve inputs each, killed at the twelfth call: every check still holds."""
    plan = SwarmPlan(processes=6, admissions=12, hold_at=12, timeout_s=60.0)
    report = run_swarm(tmp_path, plan)
    assert report.swarm == [] and report.checkers == [], (report.swarm, report.checkers)
    fig = report.figures
    assert fig["kills"] == 1 and fig["unknown_now"] == 0 and fig["reconciled_unknown"] == 1
    assert fig["completed"] == fig["admissions"] - 1
