"""Checkers of the tool round: persist before execute, one result per call, errors as results,
calls kept in place, no blind re-execution, results durable before they are shown."""

from __future__ import annotations

from collections import defaultdict
from functools import partial

from hermes_ref.closure import NOT_RUN_TEXT, RECOVERED_CALL_TEXT, UNRECORDED_RESULT_TEXT
from hermes_ref.models import EventKind, Message, Role, ToolCall, ToolKind
from hermes_ref.outcomes import ExitReason
from hermes_ref.ports import LedgerEntry
from hermes_ref.tool_specs import TOOLS_BY_NAME
from sim.checkers import loop_fire
from sim.checkers.base import (
    EPSILON_S,
    Observation,
    Violation,
    _call_keys,
    all_invalid,
    bound_spent,
    call_row_of,
    call_rows,
    calls_by_turn,
    checker,
    durable_call_row,
    holder_turn,
    invalid_streak_at_end,
    offered,
    remembered,
    result_row_of,
    round_landed,
    stopped_at_the_bound,
    tool_replies,
)
from sim.checkers.intake import taken_in_calls
from sim.checkers.lease import lost_leases
from sim.checkers.rules import holder_fields, named_path
from sim.checkers.wire import sent_messages
from sim.tools import SimLedgerEntry
from sim.world import CallRecord

# ---- tool rounds -------------------------------------------------------------------------


@checker("persist_before_execute", ("TOOL-1",),
         "every tool side effect has an earlier durable assistant row of its own turn naming "
         "its call id; once a segment's results could not be stored, no later call of that "
         "row runs")
def persist_before_execute(obs: Observation) -> list[Violation]:
    """Judged per (session, turn, call id): a row of another turn never vouches for a call.

    The check after execution is read the same way: a call whose durable result is the
    finalizer's ``UNRECORDED_RESULT_TEXT`` lost its result write, and that write ended the
    turn, so no call of the same row may have run in a later batch (the world's stamp) or,
    where no batch was stamped, later in the ledger with a result of its own.
    """
    out = _ran_after_a_lost_write(obs)
    for entry in obs.ledger:
        found = call_row_of(obs, entry)
        if found is not None and found[1] is not None:
            continue
        if found is None:
            where = "nothing committed yet"
        else:
            (session_id, turn_id), _ = found
            later = [m.message.row_id for m in obs.record.messages
                     if (m.session_id, m.message.turn_id) == (session_id, turn_id)
                     and any(c.id == entry.call_id for c in m.message.tool_calls)]
            where = (f"row #{later[0]} of turn {session_id}/{turn_id} committed later" if later
                     else f"no durable row of turn {session_id}/{turn_id}")
        out.append(Violation("persist_before_execute", "TOOL-1",
                             f"{entry.name}({entry.call_id}) ran with {where} "
                             f"(committed high-water mark was #{entry.watermark})"))
    return out


def _ran_after_a_lost_write(obs: Observation) -> list[Violation]:
    """TOOL-1's second check: a failed result write stops the round (see the checker)."""
    if not any(m.message.role is Role.TOOL and m.message.content == UNRECORDED_RESULT_TEXT
               for m in obs.record.messages):
        return []  # no result write was lost (or none was told): nothing to place
    by_row: dict[int, list[tuple[LedgerEntry, Message | None]]] = defaultdict(list)
    for entry in obs.ledger:
        found = call_row_of(obs, entry)
        if found is None or found[1] is None:
            continue  # no durable row: the first check's finding
        placed = result_row_of(obs, entry)
        by_row[found[1].row_id or 0].append((entry, placed[1] if placed is not None else None))
    out = []
    for row_id, runs in by_row.items():
        lost = next(((e, i) for i, (e, r) in enumerate(runs)
                     if r is not None and r.content == UNRECORDED_RESULT_TEXT), None)
        if lost is None:
            continue
        first, at = lost
        for entry, row in runs[at + 1:]:
            if _same_batch(first, entry) or (
                    _batch_of(first) is None and row is not None
                    and row.content == UNRECORDED_RESULT_TEXT):
                continue
            out.append(Violation("persist_before_execute", "TOOL-1",
                                 f"{entry.name}({entry.call_id}) of row #{row_id} ran after the "
                                 f"results of {first.name}({first.call_id}) could not be stored"))
            break
    return out


