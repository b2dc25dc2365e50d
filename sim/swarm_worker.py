"""One worker process of the real-process swarm: the production shell on a shared SQLite file.

Theory of operation
-------------------
``python -m sim.realswarm worker ...`` lands in ``main`` here. The process runs the
production stack, not the simulator: an ``AsyncSqliteStore`` on the shared file, an
``AsyncDriver`` on the real wall clock, a lease TTL of a few seconds refreshed by the
driver's refresher task, and in-process fakes behind the ports (``sim.swarm_ports``: a
deterministic model whose one tool call per input has an id derived from the input, and
tools that journal every effect before it happens). The journals live in ``DIR/<name>/``
(``sim.swarm_check`` reads them): ``calls.jsonl``, ``ledger.jsonl`` and ``door.jsonl``
(each submission before it is handed to the door, each answer after it, each settled
drain step, each reconcile).

Each worker begins its own runtime epoch (``door.recover`` with its holder identity), so
several processes drain one file side by side. The loop submits its admissions one per
round through ``door.admit`` (the principal is the worker's name, bound to every
session; every third request is submitted twice, which the door must answer with the
same admission), and in every round takes one drain step per session (a worker told to
hold a call submits more while nothing is left for it to reach that call on). When a
round finds nothing to do it looks for dead processes (``door.recover_dead``, at most
every ``RECOVER_EVERY_S``): the started admissions of an epoch whose holder is dead
become ``unknown``, and the session's queue pauses until an operator reconciles them
(``reconcile``; the coordinator does it). A worker stops when its submissions are done
and nothing is queued, started or unknown (with ``--coordinated``, only once the
coordinator has written ``RELEASE_FILE``, so no survivor is gone before the kill), or when
the shared queue has not moved for ``--idle-exit-s``, or at ``--deadline-s``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_ref import door
from hermes_ref.admission import Ack, EpochStart, Move, Refusal
from hermes_ref.engine import Engine
from hermes_ref.limits import Limits
from hermes_ref.shell import liveness
from hermes_ref.shell.driver import AsyncDriver
from hermes_ref.tool_specs import REFERENCE_TOOLS
from sim.realcrash import append_jsonl
from sim.sabotage import SABOTAGES
from sim.swarm_ports import MARKER_FILE, SwarmProvider, SwarmStore, SwarmTools

OPERATOR = "olga"  # the operator principal that reconciles unknown admissions
CALLS_FILE, LEDGER_FILE, DOOR_FILE = "calls.jsonl", "ledger.jsonl", "door.jsonl"
_PROGRESS = ("SELECT (SELECT COALESCE(MAX(tick), 0) FROM runtime_epoch), "
             "(SELECT COALESCE(MAX(seq), 0) FROM admissions), "
             "(SELECT COUNT(*) FROM admissions WHERE status IN ('queued', 'started', 'unknown'))")
RECOVER_EVERY_S = 0.2
RELEASE_FILE = "release"  # the coordinator's word that the run is over: no kill is to come


@dataclass(frozen=True)
class WorkerConfig:
    db: Path
    workdir: Path
    name: str
    sessions: tuple[str, ...]
    admissions: int
    seed: int = 0
    lease_ttl_s: float = 6.0
    lease_refresh_s: float = 1.0
    hold_at: int | None = None
    hold_s: float = 60.0
    hold_when: str = "after"  # hold the call after its effect, or "before" it
    idle_exit_s: float = 5.0
    deadline_s: float = 30.0
    coordinated: bool = False  # wait for the coordinator's release before stopping


def submission(cfg: WorkerConfig, i: int) -> door.Submission:
    """This worker's i-th request, round robin over the sessions (start shifted by the seed)."""
    session = cfg.sessions[(i + cfg.seed) % len(cfg.sessions)]
    return door.Submission(principal_id=cfg.name, session_id=session,
                           request_id=f"{cfg.name}-{i}",
                           payload={"text": f"{cfg.name} asks: keep note {i} of {session}."})


def submissions(cfg: WorkerConfig) -> list[door.Submission]:
    """This worker's requests; every third one is handed in twice (ADM-3: one admission)."""
    out: list[door.Submission] = []
    for i in range(cfg.admissions):
        sub = submission(cfg, i)
        out.extend([sub, sub] if i % 3 == 0 else [sub])
    return out


