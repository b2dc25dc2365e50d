"""Checkers of slow, stuck and huge tools: results in call order, at most [8] at once, the
batch deadline, the start gate (TOOL-5) and oversized results spilled (TOOL-7).

Each judges the durable record and the tool world's own ledger, never what the engine
chose to emit: a ``SimLedgerEntry`` carries the batch's record of its call (when the batch
began, when the call got a worker, passed the gate, started and ended) and, for its
output, the whole text's size and digest and the spill file's digest as read back. The
bounds are the turn's contract (``obs.limits``), not whatever a driver says it applied.
A ledger entry of the simulated tools without its batch record is itself a finding: a
driver that stops recording cannot pass by silence.
"""

from __future__ import annotations

from collections import defaultdict

from hermes_ref.closure import INTERRUPTED_CALL_TEXT, RECOVERED_CALL_TEXT, UNRECORDED_RESULT_TEXT
from hermes_ref.effects import Site
from hermes_ref.models import Message, Role
from hermes_ref.tool_batch import BatchBounds
from sim.checkers.base import (
    EPSILON_S,
    Observation,
    Violation,
    call_row_of,
    checker,
    result_row_of,
)
from sim.checkers.compaction_record import turn_of
from sim.checkers.rules import says_timed_out, spill_named
from sim.checkers.wire import sent_messages
from sim.tools import SimLedgerEntry


def _entries(obs: Observation) -> list[SimLedgerEntry]:
    return [e for e in obs.ledger if isinstance(e, SimLedgerEntry)]


def _bounds(obs: Observation) -> BatchBounds:
    """The turn's bounds, field by field from its limits (not ``tool_round.batch_bounds``,
    the engine's own hand-off of them)."""
    limits = obs.limits
    return BatchBounds(limits.tool_workers_max, limits.tool_batch_deadline_s,
                       limits.tool_start_gate_s)


def _gate_s(obs: Observation) -> float:
    """The start gate as the catalog words it, min([120 s], deadline / 2), computed here
    from the turn's limits: ``BatchBounds.gate_s`` is the engine's reading of the same
    words, and a gate the engine reads wrong must not widen the one it is judged by."""
    return min(obs.limits.tool_start_gate_s, obs.limits.tool_batch_deadline_s / 2)


def _by_batch(obs: Observation) -> tuple[dict[int, list[SimLedgerEntry]], list[SimLedgerEntry]]:
    batches: dict[int, list[SimLedgerEntry]] = defaultdict(list)
    unstamped = []
    for entry in _entries(obs):
        if entry.batch is None or entry.batch_at is None:
            unstamped.append(entry)
        else:
            batches[entry.batch].append(entry)
    return batches, unstamped


# ---- results in call order -------------------------------------------------------------


@checker("results_in_call_order", ("TOOL-5",),
         "the results of a call row are stored in the order of its calls")
