"""Invariant predicates over what the world recorded, never over the engine's memory.

Theory of operation
-------------------
A checker reads an ``Observation``: the store's durable record (sessions, messages,
leases, the event log), the tool world's side-effect ledger, and the provider's own log
of requests and replies. None of these is the engine's say-so: the store assigns row ids
and commits, the ledger is written by the tools when they act, the call log by the
provider when it is called. A broken engine therefore cannot talk a checker round.

Some rules hold only *at rest*: a session is at rest when its turn lease is released
(durably). A crash leaves the lease held, so a half-finished tool round after a crash is
not a violation until the next turn (which must repair it) has released the lease.

Each checker returns a list of ``Violation`` values; an empty list is a pass. Every
checker is registered in ``CHECKERS`` with the invariant ids it decides.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from hermes_ref.limits import Limits
from hermes_ref.models import WIRE_MESSAGE_KEYS, Event, Message, Role
from hermes_ref.outcomes import ExitReason
from hermes_ref.ports import DurableRecord, LedgerEntry
from hermes_ref.scaffolding import (
    DROPPED_TOOLCALL_NUDGE,
    EMPTY_AFTER_TOOLS_NUDGE,
    EMPTY_SENTINEL,
    GRACE_SUMMARY_PROMPT,
)
from sim.world import CallRecord


@dataclass(frozen=True, slots=True)
class Violation:
    checker: str
    invariant: str
    message: str

    def __str__(self) -> str:
        return f"{self.invariant} [{self.checker}] {self.message}"


@dataclass(frozen=True)
class Observation:
    record: DurableRecord
    ledger: tuple[LedgerEntry, ...]
    calls: tuple[CallRecord, ...]
    crash_seqs: tuple[int, ...]
    limits: Limits

    def at_rest(self, session_id: str) -> bool:
        for lease in self.record.leases:
            if lease.session_id == session_id:
                return lease.holder is None
        return True

    def events(self, kind: str) -> list[Event]:
        return [e for e in self.record.events if e.kind == kind]

    def rows_of_turn(self, turn_id: str) -> list[Message]:
        return [m.message for m in self.record.messages if m.message.turn_id == turn_id]

    def calls_of_turn(self, turn_id: str) -> list[CallRecord]:
        return [c for c in self.calls if c.turn_id == turn_id]


Check = Callable[[Observation], list[Violation]]


@dataclass(frozen=True)
class Checker:
    name: str
    invariants: tuple[str, ...]
    summary: str
    check: Check


CHECKERS: dict[str, Checker] = {}


def checker(name: str, invariants: tuple[str, ...], summary: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKERS[name] = Checker(name, invariants, summary, fn)
        return fn
    return register


def run_all(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for entry in CHECKERS.values():
        out.extend(entry.check(obs))
    return out


# ---- tool rounds -------------------------------------------------------------------------


@checker("persist_before_execute", ("TOOL-1",),
         "every tool side effect has an earlier durable assistant row naming its call id")
def persist_before_execute(obs: Observation) -> list[Violation]:
    call_rows: dict[str, int] = {}
    for stored in obs.record.messages:
        for call in stored.message.tool_calls:
            call_rows.setdefault(call.id, stored.message.row_id or 0)
    out = []
    for entry in obs.ledger:
        row_id = call_rows.get(entry.call_id)
        if row_id is None or row_id > entry.watermark:
            where = "no durable row" if row_id is None else f"row #{row_id} committed later"
            out.append(Violation("persist_before_execute", "TOOL-1",
                                 f"{entry.name}({entry.call_id}) ran with {where} "
                                 f"(committed high-water mark was #{entry.watermark})"))
    return out


@checker("one_result_per_call", ("TOOL-3",),
         "each call id has at most one result, after its call; exactly one at rest")
def one_result_per_call(obs: Observation) -> list[Violation]:
    out = []
    by_session: dict[str, list[Message]] = defaultdict(list)
    for stored in obs.record.messages:
        by_session[stored.session_id].append(stored.message)
    for session_id, rows in by_session.items():
        called: dict[str, int] = {}
        answered: dict[str, int] = defaultdict(int)
        for row in rows:
            for call in row.tool_calls:
                called[call.id] = row.row_id or 0
            if row.role is Role.TOOL:
                cid = row.tool_call_id or ""
                if cid not in called:
                    out.append(Violation("one_result_per_call", "TOOL-3",
                                         f"{session_id}: result #{row.row_id} for {cid!r} "
                                         "has no earlier call"))
                answered[cid] += 1
        rest = obs.at_rest(session_id)
        for cid in called:
            n = answered.get(cid, 0)
            if n > 1 or (rest and n == 0):
                out.append(Violation("one_result_per_call", "TOOL-3",
                                     f"{session_id}: call {cid} has {n} results"))
    return out


@checker("tool_error_is_result", ("TOOL-6",),
         "a tool that failed (per the ledger) gets a tool row, and the model is called again")
def tool_error_is_result(obs: Observation) -> list[Violation]:
    out = []
    rows = {m.message.tool_call_id: m for m in obs.record.messages
            if m.message.role is Role.TOOL}
    for entry in obs.ledger:
        if entry.outcome != "error":
            continue
        stored = rows.get(entry.call_id)
        if stored is None:
            if obs.crash_seqs:
                continue  # the process may have died before the result was written
            out.append(Violation("tool_error_is_result", "TOOL-6",
                                 f"{entry.name}({entry.call_id}) failed and has no result row"))
            continue
        row = stored.message
        if row.turn_id is None or not obs.at_rest(stored.session_id):
            continue
        later = [c for c in obs.calls_of_turn(row.turn_id) if c.watermark >= (row.row_id or 0)]
        if not later:
            out.append(Violation("tool_error_is_result", "TOOL-6",
                                 f"the failure of {entry.name}({entry.call_id}) ended turn "
                                 f"{row.turn_id} without another model call"))
    return out


# ---- transcript shape --------------------------------------------------------------------


@checker("tail_closure", ("FIN-3",),
         "a delivered answer is the visible text of the last durable row of its turn")
def tail_closure(obs: Observation) -> list[Violation]:
    out = []
    for event in obs.events("turn.completed"):
        final = event.data.get("final_response")
        if event.data.get("failed") or not isinstance(final, str) or not final.strip():
            continue
        rows = obs.rows_of_turn(event.turn_id)
        tail = rows[-1] if rows else None
        if tail is None or tail.role is not Role.ASSISTANT or tail.content != final:
            shape = "no rows" if tail is None else f"{tail.role.value} row #{tail.row_id}"
            out.append(Violation("tail_closure", "FIN-3",
                                 f"turn {event.turn_id} delivered {final[:40]!r} but its "
                                 f"durable tail is {shape}"))
    return out


SCAFFOLD_TEXTS = frozenset({DROPPED_TOOLCALL_NUDGE, EMPTY_AFTER_TOOLS_NUDGE, GRACE_SUMMARY_PROMPT})


@checker("no_scaffolding_persisted", ("SCAF-1",),
         "no stored row is a synthetic retry message")
def no_scaffolding_persisted(obs: Observation) -> list[Violation]:
    out = []
    for stored in obs.record.messages:
        row = stored.message
        text = row.content or ""
        synthetic = text in SCAFFOLD_TEXTS or (
            row.role is Role.ASSISTANT and not row.tool_calls and not row.hidden
            and text.strip() in ("", EMPTY_SENTINEL)
        )
        if synthetic:
            out.append(Violation("no_scaffolding_persisted", "SCAF-1",
                                 f"row #{row.row_id} ({row.role.value}) is scaffolding: "
                                 f"{text[:40]!r}"))
    return out


# ---- the wire ----------------------------------------------------------------------------


@checker("no_private_keys_on_wire", ("WIRE-3",),
         "requests carry only wire keys: no _-keys, no sidecar or bookkeeping fields")
def no_private_keys_on_wire(obs: Observation) -> list[Violation]:
    out = []
    for call in obs.calls:
        for index, message in enumerate(call.request.wire()["messages"]):
            bad = sorted(k for k in message if k.startswith("_") or k not in WIRE_MESSAGE_KEYS)
            if bad:
                out.append(Violation("no_private_keys_on_wire", "WIRE-3",
                                     f"call at effect {call.seq}: message {index} "
                                     f"carries {', '.join(bad)}"))
                break
    return out


def _shape(message: Message) -> tuple[str, str | None, tuple[str, ...], str | None]:
    wire = message.wire
    return (wire["role"], wire.get("tool_call_id"),
            tuple(c["id"] for c in wire.get("tool_calls", ())), wire.get("content"))


@checker("requests_match_record", ("CTX-2",),
         "each request carries the durable transcript in order; extras only after the turn's user row")
def requests_match_record(obs: Observation) -> list[Violation]:
    out = []
    for call in obs.calls:
        durable = [m.message for m in obs.record.messages
                   if m.session_id == call.session_id and (m.message.row_id or 0) <= call.watermark]
        problem = _history_mismatch(call, durable)
        if problem:
            out.append(Violation("requests_match_record", "CTX-2",
                                 f"call at effect {call.seq}: {problem}"))
    return out


def _same(sent: Message, row: Message) -> bool:
    a, b = _shape(sent), _shape(row)
    return a[:3] == b[:3] and (a[3] == b[3] or not (a[3] or "").strip())


def _history_mismatch(call: CallRecord, durable: list[Message]) -> str | None:
    """Durable rows must appear in order; anything else only after this turn's user row."""
    sent = [m for m in call.request.messages if m.role is not Role.SYSTEM]
    matched = 0
    in_turn = False
    for message in sent:
        if matched < len(durable) and _same(message, durable[matched]):
            row = durable[matched]
            in_turn = in_turn or (row.role is Role.USER and row.turn_id == call.turn_id)
            matched += 1
        elif not in_turn:
            return (f"sends a {message.role.value} message that is not in the durable history "
                    f"before row #{durable[matched].row_id if matched < len(durable) else 'end'}")
    if matched < len(durable):
        return f"omits durable row #{durable[matched].row_id}"
    return None


