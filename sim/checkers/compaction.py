"""Checkers of compaction before a call (CMP-1..4, CMP-7, CTX-5..7, LOOP-5's overflow branch).

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

from dataclasses import dataclass
from itertools import pairwise

from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role
from hermes_ref.outcomes import CONTEXT_PRESSURE_EXITS
from hermes_ref.ports import CompactionRow, DurableRecord, StoredMessage
from hermes_ref.tokens import count_message, count_wire_messages
from sim.checkers.base import Observation, TurnView, Violation, checker
from sim.checkers.lineage import roots
from sim.checkers.rotation import CompactionRun  # a story's own compaction, not judged here
from sim.checkers.wire import sent_messages
from sim.world import CallRecord

SUMMARY_PREFIX = "[Summary of the earlier conversation, written when it was compacted]\n"
PRUNED_PREFIX = "[tool output pruned to save context: "
STAGED_PREFIX = "[Summary of earlier conversation]"  # sim.rotation_story's own compactions


# ---- the figures, by the catalog's arithmetic ---------------------------------------------


def threshold_tokens(limits: Limits) -> int:
    """CMP-1: 0.75 under 512K, window minus max_tokens, the 64,000 floor and the 0.85 rule."""
    context = limits.context_window_tokens
    ratio = limits.compression_threshold
    if context < limits.compression_small_window_tokens:
        ratio = max(ratio, limits.compression_small_window_threshold)
    window = context
    if limits.max_tokens and context - limits.max_tokens > 0:
        window = context - limits.max_tokens
    value = max(int(window * ratio), 64_000)
    return min(int(window * 0.85), window - 1) if value >= window else value


def tail_tokens(limits: Limits) -> int:
    ratio = min(0.80, max(0.10, limits.compression_target_ratio))
    return int(threshold_tokens(limits) * ratio)


def _sent_tokens(call: CallRecord) -> int | None:
    sent = sent_messages(call)
    return None if isinstance(sent, str) else count_wire_messages(sent)


def _is_summary(message: Message) -> bool:
    return (message.content or "").startswith(SUMMARY_PREFIX)


def _tokens(rows: list[Message]) -> int:
    return sum(count_message(m.wire) for m in rows)


def _turn_of(holder: str) -> str | None:
    for part in holder.split(":"):
        if part.startswith("turn="):
            return part[len("turn="):]
    return None


# ---- what each compaction replaced and kept ------------------------------------------------


@dataclass(frozen=True)
class Pass:
    """One committed compaction, as the record shows it."""

    done: CompactionRow
    turn: str | None
    before: list[Message]   # the live rows it replaced
    after: list[Message]    # the rows it inserted
    system_tokens: int

    @property
    def progress(self) -> bool:
        """CTX-6: fewer messages, or tokens under 95 % of before."""
        return len(self.after) < len(self.before) or \
            _tokens(self.after) < _tokens(self.before) * 0.95

    @property
    def tokens_after(self) -> int:
        return self.system_tokens + _tokens(self.after)


def _every(record: DurableRecord) -> list[StoredMessage]:
    return sorted((*record.messages, *record.archived), key=lambda m: m.message.row_id or 0)


def passes(obs: Observation) -> list[Pass]:
    record = obs.record
    prompts = {s.id: s.system_prompt for s in record.sessions}
    every = _every(record)
    staged = {r.turn_id for r in obs.runs or () if isinstance(r, CompactionRun)}
    out = []
    for done in record.compactions:
        if _turn_of(done.holder) in staged:
            continue  # a story's own compaction (sim.rotation_story), not the engine's
        target = done.child_id or done.session_id
        earlier = [c.first_row_id for c in record.compactions if c.first_row_id < done.first_row_id
                   and (c.child_id or c.session_id) == done.session_id]
        floor = max(earlier, default=0)
        before = [m.message for m in every if m.session_id == done.session_id
                  and floor <= (m.message.row_id or 0) < done.first_row_id]
        last = done.first_row_id + done.rows_after
        after = [m.message for m in every if m.session_id == target
                 and done.first_row_id <= (m.message.row_id or 0) < last]
        if any((m.content or "").startswith(STAGED_PREFIX) for m in after):
            continue  # the story wrote this set itself, before its runs are marked as such
        system = count_message({"role": "system", "content": prompts.get(done.session_id, "")})
        out.append(Pass(done, _turn_of(done.holder), before, after, system))
    return out


def _lineage(obs: Observation) -> dict[str, str]:
    root = roots(obs.record)
    return {s.id: root.get(s.id, s.id) for s in obs.record.sessions}


def _summary_calls(obs: Observation) -> list[CallRecord]:
    return list(obs.summary_calls or ())


def _attempts(obs: Observation, turn: str, before: CallRecord | None = None,
              after: CallRecord | None = None) -> int:
    """The turn's compaction attempts (summary calls, committed compactions) between two of
    its calls: ordered by the world's effect counter and the store's row ids, not by time."""
    count = 0
    for c in _summary_calls(obs):
        if c.turn_id == turn and (before is None or c.seq < before.seq) \
                and (after is None or c.seq > after.seq):
            count += 1
    for p in passes(obs):
        if p.turn == turn and (before is None or p.done.first_row_id <= before.watermark) \
                and (after is None or p.done.first_row_id > after.watermark):
            count += 1
    return count


def window_tokens(limits: Limits, model: str | None = None) -> int:
    """The window of the route a request went to (LOOP-6: a fallback has its own)."""
    for route in getattr(limits, "fallback_providers", ()):
        if route.model == model:
            return int(route.window_in_estimate)
    return limits.context_window_tokens


def smallest_window(limits: Limits) -> int:
    routes = [int(r.window_in_estimate) for r in getattr(limits, "fallback_providers", ())]
    return min([limits.context_window_tokens, *routes])


def limits_for(limits: Limits, model: str) -> Limits:
    window = window_tokens(limits, model)
    if window == limits.context_window_tokens:
        return limits
    return limits.model_copy(update={"context_window_tokens": window})


# ---- CMP-1: compaction at the threshold, and only there ------------------------------------


def _excused_early(obs: Observation, view: TurnView | None, call: CallRecord) -> str | None:
    """Why a summary call under the threshold was due anyway: manual, or after an overflow."""
    lineage = _lineage(obs)
    root = lineage.get(call.session_id, call.session_id)
    if any(lineage.get(s, s) == root and seq < call.seq for s, seq in obs.manual_compactions):
        return "manual"
    turn_calls = view.calls if view is not None else []
    if any(c.error == "ContextOverflow" and c.seq < call.seq for c in turn_calls):
        return "overflow"
    return None


def _pre_tokens(obs: Observation, call: CallRecord) -> int:
    """The request the turn would have sent when it asked for the summary: the system
    prompt and the session's rows committed by then."""
    prompt = next((s.system_prompt for s in obs.record.sessions if s.id == call.session_id), "")
    rows = [m.message for m in obs.record.messages
            if m.session_id == call.session_id and (m.message.row_id or 0) <= call.watermark]
    return count_message({"role": "system", "content": prompt}) + _tokens(rows)


