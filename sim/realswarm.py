"""Real processes on one SQLite file: several workers submit and drain, one is SIGKILLed.

Theory of operation
-------------------
::

    python -m sim.realswarm run    --workdir DIR [--processes 4 --sessions 3 --admissions 6]
    python -m sim.realswarm worker --db FILE --workdir DIR --name W --sessions s-a,s-b ...
    python -m sim.realswarm check  --workdir DIR

``run`` (``run_swarm``) sets the file up in this process with the production store: the
sessions, each worker's principal bound to every session as a member, and the operator.
This process then begins its own runtime epoch (it is the operator, and it submits too)
and starts P worker processes (``sim.swarm_worker``), each on an epoch of its own. They
all submit to and drain the same sessions at once; the admission queue (ADM-4) and the
turn lease (LEASE-1) are all that keep them apart. The first worker is told to hold its
``hold_at``-th tool call: right after the call's effect is journaled (or just before it)
it writes ``midturn.json`` and sleeps in its tool thread, its lease still refreshed. The
coordinator waits for that marker, checks the file (``mid_turn``: the victim's unexpired
lease, the durable tool-call row, no result), SIGKILLs the worker, reaps it (a zombie
still answers ``kill(pid, 0)``, so reaping is what makes its pid dead to the liveness
probe) and writes ``kills.jsonl``.

The survivors run on. When a round of theirs finds nothing to do they look for dead
processes (``door.recover_dead``): the killed worker's epoch is retired and its started
admission becomes ``unknown``, which pauses that session's queue (ADM-5). The
coordinator then acts as the operator would: it submits one more input to each session
(a user writing again, so every session runs a turn after the kill), waits for the
unknown row and reconciles it (terminal ``interrupted``, never re-run). The survivors
drain the rest. The first turn on the killed session finds the dead holder's lease still
unexpired and takes it back through the liveness probe; its prologue reports the held
call unknown instead of running it again (TOOL-10). The coordinator then writes the
release file, and the survivors exit once nothing is queued, started or unknown (before
the release an empty queue does not end them: a survivor gone before the kill could not
find the dead).

Then ``check`` (``sim.swarm_check``) judges the file and the journals: the three swarm
checks and every registered checker over the rebuilt observation. ``SwarmReport``
carries the figures (processes, sessions, admissions submitted, completed, unknown,
kills, phase times, wall time) and both lists of violations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hermes_ref.admission import AdmissionStatus, Binding, BindingRole, PrincipalKind
from hermes_ref.lease import holder_fields
from hermes_ref.limits import Limits
from hermes_ref.prologue import TurnInput, session_record
from hermes_ref.tool_specs import REFERENCE_TOOLS
from sim import swarm_worker
from sim.checkers import run_all
from sim.realcrash import append_jsonl, read_jsonl
from sim.swarm_check import KILLS_FILE, load, observation, swarm_violations
from sim.swarm_ports import MARKER_FILE, SwarmStore
from sim.swarm_worker import OPERATOR

ROOT = Path(__file__).resolve().parents[1]
DB_FILE = "swarm.db"
COORDINATOR = "op"  # the coordinator's name as a submitter (it reconciles as OPERATOR)


@dataclass(frozen=True)
class SwarmPlan:
    processes: int = 4
    sessions: int = 3
    admissions: int = 6  # per worker (every third is also handed in a second time)
    hold_at: int = 2     # the victim is killed holding its hold_at-th tool call
    hold_when: str = "after"  # after that call's effect, or "before" it
    lease_ttl_s: float = 8.0  # long enough that the dead holder's lease is still unexpired
    lease_refresh_s: float = 1.0  # when recovery asks for it: the liveness probe reclaims it
    idle_exit_s: float = 5.0  # a fallback: workers exit once nothing is left to do
    timeout_s: float = 30.0
    sabotage: str = ""   # a sim.sabotage name every worker runs under (proof the checks bite)

    @property
    def session_ids(self) -> tuple[str, ...]:
        return tuple(f"s-{chr(ord('a') + i)}" for i in range(self.sessions))

    @property
    def limits(self) -> Limits:
        return Limits(lease_ttl_s=self.lease_ttl_s, lease_refresh_s=self.lease_refresh_s)


@dataclass
class SwarmReport:
    figures: dict[str, Any]
    swarm: list[str] = field(default_factory=list)     # the three swarm checks
    checkers: list[str] = field(default_factory=list)  # every registered checker

    @property
    def ok(self) -> bool:
        return not self.swarm and not self.checkers


async def _setup(db: Path, plan: SwarmPlan, names: Sequence[str]) -> None:
    """Sessions and bindings, through the production store."""
    store = await SwarmStore.open_shared(db)
    try:
        now = time.time()
        for session in plan.session_ids:
            record = session_record(TurnInput(session_id=session, text=""), REFERENCE_TOOLS, now)
            await store.ensure_session(record)
            for name in names:
                await store.bind_principal(Binding(principal_id=name, kind=PrincipalKind.USER,
                                                   session_id=session, role=BindingRole.MEMBER))
            await store.bind_principal(Binding(principal_id=OPERATOR, kind=PrincipalKind.OPERATOR,
                                               session_id=session, role=BindingRole.OPERATOR))
    finally:
        await store.close()


def _spawn(db: Path, workdir: Path, name: str, plan: SwarmPlan, **options: object,
           ) -> subprocess.Popen[str]:
    argv = swarm_worker.worker_command(
        db, workdir, name, plan.session_ids, lease_ttl_s=plan.lease_ttl_s,
        lease_refresh_s=plan.lease_refresh_s, idle_exit_s=plan.idle_exit_s,
        deadline_s=plan.timeout_s, sabotage=plan.sabotage or None, coordinated=True, **options)
    return subprocess.Popen([sys.executable, "-m", "sim.realswarm", *argv], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def _await_marker(marker: Path, victim: subprocess.Popen[str],
                        deadline: float) -> dict[str, Any]:
    while time.monotonic() < deadline:
        lines = read_jsonl(marker)
        if lines:
            return lines[-1]
        if victim.poll() is not None:
            raise RuntimeError(f"the victim exited ({victim.returncode}) before it held a call: "
                               f"{victim.stderr.read() if victim.stderr else ''}")
        await asyncio.sleep(0.01)
    raise TimeoutError("the victim never reached its held tool call")


def _unknown_rows(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        rows = conn.execute("SELECT admission_id, session_id FROM admissions "
                            "WHERE status = 'unknown' ORDER BY seq").fetchall()
    conn.close()
    return [(str(a), str(s)) for a, s in rows]


async def _operate(operator: swarm_worker.Worker, deadline: float) -> int:
    """After the kill: one more input per session, then reconcile what a survivor made unknown."""
    for i in range(len(operator.cfg.sessions)):
        await operator.submit(swarm_worker.submission(operator.cfg, i))
    while time.monotonic() < deadline:
        found = _unknown_rows(operator.cfg.db)
        if found:
            for admission_id, session_id in found:
                await operator.reconcile(admission_id, session_id)
            return len(found)
        await asyncio.sleep(0.01)
    raise TimeoutError("no survivor found the killed worker's admission")


def mid_turn(db: Path, held: dict[str, Any], pid: int) -> dict[str, bool]:
    """What the file shows of the held turn just before the kill: its lease, held by the
    victim and unexpired, and its durable tool-call row (and no result row yet)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        lease = conn.execute("SELECT holder, expires_at FROM turn_leases WHERE session_id = ?",
                             (held["session_id"],)).fetchone()
        rows = conn.execute("SELECT role, tool_calls, tool_call_id FROM messages "
                            "WHERE session_id = ? AND turn_id = ?",
                            (held["session_id"], held["turn_id"])).fetchall()
    conn.close()
    fields = holder_fields(str(lease[0])) if lease is not None and lease[0] else {}
    return {
        "lease_held": fields.get("pid") == str(pid) and fields.get("turn") == held["turn_id"]
        and float(lease[1]) > time.time(),
        "call_row": any(role == "assistant" and held["call_id"] in (calls or "")
                        for role, calls, _ in rows),
        "result_row": any(role == "tool" and call_id == held["call_id"]
                          for role, _, call_id in rows),
    }