def _batch_of(entry: LedgerEntry) -> int | None:
    return entry.batch if isinstance(entry, SimLedgerEntry) else None


def _same_batch(a: LedgerEntry, b: LedgerEntry) -> bool:
    return _batch_of(a) is not None and _batch_of(a) == _batch_of(b)


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
        opener: str | None = None  # the turn whose call row opened the group
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
            opener = row.turn_id
        open_allowed = not obs.at_rest(session_id) or _holder_lost_it(obs, session_id, opener)
        out.extend(_close_group(session_id, group, open_allowed=open_allowed))
    return out


def _holder_lost_it(obs: Observation, session_id: str, turn_id: str | None) -> bool:
    """The turn that made the trailing calls lost its last grant (expired, or its holder
    died): like a crash, that leaves its open calls to the next turn's prologue. A later
    grant that is no turn's (an operator's redaction under the session's lease) closes
    nothing, so only the opening turn's own grants are read; with no turn known, the
    session's last grant."""
    grants = [g for g in obs.record.lease_grants if g.session_id == session_id]
    own = [g for g in obs.record.lease_grants
           if turn_id is not None and holder_turn(g.holder) == turn_id]
    last = own or grants
    return bool(last) and last[-1].end_reason not in (None, "released")


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
    """Judged per call as the record places it: its own call row, then its own result."""
    out = []
    for entry in obs.ledger:
        if entry.outcome != "error":
            continue
        found = result_row_of(obs, entry)
        if found is None:
            if obs.crash_seqs:
                continue  # the process may have died before the result was written
            if _left_open_by_a_lost_lease(obs, entry):
                continue  # its result write was fenced (LEASE-4): the next turn's prologue closes it
            out.append(Violation("tool_error_is_result", "TOOL-6",
                                 f"{entry.name}({entry.call_id}) failed and has no result row"))
            continue
        session_id, row = found
        if row.turn_id is None or not obs.at_rest(session_id):
            continue
        if row.content == UNRECORDED_RESULT_TEXT:
            continue  # its result could not be stored, so it was never sent (TOOL-8)
        if any(run.turn_id == row.turn_id and run.crashed for run in obs.runs or ()):
            continue  # its process died after the result: the crash ended the turn, not the error
        later = [c for c in obs.calls_of_turn(row.turn_id) if c.watermark >= (row.row_id or 0)]
        if not later and not stopped_at_the_bound(obs, row.turn_id) \
                and not _ended_by_something_else(obs, session_id, row.turn_id):
            out.append(Violation("tool_error_is_result", "TOOL-6",
                                 f"the failure of {entry.name}({entry.call_id}) ended turn "
                                 f"{row.turn_id} without another model call"))
    return out


def _left_open_by_a_lost_lease(obs: Observation, entry: LedgerEntry) -> bool:
    """The call's process was frozen (a stall or a clock jump) from the call's batch on
    while its turn's lease lapsed, so the woken holder could write neither the error's
    result nor a closure (LEASE-4), and its call row is still its session's last row: the
    call waits, open, for the next turn's prologue to report it unknown (TOOL-10). A lease
    that lapsed while the process ran (an engine slow to write) excuses nothing, and once
    anything follows the call row, the call's result must be among what follows."""
    found = call_row_of(obs, entry)
    if found is None or found[0] not in lost_leases(obs):
        return False
    (session_id, turn_id), call_row = found
    if call_row is None or turn_id is None or not _lapsed_while_frozen(obs, entry, turn_id):
        return False
    last = next((m.message for m in reversed(obs.record.messages) if m.session_id == session_id), None)
    return last is not None and last.row_id == call_row.row_id


def _lapsed_while_frozen(obs: Observation, entry: LedgerEntry, turn_id: str) -> bool:
    """Did a grant of ``turn_id`` lapse (expire, or be reclaimed from a dead holder) inside
    a pause of the process that ran the call, a pause that began once its batch had?"""
    if not isinstance(entry, SimLedgerEntry) or entry.pid is None or entry.batch_at is None:
        return False
    pid, began = entry.pid, entry.batch_at
    pauses = [(since, until) for p, since, until in obs.stalls
              if p == pid and since >= began - EPSILON_S]
    return any(g.end_reason in ("expired", "holder_dead") and holder_turn(g.holder) == turn_id
               and any(since - EPSILON_S <= g.expires_at <= until + EPSILON_S for since, until in pauses)
               for g in obs.record.lease_grants)