def _idle_due(obs: Observation, call: CallRecord) -> bool | None:
    """CTX-5 at the summary call's turn: None when idle compaction is off."""
    limits = obs.limits
    if limits.idle_compact_after_s <= 0 or not limits.compression_enabled:
        return None
    users = [m.message for m in obs.record.messages if m.session_id == call.session_id
             and m.message.role is Role.USER and m.message.created_at is not None
             and not _is_summary(m.message) and (m.message.row_id or 0) <= call.watermark]
    own = [m for m in users if m.turn_id == call.turn_id]
    earlier = [m for m in users if m.turn_id != call.turn_id]
    if not own or not earlier:
        return False
    gap = (own[-1].created_at or 0.0) - (earlier[-1].created_at or 0.0)
    floor = int(threshold_tokens(limits) * min(0.80, max(0.10, limits.compression_target_ratio)))
    lineage = _lineage(obs)
    root = lineage.get(call.session_id, call.session_id)
    before = [p for p in passes(obs) if p.done.first_row_id <= call.watermark
              and lineage.get(p.done.session_id, p.done.session_id) == root and p.turn != call.turn_id]
    if before:  # the floor rises by what the last compaction left
        floor += before[-1].tokens_after
    return gap >= limits.idle_compact_after_s and _pre_tokens(obs, call) > floor