def results_in_call_order(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    by_session: dict[str, list[Message]] = defaultdict(list)
    for stored in obs.record.messages:
        by_session[stored.session_id].append(stored.message)
    for session_id, rows in by_session.items():
        order: list[str] | None = None
        answered: list[str] = []
        for row in [*rows, None]:
            if row is not None and row.role is Role.TOOL:
                answered.append(row.tool_call_id or "")
                continue
            if order is not None:
                kept = [cid for cid in order if cid in answered]
                seen = [cid for cid in answered if cid in order]
                if seen != kept:
                    out.append(Violation("results_in_call_order", "TOOL-5",
                                         f"{session_id}: the results of [{', '.join(order)}] are "
                                         f"stored as [{', '.join(seen)}]"))
            order = [c.id for c in row.tool_calls] if row is not None and row.tool_calls else None
            answered = []
    return out


# ---- workers ---------------------------------------------------------------------------


@checker("workers_bounded", ("TOOL-5",),
         "at no virtual instant does one batch run more calls than [8] workers; every call "
         "of the simulated tools carries its batch's record")
def workers_bounded(obs: Observation) -> list[Violation]:
    bounds = _bounds(obs)
    batches, unstamped = _by_batch(obs)
    out = [Violation("workers_bounded", "TOOL-5",
                     f"{e.name}({e.call_id}) ran at t={e.at:g} with no batch record")
           for e in unstamped]
    for batch, entries in batches.items():
        limit = bounds.workers_max if entries[0].parallel else 1
        most, when = _most_at_once(entries, bounds)
        if most > limit:
            since = when - (entries[0].batch_at or 0.0)
            out.append(Violation("workers_bounded", "TOOL-5",
                                 f"batch {batch} ran {most} calls at once, {since:g}s after it "
                                 f"began (at most {limit})"))
    return out


def _most_at_once(entries: list[SimLedgerEntry], bounds: BatchBounds) -> tuple[int, float]:
    """The most calls running at one instant (a call holds its worker until it ends, or
    until the deadline abandons it), and when."""
    edges: list[tuple[float, int]] = []
    for e in entries:
        cutoff = (e.batch_at or 0.0) + bounds.deadline_s
        end = cutoff if e.ended_at is None else min(e.ended_at, cutoff)
        edges += [(e.at, 1), (max(end, e.at), -1)]
    edges.sort(key=lambda edge: (edge[0] + (0 if edge[1] < 0 else EPSILON_S), edge[1]))
    running = most = 0
    when = 0.0
    for at, step in edges:
        running += step
        if running > most:
            most, when = running, at
    return most, when


# ---- the deadline ----------------------------------------------------------------------


@checker("batch_deadline_kept", ("TOOL-5", "TOOL-3"),
         "a call that ended past the batch deadline [420 s] (or never) has the timed-out "
         "result in place; one that ended in time has its own; no call starts after it")
def batch_deadline_kept(obs: Observation) -> list[Violation]:
    bounds = _bounds(obs)
    out: list[Violation] = []
    batches, _ = _by_batch(obs)
    for entries in batches.values():
        for e in entries:
            found = result_row_of(obs, e)
            late = e.ended_at is None or e.ended_at - (e.batch_at or 0.0) > bounds.deadline_s + EPSILON_S
            t0 = e.batch_at or 0.0
            tag = f"{e.name}({e.call_id}) of batch {e.batch}"
            if e.at - t0 > bounds.deadline_s + EPSILON_S:
                out.append(Violation("batch_deadline_kept", "TOOL-5",
                                     f"{tag} started {e.at - t0:g}s in, after the deadline"))
            if found is None:
                if late and _settled(obs, e) and not _stopped_in_time(obs, e, bounds):
                    out.append(Violation("batch_deadline_kept", "TOOL-3",
                                         f"{tag} was cut by the deadline and has no result"))
                continue
            content = found[1].content
            if late and content == RECOVERED_CALL_TEXT and _stopped_in_time(obs, e, bounds):
                continue  # TOOL-10: its process stopped before the deadline could close it
            if late and content == INTERRUPTED_CALL_TEXT and _interrupted_in_time(obs, e, bounds):
                continue  # FIN-4: the user stopped the turn before the deadline could close it
            if late and content == UNRECORDED_RESULT_TEXT and _unrecorded_in_time(obs, e, bounds):
                continue  # TOOL-8: the deadline closed it, but its timed-out result was not stored
            if late and not says_timed_out(content, bounds.deadline_s):
                ended = "never ended" if e.ended_at is None else f"ended {e.ended_at - t0:g}s in"
                out.append(Violation("batch_deadline_kept", "TOOL-5",
                                     f"{tag} {ended}, past the {bounds.deadline_s:g}s deadline, "
                                     f"and its own result counts: {(content or '')[:40]!r}"))
            elif not late and says_timed_out(content, bounds.deadline_s):
                out.append(Violation("batch_deadline_kept", "TOOL-5",
                                     f"{tag} ended {(e.ended_at or t0) - t0:g}s in, in time, but its result "
                                     "says it timed out"))
    return out


def _stopped_in_time(obs: Observation, entry: SimLedgerEntry, bounds: BatchBounds) -> bool:
    """Did the batch's process stop before the deadline could close the call?

    It stopped when it died after the batch began and before the deadline, or froze in
    that span and either died still frozen (it never ran again) or its turn lost the
    lease meanwhile (a refresh failed, or the grant expired during the freeze: a frozen
    process wakes to find its writes fenced). Then no live
    holder of the turn reached the deadline: the call stays open until the next turn's
    prologue closes it as unknown (TOOL-10), which is its right result, not one that
    counts as its own.
    """
    t0 = entry.batch_at or 0.0
    due = t0 + bounds.deadline_s + EPSILON_S
    if any(pid == entry.pid and t0 <= at <= due for pid, at in obs.deaths):
        return True
    frozen = [(since, until) for pid, since, until in obs.stalls
              if pid == entry.pid and since < due and until > t0]
    if not frozen:
        return False
    if any(pid == entry.pid and since <= at <= until
           for pid, at in obs.deaths for since, until in frozen):
        return True  # killed before it thawed: the freeze was its stop
    found = call_row_of(obs, entry)
    if obs.lease_log is None or found is None:
        return obs.lease_log is None
    session_id, turn_id = found[0]
    if any(step.what == "refresh_failed" and step.session_id == session_id and step.at >= t0
           and turn_of(step.holder) == turn_id for step in obs.lease_log):
        return True
    # or the grant lapsed while the process was frozen, and the turn, waking past the
    # deadline, ended before its refresher ever tried again: the record's grant shows it
    return any(g.end_reason in ("expired", "holder_dead") and turn_of(g.holder) == turn_id
               and any(since - EPSILON_S <= g.expires_at <= until + EPSILON_S
                       for since, until in frozen)
               for g in obs.record.lease_grants if g.session_id == session_id)


def _interrupted_in_time(obs: Observation, entry: SimLedgerEntry, bounds: BatchBounds) -> bool:
    """Did the user stop the call's turn (the world's own log of interrupts) after the
    batch began and before its deadline? Then the interrupt, not the deadline, closed the
    call, and the interrupted text is its right result."""
    found = call_row_of(obs, entry)
    if found is None:
        return False
    session_id, turn_id = found[0]
    t0 = entry.batch_at or 0.0
    return any(i.what == "interrupt" and i.turn_id == turn_id and i.session_id == session_id
               and t0 <= i.at <= t0 + bounds.deadline_s + EPSILON_S for i in obs.interventions)


def _unrecorded_in_time(obs: Observation, entry: SimLedgerEntry, bounds: BatchBounds) -> bool:
    """Did the deadline close the call, and the write of its timed-out result fail?

    The world failed the turn's write of its tool results between the batch's start and
    its deadline, and the turn left its tool round by the deadline (its lease refresher
    stopped, or the lease was let go, in time): the batch gave up on the call when it
    should, but the result that says so could not be stored, so the closing row says the
    call's result was not recorded (TOOL-8), which is its right result. Any other failed
    write of the turn excuses nothing, and a turn that waited out the call leaves its tool
    round too late.
    """
    found = call_row_of(obs, entry)
    if found is None or obs.lease_log is None:
        return False
    session_id, turn_id = found[0]
    t0 = entry.batch_at or 0.0
    due = t0 + bounds.deadline_s + EPSILON_S
    if not any(w.turn_id == turn_id and w.site == Site.TOOL_RESULTS and t0 <= w.at <= due
               for w in obs.failed_writes):
        return False
    left = [step.at for step in obs.lease_log
            if step.what in ("refresher_stopped", "released") and step.session_id == session_id
            and turn_of(step.holder) == turn_id and step.at >= t0]
    return bool(left) and min(left) <= due


def _settled(obs: Observation, entry: SimLedgerEntry) -> bool:
    """Is the call's session at rest with its call row durable (so a result is due)?"""
    found = call_row_of(obs, entry)
    return found is not None and found[1] is not None and obs.at_rest(found[0][0]) \
        and not obs.crash_seqs


# ---- the start gate --------------------------------------------------------------------


@checker("start_gate_kept", ("TOOL-5",),
         "a ready call waits for the earlier calls of its batch to start, but never longer "
         "than the gate, min([120 s], deadline / 2), or than its process's first waking "
         "moment after the gate expired")
def start_gate_kept(obs: Observation) -> list[Violation]:
    gate_s = _gate_s(obs)
    out: list[Violation] = []
    batches, _ = _by_batch(obs)
    for batch, entries in batches.items():
        order = obs.batches[batch] if batch < len(obs.batches) else tuple(e.call_id for e in entries)
        started = {e.call_id: e.at for e in entries}
        for e in entries:
            ready, passed = e.ready_at or 0.0, e.dispatched_at or 0.0
            waited = passed - ready
            tag = f"{e.name}({e.call_id}) of batch {batch}"
            due = _gate_due(obs, e, ready + gate_s)
            if passed > due + EPSILON_S:
                woke = "" if due <= ready + gate_s + EPSILON_S else \
                    f", its process paused until {due - ready:g}s"
                out.append(Violation("start_gate_kept", "TOOL-5",
                                     f"{tag} waited {waited:g}s at the start gate "
                                     f"(at most {gate_s:g}s{woke})"))
            elif waited < gate_s - EPSILON_S and e.call_id in order:
                earlier = order[:order.index(e.call_id)]
                behind = [cid for cid in earlier if cid in started and started[cid] > passed + EPSILON_S]
                if behind:
                    out.append(Violation("start_gate_kept", "TOOL-5",
                                         f"{tag} passed the gate {waited:g}s after it was ready, "
                                         f"before the earlier {', '.join(behind)} started"))
    return out


def _gate_due(obs: Observation, entry: SimLedgerEntry, expires: float) -> float:
    """When the gate must have let the call pass: at ``expires``, or, when the process
    running the batch was paused then (a stall, or a clock jump, which pauses every
    process), at the end of that pause. A frozen process runs nothing, its gate included,
    and passes the call as it wakes; only an entry that names its process is excused."""
    pauses = [(a, b) for pid, a, b in obs.stalls if entry.pid is not None and pid == entry.pid]
    due, moved = expires, True
    while moved:
        moved = False
        for start, until in pauses:
            if start <= due + EPSILON_S and due < until - EPSILON_S:
                due, moved = until, True
    return due


# ---- oversized results -----------------------------------------------------------------


@checker("oversized_results_spilled", ("TOOL-7",),
         "no tool message sent is longer than the cap; an output over it is in a spill file "
         "whole, and its stored result names that file")
def oversized_results_spilled(obs: Observation) -> list[Violation]:
    cap = obs.limits.tool_result_spill_chars
    out: list[Violation] = []
    tool = Role.TOOL.value  # read once: an enum's value is a property
    for call in obs.calls:
        messages = sent_messages(call)
        if isinstance(messages, str):
            continue  # an unreadable body is WIRE-3's finding
        for message in messages:
            content = message.get("content")
            if message.get("role") == tool and isinstance(content, str) \
                    and len(content) > cap:
                out.append(Violation("oversized_results_spilled", "TOOL-7",
                                     f"the request at effect {call.seq} sent the result of "
                                     f"{message.get('tool_call_id')} inline: {len(content)} "
                                     f"characters (cap {cap})"))
                break
    for e in _entries(obs):
        if e.output_chars > cap:
            out.extend(_spill_problems(obs, e))
    return out


# the rows written for a call whose own result was never stored: after a crash (TOOL-10), a
# result that could not be recorded (TOOL-8), an interrupt (FIN-4); none was shown to the model
UNDELIVERED_TEXTS = frozenset({RECOVERED_CALL_TEXT, UNRECORDED_RESULT_TEXT, INTERRUPTED_CALL_TEXT})


def _spill_problems(obs: Observation, e: SimLedgerEntry) -> list[Violation]:
    tag = f"{e.name}({e.call_id}) printed {e.output_chars} characters"
    if e.spilled_to is None:
        return [Violation("oversized_results_spilled", "TOOL-7", f"{tag} and nothing was spilled")]
    if e.spill_sha256 != e.output_sha256:
        return [Violation("oversized_results_spilled", "TOOL-7",
                          f"{tag} but {e.spilled_to} does not hold the whole output")]
    found = result_row_of(obs, e)
    if found is None or says_timed_out(found[1].content, _bounds(obs).deadline_s) \
            or found[1].content in UNDELIVERED_TEXTS:
        return []  # no result reached the model: a closure row stands for it (FIN-4, TOOL-8/10)
    named = spill_named(found[1].content)
    if named != e.spilled_to:
        return [Violation("oversized_results_spilled", "TOOL-7",
                          f"{tag}; its result names {named!r}, not the spill file {e.spilled_to}")]
    return []
