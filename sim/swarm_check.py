"""The swarm's verdict: no lost admission, no overlap, no double execution, over the file.

Theory of operation
-------------------
After the workers of ``sim.realswarm`` are gone (one SIGKILLed mid-turn, the others run
to completion, its admission made unknown by a survivor and reconciled by the operator),
``load`` reads what is left: the SQLite file (admission rows, lease grants) and every
process's journals (see ``sim.swarm_worker``): the door lines (each submission before it
reached the door, each answer after, each orphaning and reconcile), the tool ledger (an
intent line fsynced before each effect) and the call log, plus the coordinator's
``kills.jsonl`` (the killed pid and the call it was holding).
The three checks are plain functions over that ``SwarmRecord``, so a test can hand them
a record it made up and watch them fail:

``lost_admissions``  every row is terminal, or ``unknown`` (at most one per kill); none
                     is queued or started; every answer names a row with its own key and
                     seq; the two answers of a request handed in twice name one row; every
                     submission got an answer, except the last one of a killed process.
``overlaps``         the grants of a session never overlap in time (``lease_grants``), and
                     every model call and tool run happened inside a live grant of its own
                     (session, turn).
``double_executions`` no (session, call id) has two intents in the ledgers of all the
                     processes; the call a killed turn held never runs in another process
                     (TOOL-10: a durable call without a durable result is reported unknown).

``observation`` rebuilds the whole ``DoorObservation`` (the file, the ledger, the call log
with the bytes sent, the answers) so every registered checker can judge it too
(``sim.realswarm`` runs ``run_all``), as ``sim.realcrash`` does for one process.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from hermes_ref.admission import Ack, AdmissionRow, AdmissionStatus, Refusal
from hermes_ref.door import Submission
from hermes_ref.lease import holder_fields
from hermes_ref.limits import Limits
from hermes_ref.ports import LeaseGrantRow, LedgerEntry
from hermes_ref.tool_specs import TOOLS_BY_NAME
from sim.checkers.admission import DoorObservation
from sim.realcrash import load_calls, load_ledger, read_jsonl
from sim.sqlite_store import SqliteStore
from sim.swarm_worker import CALLS_FILE, DOOR_FILE, LEDGER_FILE
from sim.world import AckRecord, CallRecord

KILLS_FILE = "kills.jsonl"
EPSILON_S = 1e-6


@dataclass(frozen=True)
class ToolRun:
    """One executed tool call from a worker's ledger (its intent line, and outcome if any)."""

    pid: int
    session_id: str
    turn_id: str
    call_id: str
    at: float
    outcome: str = "unknown"


@dataclass(frozen=True)
class Activity:
    """A model call or a tool run, with its process, session, turn and wall time."""

    pid: int
    session_id: str
    turn_id: str
    at: float
    what: str


@dataclass(frozen=True)
class Kill:
    """A SIGKILLed worker and the tool call it was holding when it died."""

    pid: int
    at: float
    session_id: str
    turn_id: str
    call_id: str


@dataclass(frozen=True)
class SwarmRecord:
    admissions: tuple[AdmissionRow, ...]
    grants: tuple[LeaseGrantRow, ...]
    door: tuple[dict[str, Any], ...]  # submit / answer / settled / reconciled lines
    runs: tuple[ToolRun, ...]
    activities: tuple[Activity, ...]
    kills: tuple[Kill, ...]


def _folders(workdir: Path) -> list[Path]:
    return sorted(p for p in workdir.iterdir() if p.is_dir() and (p / DOOR_FILE).exists())


def _runs(folder: Path) -> list[ToolRun]:
    intents: dict[int, dict[str, Any]] = {}
    for line in read_jsonl(folder / LEDGER_FILE):
        if line["kind"] == "intent":
            intents[int(line["n"])] = dict(line)
        elif int(line["n"]) in intents:
            intents[int(line["n"])]["outcome"] = line["outcome"]
    return [ToolRun(int(i["pid"]), str(i["session_id"]), str(i["turn_id"]), str(i["call_id"]),
                    float(i["at"]), str(i.get("outcome", "unknown"))) for i in intents.values()]


