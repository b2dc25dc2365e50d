"""One worker process of the real-process swarm: the production shell on a shared SQLite file.

Theory of operation
-------------------
``python -m sim.realswarm worker ...`` lands in ``main`` here. The process runs the
production stack, not the simulator: an ``AsyncSqliteStore`` on the shared file (with the
pid liveness probe, so a dead holder's lease is reclaimed), an ``AsyncDriver`` on the real
wall clock, a lease TTL of a few seconds refreshed by the driver's refresher task, and
two in-process fakes behind the ports:

* ``SwarmProvider``: a deterministic model. A request whose last message is a user row
  gets one ``write_file`` call whose id is derived from the session and the user text (so
  a re-run of the same input would call the same id again, visibly); a request whose
  last message is a tool result gets a short answer.
* ``SwarmTools``: the simulator's tools (``SimTools``) over a private in-memory
  workspace, with every executed call journaled: an ``intent`` line (pid, session, turn,
  call id, watermark, time) is appended and fsynced *before* the effect, an ``outcome``
  line after it. With ``--hold-at N`` the N-th executed call then writes the mid-turn
  marker (fsynced) and sleeps in its tool thread, holding the lease (its refresher keeps
  running) until the coordinator's SIGKILL arrives.

``SwarmStore`` remembers which (session, turn) this process was last granted a lease
for; the provider and the tools read it to journal their session and turn (a process
runs one turn at a time). The journals live in ``DIR/<name>/`` (``swarm_check`` reads
them): ``calls.jsonl``, ``ledger.jsonl`` and ``door.jsonl`` (each submission before it
is handed to the door, each answer after it, each settled drain step).

The loop submits its admissions one per round through ``door.admit`` (the principal is
the worker's name, bound to every session; every third request is submitted twice, which
the door must answer with the same admission), and in every round takes one drain step
per session. It stops when its submissions are done and the shared queue has not moved
(no claim, settle or new row) for ``--idle-exit-s``, or at ``--deadline-s``. With
``--recover`` it first begins a new runtime epoch (started rows of the old one become
unknown), reconciles each orphan as the operator, and drains until nothing is queued.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_ref import door
from hermes_ref.admission import Ack, Move, Refusal
from hermes_ref.engine import Engine
from hermes_ref.lease import holder_fields
from hermes_ref.limits import Limits
from hermes_ref.models import Lease, LeaseGrant, ProviderReply, Role, SessionRecord, ToolCall, ToolResult
from hermes_ref.shell import liveness
from hermes_ref.shell.driver import AsyncDriver
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from hermes_ref.tool_specs import REFERENCE_TOOLS, ledger_outcome
from hermes_ref.wire import ProviderRequest
from sim.provider import FunctionProvider, text, tool_calls
from sim.realcrash import append_jsonl
from sim.tools import SimTools

OPERATOR = "olga"  # the operator principal that reconciles unknown admissions
MARKER_FILE = "midturn.json"
CALLS_FILE, LEDGER_FILE, DOOR_FILE = "calls.jsonl", "ledger.jsonl", "door.jsonl"
_PROGRESS = ("SELECT (SELECT COALESCE(MAX(tick), 0) FROM runtime_epoch), "
             "(SELECT COALESCE(MAX(seq), 0) FROM admissions), "
             "(SELECT COUNT(*) FROM admissions WHERE status IN ('queued', 'started'))")


class SwarmStore(AsyncSqliteStore):
    """The production store, remembering the (session, turn) of this process's last grant."""

    turn: tuple[str, str] = ("", "")

    @classmethod
    async def open_shared(cls, path: Path) -> SwarmStore:
        """``open`` (with the pid liveness probe), typed as this class, which it builds."""
        store = await cls.open(path)
        assert isinstance(store, SwarmStore)
        return store

    def _granted(self, session_id: str, holder: str) -> None:
        self.turn = (session_id, holder_fields(holder).get("turn", ""))

    async def open_turn(self, record: SessionRecord, holder: str, *args: Any,
                        **kwargs: Any) -> LeaseGrant:
        grant = await super().open_turn(record, holder, *args, **kwargs)
        if grant.lease is not None:
            self._granted(record.id, holder)
        return grant

    async def acquire_lease(self, session_id: str, holder: str, *args: Any,
                            **kwargs: Any) -> Lease | None:
        lease = await super().acquire_lease(session_id, holder, *args, **kwargs)
        if lease is not None:
            self._granted(session_id, holder)
        return lease


