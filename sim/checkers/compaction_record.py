"""What the record says about compaction, read for the compaction checkers (CMP, CTX-5..7).

Theory of operation
-------------------
The figures are computed here from the settings by the catalog's arithmetic, never asked
of the engine (``threshold_tokens``: 0.75 under 512K, the window minus ``max_tokens``, the
64,000 floor and the 0.85 rule). ``passes`` reads every committed compaction as the rows it
replaced and the rows it inserted, from the store's own log (a story's own compactions,
``sim.rotation_story``, are left out). ``attempts`` counts a turn's summary calls and
compactions between two of its calls, ordered by the world's effect counter and the
store's row ids (virtual time does not move within a turn). CMP-4's anti-thrash streak,
with the passes that found nothing to compact, is read in ``sim.checkers.compaction_streak``.
The checkers themselves are ``sim.checkers.compaction`` (when compaction runs) and
``sim.checkers.compaction_shape`` (what it may write and send).
"""

from __future__ import annotations

from dataclasses import dataclass

from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role, ScaffoldFlag
from hermes_ref.ports import CompactionRow, DurableRecord, StoredMessage
from hermes_ref.scaffolding import (
    DROPPED_TOOLCALL_NUDGE,
    EMPTY_AFTER_TOOLS_NUDGE,
    EMPTY_SENTINEL,
    PRE_VERIFY_NUDGE,
)
from sim.checkers.base import (  # window_tokens: read here by the CMP checkers
    Observation,
    TurnView,
    all_invalid,
    as_sent_at,
    as_written,
    record_tokens,
    remembered,
    round_landed,
    window_tokens,
    wrote_in,
)
from sim.checkers.lineage import roots
from sim.checkers.measure import message_tokens, route_window_tokens, wire_tokens
from sim.checkers.rotation import CompactionRun  # a story's own compaction, not judged here
from sim.checkers.rules import holder_fields
from sim.checkers.thoughts import inline_thought, thought_of, visible_text
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


def sent_tokens(call: CallRecord) -> int | None:
    sent = sent_messages(call)
    return None if isinstance(sent, str) else wire_tokens(sent)


def tokens_sent(obs: Observation, call: CallRecord) -> int | None:
    """``sent_tokens``, counted once per call (its body never changes)."""
    return remembered(obs, "sent tokens", (call,), lambda: sent_tokens(call))


def is_summary(message: Message) -> bool:
    return (message.content or "").startswith(SUMMARY_PREFIX)


def tokens_of(rows: list[Message]) -> int:
    """What ``rows`` add to a request: a hidden row goes on no wire (LOOP-4), so adds nothing."""
    return sum(message_tokens(m.wire) for m in rows if not m.hidden)


def turn_of(holder: str) -> str | None:
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
            tokens_of(self.after) < tokens_of(self.before) * 0.95

    @property
    def tokens_after(self) -> int:
        return self.system_tokens + tokens_of(self.after)


def _every(record: DurableRecord) -> list[StoredMessage]:
    return sorted((*record.messages, *record.archived), key=lambda m: m.message.row_id or 0)


def passes(obs: Observation) -> list[Pass]:
    """Every committed compaction of the record as a ``Pass``, in the record's order.

    Read once per observation and shared (a dozen readings ask at every check): a ``Pass``
    is frozen and no reader changes its lists, so each gets the very values it would
    have read itself."""
    found: list[Pass] = obs.reading("compaction passes", lambda: _passes(obs))
    return list(found)


def _passes(obs: Observation) -> list[Pass]:
    record = obs.record
    if not record.compactions:
        return []
    prompts = {s.id: s.system_prompt for s in record.sessions}
    every = _every(record)
    staged = {r.turn_id for r in obs.runs or () if isinstance(r, CompactionRun)}
    out = []
    for done in record.compactions:
        if turn_of(done.holder) in staged:
            continue  # a story's own compaction (sim.rotation_story), not the engine's
        target = done.child_id or done.session_id
        earlier = [c.first_row_id for c in record.compactions if c.first_row_id < done.first_row_id
                   and (c.child_id or c.session_id) == done.session_id]
        floor = max(earlier, default=0)
        then = as_written(obs, done.first_row_id)
        before = [then(m.message) for m in every if m.session_id == done.session_id
                  and floor <= (m.message.row_id or 0) < done.first_row_id]
        last = done.first_row_id + done.rows_after
        after = [then(m.message) for m in every if m.session_id == target
                 and done.first_row_id <= (m.message.row_id or 0) < last]
        if any((m.content or "").startswith(STAGED_PREFIX) for m in after):
            continue  # the story wrote this set itself, before its runs are marked as such
        system = message_tokens({"role": "system", "content": prompts.get(done.session_id, "")})
        out.append(Pass(done, turn_of(done.holder), before, after, system))
    return out


