"""CMP-4's anti-thrash streak, read from the record as one engine counts it.

Theory of operation
-------------------
The engine judges every pass it runs (``CompressionState.judge``): a pass that leaves the
request at or over its route's threshold is ineffective, one under it ends the streak,
and ``compression_ineffective_max`` (2) ineffective passes in a row block automatic
compaction. A committed pass shows its verdict in the rows it wrote
(``compaction_record.passes``), judged on the threshold of the route it ran for (LOOP-6).
A pass that found nothing to compact writes no row and asks for no summary, yet the
engine judges it all the same (the source notes: "compress also counts an ineffective
attempt when there is too little to compress"). ``verdicts`` are both kinds in the
record's order; the empty ones are inferred at the places the record shows
(``Preflight``): a turn's first preflight (its idle pass, then its threshold passes,
before its first call or failing closed before any), a later one (before a call after a
reply, a cut or a fallback hop, or failing closed after one), and the forced pass after
a provider-proven overflow.

Whether a pass there found nothing is not guessed: it is what the engine's own planner
gives over the list the engine held (``working_list``: the request the turn sent next,
without its system prompt, with the hidden rows of replies a correction cut, which the
list keeps and the wire leaves out; at a fail-closed exit, that list with what came
after it). A pass finds nothing exactly when ``compression.prune`` rewrites no tool
output and ``compression.plan`` leaves no middle to summarize (``finds_nothing``). The
planner and the figures it plans by are the one thing asked of the engine, and asked as
the engine runs them: a sabotaged planner is the one the sabotaged engine used, and what
it plans is judged on every committed pass by CMP-2's and CMP-3's checkers. Thresholds,
cooldowns, pass caps and the streak are read here from the settings and the record.

So no pass is invented, and none is missed (``tests/unit/test_compaction_streak.py``
compares the verdicts with the engine's, pass for pass). Where the planner finds
something, a due pass writes something (a summary request, a compaction), and a place
that shows neither left compaction blocked: ``early_blocks`` lists those, with the streak
the record shows there, and a streak short of ``compression_ineffective_max`` means the
block came early (CMP-4).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from hermes_ref import compression
from hermes_ref.limits import Limits
from hermes_ref.models import EventKind, Message, Role
from hermes_ref.outcomes import ExitReason
from hermes_ref.tokens import count_message
from sim.checkers.base import Observation, TurnView, as_written, remembered
from sim.checkers.compaction_record import (
    AFTER_EVERY_CALL,
    Pass,
    idle_pass,
    is_summary,
    limits_for,
    lineage_of,
    passes,
    same_engine,
    scaffolding_after,
    summary_calls_of,
    tail_tokens,
    threshold_tokens,
    turn_of,
)
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
class Verdict:
    """One anti-thrash verdict of an engine (CMP-4), in the record's order: a committed pass,
    judged by the request it left; or a pass that found nothing to compact and so wrote
    nothing, which the engine counts as ineffective too."""

    root: str            # the compression lineage the session belongs to
    turn: str | None
    order: Order
    ineffective: bool
    empty: bool = False  # inferred from the record: a pass that left no row and no call


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


def _estimate(call: CallRecord, messages: tuple[Message, ...]) -> int:
    """The engine's estimate of a request: its system prompt and the working list."""
    system = sum(m.tokens for m in call.request.messages if m.role is Role.SYSTEM)
    return system + sum(m.tokens for m in messages)


# ---- the places the record shows ----------------------------------------------------------


def _preflights(obs: Observation) -> list[Preflight]:
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
            messages = working_list(obs, call)
            tokens, limits = _estimate(call, messages), limits_for(obs.limits, call.request.model)
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


