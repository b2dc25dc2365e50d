"""Real crashes: a child process is killed with SIGKILL at a crash point, then restarted.

Theory of operation
-------------------
The simulated crash stories (``scenarios/crashes.py``) drop the engine's coroutine at a
named crash point inside one Python process. This module runs the same stories across
real processes on one SQLite file::

    python -m sim.realcrash first  --db PATH --workdir DIR --story NAME [--crash POINT]
    python -m sim.realcrash second --db PATH --workdir DIR --story NAME
    python -m sim.realcrash check  --db PATH --workdir DIR

``first`` runs the story's first turn with ``World.on_crash`` set to SIGKILL the process
itself: when the driver reaches the crash point the process dies on the spot, mid-turn,
and SQLite keeps exactly what it had committed. ``second`` is a new process on the same
file: its engine's prologue finds the session lease still held (and unexpired: the
virtual clock has moved on by one second only) by a holder naming the dead pid, and
reclaims it because ``liveness.holder_alive`` says that pid no longer exists; the
recovery rows are then written and the second turn runs. ``check`` (``check()``) opens
the file with a fresh store and runs every checker.

What the children persist outside the store, and why
----------------------------------------------------
The checkers read three things: the durable record (the SQLite file), the tool ledger
and the provider call log. A killed process keeps nothing in memory, so the other two
are journaled in ``DIR``, each made durable (``flush`` + ``os.fsync``) *before* the fact
it describes can be lost:

* ``ledger.jsonl``: an ``intent`` line (call id, name, arguments, watermark, time) is
  written before a validated tool call's effect is applied, and an ``outcome`` line after
  it. An intent without an outcome rebuilds as a ledger entry with outcome ``unknown``:
  the effect may have happened, so the ledger must not forget it (TOOL-1 is judged on it).
* ``files.json``: the simulated workspace, rewritten atomically (temp file, fsync,
  rename, fsync of the folder) after every tool call and before its outcome line, so
  an outcome line implies the file shows the effect. Both phases load it at start.
* ``calls.jsonl``: one line per provider call, written right after the provider answers
  and before the engine sees the reply: session, turn, watermark, the driver's effect
  counter, the virtual time, the request body exactly as recorded (the bytes
  ``ProviderRequest.body`` produced, as UTF-8 text; plus model, purpose and prompt tokens,
  which the engine's request carries beside the body) and the reply or error (with the
  Retry-After of a rate limit). Retries of one request share a
  ``request_key`` so the rebuilt records share one request object, as the in-process
  records do (``budget_accounting`` counts distinct request objects).
* ``crashes.jsonl``: the crash point, the driver's effect counter and the virtual time,
  written by the ``on_crash`` hook just before the SIGKILL. It rebuilds
  ``Observation.crash_seqs`` and lets ``second`` start its clock after the crash.

Each phase mints ids from its own base (``first`` 0, ``second`` 1000), so turn ids of
the two processes never collide.

Checkers over persisted data
----------------------------
Every registered checker runs on the rebuilt ``Observation``. Each rebuilt call record
carries the logged body bytes, so the wire checkers (WIRE-3 among them) judge exactly
what the killed process sent, as they do in process. The request object beside them is
rebuilt from the body with ``request_from_wire``, after dropping any non-wire key it
would refuse; its messages carry their wire form only (``content`` is what was sent,
local fields such as row ids are absent), which is all the request-reading checkers
look at.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_ref.engine import Engine
from hermes_ref.limits import Limits
from hermes_ref.models import WIRE_MESSAGE_KEYS, ProviderReply, ToolCall, ToolResult
from hermes_ref.ports import LedgerEntry
from hermes_ref.prologue import TurnInput
from hermes_ref.shell import liveness
from hermes_ref.tool_specs import REFERENCE_TOOLS
from hermes_ref.wire import ProviderRequest, WireBody
from sim.checkers import Observation, run_all
from sim.clock import DEFAULT_EPOCH_S, VirtualClock
from sim.driver import SimDriver
from sim.faults import CrashPoint, FaultPlan
from sim.provider import ScriptedProvider, text, tool_calls
from sim.provider_http import request_from_wire
from sim.sqlite_store import SqliteStore
from sim.tools import SimTools
from sim.world import CallRecord, World

SESSION_ID = "s-1"
ID_BASES = {"first": 0, "second": 1000}
LEDGER_FILE = "ledger.jsonl"
CALLS_FILE = "calls.jsonl"
CRASHES_FILE = "crashes.jsonl"
FILES_FILE = "files.json"


# ---- the stories ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RealStory:
    """Two turns around a crash: the same shape as ``scenarios/crashes.py``."""

    files: dict[str, str]
    first_script: tuple[ProviderReply, ...]
    first_text: str
    second_script: tuple[ProviderReply, ...]
    second_text: str
    crash: str  # the default crash point of the first turn


def _save_notes(crash: str) -> RealStory:
    return RealStory(
        files={"notes.txt": "draft"},
        first_script=(tool_calls(("write_file", {"path": "notes.txt", "content": "final"})),
                      text("Saved.")),
        first_text="Save the final version of my notes.",
        second_script=(text("I am here."),),
        second_text="Are you still there?",
        crash=crash,
    )


STORIES: dict[str, RealStory] = {
    "crash_before_tool_call_row": _save_notes("before:tool_calls"),
    "crash_after_tool_call_row": _save_notes("after:tool_calls"),
    "crash_after_tool_ran": _save_notes("after:tools"),
    "crash_before_final_row": _save_notes("before:final"),
}


# ---- durable journals -----------------------------------------------------------------------


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line and make it durable before returning."""
    created = not path.exists()
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    if created:
        _fsync_dir(path.parent)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a journal; a torn last line (no newline) is ignored."""
    if not path.exists():
        return []
    raw = path.read_text(encoding="utf-8")
    lines = raw.split("\n")
    complete = lines[:-1]  # the piece after the last newline is empty or torn
    return [json.loads(line) for line in complete if line.strip()]


def write_json_atomic(path: Path, value: object) -> None:
    """Replace ``path`` with ``value`` so a reader sees the old or the new file, whole."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump(value, handle, sort_keys=True, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def load_files(workdir: Path) -> dict[str, str]:
    path = workdir / FILES_FILE
    if not path.exists():
        return {}
    loaded = json.loads(path.read_text(encoding="utf-8"))
    return {str(k): str(v) for k, v in loaded.items()}