# ---- prologue ----------------------------------------------------------------------------


@checker("session_row_first", ("CTX-4",),
         "a session row always holds the system prompt that requests then send byte for byte")
def session_row_first(obs: Observation) -> list[Violation]:
    out = []
    prompts = {s.id: s.system_prompt for s in obs.record.sessions}
    for session_id, prompt in prompts.items():
        if not prompt or not prompt.strip():
            out.append(Violation("session_row_first", "CTX-4",
                                 f"session {session_id} was written with an empty system prompt"))
    for call in obs.calls:
        first = call.request.messages[0] if call.request.messages else None
        stored = prompts.get(call.session_id)
        if stored is None:
            out.append(Violation("session_row_first", "CTX-4",
                                 f"call at effect {call.seq} for {call.session_id} "
                                 "was made before its session row existed"))
        elif first is None or first.role is not Role.SYSTEM or first.content != stored:
            out.append(Violation("session_row_first", "CTX-4",
                                 f"call at effect {call.seq} sent a system prompt that differs "
                                 "from the session row"))
    return out


@checker("user_row_before_call", ("CTX-8",),
         "the turn's user row is durable, once, before the turn's first model call")
def user_row_before_call(obs: Observation) -> list[Violation]:
    out = []
    first_call: dict[str, CallRecord] = {}
    for call in obs.calls:
        first_call.setdefault(call.turn_id, call)
    for turn_id, call in first_call.items():
        users = [m for m in obs.rows_of_turn(turn_id) if m.role is Role.USER]
        if len(users) != 1:
            out.append(Violation("user_row_before_call", "CTX-8",
                                 f"turn {turn_id} has {len(users)} user rows"))
        elif (users[0].row_id or 0) > call.watermark:
            out.append(Violation("user_row_before_call", "CTX-8",
                                 f"turn {turn_id} called the model before its user row "
                                 f"#{users[0].row_id} was committed"))
    return out


