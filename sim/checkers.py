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
from itertools import pairwise

from hermes_ref.closure import RECOVERED_CALL_TEXT
from hermes_ref.effects import ProviderRequest
from hermes_ref.errors import ProviderAuthError, ProviderError
from hermes_ref.limits import Limits
from hermes_ref.models import WIRE_MESSAGE_KEYS, Event, Message, ProviderReply, Role, ToolCall
from hermes_ref.outcomes import CONTEXT_PRESSURE_EXITS, FAILED_EXITS, ExitReason
from hermes_ref.ports import DurableRecord, LedgerEntry
from hermes_ref.scaffolding import (
    DROPPED_TOOLCALL_NUDGE,
    EMPTY_AFTER_TOOLS_NUDGE,
    EMPTY_SENTINEL,
    GRACE_SUMMARY_PROMPT,
)
from hermes_ref.tool_specs import TOOLS_BY_NAME
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


# ---- shared readings of the call log and the record ----------------------------------------


def calls_by_turn(obs: Observation) -> dict[str, list[CallRecord]]:
    """Each turn's provider calls, in call order."""
    grouped: dict[str, list[CallRecord]] = defaultdict(list)
    for call in obs.calls:
        grouped[call.turn_id].append(call)
    return grouped


def distinct_requests(records: list[CallRecord]) -> list[ProviderRequest]:
    """The requests of ``records`` in first-call order; retries share one request object."""
    seen: dict[int, ProviderRequest] = {}
    for record in records:
        seen.setdefault(id(record.request), record.request)
    return list(seen.values())


def is_grace(record: CallRecord) -> bool:
    return record.request.purpose == "grace"


def offered(request: ProviderRequest) -> frozenset[str]:
    return frozenset(t.name for t in request.tools)


def tool_replies(records: list[CallRecord]) -> list[CallRecord]:
    """The budgeted calls whose reply called tools: the turn's tool rounds, in order."""
    return [r for r in records if r.reply is not None and r.reply.tool_calls and not is_grace(r)]


def all_invalid(record: CallRecord) -> bool:
    """Every call of the reply names a tool the request did not offer."""
    names = offered(record.request)
    return record.reply is not None and all(c.name not in names for c in record.reply.tool_calls)


def round_landed(obs: Observation, record: CallRecord) -> bool:
    """Every call of the reply has a durable result written by the same turn."""
    if record.reply is None:
        return False
    answered = {m.tool_call_id for m in obs.rows_of_turn(record.turn_id) if m.role is Role.TOOL}
    return all(c.id in answered for c in record.reply.tool_calls)


def invalid_streak_at_end(obs: Observation, records: list[CallRecord]) -> int:
    """All-invalid tool rounds in a row that end the turn's calls (0 if its last call is not one)."""
    rounds = tool_replies(records)
    if not rounds or rounds[-1] is not records[-1] or not round_landed(obs, rounds[-1]):
        return 0
    streak = 0
    for record in reversed(rounds):
        if not all_invalid(record):
            break
        streak += 1
    return streak


def call_rows(obs: Observation) -> list[Message]:
    """Every durable assistant row that carries tool calls, in row order."""
    return [m.message for m in obs.record.messages if m.message.tool_calls]


def durable_call_row(entry: LedgerEntry, rows: list[Message]) -> Message | None:
    """The latest call row, durable when the tool ran, that holds this ledger entry's call."""
    for row in reversed(rows):
        if (row.row_id or 0) <= entry.watermark and any(
                c.id == entry.call_id and c.name == entry.name for c in row.tool_calls):
            return row
    return None


def _call_keys(message_calls: tuple[ToolCall, ...]) -> list[tuple[str, str, str]]:
    return [(c.id, c.name, c.arguments) for c in message_calls]


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
         "each call has exactly one result right after its row; only the trailing group may be open")
def one_result_per_call(obs: Observation) -> list[Violation]:
    """Results are matched to the tool-call row they follow, so ids may repeat across turns."""
    out: list[Violation] = []
    by_session: dict[str, list[Message]] = defaultdict(list)
    for stored in obs.record.messages:
        by_session[stored.session_id].append(stored.message)
    for session_id, rows in by_session.items():
        group: dict[str, int] | None = None
        for row in rows:
            if row.role is Role.TOOL:
                cid = row.tool_call_id or ""
                if group is None or cid not in group:
                    out.append(_v3(f"{session_id}: result #{row.row_id} for {cid!r} does not "
                                   "follow a row that made that call"))
                else:
                    group[cid] += 1
                continue
            out.extend(_close_group(session_id, group, open_allowed=False))
            group = {c.id: 0 for c in row.tool_calls} if row.tool_calls else None
        out.extend(_close_group(session_id, group, open_allowed=not obs.at_rest(session_id)))
    return out