def load(db: Path, workdir: Path) -> SwarmRecord:
    """The file and the journals, as the checks read them."""
    store = SqliteStore(db)
    try:
        record = store.snapshot()
    finally:
        store.close()
    door: list[dict[str, Any]] = []
    runs: list[ToolRun] = []
    acts: list[Activity] = []
    for folder in _folders(workdir):
        door.extend(read_jsonl(folder / DOOR_FILE))
        found = _runs(folder)
        runs.extend(found)
        acts.extend(Activity(r.pid, r.session_id, r.turn_id, r.at, f"tool run {r.call_id}")
                    for r in found)
        acts.extend(Activity(int(c["pid"]), str(c["session_id"]), str(c["turn_id"]),
                             float(c["at"]), f"model call {c['request_key']}")
                    for c in read_jsonl(folder / CALLS_FILE))
    kills = tuple(Kill(int(k["pid"]), float(k["at"]), str(k["session_id"]), str(k["turn_id"]),
                       str(k["call_id"])) for k in read_jsonl(workdir / KILLS_FILE))
    return SwarmRecord(record.admissions, record.lease_grants, tuple(door), tuple(runs),
                       tuple(acts), kills)


# ---- the three checks ----------------------------------------------------------------------


def lost_admissions(rec: SwarmRecord) -> list[str]:
    """Every admission ended (or is unknown for a kill); every answer names its own row."""
    out: list[str] = []
    for row in rec.admissions:
        if row.status in (AdmissionStatus.QUEUED, AdmissionStatus.STARTED):
            out.append(f"admission {row.admission_id} ({row.request_id} to {row.session_id}) "
                       f"is still {row.status.value}")
    unknown = [r.admission_id for r in rec.admissions if r.status is AdmissionStatus.UNKNOWN]
    if len(unknown) > len(rec.kills):
        out.append(f"{len(unknown)} admissions are unknown after {len(rec.kills)} kill(s): "
                   f"{', '.join(unknown)}")
    rows = {r.admission_id: r for r in rec.admissions}
    named: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for line in rec.door:
        if line["kind"] != "answer" or "admission_id" not in line:
            continue
        key = (str(line["principal_id"]), str(line["session_id"]), str(line["request_id"]))
        named[key].add(str(line["admission_id"]))
        found = rows.get(str(line["admission_id"]))
        if found is None or (found.principal_id, found.session_id, found.request_id) != key \
                or found.seq != line["seq"]:
            out.append(f"request {key[2]} of {key[0]} was acknowledged as admission "
                       f"{line['admission_id']} (seq {line['seq']}), which has no such row")
    out.extend(f"request {key[2]} of {key[0]} was acknowledged as {len(ids)} admissions"
               for key, ids in named.items() if len(ids) > 1)
    return out + _unanswered(rec)


def _unanswered(rec: SwarmRecord) -> list[str]:
    """Submissions without an answer: allowed only for the last one of a killed process."""
    asked: Counter[tuple[int, str]] = Counter()
    answered: Counter[tuple[int, str]] = Counter()
    last: dict[int, str] = {}
    for line in rec.door:
        key = (int(line["pid"]), str(line.get("request_id")))
        if line["kind"] == "submit":
            asked[key] += 1
            last[key[0]] = key[1]
        elif line["kind"] == "answer":
            answered[key] += 1
    killed = {k.pid for k in rec.kills}
    out: list[str] = []
    for (pid, request), count in asked.items():
        missing = count - answered[(pid, request)]
        if missing > 0 and not (pid in killed and last.get(pid) == request and missing == 1):
            out.append(f"request {request} of pid {pid} was submitted {count} time(s) and "
                       f"answered {answered[(pid, request)]}")
    return out


def _turn_of(grant: LeaseGrantRow) -> str:
    return holder_fields(grant.holder).get("turn", "")