@checker("compaction_threshold", ("CMP-1", "CTX-5"),
         "compaction runs when a request reaches the threshold (CMP-1: 0.75 under 512K, the "
         "64,000 floor, 0.85 of small windows) unless it is blocked, and never below it unless "
         "asked for, idle (CTX-5), or after an overflow")
def compaction_threshold(obs: Observation) -> list[Violation]:
    limit = threshold_tokens(obs.limits)
    views = {v.turn_id: v for v in obs.turns.values()}
    out: list[Violation] = []
    for call in _summary_calls(obs):
        tokens = _pre_tokens(obs, call)
        if tokens >= limit or _excused_early(obs, views.get(call.turn_id), call):
            continue
        idle = _idle_due(obs, call)
        if idle is None:
            out.append(Violation("compaction_threshold", "CMP-1",
                                 f"turn {call.turn_id} compacted at {tokens} tokens, under the "
                                 f"threshold of {limit}, unasked"))
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
    lineage = _lineage(obs)
    root = lineage.get(call.session_id, call.session_id)
    failed = [c.at for c in _summary_calls(obs) if c.error is not None
              and lineage.get(c.session_id, c.session_id) == root and c.seq < call.seq]
    if failed and call.at < failed[-1] + limits.compression_cooldown_s:
        return True
    streak = 0
    for done in passes(obs):
        if lineage.get(done.done.session_id, done.done.session_id) != root \
                or done.done.first_row_id > call.watermark:
            continue
        streak = streak + 1 if done.tokens_after >= threshold_tokens(limits) else 0
    if streak >= limits.compression_ineffective_max:
        return True
    return _attempts(obs, call.turn_id, before=call) >= limits.compression_passes_max


def _compressible(call: CallRecord, limits: Limits) -> bool:
    """More messages than the head, the tail floor and a tool group's slack could hold."""
    sent = sent_messages(call)
    if isinstance(sent, str):
        return False
    rest = [m for m in sent if m.get("role") != "system"
            and not str(m.get("content") or "").startswith(SUMMARY_PREFIX)]
    return len(rest) > limits.compression_protect_first + limits.compression_tail_floor_messages + 2


def _over_threshold_sent(obs: Observation, limit: int) -> list[Violation]:
    out = []
    for call in obs.calls:
        tokens = _sent_tokens(call)
        if window_tokens(obs.limits, call.request.model) != obs.limits.context_window_tokens:
            continue  # a fallback route's threshold is its own (LOOP-6)
        if tokens is None or tokens < limit or call.request.purpose != "turn":
            continue
        tried = _attempts(obs, call.turn_id, before=call) > 0
        if tried or _blocked(obs, call) or not _compressible(call, obs.limits):
            continue
        out.append(Violation("compaction_threshold", "CMP-1",
                             f"turn {call.turn_id} sent {tokens} tokens at effect {call.seq}, "
                             f"over the threshold of {limit}, without trying to compact"))
    return out


def _idle_missed(obs: Observation) -> list[Violation]:
    """CTX-5's silence: a turn that began idle past the gap, above the floor, compacted."""
    limits = obs.limits
    if limits.idle_compact_after_s <= 0 or not limits.compression_enabled:
        return []
    out = []
    first: dict[str, CallRecord] = {}
    for call in obs.calls:
        first.setdefault(call.turn_id, call)
    for turn, call in first.items():
        if _idle_due(obs, call) and not _blocked(obs, call) \
                and not _attempts(obs, turn, before=call):
            out.append(Violation("compaction_threshold", "CTX-5",
                                 f"turn {turn} began after an idle gap past "
                                 f"{limits.idle_compact_after_s:g} s above the floor and did "
                                 "not compact"))
    return out