class JournaledTools(SimTools):
    """``SimTools`` whose ledger and workspace survive a SIGKILL (see the module docstring)."""

    def __init__(self, workdir: Path, phase: str) -> None:
        super().__init__(load_files(workdir))
        self._ledger_path = workdir / LEDGER_FILE
        self._files_path = workdir / FILES_FILE
        self._phase = phase
        self._context: tuple[int, float] = (0, 0.0)
        self._intents = 0

    def run(self, call: ToolCall, *, watermark: int = 0, at: float = 0.0) -> ToolResult:
        self._context = (watermark, at)
        before = len(self.ledger)
        result = super().run(call, watermark=watermark, at=at)
        write_json_atomic(self._files_path, self.snapshot_files())
        if len(self.ledger) > before:
            append_jsonl(self._ledger_path, {
                "kind": "outcome", "phase": self._phase, "n": self._intents,
                "call_id": call.id, "outcome": self.ledger[-1].outcome,
            })
        return result

    def _execute(self, call: ToolCall, name: str, args: dict[str, Any]) -> ToolResult:
        # Reached only for validated calls, i.e. exactly those SimTools puts in its ledger.
        watermark, at = self._context
        self._intents += 1
        append_jsonl(self._ledger_path, {
            "kind": "intent", "phase": self._phase, "n": self._intents, "call_id": call.id,
            "name": call.name, "arguments": call.arguments, "watermark": watermark, "at": at,
        })
        return super()._execute(call, name, args)


class JournaledCalls(list[CallRecord]):
    """The world's provider call log, each record fsynced to ``calls.jsonl`` as it arrives."""

    def __init__(self, path: Path, phase: str) -> None:
        super().__init__()
        self._path = path
        self._phase = phase
        self._keys: dict[int, str] = {}  # id(request) -> key; records keep the requests alive

    def append(self, record: CallRecord, /) -> None:
        key = self._keys.setdefault(id(record.request), f"{self._phase}:{len(self._keys) + 1}")
        request = record.request
        append_jsonl(self._path, {
            "phase": self._phase, "seq": record.seq, "session_id": record.session_id,
            "turn_id": record.turn_id, "watermark": record.watermark, "request_key": key,
            "purpose": request.purpose, "model": request.model,
            "prompt_tokens": request.prompt_tokens, "body": record.body.decode("utf-8"),
            "reply": None if record.reply is None else record.reply.model_dump(mode="json"),
            "error": record.error, "at": record.at, "retry_after_s": record.retry_after_s,
        })
        super().append(record)


# ---- the phases -----------------------------------------------------------------------------


def _crash_records(workdir: Path) -> list[dict[str, Any]]:
    return read_jsonl(workdir / CRASHES_FILE)