def overlaps(rec: SwarmRecord) -> list[str]:
    """Grants of a session never overlap; every call and run is inside a live grant of its turn."""
    out: list[str] = []
    by_session: dict[str, list[LeaseGrantRow]] = defaultdict(list)
    for grant in rec.grants:
        by_session[grant.session_id].append(grant)
    for session_id, grants in sorted(by_session.items()):
        grants.sort(key=lambda g: g.token)
        for before, after in pairwise(grants):
            if after.acquired_at + EPSILON_S < before.live_until():
                out.append(f"{session_id}: token {after.token} ({after.holder}) was granted "
                           f"{before.live_until() - after.acquired_at:.3f} s before token "
                           f"{before.token} ({before.holder}) stopped being live")
    for act in rec.activities:
        live = [g for g in by_session.get(act.session_id, []) if _turn_of(g) == act.turn_id
                and g.acquired_at - EPSILON_S <= act.at <= g.live_until() + EPSILON_S]
        if not live:
            out.append(f"pid {act.pid} made a {act.what} for turn {act.turn_id} of "
                       f"{act.session_id} at {act.at:.3f} outside any live grant of that turn")
    return out


def double_executions(rec: SwarmRecord) -> list[str]:
    """No (session, call id) runs twice across the processes; a killed turn's call never again."""
    runs: dict[tuple[str, str], list[ToolRun]] = defaultdict(list)
    for run in rec.runs:
        runs[(run.session_id, run.call_id)].append(run)
    out = [f"{call_id} of {session_id} ran {len(found)} times (pids "
           f"{', '.join(str(r.pid) for r in found)})"
           for (session_id, call_id), found in sorted(runs.items()) if len(found) > 1]
    for kill in rec.kills:
        again = [r for r in runs.get((kill.session_id, kill.call_id), []) if r.pid != kill.pid]
        if again:
            out.append(f"{kill.call_id} of {kill.session_id}, held by killed pid {kill.pid}, "
                       f"ran again in pid {again[0].pid} (TOOL-10: it must be reported unknown)")
    return out


def swarm_violations(rec: SwarmRecord) -> list[str]:
    return lost_admissions(rec) + overlaps(rec) + double_executions(rec)


# ---- the whole observation, for every registered checker ----------------------------------


def _ack(line: dict[str, Any]) -> AckRecord:
    sub = Submission(line["principal_id"], line["session_id"], line["request_id"],
                     line["payload"])
    answer: Ack | Refusal
    if "admission_id" in line:
        answer = Ack(admission_id=line["admission_id"], seq=line["seq"],
                     session_id=line["session_id"], principal_id=line["principal_id"],
                     request_id=line["request_id"], fresh=line["fresh"])
    else:
        answer = Refusal(code=line["refused"], message=line.get("message", ""),
                         principal_id=sub.principal_id, session_id=sub.session_id,
                         request_id=sub.request_id, carried=sub.payload)
    return AckRecord(answer=answer, mark=int(line["mark"]), submitted=sub)


def _with_catalog_tools(call: CallRecord) -> CallRecord:
    """The call with the offered tools' local fields back (``keeps_memory`` is not on the
    wire, and CTX-1's checker asks it): each rebuilt spec replaced by the catalog's own."""
    tools = tuple(TOOLS_BY_NAME.get(t.name, t) for t in call.request.tools)
    return dataclasses.replace(call, request=dataclasses.replace(call.request, tools=tools))


def observation(db: Path, workdir: Path, limits: Limits) -> DoorObservation:
    """The ``DoorObservation`` the file and every worker's journals support."""
    store = SqliteStore(db)
    try:
        record = store.snapshot()
    finally:
        store.close()
    ledger: list[LedgerEntry] = []
    calls: list[CallRecord] = []
    acks: list[AckRecord] = []
    for folder in _folders(workdir):
        ledger.extend(load_ledger(folder))
        calls.extend(load_calls(folder))
        acks.extend(_ack(line) for line in read_jsonl(folder / DOOR_FILE)
                    if line["kind"] == "answer")
    calls = sorted((_with_catalog_tools(c) for c in calls), key=lambda c: c.at)
    kills = read_jsonl(workdir / KILLS_FILE)
    return DoorObservation(record=record, ledger=tuple(sorted(ledger, key=lambda e: e.at)),
                           calls=tuple(calls), crash_seqs=tuple(range(len(kills))),
                           limits=limits, acks=tuple(acks))