def _answer_line(answer: Ack | Refusal) -> dict[str, Any]:
    if isinstance(answer, Ack):
        return {"admission_id": answer.admission_id, "seq": answer.seq, "fresh": answer.fresh}
    return {"refused": answer.code, "message": answer.message}


class Worker:
    """One process's door client and drainer; see the module docstring."""

    def __init__(self, cfg: WorkerConfig, store: SwarmStore) -> None:
        self.cfg = cfg
        folder = cfg.workdir / cfg.name
        folder.mkdir(parents=True, exist_ok=True)
        self.journal = folder / DOOR_FILE
        self.store = store
        self.limits = Limits(lease_ttl_s=cfg.lease_ttl_s, lease_refresh_s=cfg.lease_refresh_s,
                             lease_wait_s_max=cfg.deadline_s, lease_poll_s=0.05)
        self.provider = SwarmProvider(store, folder / CALLS_FILE, cfg.name)
        self.tools = SwarmTools(store, folder / LEDGER_FILE, cfg.name, cfg.workdir / MARKER_FILE,
                                cfg.hold_at, cfg.hold_s, cfg.hold_when)
        self.driver = AsyncDriver(store=store, provider=self.provider, tools=self.tools,
                                  tool_batch_deadline_s=cfg.deadline_s + cfg.hold_s)
        self.engine = Engine(limits=self.limits, tools=REFERENCE_TOOLS,
                             holder=liveness.holder_identity())
        self.epoch = 0  # until ``begin``
        self.turns = 0

    def _log(self, line: dict[str, Any]) -> None:
        append_jsonl(self.journal, {"pid": os.getpid(), "worker": self.cfg.name, **line})

    async def submit(self, sub: door.Submission) -> None:
        self._log({"kind": "submit", "principal_id": sub.principal_id,
                   "session_id": sub.session_id, "request_id": sub.request_id,
                   "payload": sub.payload})
        answer = await self.driver.run(door.admit(sub, self.limits, self.epoch))
        mark = await self.store.admission_mark()  # read after the answer: an upper bound
        self._log({"kind": "answer", "request_id": sub.request_id, "session_id": sub.session_id,
                   "principal_id": sub.principal_id, "payload": sub.payload, "mark": mark,
                   **_answer_line(answer)})

    async def drain_round(self) -> bool:
        """One drain step per session; True when any of them ran a turn."""
        ran = False
        for session in self.cfg.sessions:
            step = await self.driver.run(door.drain_step(self.engine, session, self.epoch))
            if step.admission is None or step.result is None:
                continue
            ran = True
            self.turns += 1
            self._log({"kind": "settled", "admission_id": step.admission.admission_id,
                       "session_id": session, "turn_id": step.result.turn_id,
                       "status": step.admission.status.value,
                       "exit_reason": step.result.exit_reason.value,
                       "settle_error": step.settle_error})
        return ran

    async def begin(self) -> None:
        """This process's own epoch; dead processes' started rows become unknown."""
        start = await self.driver.run(door.recover(liveness.holder_identity()))
        self.epoch = start.epoch
        self._orphans(start)

    async def recover_dead(self) -> None:
        """Look for processes that died since: their started rows become unknown."""
        self._orphans(await self.driver.run(door.recover_dead(self.epoch)))

    def _orphans(self, start: EpochStart) -> None:
        for row in start.orphaned:
            self._log({"kind": "orphaned", "admission_id": row.admission_id,
                       "session_id": row.session_id, "epoch": self.epoch,
                       "retired": list(start.retired)})

    async def reconcile(self, admission_id: str, session_id: str) -> None:
        """The operator's verdict on an unknown row: terminal ``interrupted``, never re-run."""
        moved = await self.driver.run(door.resolve(OPERATOR, session_id, admission_id,
                                                   self.epoch, Move.RECONCILE))
        self._log({"kind": "reconciled", "admission_id": admission_id,
                   "session_id": session_id, "epoch": self.epoch,
                   "refused": moved.code if isinstance(moved, Refusal) else None})

    def _released(self) -> bool:
        """May this worker stop once the queue is empty? Only after the coordinator said
        so (``RELEASE_FILE``: no kill is to come), or at once when nobody coordinates."""
        return not self.cfg.coordinated or (self.cfg.workdir / RELEASE_FILE).exists()

    async def run(self) -> dict[str, Any]:
        cfg = self.cfg
        started = time.monotonic()
        await self.begin()
        todo, more = submissions(cfg), cfg.admissions
        marker, still, looked = _progress(cfg.db), time.monotonic(), 0.0
        while time.monotonic() - started < cfg.deadline_s:
            if todo:
                await self.submit(todo.pop(0))
            ran = await self.drain_round()
            now_marker = _progress(cfg.db)
            if ran or todo or now_marker != marker:
                marker, still = now_marker, time.monotonic()
                continue
            if now_marker[2] == 0 and cfg.hold_at is not None:
                todo.append(submission(cfg, more))  # the others took all the work before
                more += 1                           # this worker reached its held call
            elif (now_marker[2] == 0 and self._released()) \
                    or time.monotonic() - still >= cfg.idle_exit_s:
                break
            elif time.monotonic() - looked >= RECOVER_EVERY_S:
                looked = time.monotonic()
                await self.recover_dead()
            await asyncio.sleep(0.02)
        return {"worker": cfg.name, "pid": os.getpid(), "turns": self.turns,
                "epoch": self.epoch, "tool_runs": self.tools.executed,
                "left": len(todo), "wall_s": round(time.monotonic() - started, 3)}