def _refused_at_preflight(view: TurnView) -> bool:
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
    if not _refused_at_preflight(view):
        return None
    later = tuple(m for m in view.rows if (m.row_id or 0) > last.watermark)
    held = working_list(obs, last)
    if any(m.role is Role.USER for m in later):
        messages = (*(m for m in held if m.scaffold is None), *later)
    else:
        carried = [m for m in held if m.scaffold is not None]
        then = scaffolding_after(obs.limits, calls, last)
        if then == carried:
            messages = (*held, *later)
        elif then[:len(carried)] == carried:
            messages = (*held, *later, *then[len(carried):])
        else:  # a newer reasoning prefill replaced the one at the list's end
            messages = (*held[:-1], *later, then[-1])
    root = lineage_of(obs).get(last.session_id, last.session_id)
    return Preflight(view, "later", root, None, last, _exit_at(view, last.at), last.seq + 1,
                     (last.watermark, 1, 2 * last.seq + 1, 1), messages, _estimate(last, messages),
                     _refusing_route(obs, view, last))


def _refusing_route(obs: Observation, view: TurnView, last: CallRecord) -> Limits:
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
    if not _refused_at_preflight(view) or not view.rows:
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
    tokens = count_message({"role": "system", "content": prompt}) + sum(m.tokens for m in rows)
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


# ---- the verdicts, and the preflights that left compaction blocked ------------------------


@dataclass(frozen=True)
class Reading:
    verdicts: list[Verdict]
    early: list[tuple[Preflight, int]]  # a due pass with something to write, none on record


def verdicts(obs: Observation) -> list[Verdict]:
    """Every anti-thrash verdict of the record, committed passes and empty ones, in order."""
    return _reading(obs).verdicts


def early_blocks(obs: Observation) -> list[tuple[Preflight, int]]:
    """The preflights where a pass was due but for the anti-thrash block, the engine's
    planner finds something to write, and the record shows no pass: each with the
    ineffective streak the record shows there, short of ``compression_ineffective_max``."""
    return _reading(obs).early


def ineffective_streak(obs: Observation, root: str, turn: str | None, order: Order, *,
                       own: bool = True, among: list[Verdict] | None = None) -> int:
    """Ineffective passes in a row, before ``order``, in one lineage and one process (the
    streak is one engine's memory: a restarted process starts without it); ``own`` False
    leaves out the passes of ``turn`` itself."""
    streak = 0
    for verdict in verdicts(obs) if among is None else among:
        if verdict.order >= order:
            break
        if verdict.root != root or not same_engine(obs, verdict.turn, turn) \
                or (not own and verdict.turn == turn):
            continue
        streak = streak + 1 if verdict.ineffective else 0
    return streak


def _reading(obs: Observation) -> Reading:
    sources = (obs.record, obs.calls, obs.summary_calls)
    return remembered(obs, "anti-thrash verdicts", sources, lambda: _read(obs))


def _read(obs: Observation) -> Reading:
    """The committed passes, then each place in order: its idle pass, if one ran and found
    nothing; then, where a threshold pass was due, an empty pass if the planner finds
    nothing, else a block that came early; and an overflow's forced pass that found
    nothing. Whether a pass was due depends on the streak the earlier verdicts left."""
    lineage = lineage_of(obs)
    views = {v.turn_id: v for v in obs.turns.values()}
    out = sorted((Verdict(lineage.get(p.done.session_id, p.done.session_id), p.turn,
                          (p.done.first_row_id, 0, 0, 0),
                          p.tokens_after >= threshold_tokens(_route_of(obs, views.get(p.turn or ""), p)))
                  for p in passes(obs)), key=lambda v: v.order)
    early: list[tuple[Preflight, int]] = []
    if not obs.limits.compression_enabled:
        return Reading(out, early)
    unplaced = _unplaced_attempts(obs)
    for point in sorted(_preflights(obs), key=lambda p: p.order):
        turn, over = point.view.turn_id, point.tokens >= threshold_tokens(point.limits)
        if point.kind == "overflow":
            if _forced_pass_found_nothing(obs, point):
                _add(out, point, over, 1)
            continue
        if point.kind == "first" and _idle_ran(obs, point, out):
            if not finds_nothing(point.messages, point.limits, turn):
                continue  # an idle pass with something to write left no record: _idle_missed
            _add(out, point, over, 0)
        streak = _streak_if_due(obs, point, out)
        if streak is None or streak >= point.limits.compression_ineffective_max:
            continue
        if finds_nothing(point.messages, point.limits, turn):
            _add(out, point, True, 1)
        elif turn not in unplaced:
            early.append((point, streak))
    return Reading(out, early)