# ---- loop accounting ---------------------------------------------------------------------


@checker("budget_accounting", ("LOOP-1", "LOOP-2", "CTX-1"),
         "calls, budget units and refunds of each turn add up against the provider's log")
def budget_accounting(obs: Observation) -> list[Violation]:
    out = []
    refundable = obs.limits.refundable_tools
    for event in obs.events("turn.exit"):
        data = event.data
        requests = {id(c.request): c.request for c in obs.calls_of_turn(event.turn_id)}
        grace = sum(1 for r in requests.values() if r.purpose == "grace")
        regular = len(requests) - grace
        refunds = sum(1 for m in obs.rows_of_turn(event.turn_id)
                      if m.tool_calls and all(c.name in refundable for c in m.tool_calls))
        tag = f"turn {event.turn_id}"
        if data.get("api_calls") != len(requests):
            out.append(Violation("budget_accounting", "LOOP-3",
                                 f"{tag} reports {data.get('api_calls')} calls, the provider "
                                 f"saw {len(requests)}"))
        if regular > obs.limits.max_iterations or grace > 1:
            out.append(Violation("budget_accounting", "LOOP-1",
                                 f"{tag} made {regular} budgeted calls and {grace} grace calls "
                                 f"with max_iterations={obs.limits.max_iterations}"))
        if data.get("budget_used") != regular - refunds:
            out.append(Violation("budget_accounting", "LOOP-2",
                                 f"{tag} used {data.get('budget_used')} budget units for "
                                 f"{regular} calls and {refunds} refundable rounds"))
        if data.get("budget_max") != obs.limits.iteration_budget:
            out.append(Violation("budget_accounting", "CTX-1",
                                 f"{tag} ran with a budget of {data.get('budget_max')}, "
                                 f"not a fresh {obs.limits.iteration_budget}"))
    return out