def run_phase(phase: str, db: Path, workdir: Path, story: RealStory, crash: str | None) -> int:
    """Run one turn of ``story`` in this process; a planned crash kills the process."""
    workdir.mkdir(parents=True, exist_ok=True)
    if phase == "first":
        write_json_atomic(workdir / FILES_FILE, story.files)
        script, user_text = story.first_script, story.first_text
        start_s = DEFAULT_EPOCH_S
    else:
        script, user_text = story.second_script, story.second_text
        crashes = _crash_records(workdir)
        # A new process starts after the old one died; one second on, the dead holder's
        # lease is still unexpired, so only the liveness probe can reclaim it.
        start_s = (float(crashes[-1]["clock"]) if crashes else DEFAULT_EPOCH_S) + 1.0
    store = SqliteStore(db, holder_alive=liveness.holder_alive)
    world = World(
        store=store, provider=ScriptedProvider(list(script)),
        tools=JournaledTools(workdir, phase), seed=ID_BASES[phase],
        faults=FaultPlan(crash=CrashPoint.parse(crash) if crash else None),
        trace=False, id_base=ID_BASES[phase], clock=VirtualClock(start_s),
        calls=JournaledCalls(workdir / CALLS_FILE, phase),
    )
    driver = SimDriver(world)

    def die(point: str) -> None:
        append_jsonl(workdir / CRASHES_FILE, {
            "phase": phase, "point": point, "seq": driver.effects_performed,
            "clock": world.clock.now(), "pid": os.getpid(),
        })
        os.kill(os.getpid(), signal.SIGKILL)

    world.on_crash = die
    engine = Engine(holder=liveness.holder_identity(), tools=REFERENCE_TOOLS)
    result = driver.run(engine.run_turn(TurnInput(session_id=SESSION_ID, text=user_text)))
    store.close()
    print(json.dumps({
        "phase": phase, "pid": os.getpid(), "session_id": result.session_id,
        "turn_id": result.turn_id, "exit_reason": result.exit_reason.value,
        "final_response": result.final_response, "failed": result.failed,
    }, sort_keys=True))
    return 0


# ---- the check ------------------------------------------------------------------------------


def load_ledger(workdir: Path) -> list[LedgerEntry]:
    """The tool ledger from ``ledger.jsonl``; an intent without an outcome is ``unknown``."""
    entries: dict[tuple[str, int], dict[str, Any]] = {}
    for line in read_jsonl(workdir / LEDGER_FILE):
        key = (str(line["phase"]), int(line["n"]))
        if line["kind"] == "intent":
            entries[key] = {**line, "outcome": "unknown"}
        elif line["kind"] == "outcome" and key in entries:
            entries[key]["outcome"] = line["outcome"]
    return [
        LedgerEntry(call_id=e["call_id"], name=e["name"], arguments=e["arguments"],
                    watermark=int(e["watermark"]), at=float(e["at"]), outcome=e["outcome"])
        for e in entries.values()
    ]


def _rebuild_request(line: dict[str, Any]) -> ProviderRequest:
    body = json.loads(line["body"])
    body["messages"] = [{k: v for k, v in m.items() if k in WIRE_MESSAGE_KEYS}
                        for m in body.get("messages", [])]
    request = request_from_wire(body)
    return dataclasses.replace(request, model=line["model"], purpose=line["purpose"],
                               prompt_tokens=int(line["prompt_tokens"]))


def load_calls(workdir: Path) -> list[CallRecord]:
    """Call records from ``calls.jsonl``, each with the body bytes the process sent."""
    records: list[CallRecord] = []
    requests: dict[str, ProviderRequest] = {}
    for line in read_jsonl(workdir / CALLS_FILE):
        key = str(line["request_key"])
        if key not in requests:
            requests[key] = _rebuild_request(line)
        reply = None if line["reply"] is None else ProviderReply.model_validate(line["reply"])
        retry_after = line["retry_after_s"]
        records.append(CallRecord(int(line["seq"]), line["session_id"], line["turn_id"],
                                  requests[key], reply, line["error"], int(line["watermark"]),
                                  float(line["at"]),
                                  None if retry_after is None else float(retry_after),
                                  WireBody(str(line["body"]).encode("utf-8"))))
    return records


def observe(db: Path, workdir: Path) -> Observation:
    """The ``Observation`` the persisted data supports."""
    store = SqliteStore(db)
    try:
        record = store.snapshot()
    finally:
        store.close()
    calls = load_calls(workdir)
    crash_seqs = tuple(int(c["seq"]) for c in _crash_records(workdir))
    obs = Observation(record=record, ledger=tuple(load_ledger(workdir)), calls=tuple(calls),
                      crash_seqs=crash_seqs, limits=Limits())
    return obs


def check(db: Path | str, workdir: Path | str) -> list[str]:
    """Run every checker over the SQLite file and the journals; violations as strings.

    All registered checkers are evaluated; the wire checkers read the logged bodies.
    """
    found = run_all(observe(Path(db), Path(workdir)))
    out: list[str] = []
    for violation in found:
        if str(violation) not in out:
            out.append(str(violation))
    return out


# ---- the command line -----------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.realcrash", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=("first", "second", "check"))
    parser.add_argument("--db", required=True, type=Path)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--story", choices=sorted(STORIES))
    parser.add_argument("--crash", help="crash point, e.g. after:tool_calls "
                                         "(first: defaults to the story's own)")
    args = parser.parse_args(argv)
    if args.phase == "check":
        violations = check(args.db, args.workdir)
        print(json.dumps({"violations": violations}, indent=1))
        return 1 if violations else 0
    if args.story is None:
        parser.error(f"{args.phase} needs --story")
    story = STORIES[args.story]
    crash = args.crash if args.crash is not None or args.phase != "first" else story.crash
    return run_phase(args.phase, args.db, args.workdir, story, crash)


if __name__ == "__main__":
    sys.exit(main())