# ---- CMP-2: prune first, head and tail kept, the middle summarized, the summary updated -----


def _key(m: Message) -> tuple[object, ...]:
    return (m.role, m.content, m.tool_call_id, tuple(c.id for c in m.tool_calls))


def _summary_of(obs: Observation, step: Pass) -> CallRecord | None:
    """The successful summary call of the compaction's turn whose text its summary row holds."""
    texts = {(m.content or "")[len(SUMMARY_PREFIX):] for m in step.after if _is_summary(m)}
    made = [c for c in _summary_calls(obs) if c.turn_id == step.turn and c.reply is not None
            and (c.reply.content or "").strip() in texts]
    return made[-1] if made else None


def _tail_start(rows: list[Message], budget: int, floor: int) -> int:
    start, spent = len(rows), 0
    while start > 0:
        cost = count_message(rows[start - 1].wire)
        if len(rows) - start >= floor and spent + cost > budget:
            break
        spent += cost
        start -= 1
    return start


def _prunable_saving(step: Pass, limits: Limits) -> int:
    """Tokens pruning old tool outputs (after the head, before the tail, neither splitting a
    tool group) would have saved, each replaced by its placeholder."""
    rows = step.before
    head = 0 if any(_is_summary(m) for m in rows) else min(limits.compression_protect_first,
                                                           len(rows))
    while head < len(rows) and rows[head].role is Role.TOOL:
        head += 1
    start = _tail_start(rows, tail_tokens(limits), limits.compression_tail_floor_messages)
    while 0 < start < len(rows) and rows[start].role is Role.TOOL:
        start -= 1
    saved = 0
    for row in rows[head:start]:
        text = row.content or ""
        placeholder = f"{PRUNED_PREFIX}{len(text)} characters]"
        if row.role is Role.TOOL and len(text) > len(placeholder) \
                and not text.startswith(PRUNED_PREFIX):
            saved += count_message(row.wire) - count_message({**row.wire, "content": placeholder})
    return saved


@checker("compaction_shape", ("CMP-2",),
         "a compaction keeps the protected head and a tail of at least [8] messages, replaces "
         "the middle with one summary the auxiliary model wrote (updating an earlier one), and "
         "summarizes only when pruning old tool outputs would not have been enough")
def compaction_shape(obs: Observation) -> list[Violation]:
    limits, limit = obs.limits, threshold_tokens(obs.limits)
    out: list[Violation] = []

    def bad(step: Pass, message: str) -> None:
        out.append(Violation("compaction_shape", "CMP-2",
                             f"compaction of {step.done.session_id} by {step.turn}: {message}"))

    for step in passes(obs):
        before, after = step.before, step.after
        if len(after) >= len(before):
            continue  # nothing was dropped: pruning only, nothing to summarize
        summaries = [m for m in after if _is_summary(m)]
        call = _summary_of(obs, step)
        said = (call.reply.content or "").strip() if call is not None and call.reply else None
        if len(summaries) != 1 or said is None or \
                (summaries[0].content or "")[len(SUMMARY_PREFIX):] != said:
            bad(step, f"dropped {len(before) - len(after)} rows without exactly one summary "
                "written by the auxiliary model")
            continue
        floor = min(len(before), limits.compression_tail_floor_messages)
        if [_key(m) for m in after[-floor:]] != [_key(m) for m in before[-floor:]]:
            bad(step, f"did not keep the last {floor} messages as they were")
        if not any(_is_summary(m) for m in before):
            head = before[:limits.compression_protect_first]
            if [_key(m) for m in after[:len(head)]] != [_key(m) for m in head]:
                bad(step, f"did not keep the first {len(head)} messages as they were")
        previous = [m for m in before if _is_summary(m)]
        asked = call.request.messages[-1].content or "" if call is not None else ""
        if previous and (previous[-1].content or "")[len(SUMMARY_PREFIX):].strip() not in asked:
            bad(step, "started a new summary instead of updating the earlier one")
        pre = step.system_tokens + _tokens(before)
        if pre >= limit and call is not None and pre - _prunable_saving(step, limits) < limit \
                and _excused_early(obs, obs.turns.get((call.session_id, call.turn_id)), call) is None:
            bad(step, f"summarized {pre} tokens though pruning old tool outputs would have "
                f"brought them under {limit}")
    return out