def _ended_by_something_else(obs: Observation, session_id: str, turn_id: str) -> bool:
    """Something other than the error ended the turn before its next call: the user or a
    lost lease stopped it (FIN-4, LEASE-4), preflight would not send the next request
    (CMP-7), or the budget ran out with an answer the verification gate held, which FIN-1
    delivers instead of a grace call."""
    views = [v for v in obs.turns.values() if v.turn_id == turn_id and v.exit is not None]
    stopped = loop_fire.interrupted(obs)
    return any((v.exit is not None and v.exit.reason is ExitReason.INTERRUPTED
                and ((v.session_id, turn_id) in stopped or (session_id, turn_id) in stopped))
               or loop_fire.refused_by_preflight(v)
               # every held answer, overruled or not: which one the budget's end owes is
               # FIN-1's to judge (``withheld_answer_reused``, ``overruled_answer_not_delivered``)
               or (bound_spent(obs, v) and loop_fire.withheld_answers(v, obs))
               for v in views)


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
    want = remembered(obs, "taken-in call keys", (record,), partial(_taken_in_keys, record))
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


def _taken_in_keys(record: CallRecord) -> list[tuple[str, str, str]]:
    """The reply's calls as the engine must record them (``taken_in_calls``), as keys: a
    function of the record's own reply, kept between checks."""
    return _call_keys(taken_in_calls(record.reply.tool_calls) if record.reply else ())


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
    """The streak that ends a turn is exactly [3]: fewer is no reason to stop, and a turn
    that reached it and then called the model again went past it (an exit at the fourth
    all-invalid round is as wrong as none at all)."""
    limit = obs.limits.invalid_tool_rounds_max
    by_turn = calls_by_turn(obs)
    out = []
    for turn_id, records in by_turn.items():
        past = _past_the_streak(obs, records, limit)
        if past is not None:
            out.append(Violation("calls_keep_their_place", "TOOL-2",
                                 f"turn {turn_id} called the model at effect {past} after "
                                 f"{limit} all-invalid tool rounds in a row (limit {limit})"))
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


def _past_the_streak(obs: Observation, records: list[CallRecord], limit: int) -> int | None:
    """The effect of the first call a turn made after its all-invalid streak reached
    ``limit``, or None. Rounds that never landed (asked again unrecorded, LOOP-9) neither
    count nor break the streak, and only a tool round moves it, as in
    ``invalid_streak_at_end`` (the engine's count goes back to 0 only when a round runs)."""
    rounds = {id(r) for r in tool_replies(records)}
    streak = 0
    for record in records:
        if streak >= limit:
            return record.seq
        if id(record) in rounds and round_landed(obs, record):
            streak = streak + 1 if all_invalid(record) else 0
    return None


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
    started = _recovering_since(obs)
    for result, owner in _recovered_results(obs):
        cid = result.tool_call_id or ""
        tag = f"turn {result.turn_id} recovered {cid} of turn {owner.turn_id} (row #{result.row_id})"
        if result.content != RECOVERED_CALL_TEXT:
            out.append(Violation("recovered_calls_not_rerun", "TOOL-10",
                                 f"{tag} with {(result.content or '')[:40]!r}, not the unknown report"))
        since = started.get(result.turn_id or "")
        # after the recovery: the run saw the recovery row committed, or came later in time
        # (at the same instant, the committed high-water mark tells which came first)
        late = [e for e in runs.get((owner.row_id or 0, cid), [])
                if e.watermark >= (result.row_id or 0) or (since is not None and e.at > since)]
        if late:
            out.append(Violation("recovered_calls_not_rerun", "TOOL-10",
                                 f"{tag} but ran it again at t={late[0].at:g} after that turn began"))
    return out


def _recovering_since(obs: Observation) -> dict[str, float]:
    """When each turn could first recover a call: once it held the session's lease, its first
    grant (else when it began). A run begun while the turn still waited in line for a busy
    session is the call's one run, made by the turn that called it, not a second."""
    since = {e.turn_id: e.at for e in obs.events(EventKind.TURN_STARTED)
             if e.turn_id and e.at is not None}
    granted: set[str] = set()
    for grant in obs.record.lease_grants:
        turn = holder_fields(grant.holder).get("turn")
        if turn is not None and turn not in granted:
            granted.add(turn)
            since[turn] = max(since.get(turn, grant.acquired_at), grant.acquired_at)
    return since