def _route_of(obs: Observation, view: TurnView | None, step: Pass) -> Limits:
    """The settings of the route a committed pass was judged on (LOOP-6): the route of the
    turn's call that followed it, or of the window that refused the turn after it."""
    calls = sorted((c for c in view.calls if c.request.purpose == "turn"),
                   key=lambda c: c.seq) if view is not None else []
    after = [c for c in calls if c.watermark >= step.done.first_row_id]
    if after:
        return limits_for(obs.limits, after[0].request.model)
    if view is not None and calls and _refused_at_preflight(view):
        return _refusing_route(obs, view, calls[-1])
    return limits_for(obs.limits, calls[-1].request.model) if calls else obs.limits


def _add(out: list[Verdict], point: Preflight, ineffective: bool, step: int) -> None:
    """An empty pass at ``point``: ``step`` 0 is its manual or idle pass, 1 its threshold
    or forced pass. Judged like any: still over the threshold is ineffective."""
    order = (*point.order[:3], step)
    out.append(Verdict(point.root, point.view.turn_id, order, ineffective, empty=True))
    out.sort(key=lambda v: v.order)


def _cooling(obs: Observation, point: Preflight) -> bool:
    """A summary of the same lineage and process failed less than the cooldown before."""
    lineage = lineage_of(obs)
    failed = [c.at for c in summary_calls_of(obs) if c.error is not None and c.seq < point.seq
              and lineage.get(c.session_id, c.session_id) == point.root
              and same_engine(obs, c.turn_id, point.view.turn_id)]
    return bool(failed) and point.at < failed[-1] + point.limits.compression_cooldown_s


def _streak_if_due(obs: Observation, point: Preflight, so_far: list[Verdict]) -> int | None:
    """The ineffective streak at a preflight where the engine was to run a threshold pass
    unless that streak blocked it: the request was over its route's threshold, no pass of
    this preflight is on record (before the first call: the passes went on), no cooldown
    ran, and the turn had passes left. None where a pass was not due."""
    limits, turn = point.limits, point.view.turn_id
    if point.tokens < threshold_tokens(limits) or not _passes_went_on(obs, point) \
            or _cooling(obs, point):
        return None
    mine = [v for v in so_far if v.turn == turn and v.order < point.order]
    summaries = [c for c in summary_calls_of(obs) if c.turn_id == turn and c.seq < point.seq]
    made = max(len(summaries), sum(not v.empty for v in mine)) + sum(v.empty for v in mine)
    if made >= limits.compression_passes_max:
        return None
    return ineffective_streak(obs, point.root, turn, point.order, among=so_far)


def _records(obs: Observation, point: Preflight) -> tuple[list[CallRecord], list[Pass]]:
    """The summary requests and the committed passes of the turn between the call before
    ``point`` and the call after it (the whole turn, where there is neither)."""
    turn, after = point.view.turn_id, point.after
    low_seq, low_row = (after.seq, after.watermark) if after is not None else (-1, -1)
    high_seq, high_row = (point.before.seq, point.before.watermark) if point.before is not None \
        else (AFTER_EVERY_CALL, AFTER_EVERY_CALL)
    asked = [c for c in summary_calls_of(obs) if c.turn_id == turn and low_seq < c.seq < high_seq]
    done = [p for p in passes(obs) if p.turn == turn
            and low_row < p.done.first_row_id <= high_row]
    return asked, done


