"""Checkers of streaming and delivery: deltas, recovered answers, what a client saw.

Each judges the durable event log and rows against the world's own records: what the
provider streamed (``CallRecord``: a kept reply's ``deltas``, a cut stream's
``delivered``) and what each simulated client was handed (``sim.stream_client``). None
reads what the engine decided to emit.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hermes_ref.models import Event, EventKind, Message, Role, StreamDelta
from hermes_ref.scaffolding import EMPTY_SENTINEL
from sim.checkers import loop_fire
from sim.checkers.base import Observation, TurnView, Violation, checker, remembered
from sim.checkers.intake import taken_in_text
from sim.checkers.thoughts import visible_text
from sim.world import CallRecord

_SHOWN = {"text": EventKind.DELTA_TEXT, "reasoning": EventKind.DELTA_REASONING,
          "tool_call": EventKind.DELTA_TOOL_CALL}
_REASONING_CHARS_MIN = 8  # shorter reasoning could be in any text by chance


def _shown(deltas: tuple[StreamDelta, ...]) -> list[tuple[str, str]]:
    """The (event kind, text) pairs a kept stream must leave in the log, in order."""
    return [(_SHOWN[d.kind].value, d.text) for d in deltas if d.kind in _SHOWN]


def _delta_events(view: TurnView) -> dict[Any, list[Event]]:
    by_call: dict[Any, list[Event]] = defaultdict(list)
    for event in view.events:
        if event.kind.value.startswith("delta."):
            by_call[event.data.get("call")].append(event)
    return by_call


def _answer_row(view: TurnView) -> Message | None:
    rows = [m for m in view.rows if m.role is Role.ASSISTANT and m.has_visible_text
            and not m.tool_calls]
    return rows[-1] if rows else None


# ---- DEL-1: numbered events, and each kept stream's deltas in the log ---------------------


@checker("deltas_match_the_stream", ("DEL-1",),
         "every event has its place in its turn (1, 2, ... in commit order), and a finished "
         "turn's log holds each kept stream's deltas, in the order the provider sent them")
def deltas_match_the_stream(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for view in obs.turns.values():
        numbers = [e.turn_seq for e in view.events]
        if numbers and numbers != list(range(1, len(numbers) + 1)):
            shown = ", ".join(str(n) for n in numbers[:12])
            out.append(_v1(f"turn {view.key}: its events are numbered {shown}, not 1, 2, ..."))
        if view.completion is not None:
            problem = _stream_problem_of(obs, view)
            if problem:
                out.append(_v1(f"turn {view.key}: {problem}"))
    return out


def _stream_problem_of(obs: Observation, view: TurnView) -> str | None:
    """``_stream_problem``, read once per view (a view is kept from check to check while
    its turn's rows, calls and events stay the same: ``Memo.same_views``)."""
    return remembered(obs, "DEL-1 stream", (view,), lambda: _stream_problem(view))


def _stream_problem(view: TurnView) -> str | None:
    """The logged delta groups are, in order, those of streams the world sent, and every
    kept reply's stream is among them (a turn cannot drop a reply's deltas silently).

    Kept is the world's word: a call that got a reply and was not cut (LOOP-4). A stream
    that was cut yet held a whole answer (FIN-2) may be logged; a cut or failed attempt
    must not be required. The one reply that may be kept by the world yet never reach the
    engine is the turn's last, when the turn was stopped while it arrived (interrupted,
    its lease lost, its write failed), so only that one is excused.
    """
    streamed = [c for c in view.calls if c.request.stream and _shown(_sent(c))
                and (c.reply is not None or whole_answer(c) is not None)]
    excused = view.exit is None or view.exit.reason.value in _STOPPED_EXITS
    last = view.calls[-1] if view.calls else None
    sent = [(_shown(_sent(c)), _kept(c) and not (excused and c is last)) for c in streamed]
    logged = [[(e.kind.value, str(e.data.get("text", ""))) for e in events]
              for events in _delta_events(view).values()]
    missing = _unmatched(sent, logged)
    if missing is None:
        return None
    if missing < 0:
        return "the deltas logged for one of its streamed calls are not the ones it was sent"
    call = streamed[missing]
    return (f"the reply of its call at effect {call.seq} was kept, but its streamed deltas "
            "are not in the log, in order")


_STOPPED_EXITS = frozenset({"interrupted", "session_turn_lease_timeout",
                            "session_persistence_failed"})


def _kept(call: CallRecord) -> bool:
    return call.reply is not None and call.cut is None


Sent = list[tuple[list[tuple[str, str]], bool]]  # each stream's shown deltas, and required


def _unmatched(sent: Sent, logged: list[list[tuple[str, str]]]) -> int | None:
    """None when the logged groups match a subsequence of ``sent`` holding every required
    stream; else the index of the first required stream no matching can place, or -1 when
    the logged groups match no subsequence at all."""
    if _fits(sent, logged):
        return None
    for i, (_, required) in enumerate(sent):
        if required and not _fits([(s, r and k <= i) for k, (s, r) in enumerate(sent)], logged):
            return i
    return -1


def _fits(sent: Sent, logged: list[list[tuple[str, str]]]) -> bool:
    """Whether ``logged`` is, group for group, a subsequence of ``sent`` that keeps each
    required stream (a small table: a turn makes a handful of calls)."""
    fits = [[False] * (len(logged) + 1) for _ in range(len(sent) + 1)]
    fits[len(sent)][len(logged)] = True
    for i in range(len(sent) - 1, -1, -1):
        stream, required = sent[i]
        for j in range(len(logged), -1, -1):
            take = j < len(logged) and logged[j] == stream and fits[i + 1][j + 1]
            fits[i][j] = take or (not required and fits[i + 1][j])
    return fits[0][0]


@checker("reasoning_never_replayed", ("DEL-1",),
         "reasoning a provider streamed is shown as delta.reasoning events only: no stored "
         "row's content or api_content carries it")
def reasoning_never_replayed(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for view in obs.turns.values():
        thoughts = {_joined(c, "reasoning") for c in view.calls}
        thoughts = {t for t in thoughts if len(t.strip()) >= _REASONING_CHARS_MIN}
        for row in view.rows:
            stored = f"{row.content or ''}\n{row.api_content or ''}"
            if any(t in stored for t in thoughts):
                out.append(Violation("reasoning_never_replayed", "DEL-1",
                                     f"turn {view.key}: row #{row.row_id} ({row.role.value}) "
                                     "stores reasoning the provider streamed"))
    return out


def _sent(call: CallRecord) -> tuple[StreamDelta, ...]:
    return call.reply.deltas if call.reply is not None else call.delivered


def _joined(call: CallRecord, kind: str) -> str:
    return "".join(d.text for d in _sent(call) if d.kind == kind)


# ---- FIN-2: a whole answer whose stream then failed is the answer ----------------------------


def whole_answer(call: CallRecord) -> str | None:
    """The visible text of a failed stream that had said it was done with text and no call."""
    sent = call.delivered
    if call.reply is not None or not sent or not any(d.kind == "finish" for d in sent):
        return None
    finish = [d.text for d in sent if d.kind == "finish"][-1]
    if finish == "tool_calls" or any(d.kind == "tool_call" for d in sent):
        return None
    text = _joined(call, "text")
    return text if text.strip() else None


def failed_calls(calls: list[CallRecord]) -> int:
    """How many of ``calls`` count against ``outer_loop_errors_max`` (LOOP-5): the ones that
    failed, but not an overflow (back to preflight before any count: compaction bounds those,
    CMP-7) and not a cut stream whose whole answer was kept (it answered, FIN-2)."""
    return sum(1 for c in calls if c.error not in (None, "ContextOverflow")
               and whole_answer(c) is None)


@checker("streamed_answer_recovered", ("FIN-2",),
         "a stream that failed after delivering a whole text answer (its finish delta came) "
         "is the turn's answer: the durable answer row and the completion hold exactly that "
         "text, and the call is not asked again")
def streamed_answer_recovered(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    ended = {(v.session_id, v.turn_id) for v in obs.ended_turns()}
    for key, view in obs.turns.items():
        for i, call in enumerate(view.calls):
            text = whole_answer(call)
            if text is None or key not in ended:
                continue
            if any(held is call for held, _ in loop_fire.held_calls(view, obs)):
                problem = _asked_again(view.calls[i + 1:], call)  # the gate held it (FIN-1)
            else:
                problem = _recovery_problem(view, view.calls[i + 1:], call, text)
            if problem:
                out.append(Violation("streamed_answer_recovered", "FIN-2",
                                     f"turn {view.key}: {problem}"))
    return out


def _asked_again(later: list[CallRecord], call: CallRecord) -> str | None:
    """A whole streamed answer is an answer: its request is never sent again. When the
    verification gate held that answer back, whether it is the turn's answer is FIN-1's
    and FIN-6's to judge (owed at the budget's end or on a failed check, superseded by the
    model's verified answer, overruled by a correction); this is all FIN-2 asks of it."""
    if any(c.request is call.request for c in later):
        return "a stream that had delivered its whole answer was asked for again"
    return None


def _recovery_problem(view: TurnView, later: list[CallRecord], call: CallRecord,
                      text: str) -> str | None:
    again = _asked_again(later, call)
    if again is not None:
        return again
    row = _answer_row(view)
    if row is None:
        return "a whole streamed answer was lost: the turn stores no answer row"
    if not loop_fire.delivers_held(row.content, [text]):  # TOOL-9 may add its note
        return (f"the stored answer {row.content!r:.60} is not the streamed answer "
                f"{text!r:.60}")
    done = view.completion
    if done is None or done.final_response != row.content:
        return "the completion does not carry the streamed answer"
    return None


# ---- DEL-2: what a client saw is the durable log, once, without a gap ------------------------


@checker("client_saw_the_durable_stream", ("DEL-2",),
         "each simulated client was handed only committed events, each once, in turn order "
         "without a gap; connected at the end it has every durable event of the turns it "
         "followed, and the text it was shown is the durable answer exactly once")
def client_saw_the_durable_stream(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for client in obs.clients:
        out.extend(Violation("client_saw_the_durable_stream", "DEL-2", f"{client.name}: {p}")
                   for p in _client_problems(obs, client))
    return out


def _client_problems(obs: Observation, client: Any) -> list[str]:
    durable = {(e.turn_id, e.turn_seq): e for e in obs.record.events
               if e.session_id == client.session_id}
    if not client.seen:
        # a turn that died before its first commit left nothing to hand out
        ran = any(r.session_id == client.session_id and not r.crashed for r in obs.runs or ())
        if durable or ran:
            return [f"it was handed nothing, but {len(durable)} events of "
                    f"{client.session_id} are durable"]
        return []
    problems: list[str] = []
    seen_by_turn: dict[str, list[int]] = defaultdict(list)
    for seen in client.seen:
        event = seen.event
        stored = durable.get((event.turn_id, event.turn_seq))
        if stored is None or stored.kind != event.kind or stored.data != event.data:
            problems.append(f"it was handed {event.kind.value} #{event.turn_seq} of "
                            f"{event.turn_id} ({seen.via}), which the record does not have")
        seen_by_turn[event.turn_id].append(event.turn_seq or 0)
    for turn_id, numbers in seen_by_turn.items():
        problems.extend(_order_problems(turn_id, numbers))
        if client.connected:
            stored_numbers = sorted(n for t, n in durable if t == turn_id and n is not None)
            missing = sorted(set(stored_numbers) - set(numbers))
            if missing:
                problems.append(f"connected at the end, it never got {turn_id} "
                                f"#{', #'.join(map(str, missing[:6]))}")
            problems.extend(_text_problems(obs, client, turn_id))
    return problems


def _order_problems(turn_id: str, numbers: list[int]) -> list[str]:
    out: list[str] = []
    dupes = sorted({n for n in numbers if numbers.count(n) > 1})
    if dupes:
        out.append(f"it was handed {turn_id} #{', #'.join(map(str, dupes))} twice")
    distinct = list(dict.fromkeys(numbers))
    if distinct != list(range(1, len(distinct) + 1)):
        out.append(f"it was handed {turn_id} out of order or with a gap: "
                   f"{', '.join(map(str, numbers[:12]))}")
    return out


def _text_problems(obs: Observation, client: Any, turn_id: str) -> list[str]:
    view = obs.turns.get((client.session_id, turn_id))
    if view is None or view.completion is None or view.completion.failed:
        return []
    row = _answer_row(view)
    calls = [e.data.get("call") for e in view.events if e.kind is EventKind.DELTA_TEXT]
    if row is None or not calls or row.content == EMPTY_SENTINEL:
        return []
    stored = row.content or ""
    shown = _shown_answer(obs, view, client, calls, stored)
    # think blocks fold away, and the engine's note may follow the model's text (TOOL-9)
    if not loop_fire.delivers_held(stored, [shown, visible_text(shown)]):
        return [f"it was shown {shown!r:.60} for {turn_id}, the durable answer is "
                f"{stored!r:.60}"]
    return []


def _shown_answer(obs: Observation, view: TurnView, client: Any, calls: list[Any],
                  stored: str) -> str:
    """The text the client was shown for the call that gave the answer, as a UTF-16 client
    renders it: the turn's last streamed call, or, when the answer is one the verification
    gate held back and FIN-1 delivered at the budget's end, the call that gave it (the
    model went on to check its work in later calls)."""
    last = taken_in_text(client.text(view.turn_id, calls[-1])) or ""
    held = loop_fire.withheld_answers(view, obs)
    if not loop_fire.delivers_held(stored, held):
        return last
    for call in reversed(list(dict.fromkeys(calls))):
        shown = taken_in_text(client.text(view.turn_id, call)) or ""
        if shown in held or visible_text(shown) in held:
            return shown
    return last


def _v1(message: str) -> Violation:
    return Violation("deltas_match_the_stream", "DEL-1", message)