def _progress(db: Path) -> tuple[int, int, int]:
    """The shared queue's motion: (admission clock, highest seq, rows not yet terminal)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        tick, seq, open_rows = conn.execute(_PROGRESS).fetchone()
    conn.close()
    return int(tick), int(seq), int(open_rows)


async def run_worker(cfg: WorkerConfig) -> dict[str, Any]:
    store = await SwarmStore.open_shared(cfg.db)
    try:
        return await Worker(cfg, store).run()
    finally:
        await store.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, type=Path)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--sessions", required=True, help="comma-separated session ids")
    parser.add_argument("--admissions", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lease-ttl-s", type=float, default=6.0)
    parser.add_argument("--lease-refresh-s", type=float, default=1.0)
    parser.add_argument("--hold-at", type=int, default=None,
                        help="hold (and mark) the N-th executed tool call, to be killed there")
    parser.add_argument("--hold-s", type=float, default=60.0)
    parser.add_argument("--hold-when", choices=("after", "before"), default="after",
                        help="hold the call after its effect, or before it")
    parser.add_argument("--idle-exit-s", type=float, default=5.0)
    parser.add_argument("--deadline-s", type=float, default=30.0)
    parser.add_argument("--coordinated", action="store_true",
                        help="an empty queue ends the worker only after the coordinator's release")
    parser.add_argument("--sabotage", choices=sorted(SABOTAGES), default=None,
                        help="run this worker's engine broken in this way (sim.sabotage)")


def main(args: argparse.Namespace) -> int:
    cfg = WorkerConfig(
        db=args.db, workdir=args.workdir, name=args.name,
        sessions=tuple(s for s in args.sessions.split(",") if s), admissions=args.admissions,
        seed=args.seed, lease_ttl_s=args.lease_ttl_s,
        lease_refresh_s=args.lease_refresh_s, hold_at=args.hold_at, hold_s=args.hold_s,
        hold_when=args.hold_when,
        idle_exit_s=args.idle_exit_s, deadline_s=args.deadline_s, coordinated=args.coordinated)
    with SABOTAGES[args.sabotage].applied() if args.sabotage else contextlib.nullcontext():
        summary = asyncio.run(run_worker(cfg))
    print(json.dumps(summary, sort_keys=True), flush=True)
    return 0


def worker_command(db: Path, workdir: Path, name: str, sessions: Sequence[str],
                   **options: object) -> list[str]:
    """The argv tail of one worker (``python -m sim.realswarm`` comes before it)."""
    argv = ["worker", "--db", str(db), "--workdir", str(workdir), "--name", name,
            "--sessions", ",".join(sessions)]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not None and value is not False:
            argv += [flag, str(value)]
    return argv