def _recovered_results(obs: Observation) -> list[tuple[Message, Message]]:
    """(result row, call row) pairs where the result was written by a later turn."""
    owners: dict[tuple[str, str], Message] = {}
    out = []
    copies = obs.copied_row_ids  # a compaction's copy (pruned, say) is judged where first written
    for stored in obs.record.messages:
        row = stored.message
        for call in row.tool_calls:
            owners[(stored.session_id, call.id)] = row
        owner = owners.get((stored.session_id, row.tool_call_id or "")) if row.role is Role.TOOL else None
        if owner is not None and owner.turn_id != row.turn_id and (row.row_id or 0) not in copies:
            out.append((row, owner))
    return out


@checker("results_durable_before_sent", ("TOOL-8",),
         "a tool result reaches the model only after it is durable; a call that ran and "
         "lost its result is never recorded as not run")
def results_durable_before_sent(obs: Observation) -> list[Violation]:
    """Judged on the bytes each call sent, against the durable results of its own session.

    A result that could not be stored is replaced by a closing row that says its effect is
    unknown; a call the tool world ran (it is in the ledger) whose result row says
    ``NOT_RUN_TEXT`` tells the model and the user that nothing happened when something did.
    """
    out = _ran_but_told_not_run(obs)
    durable: dict[tuple[str, str], list[tuple[int, str | None]]] = defaultdict(list)
    for stored in obs.record.messages:
        row = stored.message
        if row.role is Role.TOOL:
            durable[(stored.session_id, row.tool_call_id or "")].append((row.row_id or 0, row.content))
    tool = Role.TOOL.value  # read once: an enum's value is a property
    for call in obs.calls:
        messages = sent_messages(call)
        if isinstance(messages, str):
            continue  # an unreadable body is WIRE-3's finding
        for message in messages:
            if message.get("role") != tool:
                continue
            cid = str(message.get("tool_call_id") or "")
            rows = durable.get((call.session_id, cid), [])
            if not any(rid <= call.watermark and text == message.get("content") for rid, text in rows):
                out.append(Violation("results_durable_before_sent", "TOOL-8",
                                     f"call at effect {call.seq} (turn {call.turn_id}) sent the "
                                     f"result of {cid} before it was durable"))
                break
    return out


def _ran_but_told_not_run(obs: Observation) -> list[Violation]:
    if not any(m.message.role is Role.TOOL and m.message.content == NOT_RUN_TEXT
               for m in obs.record.messages):
        return []
    out = []
    for entry in obs.ledger:
        found = result_row_of(obs, entry)
        if found is not None and found[1].content == NOT_RUN_TEXT:
            out.append(Violation("results_durable_before_sent", "TOOL-8",
                                 f"{entry.name}({entry.call_id}) ran at t={entry.at:g} but its "
                                 f"result row #{found[1].row_id} says it was not run"))
    return out


@checker("segments_are_safe", ("TOOL-4",),
         "calls run together only when they may: parallel-safe kinds, no writer overlapping "
         "the path another call acts on (as the tool world resolved it), model order kept")
def segments_are_safe(obs: Observation) -> list[Violation]:
    """Each batch the world ran is located by the turn its calls ran in (``call_row_of``),
    never by call ids alone, and judged on the paths the tools were aimed at."""
    out: list[Violation] = []
    last_position: dict[int, int] = {}  # call row id (unique across sessions) -> last run
    batches, stray = _batches_with_entries(obs)
    for batch, ran in batches:
        located = next((f for f in (call_row_of(obs, e) for e in ran.values())
                        if f is not None and f[1] is not None), None)
        key, row = located if located is not None else (None, None)
        if key is None or row is None:
            continue  # nothing of it ran, or it ran with no durable row: TOOL-1 reports that
        where = f"turn {key[0]}/{key[1]} row #{row.row_id}"
        ids = [c.id for c in row.tool_calls]
        if any(cid not in ids for cid in batch):
            out.append(_v4(f"{where}: calls {', '.join(batch)} ran together, not all of that row"))
            continue
        positions = [ids.index(cid) for cid in batch]
        previous = last_position.get(row.row_id or 0, -1)
        if positions != sorted(positions) or positions[0] <= previous:
            out.append(_v4(f"{where}: calls {', '.join(batch)} ran out of model order"))
        last_position[row.row_id or 0] = positions[-1]
        by_id = {c.id: c for c in row.tool_calls}
        problem = _unsafe_together([by_id[cid] for cid in batch], ran)
        if problem:
            out.append(_v4(f"{where}: {problem}"))
    out.extend(_v4(f"{e.name}({e.call_id}) ran in no batch the world recorded") for e in stray)
    return out