# ---- CMP-3: no orphans --------------------------------------------------------------------


def _orphans(messages: list[dict[str, object]]) -> str | None:
    """The first orphan of a sent request: a result before/without its call, a call without
    a result after it."""
    called: set[object] = set()
    answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
    for index, message in enumerate(messages):
        if message.get("role") == "tool" and message.get("tool_call_id") not in called:
            return f"message {index} answers {message.get('tool_call_id')} with no call before it"
        for call in message.get("tool_calls") or ():  # type: ignore[attr-defined]
            called.add(call.get("id"))
            if call.get("id") not in answered:
                return f"message {index} calls {call.get('id')} and no result follows"
    return None


def _calls_in(text: str) -> tuple[set[str], set[str]]:
    """Call ids a summary request rendered as calls, and as results (``name#id``)."""
    calls, results = set(), set()
    for line in text.splitlines():
        if line.startswith("[tool ") and "#" in line:
            results.add(line.split("#", 1)[1].split("]", 1)[0])
        elif " calls] " in line:
            for part in line.split(" calls] ", 1)[1].split("), "):
                if "#" in part:
                    calls.add(part.split("#", 1)[1].split("(", 1)[0])
    return calls, results


@checker("no_orphans", ("CMP-3",),
         "no request and no compacted transcript holds a tool result without its call or a call "
         "without its result; a compaction keeps or summarizes a call with all its results")