def lineage_of(obs: Observation) -> dict[str, str]:
    root = roots(obs.record)
    return {s.id: root.get(s.id, s.id) for s in obs.record.sessions}


def summary_calls_of(obs: Observation) -> list[CallRecord]:
    return list(obs.summary_calls or ())


def attempts(obs: Observation, turn: str, before: CallRecord | None = None,
              after: CallRecord | None = None) -> int:
    """The turn's compaction attempts (summary calls, committed compactions) between two of
    its calls: ordered by the world's effect counter and the store's row ids, not by time."""
    count = 0
    for c in summary_calls_of(obs):
        if c.turn_id == turn and (before is None or c.seq < before.seq) \
                and (after is None or c.seq > after.seq):
            count += 1
    for p in passes(obs):
        if p.turn == turn and (before is None or p.done.first_row_id <= before.watermark) \
                and (after is None or p.done.first_row_id > after.watermark):
            count += 1
    return count


def smallest_window(limits: Limits) -> int:
    routes = [route_window_tokens(r.context_window_tokens, r.token_ratio)
              for r in getattr(limits, "fallback_providers", ())]
    return min([limits.context_window_tokens, *routes])


def limits_for(limits: Limits, model: str) -> Limits:
    window = window_tokens(limits, model)
    if window == limits.context_window_tokens:
        return limits
    return limits.model_copy(update={"context_window_tokens": window})


def excused_early(obs: Observation, view: TurnView | None, call: CallRecord) -> str | None:
    """Why a summary call under the threshold was due anyway: manual, or after an overflow."""
    lineage = lineage_of(obs)
    root = lineage.get(call.session_id, call.session_id)
    if any(lineage.get(s, s) == root and seq < call.seq for s, seq in obs.manual_compactions):
        return "manual"
    turn_calls = view.calls if view is not None else []
    if any(c.error == "ContextOverflow" and c.seq < call.seq for c in turn_calls):
        return "overflow"
    return None


def pre_tokens(obs: Observation, call: CallRecord) -> int:
    """The request the turn would have sent when it asked for the summary: the system
    prompt, the session's rows committed by then (as they were then: a redaction after
    the call shortens none of them), and the retry scaffolding (a nudge, a refused reply)
    that the turn's next model call is seen carrying on the wire."""
    then = as_sent_at(obs, call.seq)
    rows = [then(m.message) for m in obs.record.messages
            if m.session_id == call.session_id and (m.message.row_id or 0) <= call.watermark]
    return record_tokens(obs, call.session_id, rows) + \
        scaffolding_tokens(obs, call.turn_id, call.seq)


def idle_due(obs: Observation, call: CallRecord) -> bool | None:
    """CTX-5 at the summary call's turn: None when idle compaction is off."""
    limits = obs.limits
    if limits.idle_compact_after_s <= 0 or not limits.compression_enabled:
        return None
    users = [m.message for m in obs.record.messages if m.session_id == call.session_id
             and m.message.role is Role.USER and m.message.created_at is not None
             and not is_summary(m.message) and (m.message.row_id or 0) <= call.watermark]
    own = [m for m in users if m.turn_id == call.turn_id]
    earlier = [m for m in users if m.turn_id != call.turn_id]
    if not own or not earlier:
        return False
    gap = (own[-1].created_at or 0.0) - (earlier[-1].created_at or 0.0)
    floor = int(threshold_tokens(limits) * min(0.80, max(0.10, limits.compression_target_ratio)))
    lineage = lineage_of(obs)
    root = lineage.get(call.session_id, call.session_id)
    before = [p for p in passes(obs) if p.done.first_row_id <= call.watermark
              and lineage.get(p.done.session_id, p.done.session_id) == root and p.turn != call.turn_id
              and same_engine(obs, p.turn, call.turn_id)]
    if before:  # the floor rises by what the last compaction left, a process's memory as for CMP-4
        floor += left_by(obs, before[-1])
    return gap >= limits.idle_compact_after_s and pre_tokens(obs, call) > floor


