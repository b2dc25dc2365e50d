"""The swarm worker's ports: the shared store, a deterministic model, journaled tools.

Theory of operation
-------------------
A worker process (``sim.swarm_worker``) runs the production driver on these:

* ``SwarmStore``: the production ``AsyncSqliteStore`` on the shared file (with the pid
  liveness probe, so a dead holder's lease is reclaimed), which also remembers the
  (session, turn) of this process's last lease grant. The provider and the tools read it
  to journal their session and turn: a worker runs one turn at a time.
* ``SwarmProvider``: the async provider port over the simulator's ``FunctionProvider``. A
  request whose last message is a user row gets one ``write_file`` call whose id is
  derived from the session and the user text (``call_id_for``), so a re-run of the same
  input would call the same id again, visibly; a request whose last message is a tool
  result gets a short answer. Each call is journaled in ``calls.jsonl`` in the line
  format of ``sim.realcrash`` (its ``load_calls`` reads it back), with the wall time at
  the call's start and the bytes sent.
* ``SwarmTools``: the simulator's tools (``SimTools``) over a private in-memory
  workspace, with every executed call journaled in ``ledger.jsonl`` (``sim.realcrash``'s
  format, plus pid, session and turn): an ``intent`` line appended and fsynced *before*
  the effect, an ``outcome`` line after it. With ``hold_at`` = N the N-th executed call
  writes the mid-turn marker (fsynced) and sleeps in its tool thread, its lease still
  refreshed by the driver's refresher task, until the coordinator's SIGKILL arrives:
  after its effect (``hold_when="after"``: the effect happened, no result is durable) or
  before it (``"before"``: the call row is durable, nothing ran).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from hermes_ref.lease import holder_fields
from hermes_ref.models import Lease, LeaseGrant, ProviderReply, Role, SessionRecord, ToolCall, ToolResult
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from hermes_ref.tool_specs import ledger_outcome
from hermes_ref.wire import ProviderRequest
from sim.provider import FunctionProvider, text, tool_calls
from sim.realcrash import append_jsonl
from sim.tools import SimTools

MARKER_FILE = "midturn.json"


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
                 hold_at: int | None, hold_s: float, hold_when: str = "after") -> None:
        super().__init__({})
        self._swarm_store, self._swarm_journal, self._swarm_name = store, journal, name
        self._swarm_marker = marker
        self._swarm_hold_at, self._swarm_hold_s = hold_at, hold_s
        self._swarm_hold_before = hold_when == "before"
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
        if n == self._swarm_hold_at and self._swarm_hold_before:
            self._hold({**base, "session_id": session_id, "turn_id": turn_id, "ran": False})
        append_jsonl(self._swarm_journal, {**base, "kind": "intent", "session_id": session_id,
                                     "turn_id": turn_id, "name": call.name,
                                     "arguments": call.arguments, "watermark": watermark, "at": at})
        result = super()._execute(call, name, args)
        append_jsonl(self._swarm_journal, {**base, "kind": "outcome", "outcome": ledger_outcome(result)})
        if n == self._swarm_hold_at:
            self._hold({**base, "session_id": session_id, "turn_id": turn_id, "ran": True})
        return result

    def _hold(self, marker: dict[str, Any]) -> None:
        """Say where this call is (durably), then wait here for the SIGKILL."""
        append_jsonl(self._swarm_marker, marker)
        time.sleep(self._swarm_hold_s)  # in the tool thread: the refresher keeps the lease alive
