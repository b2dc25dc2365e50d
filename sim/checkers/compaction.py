"""Checkers of when compaction runs: the threshold, idle, the blocks, the passes (CMP-1, CMP-4,
CTX-5, CTX-6); what it writes and sends is ``sim.checkers.compaction_shape``.

Theory of operation
-------------------
Everything is read from the world and the store: the request bodies the provider got
(``calls``, parsed from the recorded bytes), the summary requests the summarizer got
(``summary_calls``), the manual compactions the user asked for, the committed compactions
(``record.compactions``) with the rows each replaced and inserted, and the user rows'
timestamps. The thresholds are computed here from the settings, by the catalog's
arithmetic, not asked of the engine. Whether a pass would have found anything to write is
the engine's planner's answer over the list the turn held, and the anti-thrash streak is
the engine's own count, empty passes included (``sim.checkers.compaction_streak``).

Each checker also fails on silence where the record demands an act: a request sent over
the threshold with nothing blocking compaction, an overflow with neither a smaller retry
nor a fail-closed exit, a manual compaction asked for and never run, an idle session not
compacted, a fail-closed exit whose request fit. A pass that was due and had something to
write, where the only block the record could show is a streak of ineffective passes
shorter than the block takes, is CMP-4's silence (the block came early), not CMP-1's or
CTX-5's.
"""

from __future__ import annotations

from itertools import pairwise

from sim.checkers import compaction_shape  # noqa: F401  # its checkers register with these
from sim.checkers.base import Observation, Violation, checker, window_tokens
from sim.checkers.compaction_places import finds_nothing, order_of, working_list
from sim.checkers.compaction_record import (
    Pass,
    attempts,
    excused_early,
    idle_due,
    idle_pass,
    lineage_of,
    passes,
    pre_tokens,
    same_engine,
    summary_calls_of,
    threshold_tokens,
    tokens_of,
    tokens_sent,
    turn_of,
)
from sim.checkers.compaction_streak import early_blocks, ineffective_streak
from sim.world import CallRecord

# ---- CMP-1: compaction at the threshold, and only there ------------------------------------


@checker("compaction_threshold", ("CMP-1", "CTX-5"),
         "compaction runs when a request reaches the threshold (CMP-1: 0.75 under 512K, the "
         "64,000 floor, 0.85 of small windows) unless it is blocked, and never below it unless "
         "asked for, idle (CTX-5), or after an overflow")
def compaction_threshold(obs: Observation) -> list[Violation]:
    limit = threshold_tokens(obs.limits)
    views = {v.turn_id: v for v in obs.turns.values()}
    out: list[Violation] = []
    for call in summary_calls_of(obs):
        tokens = pre_tokens(obs, call)
        window = window_tokens(obs.limits, call.request.model)
        mine = limit  # a compaction for a fallback is judged by that route's threshold (LOOP-6)
        if window != obs.limits.context_window_tokens:
            mine = threshold_tokens(obs.limits.model_copy(update={"context_window_tokens": window}))
        if tokens >= mine or excused_early(obs, views.get(call.turn_id), call):
            continue
        idle = idle_due(obs, call)
        if idle is None:
            out.append(Violation("compaction_threshold", "CMP-1",
                                 f"turn {call.turn_id} compacted at {tokens} tokens, under the "
                                 f"threshold of {mine}, unasked"))
        elif not idle:
            out.append(Violation("compaction_threshold", "CTX-5",
                                 f"turn {call.turn_id} compacted at {tokens} tokens, under the "
                                 f"threshold of {limit}, though the session was not idle past "
                                 f"{obs.limits.idle_compact_after_s:g} s above the floor"))
    for call, streak in _over_threshold_sent(obs, limit):
        if not streak:  # a streak short of the block: CMP-4 judges it (cooldown_respected)
            out.append(Violation("compaction_threshold", "CMP-1",
                                 f"turn {call.turn_id} sent {tokens_sent(obs, call)} tokens at "
                                 f"effect {call.seq}, over the threshold of {limit}, without "
                                 "trying to compact"))
    for call, streak in _idle_missed(obs):
        if not streak:
            out.append(Violation("compaction_threshold", "CTX-5",
                                 f"turn {call.turn_id} began after an idle gap past "
                                 f"{obs.limits.idle_compact_after_s:g} s above the floor and "
                                 "did not compact"))
    return out