def _passes_went_on(obs: Observation, point: Preflight) -> bool:
    """No pass of this preflight on record, or (before the first call, where the threshold
    passes go on while each makes progress) the last one committed and made progress. A
    manual or idle pass comes first and apart: the threshold passes follow it whatever it
    did, unless its summary failed (a cooldown) or its write was put off."""
    asked, done = _records(obs, point)
    if not asked and not done:
        return True
    if point.after is not None or len(asked) > len(done):
        return False  # one pass before a later call; a summary that failed or was deferred
    chain = done[1:] if asked and _stands_apart(obs, asked[0]) else done
    return not chain or chain[-1].progress


def _stands_apart(obs: Observation, first: CallRecord) -> bool:
    """Whether a turn's first summary request was its idle pass (CTX-5) or the manual
    compaction asked of its lineage since the lineage's previous summary request."""
    if idle_pass(obs, first):
        return True
    lineage = lineage_of(obs)
    root = lineage.get(first.session_id, first.session_id)
    earlier = [c.seq for c in summary_calls_of(obs) if c.seq < first.seq
               and lineage.get(c.session_id, c.session_id) == root]
    since = max(earlier, default=-1)
    return any(lineage.get(s, s) == root and since < seq < first.seq
               for s, seq in obs.manual_compactions)


def _idle_ran(obs: Observation, point: Preflight, so_far: list[Verdict]) -> bool:
    """Whether the engine ran an idle pass (CTX-5) at the turn's first preflight that left
    no record, by the engine's own reading of its list: the gap from the previous user row
    to the turn's own, the floor raised by what this process's last compaction of the
    lineage left, and nothing blocking automatic compaction (CMP-4)."""
    limits, turn = point.limits, point.view.turn_id
    if limits.idle_compact_after_s <= 0 or any(_records(obs, point)):
        return False
    stamped = [(m.turn_id, m.created_at) for m in point.messages
               if m.role is Role.USER and m.created_at is not None]
    earlier = [at for who, at in stamped if who != turn]
    own = [at for who, at in stamped if who == turn]
    if not earlier or (own[0] if own else point.at) - earlier[-1] < limits.idle_compact_after_s:
        return False
    if _cooling(obs, point) or ineffective_streak(obs, point.root, turn, point.order, among=so_far) \
            >= limits.compression_ineffective_max:
        return False
    lineage = lineage_of(obs)
    left = [p.tokens_after for p in passes(obs) if p.done.first_row_id <= point.order[0]
            and lineage.get(p.done.session_id, p.done.session_id) == point.root
            and same_engine(obs, p.turn, turn)]
    return point.tokens > tail_tokens(limits) + (left[-1] if left else 0)


def _forced_pass_found_nothing(obs: Observation, point: Preflight) -> bool:
    """Whether an overflow's forced pass ran (no cooldown, the turn's overflows within
    ``compression_passes_max``), left no record, and found nothing to write."""
    turn, refused = point.view.turn_id, point.after
    if refused is None or _cooling(obs, point) or any(_records(obs, point)):
        return False
    overflows = [c for c in point.view.calls if c.error == "ContextOverflow"
                 and c.request.purpose == "turn" and c.seq <= refused.seq]
    if len(overflows) > point.limits.compression_passes_max:
        return False
    return finds_nothing(point.messages, point.limits, turn)


def _unplaced_attempts(obs: Observation) -> set[str]:
    """The turns that asked for the compression lock more often than they committed a
    compaction, or had a store write fail: a pass whose write was put off (the lock held
    elsewhere, CMP-6) or failed leaves no row, and when it had no summary request the
    record cannot place it."""
    failed = {r.turn_id for r in obs.runs or () if r.write_failures and r.turn_id is not None}
    asks: dict[str, int] = defaultdict(int)
    for lock in obs.record.compression_locks:
        turn = turn_of(lock.holder)
        if turn is not None:
            asks[turn] += 1
    for step in passes(obs):
        if step.turn is not None:
            asks[step.turn] -= 1
    return failed | {turn for turn, count in asks.items() if count > 0}
