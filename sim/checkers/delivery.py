"""Checkers of the event stream a client sees (DEL)."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

from hermes_ref.closure import NOT_RUN_TEXT, RECOVERED_CALL_TEXT, UNRECORDED_RESULT_TEXT
from hermes_ref.models import Event, Role
from sim.checkers.base import Observation, Violation, checker

_END = ["turn.exit", "turn.completed"]
# results the engine writes when it closes a sequence: nothing real to report progress on
CLOSING_TEXTS = frozenset({NOT_RUN_TEXT, RECOVERED_CALL_TEXT, UNRECORDED_RESULT_TEXT})


@checker("event_stream_ordered", ("DEL-1",),
         "each turn's events are numbered in order: started, progress for recorded results, "
         "the exit line, and the completion last")
def event_stream_ordered(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    seqs = [e.seq or 0 for e in obs.record.events]
    if any(b <= a for a, b in pairwise(seqs)):
        out.append(_v("event sequence numbers are not strictly increasing"))
    by_turn: dict[str, list[Event]] = defaultdict(list)
    for event in obs.record.events:
        by_turn[event.turn_id].append(event)
    for turn_id, events in by_turn.items():
        problem = _turn_problem(obs, turn_id, [e.kind for e in events], events)
        if problem:
            out.append(_v(f"turn {turn_id}: {problem}"))
    return out


def _turn_problem(obs: Observation, turn_id: str, kinds: list[str], events: list[Event]) -> str | None:
    begun = kinds[:1] == ["turn.started"]
    finished = kinds[-2:] == _END
    middle = kinds[(1 if begun else 0):(len(kinds) - 2 if finished else len(kinds))]
    if not finished and not obs.crash_seqs and "turn.completed" in kinds:
        return f"the completion is not the last event (order: {', '.join(kinds)})"
    if finished and kinds.count("turn.exit") != 1:
        return "more than one exit line"
    if any(k != "tool.progress" for k in middle):
        return f"unexpected order of events: {', '.join(kinds)}"
    recorded = {m.tool_call_id for m in obs.rows_of_turn(turn_id)
                if m.role is Role.TOOL and m.content not in CLOSING_TEXTS}
    for event in events:
        calls = event.data.get("calls", []) if event.kind == "tool.progress" else []
        if any(c not in recorded for c in calls):
            return f"progress reported for results that were never recorded: {calls}"
    return None


def _v(message: str) -> Violation:
    return Violation("event_stream_ordered", "DEL-1", message)
