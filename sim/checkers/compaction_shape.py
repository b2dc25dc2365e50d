"""Checkers of what compaction writes and sends: its shape, no orphans, the window, the
overflow branch, the turn's own message, no boundary row after context pressure (CMP-2,
CMP-3, CMP-7, LOOP-5, CTX-7, FIN-5). When it runs is ``sim.checkers.compaction``; the
readings both share are ``sim.checkers.compaction_record``.
"""

from __future__ import annotations

from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role
from hermes_ref.outcomes import CONTEXT_PRESSURE_EXITS, ExitReason
from sim.checkers.base import (
    Observation,
    TurnKey,
    TurnView,
    Violation,
    as_written,
    bound_spent,
    checker,
    ended_in,
    record_tokens,
    window_tokens,
)
from sim.checkers.compaction_record import (
    AFTER_EVERY_CALL,
    SUMMARY_PREFIX,
    Pass,
    attempts,
    excused_early,
    idle_pass,
    is_summary,
    passes,
    scaffolding_tokens,
    smallest_window,
    summary_of,
    tail_tokens,
    threshold_tokens,
    tokens_of,
    tokens_sent,
)
from sim.checkers.compaction_split import prunable, split
from sim.checkers.compaction_streak import blind_passes
from sim.checkers.loop_fire import interrupted, stood_row_ids
from sim.checkers.measure import message_tokens
from sim.checkers.wire import sent_messages
from sim.world import CallRecord

# ---- CMP-2: prune first, head and tail kept, the middle summarized, the summary updated -----


def _key(m: Message) -> tuple[object, ...]:
    return (m.role, m.content, m.tool_call_id, tuple(c.id for c in m.tool_calls))



def _prunable_saving(step: Pass, limits: Limits) -> int:
    """Tokens pruning old tool outputs (after the head, before the tail, neither splitting a
    tool group: ``compaction_split``) would have saved, each replaced by its placeholder."""
    return sum(message_tokens(row.wire) - message_tokens({**row.wire, "content": text})
               for row, text in prunable(tuple(step.before), limits))


def _kept_tail(before: list[Message], after: list[Message]) -> int:
    """How many of ``before``'s last messages ``after`` ends with, unchanged, after its
    summary (the summary itself is never one of them)."""
    count = 0
    while count < len(before) and count < len(after) \
            and not is_summary(after[-1 - count]) \
            and _key(after[-1 - count]) == _key(before[-1 - count]):
        count += 1
    return count


def _tail_allowance(before: list[Message], limits: Limits) -> int:
    """The most messages the tail may keep: the spec's split of the list as pruning leaves
    it (``compaction_split``, the catalog's threshold × target ratio), plus one for the
    turn's own message when it stood just before the tail (lifted, it is kept there too).
    A retry's scaffolding, which the record does not show, could only have made the tail
    shorter."""
    texts = {id(row): text for row, text in prunable(tuple(before), limits)}
    pruned = tuple(row.model_copy(update={"content": texts[id(row)], "api_content": None})
                   if id(row) in texts else row for row in before)
    _, start = split(pruned, limits)
    return len(before) - start + 1


