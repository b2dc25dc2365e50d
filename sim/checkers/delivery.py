"""Checkers of the event stream a client sees (DEL)."""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from itertools import pairwise

from pydantic import ValidationError

from hermes_ref.closure import (
    INTERRUPTED_CALL_TEXT,
    NOT_RUN_TEXT,
    RECOVERED_CALL_TEXT,
    UNRECORDED_RESULT_TEXT,
)
from hermes_ref.models import EventKind, Role
from hermes_ref.outcomes import ToolProgress
from hermes_ref.tool_batch import TIMED_OUT_MARK
from sim.checkers.base import Observation, TurnView, Violation, checker, ran_in, remembered

_END = [EventKind.TURN_EXIT, EventKind.TURN_COMPLETED]
# what may stand between the opening and the end: progress and a kept call's deltas (DEL-1)
_MIDDLE = frozenset({EventKind.TOOL_PROGRESS, EventKind.DELTA_TEXT, EventKind.DELTA_REASONING,
                     EventKind.DELTA_TOOL_CALL})
# results the engine writes when it closes a sequence: nothing real to report progress on
CLOSING_TEXTS = frozenset({NOT_RUN_TEXT, RECOVERED_CALL_TEXT, UNRECORDED_RESULT_TEXT,
                           INTERRUPTED_CALL_TEXT})


@checker("event_stream_ordered", ("DEL-1",),
         "each turn that ended has one ordered stream: started, progress for every recorded "
         "result of a call that ran and for nothing else, the exit line, and one completion "
         "last, carrying the durable answer")
def event_stream_ordered(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    seqs = [e.seq or 0 for e in obs.record.events]
    if any(b <= a for a, b in pairwise(seqs)):
        out.append(_v("event sequence numbers are not strictly increasing"))
    ended = {(v.session_id, v.turn_id) for v in obs.ended_turns()}
    for key, view in obs.turns.items():
        problem = remembered(obs, "DEL-1 order", (view,), partial(_turn_problem, view, key in ended),
                             extra=key in ended)
        if problem:
            out.append(_v(f"turn {view.key}: {problem}"))
    out.extend(_unreported_results(obs))
    return out


def _unreported_results(obs: Observation) -> list[Violation]:
    """Progress is reported for every result of a call the tool world ran, not only for
    some, and counts right: in a finished turn (its completion is durable, so every event
    it emitted before is), each recorded result of a call the ledger shows it ran is named
    by a ``tool.progress`` event (errors included: a failed tool is a result like any
    other), and each event's ``errors`` is the number of its calls that did not apply
    (the ledger's outcome, or no entry at all: answered in place, or never started; or
    cut by the batch deadline, whatever the tool went on to do).
    Calls answered in place never ran and the closing texts are no real result, so
    neither is asked for."""
    ran: dict[str | None, dict[str, str]] = defaultdict(dict)  # turn -> call id -> outcome
    for entry in obs.ledger:
        key = ran_in(obs, entry)
        if key is not None:
            ran[key[1]][entry.call_id] = entry.outcome
    out = []
    for view in obs.turns.values():
        mine = ran.get(view.turn_id)
        if not mine or view.completion is None:
            continue
        results = {m.tool_call_id: m.content or "" for m in view.rows if m.role is Role.TOOL}
        reported: set[str] = set()
        for event in view.events:
            if event.kind == EventKind.TOOL_PROGRESS:
                try:
                    progress = ToolProgress.of(event)
                except ValidationError:
                    continue  # the stream's own finding (``_turn_problem``)
                reported.update(progress.calls)
                # a call that did not apply (failed, cut, or answered in place: never ran)
                failed = sum(1 for c in progress.calls if mine.get(c) != "applied"
                             or TIMED_OUT_MARK in results.get(c, ""))
                if progress.errors != failed:
                    out.append(_v(f"turn {view.key}: progress of {', '.join(progress.calls)} "
                                  f"reports {progress.errors} errors where the tools' ledger "
                                  f"shows {failed}"))
        missing = sorted({m.tool_call_id or "" for m in view.rows if m.role is Role.TOOL
                          and m.content not in CLOSING_TEXTS and m.tool_call_id in mine}
                         - reported)
        if missing:
            out.append(_v(f"turn {view.key}: results of {', '.join(missing)} were recorded but "
                          "no progress event reports them"))
    return out


def _turn_problem(view: TurnView, ended: bool) -> str | None:
    """What is wrong with the turn's stream, read from its view alone."""
    kinds = [e.kind.value for e in view.events]
    if ended and (len(view.completions) != 1 or view.completion is None):
        return (f"it ended with {len(view.completions)} completion events "
                f"(order: {', '.join(kinds) or 'no events'})")
    begun = kinds[:1] == [EventKind.TURN_STARTED]
    opening = 2 if begun and kinds[1:2] == [EventKind.TURN_OVERLAP] else int(begun)
    finished = kinds[-2:] == _END
    middle = kinds[opening:(len(kinds) - 2 if finished else len(kinds))]
    if EventKind.TURN_COMPLETED in kinds and not finished:
        return f"the completion is not the last event (order: {', '.join(kinds)})"
    if any(k not in _MIDDLE for k in middle):
        return f"unexpected order of events: {', '.join(kinds)}"
    recorded = {m.tool_call_id for m in view.rows
                if m.role is Role.TOOL and m.content not in CLOSING_TEXTS}
    for event in view.events:
        if event.kind != EventKind.TOOL_PROGRESS:
            continue
        try:
            calls = ToolProgress.of(event).calls
        except ValidationError as error:
            return f"a malformed tool.progress event: {error.errors()[0]['msg']}"
        if any(c not in recorded for c in calls):
            return f"progress reported for results that were never recorded: {calls}"
    return _answer_problem(view)


def _answer_problem(view: TurnView) -> str | None:
    """A delivered answer is the turn's durable answer row, not some accumulated text."""
    done = view.completion
    if done is None or done.failed or not (done.final_response or "").strip():
        return None
    answers = [m.content for m in view.rows if m.role is Role.ASSISTANT and m.has_visible_text]
    line = view.exit
    if done.final_response not in answers and (line is None or line.cleanup_errors == 0):
        return "its completion carries an answer that no durable row of the turn holds"
    return None


def _v(message: str) -> Violation:
    return Violation("event_stream_ordered", "DEL-1", message)