def call_id_for(session_id: str, user_text: str) -> str:
    """The deterministic call id of an input's one tool call: a re-run repeats it."""
    return "call-" + hashlib.sha256(f"{session_id}\n{user_text}".encode()).hexdigest()[:12]


class SwarmProvider:
    """The async provider port over a deterministic fake; every call journaled."""

    def __init__(self, store: SwarmStore, journal: Path, name: str) -> None:
        self._store, self._name = store, name
        self._journal = journal
        self._fake = FunctionProvider(self._reply)
        self.calls = 0

    def _reply(self, request: ProviderRequest) -> ProviderReply:
        last = request.messages[-1]
        session_id = self._store.turn[0]
        if last.role is Role.USER and request.tools:
            said = last.content or ""
            call = ToolCall(id=call_id_for(session_id, said), name="write_file",
                            arguments=json.dumps({"path": f"{call_id_for(session_id, said)}.txt",
                                                  "content": said}))
            return tool_calls(call)
        return text(f"Saved ({session_id}).")

    async def complete(self, request: ProviderRequest) -> ProviderReply:
        at = time.time()
        reply = self._fake.complete(request)
        self.calls += 1
        session_id, turn_id = self._store.turn
        append_jsonl(self._journal, {  # the line format of sim.realcrash's calls.jsonl
            "phase": self._name, "pid": os.getpid(), "seq": self.calls,
            "session_id": session_id, "turn_id": turn_id, "watermark": await self._store.watermark(),
            "request_key": f"{self._name}:{self.calls}", "purpose": request.purpose,
            "model": request.model, "prompt_tokens": request.prompt_tokens,
            "body": bytes(request.wire_body()).decode("utf-8"),
            "reply": reply.model_dump(mode="json"), "error": None, "at": at,
            "retry_after_s": None})
        return reply


class SwarmTools(SimTools):
    """``SimTools`` whose every executed call is journaled before its effect (module doc)."""

    def __init__(self, store: SwarmStore, journal: Path, name: str, marker: Path,
                 hold_at: int | None, hold_s: float) -> None:
        super().__init__({})
        self._swarm_store, self._swarm_journal, self._swarm_name = store, journal, name
        self._swarm_marker = marker
        self._swarm_hold_at, self._swarm_hold_s = hold_at, hold_s
        self._swarm_context: tuple[int, float] = (0, 0.0)
        self.executed = 0

    def _run(self, call: ToolCall, watermark: int, at: float) -> ToolResult:
        self._swarm_context = (watermark, at)
        return super()._run(call, watermark, at)

    def _execute(self, call: ToolCall, name: str, args: dict[str, Any]) -> ToolResult:
        self.executed += 1
        n = self.executed
        (session_id, turn_id), (watermark, at) = self._swarm_store.turn, self._swarm_context
        base = {"phase": self._swarm_name, "pid": os.getpid(), "n": n, "call_id": call.id}
        append_jsonl(self._swarm_journal, {**base, "kind": "intent", "session_id": session_id,
                                     "turn_id": turn_id, "name": call.name,
                                     "arguments": call.arguments, "watermark": watermark, "at": at})
        result = super()._execute(call, name, args)
        append_jsonl(self._swarm_journal, {**base, "kind": "outcome", "outcome": ledger_outcome(result)})
        if n == self._swarm_hold_at:
            append_jsonl(self._swarm_marker, {**base, "session_id": session_id, "turn_id": turn_id})
            time.sleep(self._swarm_hold_s)  # in the tool thread: the refresher keeps the lease alive
        return result