def _v4(message: str) -> Violation:
    return Violation("segments_are_safe", "TOOL-4", message)


Ran = dict[str, LedgerEntry]


def _batches_with_entries(obs: Observation) -> tuple[list[tuple[tuple[str, ...], Ran]],
                                                      list[LedgerEntry]]:
    """Each batch with the ledger entries of its calls that ran, and the entries left over.

    The driver runs a batch's calls in order and the tools ledger each one that passes
    validation, so the two records are walked side by side. An entry no batch claims is
    a finding when batches were recorded at all.
    """
    stamped = [e for e in obs.ledger if isinstance(e, SimLedgerEntry) and e.batch is not None]
    if obs.batches and len(stamped) == len(obs.ledger):  # TOOL-5: each entry names its batch
        claimed: dict[int, Ran] = defaultdict(dict)
        for e in stamped:
            claimed[e.batch or 0].setdefault(e.call_id, e)
        stray_stamped: list[LedgerEntry] = [e for e in stamped if (e.batch or 0) >= len(obs.batches)
                         or e.call_id not in obs.batches[e.batch or 0]]
        return ([(batch, claimed.get(i, {})) for i, batch in enumerate(obs.batches)],
                stray_stamped)
    ledger, index = obs.ledger, 0
    paired: list[tuple[tuple[str, ...], Ran]] = []
    for batch in obs.batches:
        ran: Ran = {}
        for cid in batch:
            if index < len(ledger) and ledger[index].call_id == cid:
                ran[cid] = ledger[index]
                index += 1
        paired.append((batch, ran))
    stray = list(ledger[index:]) if obs.batches else []
    return paired, stray


_JOINABLE = (ToolKind.READER, ToolKind.WRITER, ToolKind.PARALLEL_SAFE)


def _unsafe_together(calls: list[ToolCall], ran: Ran) -> str | None:
    """Why these calls must not have run together, or None."""
    if len(calls) < 2:
        return None
    paths: list[tuple[ToolCall, ToolKind, str | None]] = []
    for call in calls:
        spec = TOOLS_BY_NAME.get(call.name)
        if spec is None or spec.kind not in _JOINABLE or call.parsed_arguments() is None:
            return f"{call.name}({call.id}) ran alongside other calls but is a barrier"
        if named_path(call) is None and spec.kind is not ToolKind.PARALLEL_SAFE:
            return f"{call.name}({call.id}) has no usable path but ran alongside other calls"
        paths.append((call, spec.kind, _landed(call, spec.kind, ran.get(call.id))))
    for i, (a, kind_a, path_a) in enumerate(paths):
        for b, kind_b, path_b in paths[i + 1:]:
            writer = ToolKind.WRITER in (kind_a, kind_b)
            if writer and path_a is not None and path_b is not None and _touch(path_a, path_b):
                return (f"{a.name} {_named(a)} ran alongside {b.name} {_named(b)}, "
                        f"and both land on {path_a if _within(path_a, path_b) else path_b}")
    return None


def _landed(call: ToolCall, kind: ToolKind, entry: LedgerEntry | None) -> str | None:
    """Where the world says the call acted; None when it did not run or touched nothing.

    A path-scoped call ledgered without a resolved path (a runner that does not record
    one) counts as touching everything: an unknown is no pass.
    """
    if entry is None or kind not in (ToolKind.READER, ToolKind.WRITER):
        return None
    return entry.path if isinstance(entry, SimLedgerEntry) else "."


def _named(call: ToolCall) -> str:
    return str((call.arguments_object or {}).get("path", "."))


def _within(a: str, b: str) -> bool:
    """Is workspace path ``a`` inside ``b`` (or equal to it)?"""
    return b == "." or a == b or a.startswith(b + "/")


def _touch(a: str, b: str) -> bool:
    """Do two workspace-relative paths overlap (one is the other or contains it)?"""
    return _within(a, b) or _within(b, a)