def left_by(obs: Observation, step: Pass) -> int:
    """The request ``step`` left, as its engine measured it for the idle floor (CTX-5) and
    the anti-thrash verdict (CMP-4) alike: the rows it wrote and the scaffolding the turn's
    working list still held (a retry's nudge, the verification gate's held answer and its
    request to check), which the record never shows (``compaction_streak.tokens_after``)."""
    from sim.checkers.compaction_streak import tokens_after  # it reads the passes made here

    views = obs.reading("views by turn", lambda: {v.turn_id: v for v in obs.turns.values()})
    return tokens_after(obs, views.get(step.turn or ""), step)


def idle_pass(obs: Observation, call: CallRecord) -> bool:
    """Whether a summary call is its turn's idle compaction (CTX-5): the turn's first, asked
    for before its first model call, in a session idle past the gap above the floor. An idle
    pass compacts the conversation down to the tail's budget, not just under the threshold,
    so it summarizes even when pruning alone would have brought the request under it."""
    mine = [c for c in summary_calls_of(obs) if c.turn_id == call.turn_id]
    if min(mine, key=lambda c: c.seq) is not call:
        return False
    if any(c.turn_id == call.turn_id and c.seq < call.seq for c in obs.calls):
        return False
    return bool(idle_due(obs, call))


AFTER_EVERY_CALL = 1 << 62  # an effect count past any call: what the turn held at its end


def scaffolding_tokens(obs: Observation, turn_id: str, seq: int) -> int:
    """Tokens of the retry scaffolding in the turn's working list at effect ``seq``.

    Scaffolding is never stored, so the rows alone undercount a request measured while a
    retry's nudge rode in it. The provider's log of the turn's next model call shows what
    rode, unless the compaction at ``seq`` summarized it away with the middle; so it is
    also what the last call before carried plus the pair its reply called for (a dropped
    call's re-prompt, LOOP-7, or the nudge after a tool round's empty reply, LOOP-8), and
    the larger of the two counts: the engine measured all the scaffolding it held, and
    either count is only what a request of the turn carried or what the ladder adds, so
    the larger excuses nothing the turn did not hold. With no later call (the turn failed closed at
    preflight), it is the latter alone."""
    calls = [c for c in obs.calls if c.turn_id == turn_id and c.request.purpose != "grace"]
    later = [c for c in calls if c.seq > seq]
    shown = tokens_of(_scaffolding(min(later, key=lambda c: c.seq))) if later else 0
    earlier = [c for c in calls if c.seq < seq]
    if not earlier:
        return shown
    last = max(earlier, key=lambda c: c.seq)
    return max(shown, tokens_of(scaffolding_after(obs, calls, last)))


def scaffolding_after(obs: Observation, calls: list[CallRecord], last: CallRecord) -> list[Message]:
    """The scaffolding of the turn's next request once the reply of ``last`` was handled:
    what ``last`` carried and what its reply called for; ``calls`` are the turn's calls,
    whose reasoning prefills count toward the ladder's limit and whose tool rounds and
    nudges say whether the nudge is due."""
    prefills = sum(1 for c in calls if c.seq <= last.seq and _ends_on_prefill(c))
    return _after_reply(obs.limits, last, _scaffolding(last), prefills,
                        _round_not_nudged(obs, calls, last), _gate_holds(obs, calls, last))


def _gate_holds(obs: Observation, calls: list[CallRecord], last: CallRecord) -> bool:
    """FIN-1's gate would hold an answer ``last`` gave: the gate is on, a tool round of the
    turn changed a file before that reply, and no answer was held earlier in the turn (a
    held answer's request carries the pre-verify nudge; the gate holds once per turn)."""
    earlier = [c for c in calls if c.seq < last.seq]
    held = any(m.scaffold is ScaffoldFlag.PRE_VERIFY for c in [*earlier, last]
               for m in c.request.messages)
    return obs.limits.verify_before_answer and not held and wrote_in(obs, earlier)


def _round_not_nudged(obs: Observation, calls: list[CallRecord], last: CallRecord) -> bool:
    """LOOP-8's nudge is owed after ``last``'s reply: a tool round of the turn ran before it
    (its results durable, not all of its calls to tools nobody offered), and no request
    since that round carried the nudge. The nudge is counted once per tool round, so a
    correction taken in since changes nothing, though it drops the scaffolding and the
    request no longer ends on the round's results."""
    before = [c for c in calls if c.seq < last.seq]
    rounds = [i for i, c in enumerate(before) if c.reply is not None and c.reply.tool_calls
              and round_landed(obs, c) and not all_invalid(c)]
    if not rounds:
        return False
    since = [*before[rounds[-1] + 1:], last]
    return not any(m.content == EMPTY_AFTER_TOOLS_NUDGE for c in since for m in _scaffolding(c))


