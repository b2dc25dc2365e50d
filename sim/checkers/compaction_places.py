"""The places where the engine decides on a compaction pass, as the record shows them, and
the list each one held (CMP-4's streak is read over them: ``sim.checkers.compaction_streak``).

Theory of operation
-------------------
A pass is decided at a turn's first preflight (its manual or idle pass, then its threshold
passes), at a later preflight (before a call after a reply, a cut or a fallback hop), at a
preflight that fails the turn closed, and in the overflow branch (a forced pass after a
provider-proven overflow). Each ``Preflight`` carries the working list the engine held
there, rebuilt from the record: the request the turn sent next, without its system
prompt, with the hidden rows of replies a correction cut, which the list keeps and the
wire leaves out (``working_list``); at a fail-closed exit, the last such list with the
rows and scaffolding that came after it, or the rows the record holds. ``finds_nothing``
asks the engine's own planner whether a pass over that list writes anything: pruning
rewrites no tool output and no middle is left to summarize. The planner and the figures
it plans by are asked as the engine runs them, so a sabotaged planner is the one the
sabotaged engine used; what it plans is judged on every committed pass by CMP-2's and
CMP-3's checkers. ``has_work`` asks the same question of the spec's own arithmetic
(``sim.checkers.compaction_split``), so that a planner that finds nothing where there is
a middle is seen (CMP-2) rather than read as a pass with nothing to do.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from hermes_ref import compression
from hermes_ref.limits import Limits
from hermes_ref.models import EventKind, Message, Role
from hermes_ref.outcomes import ExitReason
from sim.checkers import compaction_split
from sim.checkers.base import Observation, TurnView, as_written, remembered
from sim.checkers.compaction_record import (
    is_summary,
    limits_for,
    lineage_of,
    passes,
    scaffolding_after,
    tokens_of,
    turn_of,
)
from sim.checkers.loop_fire import stood_row_ids
from sim.checkers.measure import message_tokens
from sim.world import CallRecord

Order = tuple[int, int, int, int]
# how preflight words a fail-closed exit (compaction.fail_closed via preflight.check)
PREFLIGHT_REFUSAL = "context_overflow: request of "
_REFUSED_WINDOW = re.compile(r"exceeds the (\d+)-token window")


def order_of(call: CallRecord) -> Order:
    """A call's place among the verdicts: after every pass committed before it was made
    (the rows' high-water mark), then by the world's effect counter (a preflight just
    before it, its forced pass after an overflow just after it), then by the step within
    a preflight (its manual or idle pass, then its threshold passes)."""
    return (call.watermark, 1, 2 * call.seq, 0)


@dataclass(frozen=True)
class Preflight:
    """A place in a turn where the engine decides on a pass, as the record shows it.

    ``kind`` is ``first`` (the turn's first preflight: a manual or idle pass, then the
    threshold passes), ``later`` (one threshold pass before a later call, or before failing
    closed after a reply) or ``overflow`` (the forced pass after a provider-proven
    overflow, LOOP-5). ``before`` is the call it came before (None when the turn failed
    closed there), ``after`` the turn's call before it (None before the first; the refused
    call, for an overflow); ``messages`` the working list it ended with, ``tokens`` the
    engine's estimate of that request (the system prompt included), ``limits`` the
    settings of the route it measured."""

    view: TurnView
    kind: str
    root: str            # the compression lineage of the session it measured
    before: CallRecord | None
    after: CallRecord | None
    at: float
    seq: int             # the world's effect count it came at (a bound, at an exit)
    order: Order
    messages: tuple[Message, ...]
    tokens: int
    limits: Limits


# ---- the list a pass would have planned -------------------------------------------------


def _hidden_rows(obs: Observation) -> dict[str, list[Message]]:
    """Each session's hidden rows (a reply a correction cut with nothing visible, LOOP-4),
    live or archived since, in row order."""
    def read() -> dict[str, list[Message]]:
        out: dict[str, list[Message]] = defaultdict(list)
        for stored in (*obs.record.messages, *obs.record.archived):
            if stored.message.hidden:
                out[stored.session_id].append(stored.message)
        for rows in out.values():
            rows.sort(key=lambda m: m.row_id or 0)
        return dict(out)
    return remembered(obs, "hidden rows", (obs.record,), read)


def working_list(obs: Observation, call: CallRecord) -> tuple[Message, ...]:
    """The turn's working list when it made ``call``: the request's messages without the
    system prompt, and the hidden rows among them, which the engine keeps in the list (and
    counts and plans with) but never sends. A hidden row lies between the request's first
    stored row and the call's high-water mark; it goes before the first later row."""
    sent = tuple(m for m in call.request.messages if m.role is not Role.SYSTEM)
    stored = {m.row_id for m in sent if m.row_id is not None}
    if not stored:
        return sent
    low = min(stored)
    hidden = [m for m in _hidden_rows(obs).get(call.session_id, ())
              if low < (m.row_id or 0) <= call.watermark and m.row_id not in stored]
    if not hidden:
        return sent
    out: list[Message] = []
    for message in sent:
        while hidden and message.row_id is not None and (hidden[0].row_id or 0) < message.row_id:
            out.append(hidden.pop(0))
        out.append(message)
    return (*out, *hidden)