def _v3(message: str) -> Violation:
    return Violation("one_result_per_call", "TOOL-3", message)


def _close_group(session_id: str, group: dict[str, int] | None, *, open_allowed: bool) -> list[Violation]:
    """Every call of a finished group has one result; a trailing group mid-turn may lack some."""
    if group is None:
        return []
    return [_v3(f"{session_id}: call {cid} has {n} results")
            for cid, n in group.items() if n > 1 or (n == 0 and not open_allowed)]


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


@checker("calls_keep_their_place", ("TOOL-2",),
         "the stored call row keeps every call of the reply, in order; calls to tools not offered "
         "never run; [3] all-invalid rounds in a row, and only they, end the turn invalid_tool_calls")
def calls_keep_their_place(obs: Observation) -> list[Violation]:
    out = []
    for turn_id, records in calls_by_turn(obs).items():
        for record in tool_replies(records):
            problem = _stored_calls_problem(obs, record)
            if problem:
                out.append(Violation("calls_keep_their_place", "TOOL-2",
                                     f"turn {turn_id}: the reply at effect {record.seq} {problem}"))
    out.extend(_invalid_calls_dispatched(obs))
    out.extend(_invalid_streak_exits(obs))
    return out


def _stored_calls_problem(obs: Observation, record: CallRecord) -> str | None:
    want = _call_keys(record.reply.tool_calls if record.reply else ())
    ids = {key[0] for key in want}
    touched = [m for m in obs.rows_of_turn(record.turn_id)
               if m.tool_call_id in ids or any(c.id in ids for c in m.tool_calls)]
    if not touched or any(_call_keys(m.tool_calls) == want for m in touched):
        return None  # the round never reached the store, or its row keeps every call
    called = ", ".join(f"{i} {n}" for i, n, _ in want)
    kept = next((m for m in touched if m.role is Role.ASSISTANT), None)
    if kept is None:
        return f"called [{called}] and no stored assistant row keeps those calls"
    keeps = ", ".join(f"{c.id} {c.name}" for c in kept.tool_calls)
    return f"called [{called}] but its stored row #{kept.row_id} keeps [{keeps}]"


def _invalid_calls_dispatched(obs: Observation) -> list[Violation]:
    invalid = {(r.turn_id, c.id, c.name) for r in tool_replies(list(obs.calls))
               for c in (r.reply.tool_calls if r.reply else ()) if c.name not in offered(r.request)}
    rows = call_rows(obs)
    out = []
    for entry in obs.ledger:
        row = durable_call_row(entry, rows)
        if row is not None and (row.turn_id, entry.call_id, entry.name) in invalid:
            out.append(Violation("calls_keep_their_place", "TOOL-2",
                                 f"turn {row.turn_id}: {entry.name}({entry.call_id}) ran although "
                                 "its request did not offer that tool"))
    return out


def _invalid_streak_exits(obs: Observation) -> list[Violation]:
    limit = obs.limits.invalid_tool_rounds_max
    by_turn = calls_by_turn(obs)
    out = []
    for event in obs.events("turn.exit"):
        streak = invalid_streak_at_end(obs, by_turn.get(event.turn_id, []))
        reason = event.data.get("reason")
        ended = reason == ExitReason.INVALID_TOOL_CALLS.value
        if streak >= limit and not ended:
            out.append(Violation("calls_keep_their_place", "TOOL-2",
                                 f"turn {event.turn_id} made {streak} all-invalid tool rounds in a "
                                 f"row (limit {limit}) but exited {reason}"))
        elif ended and streak < limit:
            out.append(Violation("calls_keep_their_place", "TOOL-2",
                                 f"turn {event.turn_id} exited invalid_tool_calls after {streak} "
                                 f"all-invalid tool rounds in a row (limit {limit})"))
    return out


@checker("recovered_calls_not_rerun", ("TOOL-10",),
         "a durable call runs at most once; a result a later turn wrote for it (recovery) is the "
         "unknown report, and nothing ran the call once that turn began")