@checker("compaction_shape", ("CMP-2",),
         "a compaction keeps the protected head and a tail of at least [8] messages and no "
         "more than its token budget allows over them, replaces "
         "the middle with one summary the auxiliary model wrote (updating an earlier one), and "
         "summarizes only when pruning old tool outputs would not have been enough; a pass "
         "whose list has a middle past the head and the tail's budget summarizes it")
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
        summaries = [m for m in after if is_summary(m)]
        call = summary_of(obs, step)
        said = (call.reply.content or "").strip() if call is not None and call.reply else None
        if len(summaries) != 1 or said is None or \
                (summaries[0].content or "")[len(SUMMARY_PREFIX):] != said:
            bad(step, f"dropped {len(before) - len(after)} rows without exactly one summary "
                "written by the auxiliary model")
            continue
        floor = min(len(before), limits.compression_tail_floor_messages)
        if [_key(m) for m in after[-floor:]] != [_key(m) for m in before[-floor:]]:
            bad(step, f"did not keep the last {floor} messages as they were")
        kept, budget = _kept_tail(before, after), _tail_allowance(before, limits)
        if kept > budget:
            bad(step, f"kept the last {kept} messages as they were, past the tail's budget of "
                f"{tail_tokens(limits)} tokens over its floor ({budget} messages)")
        if not any(is_summary(m) for m in before):
            head = before[:limits.compression_protect_first]
            if [_key(m) for m in after[:len(head)]] != [_key(m) for m in head]:
                bad(step, f"did not keep the first {len(head)} messages as they were")
        previous = [m for m in before if is_summary(m)]
        asked = call.request.messages[-1].content or "" if call is not None else ""
        if previous and (previous[-1].content or "")[len(SUMMARY_PREFIX):].strip() not in asked:
            bad(step, "started a new summary instead of updating the earlier one")
        # the list the engine measured also held the retry scaffolding of the turn's
        # working list (a reasoning prefill, a nudge), which the record never shows
        pre = step.system_tokens + tokens_of(before) + \
            (scaffolding_tokens(obs, call.turn_id, call.seq) if call is not None else 0)
        if pre >= limit and call is not None and pre - _prunable_saving(step, limits) < limit \
                and excused_early(obs, obs.turns.get((call.session_id, call.turn_id)), call) is None \
                and not idle_pass(obs, call):
            bad(step, f"summarized {pre} tokens though pruning old tool outputs would have "
                f"brought them under {limit}")
    for missed in blind_passes(obs):
        out.append(Violation("compaction_shape", "CMP-2",
                             f"turn {missed.turn}'s pass {missed.where}: its planner found no "
                             f"middle, though past the protected head and the tail's budget "
                             f"{missed.middle} of its {missed.rows} messages were left to "
                             "summarize"))
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
        summary = summary_of(obs, step)
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


# ---- CMP-7 and LOOP-5: every request fits, an overflow goes back to preflight ---------------


def _as_it_ended(obs: Observation, turn_id: str, rows: list[Message]) -> list[Message]:
    """The session's rows with each one a later rewrite changed (a redaction, WIRE-2) as it
    was when the turn ended: a rewrite after the turn saw the store past its last row."""
    last = max((m.row_id or 0 for m in rows if m.turn_id == turn_id), default=None)
    if last is None:
        return rows
    then = as_written(obs, last)
    return [then(m) for m in rows]


def unsent_tokens(obs: Observation, view: TurnView) -> int:
    """The request a turn that failed closed did not send, as preflight measured it: the
    session's rows as the turn ended them, and the scaffolding its working list held then.
    An answer the verification gate held back and the finalizer then delivered (FIN-6)
    was written after preflight measured: its row is left out, as its text rode in the
    request already, in the gate's scaffolding pair."""
    where, stood = ended_in(view), stood_row_ids(obs, view)
    rows = [m.message for m in obs.record.messages
            if m.session_id == where and m.message.row_id not in stood]
    return record_tokens(obs, where, _as_it_ended(obs, view.turn_id, rows)) + \
        scaffolding_tokens(obs, view.turn_id, AFTER_EVERY_CALL)


@checker("requests_fit_the_window", ("CMP-7",),
         "every request sent fits the context window; a request the provider refused as too "
         "long is never sent again; a fail-closed exit had a request that did not fit; rows go "
         "only into a summary the auxiliary model wrote, so a failed summary loses none")
def requests_fit_the_window(obs: Observation) -> list[Violation]:
    window = obs.limits.context_window_tokens
    out: list[Violation] = []
    refused: set[tuple[str, bytes]] = set()
    for call in obs.calls:
        tokens = tokens_sent(obs, call)
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
        unsent = unsent_tokens(obs, view)
        if unsent <= smallest_window(obs.limits):
            out.append(Violation("requests_fit_the_window", "CMP-7",
                                 f"turn {view.key} failed closed ({line.reason.value}) though its "
                                 f"request of {unsent} tokens fit the "
                                 f"{smallest_window(obs.limits)}-token window"))
    for step in passes(obs):
        if len(step.after) < len(step.before) and summary_of(obs, step) is None:
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
    stopped = interrupted(obs)
    for view in obs.ended_turns():
        for index, call in enumerate(view.calls):
            if call.error != "ContextOverflow":
                continue
            after = view.calls[index + 1] if index + 1 < len(view.calls) else None
            tag = f"turn {view.key}: the overflow at effect {call.seq}"
            if after is None:
                line = view.exit
                if line is not None and line.reason not in CONTEXT_PRESSURE_EXITS \
                        and not _stopped_there(line.reason, (view.session_id, view.turn_id), stopped) \
                        and not _compacted_at_the_bound(obs, view, call):
                    out.append(Violation("overflow_goes_back_to_preflight", "LOOP-5",
                                         f"{tag} ended the turn as {line.reason.value}, not "
                                         "through preflight's fail-closed exit"))
                continue
            smaller = (tokens_sent(obs, after) or 0) < (tokens_sent(obs, call) or 0)
            compacted = attempts(obs, view.turn_id, before=after, after=call) > 0
            if compacted and after.request.purpose == "grace" and call.request.purpose != "grace":
                continue  # compacted, then the bound left no unit to resend: the finalizer's
                # grace call follows, a request of its own, not the overflowed one again
            if not (smaller and compacted):
                out.append(Violation("overflow_goes_back_to_preflight", "LOOP-5",
                                     f"{tag} was followed at effect {after.seq} by a request that "
                                     f"was {'smaller' if smaller else 'not smaller'} and "
                                     f"{'' if compacted else 'not '}compacted"))
    return out


