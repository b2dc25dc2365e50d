"""Checkers of the tool round: persist before execute, one result per call, errors as results,
calls kept in place, no blind re-execution, results durable before they are shown."""

from __future__ import annotations

from collections import defaultdict

from hermes_ref.closure import RECOVERED_CALL_TEXT
from hermes_ref.models import EventKind, Message, Role, ToolCall, ToolKind
from hermes_ref.outcomes import ExitReason
from hermes_ref.ports import LedgerEntry
from hermes_ref.tool_specs import TOOLS_BY_NAME, scoped_path
from sim.checkers.base import (
    Observation,
    Violation,
    _call_keys,
    call_rows,
    calls_by_turn,
    checker,
    durable_call_row,
    invalid_streak_at_end,
    offered,
    tool_replies,
)
from sim.checkers.intake import taken_in_calls
from sim.world import CallRecord

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
    want = _call_keys(taken_in_calls(record.reply.tool_calls) if record.reply else ())
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
    for view in obs.ended_turns():
        streak = invalid_streak_at_end(obs, by_turn.get(view.turn_id, []))
        reason = view.exit.reason.value if view.exit is not None else None
        ended = reason == ExitReason.INVALID_TOOL_CALLS.value
        if streak >= limit and not ended:
            out.append(Violation("calls_keep_their_place", "TOOL-2",
                                 f"turn {view.key} made {streak} all-invalid tool rounds in a "
                                 f"row (limit {limit}) but exited {reason}"))
        elif ended and streak < limit:
            out.append(Violation("calls_keep_their_place", "TOOL-2",
                                 f"turn {view.key} exited invalid_tool_calls after {streak} "
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
    started = {e.turn_id: e.at for e in obs.events(EventKind.TURN_STARTED)}
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


@checker("segments_are_safe", ("TOOL-4",),
         "calls run together only when they may: parallel-safe kinds, no writer overlapping a path, "
         "model order kept")
def segments_are_safe(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    rows = call_rows(obs)
    index, last_position = 0, -1
    for batch in obs.batches:
        while index < len(rows) and not set(batch) <= {c.id for c in rows[index].tool_calls}:
            index, last_position = index + 1, -1
        if index == len(rows):
            break  # a batch of calls with no durable row: TOOL-1 reports that
        row = rows[index]
        positions = [[c.id for c in row.tool_calls].index(cid) for cid in batch]
        if positions != sorted(positions) or positions[0] <= last_position:
            out.append(Violation("segments_are_safe", "TOOL-4",
                                 f"row #{row.row_id}: calls {', '.join(batch)} ran out of model order"))
        last_position = positions[-1]
        by_id = {c.id: c for c in row.tool_calls}
        problem = _unsafe_together([by_id[cid] for cid in batch])
        if problem:
            out.append(Violation("segments_are_safe", "TOOL-4", f"row #{row.row_id}: {problem}"))
    return out


_JOINABLE = (ToolKind.READER, ToolKind.WRITER, ToolKind.PARALLEL_SAFE)


def _unsafe_together(calls: list[ToolCall]) -> str | None:
    if len(calls) < 2:
        return None
    paths: list[tuple[ToolCall, ToolKind, str | None]] = []
    for call in calls:
        spec = TOOLS_BY_NAME.get(call.name)
        if spec is None or spec.kind not in _JOINABLE or call.parsed_arguments() is None:
            return f"{call.name}({call.id}) ran alongside other calls but is a barrier"
        path = scoped_path(call, spec)
        if path is None and spec.kind is not ToolKind.PARALLEL_SAFE:
            return f"{call.name}({call.id}) has no usable path but ran alongside other calls"
        paths.append((call, spec.kind, path))
    for i, (a, kind_a, path_a) in enumerate(paths):
        for b, kind_b, path_b in paths[i + 1:]:
            writer = ToolKind.WRITER in (kind_a, kind_b)
            if writer and path_a is not None and path_b is not None and _touch(path_a, path_b):
                return f"{a.name} {path_a} ran alongside {b.name} {path_b}"
    return None


def _touch(a: str, b: str) -> bool:
    """Do two normalized paths overlap (one is the other or contains it)?"""
    def whole(p: str) -> bool:
        return p in (".", "..") or p.startswith("../")
    if whole(a) or whole(b):
        return True
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")