def recovered_calls_not_rerun(obs: Observation) -> list[Violation]:
    rows = call_rows(obs)
    runs: dict[tuple[int, str], list[LedgerEntry]] = defaultdict(list)
    for entry in obs.ledger:
        row = durable_call_row(entry, rows)
        if row is not None:
            runs[(row.row_id or 0, entry.call_id)].append(entry)
    out = [Violation("recovered_calls_not_rerun", "TOOL-10",
                     f"{entries[0].name}({call_id}) of row #{row_id} ran {len(entries)} times")
           for (row_id, call_id), entries in runs.items() if len(entries) > 1]
    started = {e.turn_id: e.at for e in obs.events("turn.started")}
    for result, owner in _recovered_results(obs):
        cid = result.tool_call_id or ""
        tag = f"turn {result.turn_id} recovered {cid} of turn {owner.turn_id} (row #{result.row_id})"
        if result.content != RECOVERED_CALL_TEXT:
            out.append(Violation("recovered_calls_not_rerun", "TOOL-10",
                                 f"{tag} with {(result.content or '')[:40]!r}, not the unknown report"))
        since = started.get(result.turn_id or "")
        late = [e for e in runs.get((owner.row_id or 0, cid), []) if since is not None and e.at >= since]
        if late:
            out.append(Violation("recovered_calls_not_rerun", "TOOL-10",
                                 f"{tag} but ran it again at t={late[0].at:g} after that turn began"))
    return out


def _recovered_results(obs: Observation) -> list[tuple[Message, Message]]:
    """(result row, call row) pairs where the result was written by a later turn."""
    owners: dict[tuple[str, str], Message] = {}
    out = []
    for stored in obs.record.messages:
        row = stored.message
        for call in row.tool_calls:
            owners[(stored.session_id, call.id)] = row
        owner = owners.get((stored.session_id, row.tool_call_id or "")) if row.role is Role.TOOL else None
        if owner is not None and owner.turn_id != row.turn_id:
            out.append((row, owner))
    return out


@checker("results_durable_before_sent", ("TOOL-8",),
         "a tool result reaches the model only after it is durable")
def results_durable_before_sent(obs: Observation) -> list[Violation]:
    out = []
    durable: dict[str, list[tuple[int, str | None]]] = defaultdict(list)
    for stored in obs.record.messages:
        row = stored.message
        if row.role is Role.TOOL:
            durable[row.tool_call_id or ""].append((row.row_id or 0, row.content))
    for call in obs.calls:
        for message in call.request.messages:
            if message.role is not Role.TOOL:
                continue
            rows = durable.get(message.tool_call_id or "", [])
            if not any(rid <= call.watermark and text == message.content for rid, text in rows):
                out.append(Violation("results_durable_before_sent", "TOOL-8",
                                     f"call at effect {call.seq} (turn {call.turn_id}) sent the "
                                     f"result of {message.tool_call_id} before it was durable"))
                break
    return out


REFUSED_EXITS = frozenset({ExitReason.LEASE_TIMEOUT.value})


@checker("refusal_is_not_loss", ("LEASE-5",),
         "a turn refused before it began wrote nothing and handed its input back")
def refusal_is_not_loss(obs: Observation) -> list[Violation]:
    out = []
    completions = {e.turn_id: e for e in obs.events("turn.completed")}
    for event in obs.events("turn.exit"):
        refused = event.data.get("reason") in REFUSED_EXITS or (
            event.data.get("reason") == ExitReason.PERSISTENCE_FAILED.value
            and event.data.get("last_role") == "none")
        if not refused:
            continue
        done = completions.get(event.turn_id)
        if done is None or not done.data.get("carried_input"):
            out.append(Violation("refusal_is_not_loss", "LEASE-5",
                                 f"turn {event.turn_id} was refused ({event.data.get('reason')}) "
                                 "without handing its input back"))
        if obs.rows_of_turn(event.turn_id):
            out.append(Violation("refusal_is_not_loss", "LEASE-5",
                                 f"turn {event.turn_id} was refused but wrote rows"))
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
        _, problem = align_request(call, _durable_at(obs, call))
        if problem:
            out.append(Violation("requests_match_record", "CTX-2",
                                 f"call at effect {call.seq}: {problem}"))
    return out


def _durable_at(obs: Observation, call: CallRecord) -> list[Message]:
    """The session's rows that were committed when ``call`` was made."""
    return [m.message for m in obs.record.messages
            if m.session_id == call.session_id and (m.message.row_id or 0) <= call.watermark]


