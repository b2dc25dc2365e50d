"""Checkers of when compaction runs: the threshold, idle, the blocks, the passes (CMP-1, CMP-4,
CTX-5, CTX-6); what it writes and sends is ``sim.checkers.compaction_shape``.

Theory of operation
-------------------
Everything is read from the world and the store: the request bodies the provider got
(``calls``, parsed from the recorded bytes), the summary requests the summarizer got
(``summary_calls``), the manual compactions the user asked for, the committed compactions
(``record.compactions``) with the rows each replaced and inserted, and the user rows'
timestamps. The thresholds are computed here from the settings, by the catalog's
arithmetic, not asked of the engine.

Each checker also fails on silence where the record demands an act: a request sent over
the threshold with nothing blocking compaction, an overflow with neither a smaller retry
nor a fail-closed exit, a manual compaction asked for and never run, an idle session not
compacted, a fail-closed exit whose request fit.
"""

from __future__ import annotations

from itertools import pairwise

from sim.checkers import compaction_shape  # noqa: F401  # its checkers register with these
from sim.checkers.base import Observation, Violation, checker, window_tokens
from sim.checkers.compaction_record import (
    Pass,
    attempts,
    compressible,
    excused_early,
    idle_due,
    idle_pass,
    ineffective_streak,
    lineage_of,
    order_of,
    passes,
    pre_tokens,
    same_engine,
    summary_calls_of,
    threshold_tokens,
    tokens_of,
    tokens_sent,
)
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
    out.extend(_over_threshold_sent(obs, limit))
    out.extend(_idle_missed(obs))
    return out


def _blocked(obs: Observation, call: CallRecord) -> bool:
    """Whether the record shows a block on automatic compaction at this call (CMP-4)."""
    limits = obs.limits
    if not limits.compression_enabled:
        return True
    lineage = lineage_of(obs)
    root = lineage.get(call.session_id, call.session_id)
    failed = [c.at for c in summary_calls_of(obs) if c.error is not None
              and same_engine(obs, c.turn_id, call.turn_id)
              and lineage.get(c.session_id, c.session_id) == root and c.seq < call.seq]
    if failed and call.at < failed[-1] + limits.compression_cooldown_s:
        return True
    if ineffective_streak(obs, root, call.turn_id, order_of(call)) \
            >= limits.compression_ineffective_max:
        return True  # passes that found nothing to compact count as the engine counts them
    return attempts(obs, call.turn_id, before=call) >= limits.compression_passes_max


def _over_threshold_sent(obs: Observation, limit: int) -> list[Violation]:
    out = []
    for call in obs.calls:
        tokens = tokens_sent(obs, call)
        if window_tokens(obs.limits, call.request.model) != obs.limits.context_window_tokens:
            continue  # a fallback route's threshold is its own (LOOP-6)
        if tokens is None or tokens < limit or call.request.purpose != "turn":
            continue
        tried = attempts(obs, call.turn_id, before=call) > 0
        if tried or _blocked(obs, call) or not compressible(call.request.messages, obs.limits):
            continue
        out.append(Violation("compaction_threshold", "CMP-1",
                             f"turn {call.turn_id} sent {tokens} tokens at effect {call.seq}, "
                             f"over the threshold of {limit}, without trying to compact"))
    return out


def _idle_missed(obs: Observation) -> list[Violation]:
    """CTX-5's silence: a turn that began idle past the gap, above the floor, compacted
    (unless its conversation was too short for a pass to leave a record, as for CMP-1)."""
    limits = obs.limits
    if limits.idle_compact_after_s <= 0 or not limits.compression_enabled:
        return []
    out = []
    first: dict[str, CallRecord] = {}
    for call in obs.calls:
        first.setdefault(call.turn_id, call)
    for turn, call in first.items():
        if idle_due(obs, call) and not _blocked(obs, call) \
                and compressible(call.request.messages, limits) and not attempts(obs, turn, before=call):
            out.append(Violation("compaction_threshold", "CTX-5",
                                 f"turn {turn} began after an idle gap past "
                                 f"{limits.idle_compact_after_s:g} s above the floor and did "
                                 "not compact"))
    return out


# ---- CMP-4: the cooldown, the anti-thrash block and the manual bypass ---------------------


@checker("cooldown_respected", ("CMP-4",),
         "no summary is asked for within [600 s] of a failed one, nor after [2] ineffective "
         "passes, unless the user asked for a compaction; one asked for runs at the next turn")
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
        streak = ineffective_streak(obs, root, call.turn_id, order_of(call), own=False)
        if streak >= limits.compression_ineffective_max and not asked:
            out.append(Violation("cooldown_respected", "CMP-4",
                                 f"turn {call.turn_id} compacted automatically after {streak} "
                                 "ineffective passes"))
    for root_id, seq in manual:
        later = [v for v in obs.turns.values() if v.calls
                 and lineage.get(v.session_id, v.session_id) == root_id and v.calls[0].seq > seq]
        if later and not attempts(obs, later[0].turn_id, before=later[0].calls[0]):
            out.append(Violation("cooldown_respected", "CMP-4",
                                 f"a manual compaction of {root_id} was asked for and turn "
                                 f"{later[0].turn_id} called the model without running it"))
    return out


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