def _streak_unblocked(obs: Observation, call: CallRecord) -> int | None:
    """The ineffective streak at this call when the record shows no block on automatic
    compaction there (CMP-4: the cooldown, a full streak, the turn's passes spent), or None.
    Passes that found nothing to compact count as the engine counts them."""
    limits = obs.limits
    if not limits.compression_enabled:
        return None
    lineage = lineage_of(obs)
    root = lineage.get(call.session_id, call.session_id)
    failed = [c.at for c in summary_calls_of(obs) if c.error is not None
              and same_engine(obs, c.turn_id, call.turn_id)
              and lineage.get(c.session_id, c.session_id) == root and c.seq < call.seq]
    if failed and call.at < failed[-1] + limits.compression_cooldown_s:
        return None
    streak = ineffective_streak(obs, root, call.turn_id, order_of(call))
    if streak >= limits.compression_ineffective_max \
            or attempts(obs, call.turn_id, before=call) >= limits.compression_passes_max:
        return None
    return streak


def _has_work(obs: Observation, call: CallRecord) -> bool:
    """Whether a pass before ``call`` would have written something (the engine's planner
    over the list it held): a conversation too short for a middle leaves no record."""
    return not finds_nothing(working_list(obs, call), obs.limits, call.turn_id)


def _over_threshold_sent(obs: Observation, limit: int) -> list[tuple[CallRecord, int]]:
    """Calls sent over the threshold with no pass of their turn before them, nothing
    blocking one, and something to compact: each with the ineffective streak there."""
    out = []
    for call in obs.calls:
        tokens = tokens_sent(obs, call)
        if window_tokens(obs.limits, call.request.model) != obs.limits.context_window_tokens:
            continue  # a fallback route's threshold is its own (LOOP-6)
        if tokens is None or tokens < limit or call.request.purpose != "turn":
            continue
        if attempts(obs, call.turn_id, before=call) > 0 or _refused_the_lock(obs, call):
            continue
        streak = _streak_unblocked(obs, call)
        if streak is not None and _has_work(obs, call):
            out.append((call, streak))
    return out


def _refused_the_lock(obs: Observation, call: CallRecord) -> bool:
    """Whether ``call``'s turn had asked for the compression lock by then and its pass could
    not be written: it tried to compact, and a pass put off that way leaves no row and asks
    for no summary (the record's lock asks show it). Refused the lock (another holder had
    it, CMP-6), or granted it on a session already ended under the turn (a reset on another
    route): the store compacts no ended session, so the messages stay as they are."""
    ended = {s.id: s.ended_at for s in obs.record.sessions}
    for ask in obs.record.compression_locks:
        if turn_of(ask.holder) != call.turn_id or ask.acquired_at > call.at:
            continue
        end = ended.get(ask.session_id)
        if not ask.granted or (end is not None and end <= ask.acquired_at):
            return True
    return False


def _idle_missed(obs: Observation) -> list[tuple[CallRecord, int]]:
    """CTX-5's silence: the first calls of turns that began idle past the gap, above the
    floor, with nothing blocking a pass and something to compact, yet no pass before them;
    each with the ineffective streak there."""
    limits = obs.limits
    if limits.idle_compact_after_s <= 0 or not limits.compression_enabled:
        return []
    out = []
    first: dict[str, CallRecord] = {}
    for call in obs.calls:
        first.setdefault(call.turn_id, call)
    for turn, call in first.items():
        if not idle_due(obs, call) or attempts(obs, turn, before=call) \
                or _refused_the_lock(obs, call):
            continue
        streak = _streak_unblocked(obs, call)
        if streak is not None and _has_work(obs, call):
            out.append((call, streak))
    return out


# ---- CMP-4: the cooldown, the anti-thrash block and the manual bypass ---------------------


@checker("cooldown_respected", ("CMP-4",),
         "no summary is asked for within [600 s] of a failed one, nor after [2] ineffective "
         "passes, unless the user asked for a compaction or the provider proved an overflow; "
         "one asked for runs at the next turn; "
         "fewer ineffective passes do not block a pass that has something to compact")
def cooldown_respected(obs: Observation) -> list[Violation]:
    limits = obs.limits
    lineage = lineage_of(obs)
    out: list[Violation] = []
    manual = [(lineage.get(s, s), seq) for s, seq in obs.manual_compactions]
    calls = summary_calls_of(obs)
    for index, call in enumerate(calls):
        root = lineage.get(call.session_id, call.session_id)
        asked = any(r == root and seq < call.seq for r, seq in manual)
        # the cooldown and the streak are one process's memory: a restart starts without them
        failed = [c for c in calls[:index] if c.error is not None
                  and lineage.get(c.session_id, c.session_id) == root
                  and same_engine(obs, c.turn_id, call.turn_id)]
        if failed and call.at < failed[-1].at + limits.compression_cooldown_s and not any(
                r == root and failed[-1].seq < seq < call.seq for r, seq in manual):
            out.append(Violation("cooldown_respected", "CMP-4",
                                 f"turn {call.turn_id} asked for a summary {call.at - failed[-1].at:g} s "
                                 f"after one failed (cooldown {limits.compression_cooldown_s:g} s)"))
        # the streak the engine blocked on: every pass judged before this one, the turn's
        # own included (a forced pass that relieved the request ended the streak)
        streak = ineffective_streak(obs, root, call.turn_id, order_of(call))
        if streak >= limits.compression_ineffective_max and not asked \
                and not _forced_by_overflow(obs, call):
            out.append(Violation("cooldown_respected", "CMP-4",
                                 f"turn {call.turn_id} compacted automatically after {streak} "
                                 "ineffective passes"))
    out.extend(_blocked_early(obs))
    for root_id, seq in manual:
        later = [v for v in obs.turns.values() if v.calls
                 and lineage.get(v.session_id, v.session_id) == root_id and v.calls[0].seq > seq]
        if later and not attempts(obs, later[0].turn_id, before=later[0].calls[0]):
            out.append(Violation("cooldown_respected", "CMP-4",
                                 f"a manual compaction of {root_id} was asked for and turn "
                                 f"{later[0].turn_id} called the model without running it"))
    return out


