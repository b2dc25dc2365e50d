"""CMP-4's anti-thrash streak, read from the record as one engine counts it.

Theory of operation
-------------------
The engine judges every pass it runs (``CompressionState.judge``): a pass that leaves the
request at or over its route's threshold is ineffective, one under it ends the streak,
and ``compression_ineffective_max`` (2) ineffective passes in a row block automatic
compaction. A committed pass shows its verdict in the rows it wrote
(``compaction_record.passes``) and the scaffolding the turn's next request still carried
(sent, never stored, yet part of what the engine judges), on the threshold of the route
it ran for (LOOP-6).
A pass that found nothing to compact writes no row and asks for no summary, yet the
engine judges it all the same (the source notes: "compress also counts an ineffective
attempt when there is too little to compress"). ``verdicts`` are both kinds in the
record's order; the empty ones are inferred at the places where the engine decides on a
pass (``sim.checkers.compaction_places``): an idle pass, then a threshold pass, at a
turn's first preflight; a threshold pass at a later one or at one that failed the turn
closed; the forced pass after an overflow. Each is inferred where the engine was to run
it (over the threshold, no cooldown, passes left, the streak short of the block) and its
own planner finds nothing to write over the list the turn held (``finds_nothing``).

So no pass is invented, and none is missed (``tests/unit/test_compaction_streak.py``
compares the verdicts with the engine's, pass for pass). Where the planner finds
something, a due pass writes something (a summary request, a compaction), and a place
that shows neither left compaction blocked: ``early_blocks`` lists those, with the streak
the record shows there, and a streak short of ``compression_ineffective_max`` means the
block came early (CMP-4).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role
from sim.checkers.base import Observation, TurnView, remembered
from sim.checkers.compaction_places import (
    Order,
    Preflight,
    finds_nothing,
    has_work,
    held_after,
    own_text,
    preflights,
    refused_at_preflight,
    refusing_route,
)
from sim.checkers.compaction_record import (
    AFTER_EVERY_CALL,
    Pass,
    idle_pass,
    is_summary,
    limits_for,
    lineage_of,
    passes,
    same_engine,
    summary_calls_of,
    tail_tokens,
    threshold_tokens,
    tokens_of,
    turn_of,
)
from sim.checkers.compaction_split import middle, prunable, split
from sim.checkers.measure import message_tokens
from sim.world import CallRecord


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


# ---- the verdicts, and the preflights that left compaction blocked ------------------------


@dataclass(frozen=True)
class Blind:
    """A pass the engine's planner judged to have nothing (more) to summarize where the
    spec's arithmetic finds a middle (``compaction_split``): a pass counted empty, or a
    committed one that only pruned and left the request over the threshold (CMP-2)."""

    turn: str
    where: str
    rows: int      # the list the pass planned over
    middle: int    # the messages the spec says it had to summarize


@dataclass(frozen=True)
class Reading:
    verdicts: list[Verdict]
    early: list[tuple[Preflight, int]]  # a due pass with something to write, none on record
    blind: list[Blind]                  # a pass whose planner missed the middle


def verdicts(obs: Observation) -> list[Verdict]:
    """Every anti-thrash verdict of the record, committed passes and empty ones, in order."""
    return _reading(obs).verdicts


def early_blocks(obs: Observation) -> list[tuple[Preflight, int]]:
    """The preflights where a pass was due but for the anti-thrash block, the engine's
    planner finds something to write, and the record shows no pass: each with the
    ineffective streak the record shows there, short of ``compression_ineffective_max``."""
    return _reading(obs).early


def blind_passes(obs: Observation) -> list[Blind]:
    """The passes the engine counted empty, or committed having only pruned while still
    over the threshold, though the spec's arithmetic finds a middle to summarize: each
    still counts in the streak as the engine judged it, and CMP-2 reports it."""
    return _reading(obs).blind


def ineffective_streak(obs: Observation, root: str, turn: str | None, order: Order, *,
                       among: list[Verdict] | None = None) -> int:
    """Ineffective passes in a row, before ``order``, in one lineage and one process (the
    streak is one engine's memory: a restarted process starts without it), the passes of
    ``turn`` itself included."""
    streak = 0
    for verdict in verdicts(obs) if among is None else among:
        if verdict.order >= order:
            break
        if verdict.root != root or not same_engine(obs, verdict.turn, turn):
            continue
        streak = streak + 1 if verdict.ineffective else 0
    return streak


def _reading(obs: Observation) -> Reading:
    sources = (obs.record, obs.calls, obs.summary_calls, obs.lease_log, obs.runs,
               obs.manual_compactions)
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
                          tokens_after(obs, views.get(p.turn or ""), p)
                          >= threshold_tokens(_route_of(obs, views.get(p.turn or ""), p)))
                  for p in passes(obs)), key=lambda v: v.order)
    early: list[tuple[Preflight, int]] = []
    blind = _pruned_only(obs, views)
    if not obs.limits.compression_enabled:
        return Reading(out, early, blind)
    unplaced = _unplaced_attempts(obs)
    for point in sorted(preflights(obs), key=lambda p: p.order):
        turn, over = point.view.turn_id, point.tokens >= threshold_tokens(point.limits)
        if point.kind == "overflow":
            if _forced_pass_found_nothing(obs, point):
                _add(out, point, over, 1, blind)
            continue
        if point.kind == "first" and _idle_ran(obs, point, out):
            if not finds_nothing(point.messages, point.limits, turn):
                continue  # an idle pass with something to write left no record: _idle_missed
            _add(out, point, over, 0, blind)
        streak = _streak_if_due(obs, point, out)
        if streak is None or streak >= point.limits.compression_ineffective_max:
            continue
        if finds_nothing(point.messages, point.limits, turn):
            _add(out, point, True, 1, blind)
        elif turn not in unplaced:
            early.append((point, streak))
    return Reading(out, early, blind)


def tokens_after(obs: Observation, view: TurnView | None, step: Pass) -> int:
    """The request a committed pass left, as the engine judges it: the rows it wrote, and
    the scaffolding the turn's working list still held (a nudge goes on the wire but is
    never stored), as the turn's next request carried it. Without a next request (the
    turn failed closed after the pass), the scaffolding the pass kept of what the list
    held (``_scaffolding_kept``)."""
    if view is None:
        return step.tokens_after
    calls = sorted((c for c in view.calls if c.request.purpose == "turn"), key=lambda c: c.seq)
    after = [c for c in calls if c.watermark >= step.done.first_row_id]
    if not after:
        return step.tokens_after + tokens_of(_scaffolding_kept(obs, view, calls, step))
    return step.tokens_after + sum(message_tokens(m.wire) for m in after[0].request.messages
                                   if m.scaffold is not None and not m.hidden)


def _scaffolding_kept(obs: Observation, view: TurnView, calls: list[CallRecord],
                      step: Pass) -> list[Message]:
    """The scaffolding a committed pass left in the turn's working list, where no later
    request shows it: of the list the turn held after its last call before the pass
    (``held_after``), all of it when the pass only pruned (pruning moves no message), else
    what lay in the head or the tail of the pruned list, as the spec splits it; what lay in
    the middle went with the summary. Before the turn's first call there is none."""
    before = [c for c in calls if c.watermark < step.done.first_row_id]
    if not before:
        return []
    last = before[-1]
    later = tuple(m for m in view.rows
                  if last.watermark < (m.row_id or 0) < step.done.first_row_id)
    held = held_after(obs, calls, last, later)
    earlier = {m.content for m in step.before if is_summary(m)}
    if not any(is_summary(m) and m.content not in earlier for m in step.after):
        return [m for m in held if m.scaffold is not None]
    limits = _route_of(obs, view, step)
    placeholders = {id(row): text for row, text in prunable(held, limits)}
    pruned = tuple(m.rewritten(placeholders[id(m)]) if id(m) in placeholders else m
                   for m in held)
    head, start = split(pruned, limits)
    return [m for index, m in enumerate(pruned)
            if m.scaffold is not None and not head <= index < start]


