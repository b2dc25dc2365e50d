"""The swarm checks on hand-made records: each catches its own breach and passes a clean one."""

from __future__ import annotations

import dataclasses
from typing import Any

from hermes_ref.admission import (
    AdmissionRow,
    AdmissionStatus,
    BindingRole,
    Intent,
    Move,
    Outcome,
    PrincipalKind,
)
from hermes_ref.ports import LeaseGrantRow
from sim.swarm_check import (
    Activity,
    Kill,
    SwarmRecord,
    ToolRun,
    double_executions,
    lost_admissions,
    overlaps,
    swarm_violations,
)

KILLED_PID = 101


def _row(n: int, session: str, status: AdmissionStatus = AdmissionStatus.TERMINAL,
         **update: Any) -> AdmissionRow:
    settled = {"outcome": Outcome.COMPLETED, "settled_via": Move.SETTLE, "claims": 1} \
        if status is AdmissionStatus.TERMINAL else {}
    return AdmissionRow(admission_id=f"adm-{n}", seq=n, principal_id="w1", session_id=session,
                        request_id=f"w1-{n}", payload_json='{"text":"x"}', payload_digest="d",
                        intent=Intent.QUEUE, principal_kind=PrincipalKind.USER,
                        role=BindingRole.MEMBER, status=status, owner_epoch=1, created_at=0.0,
                        updated_at=0.0, **{**settled, **update})


def _door(pid: int, n: int, session: str, *, answered: bool = True) -> list[dict[str, Any]]:
    key = {"pid": pid, "principal_id": "w1", "session_id": session, "request_id": f"w1-{n}"}
    lines = [{**key, "kind": "submit"}]
    if answered:
        lines.append({**key, "kind": "answer", "admission_id": f"adm-{n}", "seq": n, "mark": n})
    return lines


def _grant(session: str, token: int, turn: str, start: float, end: float) -> LeaseGrantRow:
    return LeaseGrantRow(session_id=session, token=token, acquired_at=start, expires_at=end + 5,
                         holder=f"pid=7:pidns=1:turn={turn}:platform=cli", ended_at=end,
                         end_reason="released")


def clean() -> SwarmRecord:
    """Two sessions, three turns, one killed turn reconciled: nothing wrong."""
    reconciled = _row(3, "s-a", outcome=Outcome.INTERRUPTED, settled_via=Move.RECONCILE,
                      unknown_tick=5)
    return SwarmRecord(
        admissions=(_row(1, "s-a"), _row(2, "s-b"), reconciled),
        grants=(_grant("s-a", 1, "t1", 0.0, 1.0), _grant("s-a", 2, "t3", 1.0, 3.0),
                _grant("s-b", 1, "t2", 0.5, 1.5)),
        door=tuple(_door(7, 1, "s-a") + _door(7, 2, "s-b") + _door(KILLED_PID, 3, "s-a")),
        runs=(ToolRun(7, "s-a", "t1", "call-1", 0.5, "applied"),
              ToolRun(KILLED_PID, "s-a", "t3", "call-3", 2.0, "applied")),
        activities=(Activity(7, "s-a", "t1", 0.2, "model call"),
                    Activity(7, "s-b", "t2", 1.2, "tool run call-2")),
        kills=(Kill(KILLED_PID, 2.5, "s-a", "t3", "call-3"),),
    )


def test_a_clean_record_passes_every_swarm_check() -> None:
    """The hand-made clean record has no lost admission, no overlap, no double execution."""
    assert swarm_violations(clean()) == []


def test_a_call_run_in_two_processes_is_a_double_execution() -> None:
    """The killed turn's call run again by a survivor is named twice: as a re-run and as TOOL-10."""
    rec = clean()
    rerun = ToolRun(7, "s-a", "t4", "call-3", 4.0, "applied")
    found = double_executions(dataclasses.replace(rec, runs=(*rec.runs, rerun)))
    assert len(found) == 2
    assert "call-3 of s-a ran 2 times" in found[0]
    assert "held by killed pid 101, ran again in pid 7" in found[1]


def test_grants_that_overlap_are_caught() -> None:
    """A grant made while the previous one of its session is still live is an overlap."""
    rec = clean()
    early = _grant("s-a", 2, "t3", 0.6, 3.0)  # token 1 is live until 1.0
    found = overlaps(dataclasses.replace(rec, grants=(rec.grants[0], early, rec.grants[2])))
    assert len(found) == 1 and "s-a: token 2" in found[0] and "token 1" in found[0]


def test_a_call_outside_its_turns_grant_is_caught() -> None:
    """A model call of a turn after its grant ended is work done without the lease."""
    rec = clean()
    late = Activity(7, "s-b", "t2", 1.9, "model call")
    found = overlaps(dataclasses.replace(rec, activities=(*rec.activities, late)))
    assert len(found) == 1 and "outside any live grant" in found[0]


def test_a_row_left_queued_is_a_lost_admission() -> None:
    """An admission still queued after the survivors finished is lost."""
    rec = clean()
    stuck = _row(4, "s-b", AdmissionStatus.QUEUED)
    found = lost_admissions(dataclasses.replace(rec, admissions=(*rec.admissions, stuck)))
    assert found == ["admission adm-4 (w1-4 to s-b) is still queued"]


def test_an_ack_without_its_row_is_a_lost_admission() -> None:
    """An acknowledged request whose row is missing from the file is lost."""
    rec = clean()
    found = lost_admissions(dataclasses.replace(rec, admissions=rec.admissions[1:]))
    assert len(found) == 1 and "w1-1 of w1 was acknowledged as admission adm-1" in found[0]


def test_an_unanswered_submission_is_lost_unless_its_process_was_killed() -> None:
    """A survivor's submission with no answer is lost; the killed process's last one is not."""
    rec = clean()
    survivor = _door(7, 5, "s-b", answered=False)
    found = lost_admissions(dataclasses.replace(rec, door=(*rec.door, *survivor)))
    assert len(found) == 1 and "w1-5 of pid 7 was submitted 1 time(s) and answered 0" in found[0]
    killed = _door(KILLED_PID, 6, "s-b", answered=False)
    assert lost_admissions(dataclasses.replace(rec, door=(*rec.door, *killed))) == []


def test_more_unknown_rows_than_kills_is_a_lost_admission() -> None:
    """Two admissions left unknown after one kill: one of them was not the killed turn's."""
    rec = clean()
    unknown = (_row(5, "s-a", AdmissionStatus.UNKNOWN), _row(6, "s-b", AdmissionStatus.UNKNOWN))
    found = lost_admissions(dataclasses.replace(rec, admissions=(*rec.admissions, *unknown)))
    assert found == ["2 admissions are unknown after 1 kill(s): adm-5, adm-6"]