def own_text(messages: tuple[Message, ...], turn: str) -> str | None:
    """The turn's text from its last user row, as the engine re-locates it (CTX-7): no
    scaffolding, no summary."""
    for message in reversed(messages):
        if message.role is Role.USER and message.turn_id == turn and message.scaffold is None \
                and not is_summary(message):
            return message.content
    return None


def finds_nothing(messages: tuple[Message, ...], limits: Limits, turn: str) -> bool:
    """Whether a pass over ``messages`` writes nothing, by the engine's own planner: pruning
    rewrites no tool output, and no middle is left to summarize."""
    figures = compression.budget(limits)
    if compression.prune(messages, figures, limits) != messages:
        return False
    return compression.plan(messages, figures, limits, own_text(messages, turn)) is None


def has_work(messages: tuple[Message, ...], limits: Limits, turn: str) -> bool:
    """Whether a pass over ``messages`` must write something, by the spec's arithmetic
    (``compaction_split``), not the engine's planner: where the planner finds nothing and
    this finds work, the planner is wrong (CMP-2)."""
    return compaction_split.has_work(messages, limits, own_text(messages, turn))


def _estimate(call: CallRecord, messages: tuple[Message, ...]) -> int:
    """The engine's estimate of a request: its system prompt and the working list (a hidden
    row in it goes on no wire and counts nothing, LOOP-4)."""
    system = sum(message_tokens(m.wire) for m in call.request.messages if m.role is Role.SYSTEM)
    return system + tokens_of(list(messages))


def _listed(obs: Observation, call: CallRecord) -> tuple[tuple[Message, ...], int]:
    """``working_list`` of ``call`` and its ``_estimate``: a function of the call and its
    session's hidden rows alone, so kept between checks while those are the same values."""
    hidden = _hidden_rows(obs).get(call.session_id, ())

    def read() -> tuple[tuple[Message, ...], int]:
        messages = working_list(obs, call)
        return messages, _estimate(call, messages)
    return remembered(obs, "working list", (call, *hidden), read)


# ---- the places the record shows ----------------------------------------------------------


def preflights(obs: Observation) -> list[Preflight]:
    """The places where the engine decided on a pass, on whichever route the request went
    to (a fallback's passes judged by its own threshold count in the same streak: LOOP-6,
    CMP-4): before a turn's first call, before each call that follows a reply (a retry of a
    failed call resends it without one, an overflow's rebuilt request follows its forced
    pass) or that is the first on a route a fallback hop went to (the iteration starts over
    for it), the one that failed the turn closed, and each overflow's forced pass. The
    grace call is measured, never compacted for."""
    lineage = lineage_of(obs)
    out = []
    for view in obs.turns.values():
        calls = sorted((c for c in view.calls if c.request.purpose == "turn"), key=lambda c: c.seq)
        for index, call in enumerate(calls):
            after = calls[index - 1] if index else None
            root = lineage.get(call.session_id, call.session_id)
            messages, tokens = _listed(obs, call)
            limits = limits_for(obs.limits, call.request.model)
            if call.error == "ContextOverflow":
                rebuilt = calls[index + 1] if index + 1 < len(calls) else None
                out.append(Preflight(view, "overflow", root, rebuilt, call, call.at, call.seq + 1,
                                     (call.watermark, 1, 2 * call.seq + 1, 1), messages, tokens,
                                     limits))
            if after is not None and after.reply is None and after.cut is None \
                    and after.request.model == call.request.model:
                continue
            out.append(Preflight(view, "later" if index else "first", root, call, after,
                                 call.at, call.seq, (call.watermark, 1, 2 * call.seq - 1, 1),
                                 messages, tokens, limits))
        closed = _closed_after(obs, view, calls) if calls else _closed_at_once(obs, view)
        if closed is not None:
            out.append(closed)
    return out


def refused_at_preflight(view: TurnView) -> bool:
    """The turn failed closed at a preflight of its loop: not in the overflow branch (whose
    exit names the provider's error), nor at the grace call's (the budget's exit reason
    comes first there, FIN-1). Its calls may have reached ``max_iterations``: a fallback
    hop gives its call back (LOOP-2), and the loop goes on to the new route's preflight."""
    line = view.exit
    return line is not None and line.reason is ExitReason.COMPRESSION_EXHAUSTED \
        and line.detail.startswith(PREFLIGHT_REFUSAL)