def _scaffolding(call: CallRecord) -> list[Message]:
    return [m for m in call.request.messages if m.scaffold is not None]


def _ends_on_prefill(call: CallRecord) -> bool:
    messages = call.request.messages
    return bool(messages) and messages[-1].scaffold is ScaffoldFlag.THINKING_PREFILL


def _after_reply(limits: Limits, call: CallRecord, carried: list[Message],
                 prefills: int, nudge_owed: bool, gate_holds: bool = False) -> list[Message]:
    """The scaffolding of the next request once the reply of ``call`` was handled, in the
    ladder's order: a dropped call's re-prompt (LOOP-7, while re-prompts are left), the
    verification gate's pair after an answer it holds back (FIN-1: the answer, then the
    pre-verify nudge), the nudge after a tool round (once per round, not for inline
    reasoning), the reasoning as a prefill (while prefills are left; a newer one replaces
    an older); a retry or a fallback sends the list as it was. Each carries its flag, as
    the engine's does: it is no message of the conversation (the tail's floor does not
    count it)."""
    reply = call.reply
    if reply is None or reply.tool_calls:
        return carried
    text = visible_text(reply.content)
    if reply.finish_reason == "tool_calls":
        reprompts = sum(1 for m in carried if m.content == DROPPED_TOOLCALL_NUDGE)
        if reprompts >= limits.dropped_toolcall_retries_max:
            return [*carried, *_held_pair(text)] if text and gate_holds else carried
        flag = ScaffoldFlag.DROPPED_TOOLCALL_NUDGE
        return [*carried, Message(role=Role.ASSISTANT, content=reply.content or "", scaffold=flag),
                Message(role=Role.USER, content=DROPPED_TOOLCALL_NUDGE, scaffold=flag)]
    if text:
        return [*carried, *_held_pair(text)] if gate_holds else carried
    if nudge_owed and not inline_thought(reply.content):
        flag = ScaffoldFlag.EMPTY_RECOVERY
        return [*carried, Message(role=Role.ASSISTANT, content=EMPTY_SENTINEL, scaffold=flag),
                Message(role=Role.USER, content=EMPTY_AFTER_TOOLS_NUDGE, scaffold=flag)]
    thought = thought_of(reply)
    if thought and prefills < limits.thinking_prefill_retries_max:
        kept = carried[:-1] if carried and carried[-1].scaffold is ScaffoldFlag.THINKING_PREFILL \
            else carried
        return [*kept, Message(role=Role.ASSISTANT, content=thought,
                               scaffold=ScaffoldFlag.THINKING_PREFILL)]
    return carried


def _held_pair(text: str) -> list[Message]:
    """The gate's two scaffolding messages after an answer it holds back, as the engine
    appends them (``loop._withheld_for_verification``)."""
    return [Message(role=Role.ASSISTANT, content=text, scaffold=ScaffoldFlag.VERIFICATION_STOP),
            Message(role=Role.USER, content=PRE_VERIFY_NUDGE, scaffold=ScaffoldFlag.PRE_VERIFY)]


def engine_of(obs: Observation) -> dict[str, str]:
    """Each turn's process (the ``pid`` its lease grants name): what one engine remembers
    between turns (the cooldown, the anti-thrash streak) is that process's alone."""
    def read() -> dict[str, str]:
        pids: dict[str, str] = {}
        for grant in obs.record.lease_grants:
            fields = holder_fields(grant.holder)
            if "turn" in fields and "pid" in fields:
                pids.setdefault(fields["turn"], fields["pid"])
        return pids
    return remembered(obs, "engine of turn", (obs.record.lease_grants,), read)


def same_engine(obs: Observation, turn: str | None, other: str | None) -> bool:
    """Whether two turns ran in one process (or the record cannot tell them apart)."""
    engines = engine_of(obs)
    mine, theirs = engines.get(turn or ""), engines.get(other or "")
    return mine is None or theirs is None or mine == theirs


def summary_of(obs: Observation, step: Pass) -> CallRecord | None:
    """The successful summary call of the compaction's turn whose text its summary row holds."""
    texts = {(m.content or "")[len(SUMMARY_PREFIX):] for m in step.after if is_summary(m)}
    made = [c for c in summary_calls_of(obs) if c.turn_id == step.turn and c.reply is not None
            and (c.reply.content or "").strip() in texts]
    return made[-1] if made else None