def _finish(proc: subprocess.Popen[str], deadline: float) -> dict[str, Any]:
    out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    if proc.returncode != 0:
        raise RuntimeError(f"worker pid {proc.pid} exited {proc.returncode}: {err[-2000:]}")
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return summary


def run_swarm(workdir: Path, plan: SwarmPlan | None = None) -> SwarmReport:
    """Start the workers, kill one mid-turn, let the others finish, check."""
    plan = plan or SwarmPlan()
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / DB_FILE
    names = [f"w{i}" for i in range(plan.processes)]
    began = time.monotonic()
    asyncio.run(_setup(db, plan, [*names, COORDINATOR]))
    procs: list[subprocess.Popen[str]] = []
    try:
        phases = asyncio.run(_kill_and_reconcile(db, workdir, plan, names, procs, began))
        summaries = [_finish(p, began + plan.timeout_s) for p in procs[1:]]
        phases["survivors_done_at_s"] = time.monotonic() - began
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    report = judge(db, workdir, plan, summaries, time.monotonic() - began)
    phases["checked_at_s"] = time.monotonic() - began
    report.figures.update({k: round(v, 2) for k, v in phases.items()})
    return report


async def _kill_and_reconcile(db: Path, workdir: Path, plan: SwarmPlan, names: Sequence[str],
                              procs: list[subprocess.Popen[str]], began: float,
                              ) -> dict[str, float]:
    """The coordinator's part while the workers run: start them, kill one, reconcile."""
    deadline = began + plan.timeout_s
    store = await SwarmStore.open_shared(db)
    try:
        operator = swarm_worker.Worker(swarm_worker.WorkerConfig(
            db=db, workdir=workdir, name=COORDINATOR, sessions=plan.session_ids,
            admissions=plan.sessions, lease_ttl_s=plan.lease_ttl_s,
            lease_refresh_s=plan.lease_refresh_s), store)
        await operator.begin()  # before the kill: the survivors, not this, find the dead
        procs.extend(_spawn(db, workdir, name, plan, admissions=plan.admissions, seed=i,
                            hold_at=plan.hold_at if i == 0 else None,
                            hold_when=plan.hold_when if i == 0 else None)
                     for i, name in enumerate(names))
        victim = procs[0]
        held = await _await_marker(workdir / MARKER_FILE, victim, deadline)
        seen = mid_turn(db, held, victim.pid)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()  # reaped: from now on its pid is dead to the liveness probe
        phases = {"killed_at_s": time.monotonic() - began}
        append_jsonl(workdir / KILLS_FILE, {**held, **seen, "pid": victim.pid,
                                            "at": time.time()})
        await _operate(operator, deadline)
        phases["reconciled_at_s"] = time.monotonic() - began
        (workdir / swarm_worker.RELEASE_FILE).touch()  # no kill is to come: finish and go
        return phases
    finally:
        await store.close()