def no_orphans(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for call in obs.calls:
        sent = sent_messages(call)
        problem = None if isinstance(sent, str) else _orphans(sent)
        if problem is not None:
            out.append(Violation("no_orphans", "CMP-3",
                                 f"call at effect {call.seq} (turn {call.turn_id}): {problem}"))
    for step in passes(obs):
        kept = [m.wire for m in step.after]
        pending = {c.id for m in step.before for c in m.tool_calls} - {
            m.tool_call_id for m in step.before if m.role is Role.TOOL}
        problem = _orphans([m for m in kept if not any(
            c.get("id") in pending for c in m.get("tool_calls") or ())])
        where = f"compaction of {step.done.session_id} by {step.turn}"
        if problem is not None:
            out.append(Violation("no_orphans", "CMP-3", f"{where}: {problem}"))
            continue
        summary = _summary_of(obs, step)
        if summary is None or len(step.after) >= len(step.before):
            continue
        calls, results = _calls_in(summary.request.messages[-1].content or "")
        kept_calls = {c.id for m in step.after for c in m.tool_calls}
        for m in step.before:
            for c in m.tool_calls:
                if c.id in kept_calls or c.id in pending:
                    continue
                if c.id not in calls or c.id not in results:
                    out.append(Violation("no_orphans", "CMP-3",
                                         f"{where}: call {c.id} went without all of its own: "
                                         f"summarized call {c.id in calls}, result {c.id in results}"))
    return out


# ---- CMP-4: the cooldown, the anti-thrash block and the manual bypass ---------------------


@checker("cooldown_respected", ("CMP-4",),
         "no summary is asked for within [600 s] of a failed one, nor after [2] ineffective "
         "passes, unless the user asked for a compaction; one asked for runs at the next turn")
def cooldown_respected(obs: Observation) -> list[Violation]:
    limits = obs.limits
    lineage = _lineage(obs)
    out: list[Violation] = []
    manual = [(lineage.get(s, s), seq) for s, seq in obs.manual_compactions]
    calls = _summary_calls(obs)
    steps = passes(obs)
    for index, call in enumerate(calls):
        root = lineage.get(call.session_id, call.session_id)
        asked = any(r == root and seq < call.seq for r, seq in manual)
        failed = [c for c in calls[:index] if c.error is not None
                  and lineage.get(c.session_id, c.session_id) == root]
        if failed and call.at < failed[-1].at + limits.compression_cooldown_s and not any(
                r == root and failed[-1].seq < seq < call.seq for r, seq in manual):
            out.append(Violation("cooldown_respected", "CMP-4",
                                 f"turn {call.turn_id} asked for a summary {call.at - failed[-1].at:g} s "
                                 f"after one failed (cooldown {limits.compression_cooldown_s:g} s)"))
        streak = 0
        for step in steps:
            if lineage.get(step.done.session_id, step.done.session_id) == root \
                    and step.done.first_row_id <= call.watermark and step.turn != call.turn_id:
                streak = streak + 1 if step.tokens_after >= threshold_tokens(limits) else 0
        if streak >= limits.compression_ineffective_max and not asked:
            out.append(Violation("cooldown_respected", "CMP-4",
                                 f"turn {call.turn_id} compacted automatically after {streak} "
                                 "ineffective passes"))
    for root_id, seq in manual:
        later = [v for v in obs.turns.values() if v.calls
                 and lineage.get(v.session_id, v.session_id) == root_id and v.calls[0].seq > seq]
        if later and not _attempts(obs, later[0].turn_id, before=later[0].calls[0]):
            out.append(Violation("cooldown_respected", "CMP-4",
                                 f"a manual compaction of {root_id} was asked for and turn "
                                 f"{later[0].turn_id} called the model without running it"))
    return out


# ---- CMP-7 and LOOP-5: every request fits, an overflow goes back to preflight ---------------


@checker("requests_fit_the_window", ("CMP-7",),
         "every request sent fits the context window; a request the provider refused as too "
         "long is never sent again; a fail-closed exit had a request that did not fit; rows go "
         "only into a summary the auxiliary model wrote, so a failed summary loses none")
def requests_fit_the_window(obs: Observation) -> list[Violation]:
    window = obs.limits.context_window_tokens
    out: list[Violation] = []
    refused: set[tuple[str, bytes]] = set()
    for call in obs.calls:
        tokens = _sent_tokens(call)
        window = window_tokens(obs.limits, call.request.model)
        if tokens is not None and tokens > window:
            out.append(Violation("requests_fit_the_window", "CMP-7",
                                 f"call at effect {call.seq} (turn {call.turn_id}) sent {tokens} "
                                 f"tokens into a {window}-token window"))
        key = (call.turn_id, call.body)
        if key in refused:
            out.append(Violation("requests_fit_the_window", "CMP-7",
                                 f"call at effect {call.seq} (turn {call.turn_id}) sent again "
                                 "a request the provider had refused as too long"))
        if call.error == "ContextOverflow":
            refused.add(key)
    for view in obs.ended_turns():
        line = view.exit
        if line is None or line.reason not in CONTEXT_PRESSURE_EXITS:
            continue
        if view.calls and view.calls[-1].error == "ContextOverflow":
            continue
        prompt = next((s.system_prompt for s in obs.record.sessions if s.id == view.session_id), "")
        rows = [m.message for m in obs.record.messages if m.session_id == view.session_id]
        unsent = count_message({"role": "system", "content": prompt}) + _tokens(rows)
        if unsent <= smallest_window(obs.limits):
            out.append(Violation("requests_fit_the_window", "CMP-7",
                                 f"turn {view.key} failed closed ({line.reason.value}) though its "
                                 f"request of {unsent} tokens fit the "
                                 f"{smallest_window(obs.limits)}-token window"))
    for step in passes(obs):
        if len(step.after) < len(step.before) and _summary_of(obs, step) is None:
            out.append(Violation("requests_fit_the_window", "CMP-7",
                                 f"compaction of {step.done.session_id} by {step.turn} dropped "
                                 f"{len(step.before) - len(step.after)} rows with no summary "
                                 "from the auxiliary model (a failed summary must lose nothing)"))
    return out


@checker("overflow_goes_back_to_preflight", ("LOOP-5",),
         "a provider-proven overflow is followed by a compaction and a smaller request, or the "
         "turn fails closed with a context-pressure exit; never the same request, never terminal")
def overflow_goes_back_to_preflight(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for view in obs.ended_turns():
        for index, call in enumerate(view.calls):
            if call.error != "ContextOverflow":
                continue
            after = view.calls[index + 1] if index + 1 < len(view.calls) else None
            tag = f"turn {view.key}: the overflow at effect {call.seq}"
            if after is None:
                line = view.exit
                if line is not None and line.reason not in CONTEXT_PRESSURE_EXITS:
                    out.append(Violation("overflow_goes_back_to_preflight", "LOOP-5",
                                         f"{tag} ended the turn as {line.reason.value}, not "
                                         "through preflight's fail-closed exit"))
                continue
            smaller = (_sent_tokens(after) or 0) < (_sent_tokens(call) or 0)
            compacted = _attempts(obs, view.turn_id, before=after, after=call) > 0
            if not (smaller and compacted):
                out.append(Violation("overflow_goes_back_to_preflight", "LOOP-5",
                                     f"{tag} was followed at effect {after.seq} by a request that "
                                     f"was {'smaller' if smaller else 'not smaller'} and "
                                     f"{'' if compacted else 'not '}compacted"))
    return out


# ---- CTX-6: passes before the first call ---------------------------------------------------


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
        attempts = [c for c in _summary_calls(obs) if c.turn_id == view.turn_id
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
        for step in mine[:-1]:
            if not step.progress:
                out.append(Violation("passes_bounded", "CTX-6",
                                     f"turn {view.key} ran another pass after one that left "
                                     f"{len(step.after)} of {len(step.before)} messages and "
                                     f"{_tokens(step.after)} of {_tokens(step.before)} tokens"))
    return out


# ---- CTX-7: the turn's own user message ---------------------------------------------------


@checker("own_user_message_kept", ("CTX-7",),
         "a compaction a turn runs keeps that turn's own user row, and every request of the "
         "turn carries its text")
def own_user_message_kept(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for step in passes(obs):
        own = [m for m in step.before if m.role is Role.USER and m.turn_id == step.turn
               and not _is_summary(m)]
        if own and not any((m.role, m.content, m.turn_id) == (Role.USER, own[-1].content, step.turn)
                           for m in step.after):
            out.append(Violation("own_user_message_kept", "CTX-7",
                                 f"compaction of {step.done.session_id} by {step.turn} dropped "
                                 "the turn's own user row"))
    for run in obs.runs or ():
        if run.turn_id is None:
            continue
        for call in obs.calls:
            sent = sent_messages(call) if call.turn_id == run.turn_id else None
            if not isinstance(sent, list):
                continue
            if not any(m.get("role") == "user" and (
                    m.get("content") == run.text
                    or str(m.get("content") or "").startswith(run.text + "\n\n")) for m in sent):
                out.append(Violation("own_user_message_kept", "CTX-7",
                                     f"call at effect {call.seq} of turn {run.turn_id} does not "
                                     "carry the turn's own message"))
    return out


# ---- FIN-5's exemption: context pressure leaves the tail as it is --------------------------

BOUNDARY_PREFIX = "[turn ended without an answer:"  # the finalizer's failure boundary row


@checker("context_pressure_keeps_its_tail", ("FIN-5",),
         "a turn that failed on context pressure (it failed closed) adds no boundary row: "
         "the row would only make the request that did not fit larger")
def context_pressure_keeps_its_tail(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for view in obs.ended_turns():
        line = view.exit
        if line is None or line.reason not in CONTEXT_PRESSURE_EXITS:
            continue
        added = [m for m in view.rows if m.role is Role.ASSISTANT and not m.tool_calls
                 and (m.content or "").startswith(BOUNDARY_PREFIX)]
        if added:
            out.append(Violation("context_pressure_keeps_its_tail", "FIN-5",
                                 f"turn {view.key} failed closed ({line.reason.value}) and still "
                                 f"wrote the boundary row #{added[-1].row_id}"))
    return out