def _same(sent: Message, row: Message) -> bool:
    a, b = _shape(sent), _shape(row)
    return a[:3] == b[:3] and (a[3] == b[3] or not (a[3] or "").strip())


Aligned = list[tuple[Message, Message]]


def align_request(call: CallRecord, durable: list[Message]) -> tuple[Aligned, str | None]:
    """Pair sent messages with durable rows, in order; the problem if the history differs.

    Durable rows must appear in order; anything else only after this turn's user row.
    """
    pairs: Aligned = []
    in_turn = False
    for message in (m for m in call.request.messages if m.role is not Role.SYSTEM):
        matched = len(pairs)
        if matched < len(durable) and _same(message, durable[matched]):
            row = durable[matched]
            in_turn = in_turn or (row.role is Role.USER and row.turn_id == call.turn_id)
            pairs.append((message, row))
        elif not in_turn:
            where = durable[matched].row_id if matched < len(durable) else "end"
            return pairs, (f"sends a {message.role.value} message that is not in the durable "
                           f"history before row #{where}")
    if len(pairs) < len(durable):
        return pairs, f"omits durable row #{durable[len(pairs)].row_id}"
    return pairs, None


@checker("sidecar_bytes_replayed", ("WIRE-1",),
         "a row with an api_content sidecar is sent as exactly those bytes, on every later call; "
         "a user row stores the bare text, a strict prefix of its sidecar")
def sidecar_bytes_replayed(obs: Observation) -> list[Violation]:
    out = []
    for stored in obs.record.messages:
        row = stored.message
        sidecar = row.api_content
        if row.role is Role.USER and sidecar is not None and (
                sidecar == row.content or not sidecar.startswith(row.content or "")):
            out.append(Violation("sidecar_bytes_replayed", "WIRE-1",
                                 f"user row #{row.row_id} of turn {row.turn_id} stores content "
                                 f"{(row.content or '')[:40]!r} that is not the bare text of its "
                                 "sidecar (the injection leaked into the record)"))
    for call in obs.calls:
        pairs, _ = align_request(call, _durable_at(obs, call))
        for sent, row in pairs:
            if row.api_content is not None and sent.wire.get("content") != row.api_content:
                out.append(Violation("sidecar_bytes_replayed", "WIRE-1",
                                     f"call at effect {call.seq} (turn {call.turn_id}) sent row "
                                     f"#{row.row_id} as {(sent.wire.get('content') or '')[:40]!r}, "
                                     "not its stored api_content"))
                break
    return out


# ---- prologue ----------------------------------------------------------------------------