@dataclass(frozen=True)
class WorkerConfig:
    db: Path
    workdir: Path
    name: str
    sessions: tuple[str, ...]
    admissions: int
    epoch: int
    seed: int = 0
    lease_ttl_s: float = 6.0
    lease_refresh_s: float = 1.0
    hold_at: int | None = None
    hold_s: float = 60.0
    idle_exit_s: float = 1.5
    deadline_s: float = 30.0
    recover: bool = False


def submissions(cfg: WorkerConfig) -> list[door.Submission]:
    """This worker's requests, round robin over the sessions (start shifted by the seed);
    every third one is handed in twice (ADM-3: the same request is one admission)."""
    out: list[door.Submission] = []
    for i in range(cfg.admissions):
        session = cfg.sessions[(i + cfg.seed) % len(cfg.sessions)]
        sub = door.Submission(principal_id=cfg.name, session_id=session,
                              request_id=f"{cfg.name}-{i}",
                              payload={"text": f"{cfg.name} asks: keep note {i} of {session}."})
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
                                cfg.hold_at, cfg.hold_s)
        self.driver = AsyncDriver(store=store, provider=self.provider, tools=self.tools,
                                  tool_batch_deadline_s=cfg.deadline_s + cfg.hold_s)
        self.engine = Engine(limits=self.limits, tools=REFERENCE_TOOLS,
                             holder=liveness.holder_identity())
        self.epoch = cfg.epoch
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

    async def recover(self) -> None:
        """A new epoch; each orphan (a started row of the old one) reconciled by the operator."""
        start = await self.driver.run(door.recover())
        self.epoch = start.epoch
        for row in start.orphaned:
            moved = await self.driver.run(door.resolve(OPERATOR, row.session_id, row.admission_id,
                                                       self.epoch, Move.RECONCILE))
            self._log({"kind": "reconciled", "admission_id": row.admission_id,
                       "session_id": row.session_id, "epoch": self.epoch,
                       "refused": moved.code if isinstance(moved, Refusal) else None})

    async def run(self) -> dict[str, Any]:
        cfg = self.cfg
        started = time.monotonic()
        if cfg.recover:
            await self.recover()
        todo = submissions(cfg)
        marker, still = _progress(cfg.db), time.monotonic()
        while time.monotonic() - started < cfg.deadline_s:
            if todo:
                await self.submit(todo.pop(0))
            ran = await self.drain_round()
            now_marker = _progress(cfg.db)
            if ran or todo or now_marker != marker:
                marker, still = now_marker, time.monotonic()
                continue
            if now_marker[2] == 0 or (not cfg.recover
                                      and time.monotonic() - still >= cfg.idle_exit_s):
                break
            await asyncio.sleep(0.02)
        return {"worker": cfg.name, "pid": os.getpid(), "turns": self.turns,
                "epoch": self.epoch, "tool_runs": self.tools.executed,
                "left": len(todo), "wall_s": round(time.monotonic() - started, 3)}


def _progress(db: Path) -> tuple[int, int, int]:
    """The shared queue's motion: (admission clock, highest seq, rows queued or started)."""
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
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lease-ttl-s", type=float, default=6.0)
    parser.add_argument("--lease-refresh-s", type=float, default=1.0)
    parser.add_argument("--hold-at", type=int, default=None,
                        help="hold (and mark) the N-th executed tool call, to be killed there")
    parser.add_argument("--hold-s", type=float, default=60.0)
    parser.add_argument("--idle-exit-s", type=float, default=1.5)
    parser.add_argument("--deadline-s", type=float, default=30.0)
    parser.add_argument("--recover", action="store_true")


def main(args: argparse.Namespace) -> int:
    cfg = WorkerConfig(
        db=args.db, workdir=args.workdir, name=args.name,
        sessions=tuple(s for s in args.sessions.split(",") if s), admissions=args.admissions,
        epoch=args.epoch, seed=args.seed, lease_ttl_s=args.lease_ttl_s,
        lease_refresh_s=args.lease_refresh_s, hold_at=args.hold_at, hold_s=args.hold_s,
        idle_exit_s=args.idle_exit_s, deadline_s=args.deadline_s, recover=args.recover)
    print(json.dumps(asyncio.run(run_worker(cfg)), sort_keys=True), flush=True)
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