def _forced_by_overflow(obs: Observation, summary: CallRecord) -> bool:
    """Whether ``summary`` belongs to a pass a provider-proven overflow forced: its turn's
    last model call before it was refused as too long. Such a pass is not held back by the
    ineffective passes before it (the provider proved the request cannot go as it is); a
    cooldown still holds it (CMP-8, LOOP-5)."""
    before = [c for c in obs.calls if c.turn_id == summary.turn_id and c.seq < summary.seq]
    return bool(before) and before[-1].error == "ContextOverflow"


def _blocked_early(obs: Observation) -> list[Violation]:
    """CMP-4's silence: a pass was due (over the threshold, no cooldown, passes left, idle
    past the gap) and had something to compact, the streak of ineffective passes was short
    of the block, and no pass ran."""
    most = obs.limits.compression_ineffective_max
    out = []
    for point, streak in early_blocks(obs):
        if streak:
            where = f"before its call at effect {point.before.seq}" if point.before is not None \
                else "before failing closed"
            out.append(Violation("cooldown_respected", "CMP-4",
                                 f"turn {point.view.turn_id} ran no pass {where}: its request of "
                                 f"{point.tokens} tokens was over the threshold and had something "
                                 f"to compact, after only {_passes(streak)} in a row (the block "
                                 f"takes {most})"))
    for call, streak in _idle_missed(obs):
        if streak:
            out.append(Violation("cooldown_respected", "CMP-4",
                                 f"turn {call.turn_id} began after an idle gap and did not "
                                 f"compact, after only {_passes(streak)} in a row (the block "
                                 f"takes {most})"))
    return out


def _passes(count: int) -> str:
    return f"{count} ineffective pass" + ("" if count == 1 else "es")


# ---- CTX-6: passes before the first call ---------------------------------------------------


def _threshold_chain(obs: Observation, asked: list[CallRecord], mine: list[Pass]) -> list[Pass]:
    """The turn's threshold passes, whose progress CTX-6 judges one after another. An idle
    pass (CTX-5) is the turn's own step before them: it compacts down to the tail's budget
    and may leave as many messages as it found, yet the threshold passes that follow start
    afresh, so its lack of progress stops nothing. It is the turn's first compaction when
    its summary call, the turn's first, succeeded."""
    if mine and asked and asked[0].error is None and idle_pass(obs, asked[0]):
        return mine[1:]
    return mine


@checker("passes_bounded", ("CTX-6",),
         "before a turn's first call at most [3] compaction passes run, and a pass runs only "
         "after one that made progress (fewer messages or >= 5 % fewer tokens)")
def passes_bounded(obs: Observation) -> list[Violation]:
    limits = obs.limits
    out: list[Violation] = []
    steps = passes(obs)
    for view in obs.ended_turns():
        first = view.calls[0] if view.calls else None
        if first is None:
            continue
        attempts = [c for c in summary_calls_of(obs) if c.turn_id == view.turn_id
                    and c.seq < first.seq]
        mine = [s for s in steps if s.turn == view.turn_id
                and s.done.first_row_id <= first.watermark]
        count = max(len(attempts), len(mine))
        if count > limits.compression_passes_max:
            out.append(Violation("passes_bounded", "CTX-6",
                                 f"turn {view.key} ran {count} passes before its first call "
                                 f"(at most {limits.compression_passes_max})"))
        for earlier, later in pairwise(attempts):
            if earlier.error is not None:
                out.append(Violation("passes_bounded", "CTX-6",
                                     f"turn {view.key} compacted again at effect {later.seq} "
                                     "after a failed summary (no progress)"))
        for step in _threshold_chain(obs, attempts, mine)[:-1]:
            if not step.progress:
                out.append(Violation("passes_bounded", "CTX-6",
                                     f"turn {view.key} ran another pass after one that left "
                                     f"{len(step.after)} of {len(step.before)} messages and "
                                     f"{tokens_of(step.after)} of {tokens_of(step.before)} tokens"))
    return out