def _compacted_at_the_bound(obs: Observation, view: TurnView, call: CallRecord) -> bool:
    """The overflowed call was the last the turn's bound allowed: it went back to preflight
    and compacted (the record shows the pass), and no unit or call was left to send the
    rebuilt request, so the loop's bound ended the turn (the finalizer takes over, FIN-1,
    FIN-8), not a fail-closed exit."""
    line = view.exit
    return line is not None and line.reason in _BOUND_EXITS and bound_spent(obs, view) \
        and attempts(obs, view.turn_id, after=call) > 0


_BOUND_EXITS = frozenset({ExitReason.MAX_ITERATIONS, ExitReason.BUDGET_EXHAUSTED,
                          ExitReason.PENDING_TOOL_RESULT})


def _stopped_there(reason: ExitReason, key: TurnKey, stopped: set[TurnKey]) -> bool:
    """The turn went back to preflight and was stopped there from outside: the user
    interrupted it, or its lease was lost while it compacted (LEASE-4), so its exit is
    ``interrupted``, not a fail-closed one."""
    return reason is ExitReason.INTERRUPTED and key in stopped


# ---- CTX-7: the turn's own user message ---------------------------------------------------


@checker("own_user_message_kept", ("CTX-7",),
         "a compaction a turn runs keeps that turn's own user row, and every request of the "
         "turn carries its text (after a correction, the correction's)")
def own_user_message_kept(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for step in passes(obs):
        own = [m for m in step.before if m.role is Role.USER and m.turn_id == step.turn
               and not is_summary(m)]
        if own and not any((m.role, m.content, m.turn_id) == (Role.USER, own[-1].content, step.turn)
                           for m in step.after):
            out.append(Violation("own_user_message_kept", "CTX-7",
                                 f"compaction of {step.done.session_id} by {step.turn} dropped "
                                 "the turn's own user row"))
    for run in obs.runs or ():
        if run.turn_id is None:
            continue
        for call in obs.calls_of_turn(run.turn_id):  # the run's own calls, in call order
            sent = sent_messages(call)
            if not isinstance(sent, list):
                continue
            text = _current_text(obs, run.turn_id, run.text, call)
            if not any(m.get("role") == "user" and (
                    m.get("content") == text
                    or str(m.get("content") or "").startswith(text + "\n\n")) for m in sent):
                out.append(Violation("own_user_message_kept", "CTX-7",
                                     f"call at effect {call.seq} of turn {run.turn_id} does not "
                                     "carry the turn's own message"))
    return out


def _current_text(obs: Observation, turn: str, text: str, call: CallRecord) -> str:
    """The turn's current user message when ``call`` was made: its own text until it took a
    correction in (LOOP-4: a later user row of the turn, stored before the call), then the
    last correction. That is the last user row of the turn, the one compaction re-locates
    and keeps (CTX-7); the message the correction superseded may be summarized."""
    sent = [i.text for i in obs.interventions if i.what == "redirect" and i.turn_id == turn]
    users = [m for m in obs.rows_of_turn(turn) if m.role is Role.USER
             and (m.row_id or 0) <= call.watermark]
    last = users[-1].content or "" if len(users) > 1 else ""
    # a later user row counts only as a correction the world sent this turn (the row holds
    # its text, or the texts of corrections taken in together)
    return last if sent and any(t in last for t in sent) else text


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