@checker("exit_reason_recorded", ("LOOP-3",),
         "every finished turn records one exit reason from the closed set, and completes")
def exit_reason_recorded(obs: Observation) -> list[Violation]:
    out = []
    closed = {r.value for r in ExitReason}
    completed = {e.turn_id for e in obs.events("turn.completed")}
    for event in obs.events("turn.exit"):
        reason = event.data.get("reason")
        if reason not in closed:
            out.append(Violation("exit_reason_recorded", "LOOP-3",
                                 f"turn {event.turn_id} exited with {reason!r}, "
                                 "outside the closed set"))
        if event.turn_id not in completed:
            out.append(Violation("exit_reason_recorded", "LOOP-3",
                                 f"turn {event.turn_id} has an exit line but no completion"))
    return out


# ---- finalizer ---------------------------------------------------------------------------


@checker("answer_delivered", ("FIN-6",),
         "a turn whose model gave a final text completes with that text, whatever failed after")
def answer_delivered(obs: Observation) -> list[Violation]:
    out = []
    completions = {e.turn_id: e for e in obs.events("turn.completed")}
    last_call: dict[str, CallRecord] = {}
    for call in obs.calls:
        last_call[call.turn_id] = call
    for turn_id, call in last_call.items():
        reply = call.reply
        if reply is None or reply.tool_calls or not (reply.content or "").strip():
            continue
        if any(seq > call.seq for seq in obs.crash_seqs):
            continue  # the process died after this call; a later turn owns the repair
        done = completions.get(turn_id)
        if done is None:
            out.append(Violation("answer_delivered", "FIN-6",
                                 f"turn {turn_id} got a final answer but never completed"))
        elif done.data.get("final_response") != reply.content:
            out.append(Violation("answer_delivered", "FIN-6",
                                 f"turn {turn_id} completed with a different answer than the "
                                 "model gave"))
    return out


@checker("exit_line", ("FIN-7",),
         "one exit line per turn; WARNING exactly when it ends on an uninterrupted tool result")
def exit_line(obs: Observation) -> list[Violation]:
    out = []
    required = {"level", "reason", "api_calls", "budget_used", "last_role", "response_len"}
    exits = obs.events("turn.exit")
    seen: set[str] = set()
    for event in exits:
        data = event.data
        if event.turn_id in seen:
            out.append(Violation("exit_line", "FIN-7", f"turn {event.turn_id} logged two exits"))
        seen.add(event.turn_id)
        missing = required - set(data)
        if missing:
            out.append(Violation("exit_line", "FIN-7",
                                 f"turn {event.turn_id} exit line lacks {sorted(missing)}"))
            continue
        want = "WARNING" if data["last_role"] == Role.TOOL.value else "INFO"
        if data["level"] != want:
            out.append(Violation("exit_line", "FIN-7",
                                 f"turn {event.turn_id} ended on {data['last_role']} but logged "
                                 f"{data['level']}"))
        tail = _durable_tail_of_turn(obs, event)
        if tail is not None and tail != data["last_role"]:
            out.append(Violation("exit_line", "FIN-7",
                                 f"turn {event.turn_id} logged last_role={data['last_role']} "
                                 f"but its durable tail is {tail}"))
    return out


def _durable_tail_of_turn(obs: Observation, event: Event) -> str | None:
    """The role of the session's last row among rows written up to this turn's end."""
    last: str | None = None
    for stored in obs.record.messages:
        if stored.session_id != event.session_id:
            continue
        if stored.message.turn_id == event.turn_id:
            last = stored.message.role.value
    return last