def judge(db: Path, workdir: Path, plan: SwarmPlan, summaries: list[dict[str, Any]],
          wall_s: float) -> SwarmReport:
    """The figures and the violations of a finished run."""
    rec = load(db, workdir)
    statuses = Counter((r.status.value, r.outcome.value if r.outcome else None)
                       for r in rec.admissions)
    answers = [d for d in rec.door if d["kind"] == "answer"]
    dead = [g for g in rec.grants if g.end_reason == "holder_dead"]
    figures = {
        "processes": plan.processes + 1,  # the workers and the coordinator (the operator)
        "workers": plan.processes, "sessions": plan.sessions,
        "submissions": sum(1 for d in rec.door if d["kind"] == "submit"),
        "admissions": len(rec.admissions),
        "resubmissions_answered_same": sum(1 for a in answers if a.get("fresh") is False),
        "completed": statuses[(AdmissionStatus.TERMINAL.value, "completed")],
        "reconciled_unknown": sum(1 for r in rec.admissions if r.unknown_tick is not None),
        "unknown_now": sum(n for (s, _), n in statuses.items() if s == "unknown"),
        "kills": len(rec.kills), "turns": sum(1 for d in rec.door if d["kind"] == "settled"),
        "tool_runs": len(rec.runs), "grants": len(rec.grants),
        "model_calls": sum(1 for a in rec.activities if a.what.startswith("model call")),
        "reclaimed_dead_holder": len(dead),
        "reclaimed_before_expiry": sum(1 for g in dead if (g.ended_at or 0) < g.expires_at),
        "wall_s": round(wall_s, 2), "workers_summary": summaries,
    }
    checkers = list(dict.fromkeys(str(v) for v in run_all(observation(db, workdir, plan.limits))))
    return SwarmReport(figures, swarm_violations(rec), checkers)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.realswarm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="the whole swarm: start, kill, recover, check")
    run.add_argument("--workdir", required=True, type=Path)
    for name, default in asdict(SwarmPlan()).items():
        run.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    swarm_worker.add_arguments(sub.add_parser("worker", help="one worker process"))
    check = sub.add_parser("check", help="judge a finished run's file and journals")
    check.add_argument("--workdir", required=True, type=Path)
    args = parser.parse_args(argv)
    if args.command == "worker":
        return swarm_worker.main(args)
    if args.command == "run":
        fields = {k: getattr(args, k) for k in asdict(SwarmPlan())}
        report = run_swarm(args.workdir, SwarmPlan(**fields))
    else:
        report = judge(args.workdir / DB_FILE, args.workdir, SwarmPlan(), [], 0.0)
    print(json.dumps(asdict(report), indent=1, sort_keys=True))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