@checker("session_row_first", ("CTX-4", "CTX-3"),
         "a session row always holds a system prompt (CTX-4), which every request of the "
         "session replays byte for byte (CTX-3)")
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
            out.append(Violation("session_row_first", "CTX-3",
                                 f"call at effect {call.seq} (turn {call.turn_id}) sent a system "
                                 f"prompt that differs from the row of session {call.session_id}"))
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
    refundable = {t.name for t in TOOLS_BY_NAME.values() if t.refundable}
    for event in obs.events("turn.exit"):
        data = event.data
        requests = {id(c.request): c.request for c in obs.calls_of_turn(event.turn_id)}
        grace = sum(1 for r in requests.values() if r.purpose == "grace")
        regular = len(requests) - grace
        refunds = sum(1 for m in obs.rows_of_turn(event.turn_id)
                      if m.tool_calls and all(c.name in refundable for c in m.tool_calls))
        tag = f"turn {event.turn_id}"
        if data.get("api_calls") != len(requests):
            out.append(Violation("budget_accounting", "LOOP-1",
                                 f"{tag} reports {data.get('api_calls')} calls, the provider "
                                 f"saw {len(requests)}"))
        if regular > obs.limits.max_iterations or grace > 1:
            out.append(Violation("budget_accounting", "LOOP-1",
                                 f"{tag} made {regular} budgeted calls and {grace} grace calls "
                                 f"with max_iterations={obs.limits.max_iterations}"))
        if data.get("budget_used") != regular - refunds:
            used = data.get("budget_used")
            # more units than this turn's calls: they were carried in from another turn
            carried = isinstance(used, int) and used > regular
            out.append(Violation("budget_accounting", "CTX-1" if carried else "LOOP-2",
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


def _error_classes(base: type[ProviderError]) -> dict[str, type[ProviderError]]:
    found = {base.__name__: base}
    for sub in base.__subclasses__():
        found.update(_error_classes(sub))
    return found


PROVIDER_ERRORS = _error_classes(ProviderError)


def error_kind(name: str) -> str:
    """'transient', 'auth' or 'terminal', by the error class the call log names."""
    cls = PROVIDER_ERRORS.get(name, ProviderError)
    if issubclass(cls, ProviderAuthError):
        return "auth"
    return "transient" if cls.transient else "terminal"


@checker("provider_errors_classified", ("LOOP-5",),
         "transient errors are retried (after any Retry-After), auth once, at most the limits; "
         "any other error ends the turn at once as terminal_provider_error")
def provider_errors_classified(obs: Observation) -> list[Violation]:
    exits = {e.turn_id: e.data.get("reason") for e in obs.events("turn.exit")}
    out: list[Violation] = []
    for turn_id, records in calls_by_turn(obs).items():
        out.extend(Violation("provider_errors_classified", "LOOP-5", f"turn {turn_id}: {problem}")
                   for problem in _retry_problems(obs.limits, records, exits.get(turn_id)))
    return out


def _retry_problems(limits: Limits, records: list[CallRecord], reason: object) -> list[str]:
    caps = {"transient": limits.transient_retries_max, "auth": limits.auth_refreshes_max,
            "terminal": -1}
    attempts_max = limits.transient_retries_max + limits.auth_refreshes_max + 1
    tallies: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    out = []
    for index, record in enumerate(records):
        tally = tallies[id(record.request)]
        tally["attempts"] += 1
        if tally["attempts"] == attempts_max + 1:
            out.append(f"the request of effect {record.seq} was attempted more than {attempts_max} times")
        if record.error is None:
            continue
        kind = error_kind(record.error)
        tally[kind] += 1
        final = tally[kind] > caps[kind]
        after = records[index + 1] if index + 1 < len(records) else None
        out.extend(_after_error(record, after, final, reason))
    return out


def _after_error(record: CallRecord, after: CallRecord | None, final: bool, reason: object) -> list[str]:
    tag = f"{record.error} at effect {record.seq}"
    if final and after is not None:
        return [f"{tag} must end the turn, but another call followed at effect {after.seq}"]
    if final and not is_grace(record) and reason not in (None, ExitReason.TERMINAL_PROVIDER_ERROR.value):
        return [f"{tag} ended the turn as {reason}, not terminal_provider_error"]
    if not final and after is None and reason is not None:
        return [f"{tag} is retryable but the turn ended ({reason}) without retrying"]
    if after is not None and record.retry_after_s is not None and (
            after.at - record.at < record.retry_after_s - 1e-9):
        return [f"{tag} asked to wait {record.retry_after_s:g} s but the next call came "
                f"{after.at - record.at:g} s later"]
    return []


def _nudges_since_tool(request: ProviderRequest) -> int:
    """Dropped-call re-prompts sent after the request's last tool result."""
    count = 0
    for message in reversed(request.messages):
        if message.role is Role.TOOL:
            break
        if message.role is Role.USER and message.wire.get("content") == DROPPED_TOOLCALL_NUDGE:
            count += 1
    return count


def _dropped(reply: ProviderReply | None) -> bool:
    return (reply is not None and reply.finish_reason == "tool_calls" and not reply.tool_calls
            and not (reply.content or "").strip())


@checker("dropped_call_reprompts", ("LOOP-7",),
         "a reply that promised tool calls and had none is re-prompted, at most [3] times in a row; "
         "a landed tool round starts the count over")
def dropped_call_reprompts(obs: Observation) -> list[Violation]:
    limit = obs.limits.dropped_toolcall_retries_max
    out = []
    for turn_id, records in calls_by_turn(obs).items():
        for before, after in pairwise(records):
            if after.request is before.request:
                continue
            sent, prior = _nudges_since_tool(after.request), _nudges_since_tool(before.request)
            if sent > limit:
                problem = f"sends {sent} dropped-call re-prompts in a row (limit {limit})"
            elif _dropped(before.reply) and prior < limit and sent != prior + 1:
                problem = f"does not re-prompt the dropped tool call of effect {before.seq}"
            else:
                continue
            out.append(Violation("dropped_call_reprompts", "LOOP-7",
                                 f"turn {turn_id}: the request of effect {after.seq} {problem}"))
    return out


# ---- finalizer ---------------------------------------------------------------------------


@checker("grace_summary", ("FIN-1",),
         "a turn that ran out of budget without an answer makes exactly one grace call, "
         "tool-less, as its last call")
def grace_summary(obs: Observation) -> list[Violation]:
    if not obs.limits.grace_call_enabled:
        return []
    by_turn = calls_by_turn(obs)
    out = []
    for event in obs.events("turn.exit"):
        records = by_turn.get(event.turn_id, [])
        if not _ran_out(obs.limits, event, records):
            continue
        graces = distinct_requests([r for r in records if is_grace(r)])
        if len(graces) != 1:
            problem = f"made {len(graces)} grace calls"
        elif graces[0].tools:
            problem = f"offered {len(graces[0].tools)} tools to its grace call"
        elif not is_grace(records[-1]):
            problem = f"called the model again at effect {records[-1].seq} after its grace call"
        else:
            continue
        out.append(Violation("grace_summary", "FIN-1",
                             f"turn {event.turn_id} ran out of budget without an answer and {problem}"))
    return out


BUDGET_END_REASONS = frozenset({ExitReason.MAX_ITERATIONS.value, ExitReason.BUDGET_EXHAUSTED.value,
                                ExitReason.PENDING_TOOL_RESULT.value})


def _ran_out(limits: Limits, event: Event, records: list[CallRecord]) -> bool:
    """The loop stopped at its bound (calls or budget), not on an answer or a failure of its own."""
    if event.data.get("reason") not in BUDGET_END_REASONS:
        return False
    regular = len(distinct_requests([r for r in records if not is_grace(r)]))
    used, budget = event.data.get("budget_used"), event.data.get("budget_max")
    at_budget = isinstance(used, int) and isinstance(budget, int) and used >= budget
    return regular >= limits.max_iterations or at_budget


@checker("failure_boundary", ("FIN-5",),
         "a failed turn whose exit reports no cleanup errors ends on an assistant row "
         "(context-pressure failures excepted)")
def failure_boundary(obs: Observation) -> list[Violation]:
    exits = {e.turn_id: e.data for e in obs.events("turn.exit")}
    pressure = {r.value for r in CONTEXT_PRESSURE_EXITS}
    out = []
    for done in obs.events("turn.completed"):
        data = exits.get(done.turn_id)
        if not done.data.get("failed") or data is None or data.get("reason") in pressure:
            continue
        rows = obs.rows_of_turn(done.turn_id)
        if data.get("cleanup_errors", 0) == 0 and rows and rows[-1].role is not Role.ASSISTANT:
            out.append(Violation("failure_boundary", "FIN-5",
                                 f"failed turn {done.turn_id} ({data.get('reason')}) left an open "
                                 f"tail: its last row #{rows[-1].row_id} is a {rows[-1].role.value} row"))
    return out


@checker("no_silent_stop", ("FIN-8",),
         "a turn that stops on the landed tool round of its last reply, with no grace call, fails "
         "pending_tool_result with an explanatory answer (unless the loop already failed it)")
def no_silent_stop(obs: Observation) -> list[Violation]:
    exits = {e.turn_id: e.data.get("reason") for e in obs.events("turn.exit")}
    loud = {r.value for r in FAILED_EXITS} - {ExitReason.PENDING_TOOL_RESULT.value}
    by_turn = calls_by_turn(obs)
    out = []
    for done in obs.events("turn.completed"):
        records = by_turn.get(done.turn_id, [])
        last = records[-1] if records else None
        if last is None or not tool_replies([last]) or any(is_grace(r) for r in records):
            continue
        reason, failed = exits.get(done.turn_id), bool(done.data.get("failed"))
        if not round_landed(obs, last) or (failed and reason in loud):
            continue
        final = done.data.get("final_response")
        explained = isinstance(final, str) and bool(final.strip())
        if reason != ExitReason.PENDING_TOOL_RESULT.value or not failed or not explained:
            out.append(Violation("no_silent_stop", "FIN-8",
                                 f"turn {done.turn_id} stopped on the tool results of its reply at "
                                 f"effect {last.seq} as {reason} (failed={failed}, "
                                 f"answer {final!r})"))
    return out


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
        tool_tail = data["last_role"] == Role.TOOL.value and not data.get("interrupted", False)
        want = "WARNING" if tool_tail else "INFO"
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