def _pruned_only(obs: Observation, views: dict[str, TurnView]) -> list[Blind]:
    """Committed passes that only pruned and left the request at or over the threshold of
    their route, so the engine planned a summary and its planner found no middle, where the
    spec's arithmetic finds one in the pruned list."""
    out = []
    for step in passes(obs):
        earlier = {m.content for m in step.before if is_summary(m)}
        if step.turn is None or any(is_summary(m) and m.content not in earlier
                                    for m in step.after):
            continue  # it wrote a summary (a middle of one message leaves as many rows)
        limits = _route_of(obs, views.get(step.turn), step)
        if step.tokens_after < threshold_tokens(limits):
            continue
        left = middle(tuple(step.after), limits, own_text(tuple(step.before), step.turn))
        if left:
            out.append(Blind(step.turn, f"in its compaction of {step.done.session_id}, which "
                             f"only pruned and left {step.tokens_after} tokens",
                             len(step.after), len(left)))
    return out


def _route_of(obs: Observation, view: TurnView | None, step: Pass) -> Limits:
    """The settings of the route a committed pass was judged on (LOOP-6): the route of the
    turn's call that followed it, or of the window that refused the turn after it."""
    calls = sorted((c for c in view.calls if c.request.purpose == "turn"),
                   key=lambda c: c.seq) if view is not None else []
    after = [c for c in calls if c.watermark >= step.done.first_row_id]
    if after:
        return limits_for(obs.limits, after[0].request.model)
    if view is not None and calls and refused_at_preflight(view):
        return refusing_route(obs, view, calls[-1])
    return limits_for(obs.limits, calls[-1].request.model) if calls else obs.limits


def _add(out: list[Verdict], point: Preflight, ineffective: bool, step: int,
         blind: list[Blind]) -> None:
    """An empty pass at ``point``: ``step`` 0 is its manual or idle pass, 1 its threshold
    or forced pass. Judged like any: still over the threshold is ineffective. Where the
    spec's arithmetic finds work in the list, the planner was blind to it: the verdict
    stands as the engine counted it, and the pass is listed for CMP-2."""
    order = (*point.order[:3], step)
    out.append(Verdict(point.root, point.view.turn_id, order, ineffective, empty=True))
    out.sort(key=lambda v: v.order)
    turn = point.view.turn_id
    if has_work(point.messages, point.limits, turn):
        where = f"before its call at effect {point.before.seq}" if point.before is not None \
            else "before failing closed"
        if step == 0:
            where = f"{where} (its idle pass)"
        elif point.kind == "overflow":
            where = f"forced after the overflow at effect {point.after.seq}" \
                if point.after is not None else where
        left = middle(point.messages, point.limits, own_text(point.messages, turn))
        out_of = len(prunable(point.messages, point.limits))
        blind.append(Blind(turn, f"{where}, judged to have nothing to compact"
                           + (f" ({out_of} tool outputs to prune)" if out_of else ""),
                           len(point.messages), len(left)))


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