def _exit_at(view: TurnView, default: float) -> float:
    ended = [e.at for e in view.events if e.kind == EventKind.TURN_EXIT and e.at is not None]
    return ended[0] if ended else default


def _closed_after(obs: Observation, view: TurnView, calls: list[CallRecord]) -> Preflight | None:
    """The preflight that failed the turn closed after its last call (after its reply, a
    correction that cut it, or a fallback hop once its route was spent; not the overflow
    branch, whose forced pass ignores the streak, nor the grace call's), with the list it
    measured: the last request's, the rows the turn wrote since, and the scaffolding the
    reply called for (none once a correction was taken in: it drops the scaffolding,
    LOOP-4)."""
    last = calls[-1]
    if not refused_at_preflight(view):
        return None
    stood = stood_row_ids(obs, view)  # a held answer's row, written after the refusal (FIN-6)
    later = tuple(m for m in view.rows if (m.row_id or 0) > last.watermark
                  and m.row_id not in stood)
    messages = held_after(obs, calls, last, later)
    root = lineage_of(obs).get(last.session_id, last.session_id)
    return Preflight(view, "later", root, None, last, _exit_at(view, last.at), last.seq + 1,
                     (last.watermark, 1, 2 * last.seq + 1, 1), messages, _estimate(last, messages),
                     refusing_route(obs, view, last))


def held_after(obs: Observation, calls: list[CallRecord], last: CallRecord,
               later: tuple[Message, ...]) -> tuple[Message, ...]:
    """The working list once the reply of ``last`` (of the turn's ``calls``) was handled and
    the turn wrote the rows ``later``: the last request's list, those rows, and the
    scaffolding the reply called for (none once a correction was taken in: it drops the
    scaffolding, LOOP-4)."""
    held = working_list(obs, last)
    if any(m.role is Role.USER for m in later):
        return (*(m for m in held if m.scaffold is None), *later)
    carried = [m for m in held if m.scaffold is not None]
    then = scaffolding_after(obs, calls, last)
    if then == carried:
        return (*held, *later)
    if then[:len(carried)] == carried:
        return (*held, *later, *then[len(carried):])
    return (*held[:-1], *later, then[-1])  # a newer reasoning prefill replaced the list's last


def refusing_route(obs: Observation, view: TurnView, last: CallRecord) -> Limits:
    """The settings of the route whose window refused the request: the exit names that
    window, and a fallback hop after the last call (LOOP-6) moved the turn to another."""
    line = view.exit
    named = _REFUSED_WINDOW.search(line.detail) if line is not None else None
    if named is None:
        return limits_for(obs.limits, last.request.model)
    return obs.limits.model_copy(update={"context_window_tokens": int(named.group(1))})


def _closed_at_once(obs: Observation, view: TurnView) -> Preflight | None:
    """The first preflight of a turn that failed closed before any call. The list it
    measured is in the record, since no retry has added scaffolding yet: the rows its last
    compaction inserted, or with none the session's live rows when it ended. Its place is
    after those rows and before its lease's release (the world's effect count)."""
    turn = view.turn_id
    if not refused_at_preflight(view) or not view.rows:
        return None
    released = [step.seq for step in obs.lease_log or ()
                if step.what == "released" and turn_of(step.holder) == turn]
    mine = [p for p in passes(obs) if p.turn == turn]
    if not released:
        return None
    if mine:
        rows = tuple(mine[-1].after)
        session = mine[-1].done.child_id or mine[-1].done.session_id
        mark = mine[-1].done.first_row_id + mine[-1].done.rows_after - 1
    else:
        mark = max(m.row_id or 0 for m in view.rows)
        found = next((m.session_id for m in obs.record.messages if m.message.row_id == mark), None)
        if found is None:
            return None
        session, rows = found, _live_rows(obs, found, mark)
    prompt = next((r.system_prompt for r in obs.record.sessions if r.id == session), "")
    tokens = message_tokens({"role": "system", "content": prompt}) + tokens_of(list(rows))
    root = lineage_of(obs).get(session, session)
    return Preflight(view, "first", root, None, None, _exit_at(view, 0.0), released[0],
                     (mark, 1, 2 * released[0] - 1, 1), rows, tokens, obs.limits)


def _live_rows(obs: Observation, session: str, mark: int) -> tuple[Message, ...]:
    """The session's rows live when its row ``mark`` was its last, as they were written."""
    floor = max((c.first_row_id for c in obs.record.compactions
                 if (c.child_id or c.session_id) == session and c.first_row_id <= mark), default=0)
    then = as_written(obs, mark)
    return tuple(sorted((then(m.message) for m in (*obs.record.messages, *obs.record.archived)
                         if m.session_id == session and floor <= (m.message.row_id or 0) <= mark),
                        key=lambda m: m.row_id or 0))
