"""Checkers of what a turn takes from its caller and keeps for its session (CTX-1, CTX-2).

Theory of operation
-------------------
*The caller's history (CTX-2).* A story that hands a turn a history hands it a mutable
list it keeps, and the harness records that list, a frozen copy of what it held when the
turn began, and how many rows the session had then (``CallerHistoryRun``). After every
step the list must still hold exactly that copy: the turn copies the caller's list and
never changes it, not during the turn and not later through anything it kept. And a
turn that seeded a new session must have worked from that history: its first request
sends the caller's messages, in order, right after the system prompt.

*The nudge counters (CTX-1).* They belong to the session, not the turn, so the record
alone says where they stand: the user rows of a session, in row order, are its user
turns. Each turn that recorded a user row says in its ``turn.started`` event which user
turn it counted itself (``user_turn``) and whether the memory review came due
(``memory_review``). Counted from the rows, the turn is the n-th, and the review is due
exactly when n is a multiple of ``memory_nudge_interval`` and the turn offered the
memory tool. Counters reset by a turn, or left at zero by a restarted process that did
not hydrate them from the history, count wrong; a missing field is a finding too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import ValidationError

from hermes_ref.models import Event, EventKind, Message, Role
from hermes_ref.outcomes import TurnStarted
from sim.checkers.base import Observation, Violation, calls_by_turn, checker
from sim.checkers.wire import sent_messages
from sim.world import CallRecord, TurnRun


@dataclass(frozen=True, slots=True)
class CallerHistoryRun(TurnRun):
    """A turn the harness ran with a caller's history, and what that history was.

    ``caller`` is the very list the turn was handed (the harness keeps it to look at
    later); ``held`` is what it held when the turn began; ``rows_before`` is how many
    rows the session's durable transcript had then (0: the history seeds the session).
    """

    caller: list[Message] = field(default_factory=list, compare=False, hash=False)
    held: tuple[Message, ...] = ()
    rows_before: int = 0


# ---- CTX-2: the caller's list is copied, never mutated ---------------------------------------


@checker("caller_history_untouched", ("CTX-2",),
         "the list a caller hands a turn still holds what it held when the turn began, and a "
         "turn that seeds a session sends that history first")
def caller_history_untouched(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    turn_calls = calls_by_turn(obs)
    for run in obs.runs or ():
        if not isinstance(run, CallerHistoryRun):
            continue
        tag = f"turn {run.session_id}/{run.turn_id}"
        changed = _first_difference(run.caller, run.held)
        if changed is not None:
            out.append(_v2(f"{tag} changed the caller's history list: it held {len(run.held)} "
                           f"messages and now holds {len(run.caller)} (first change at "
                           f"index {changed})"))
        calls = turn_calls.get(run.turn_id or "", [])
        if run.rows_before == 0 and run.held and calls:
            problem = _seed_problem(calls[0], run.held)
            if problem is not None:
                out.append(_v2(f"{tag} seeded session {run.session_id}, but its first request "
                               f"(effect {calls[0].seq}) {problem}"))
    return out


def _first_difference(now: list[Message], held: tuple[Message, ...]) -> int | None:
    for index, (a, b) in enumerate(zip(now, held, strict=False)):
        if a != b:
            return index
    return None if len(now) == len(held) else min(len(now), len(held))


def _seed_problem(call: CallRecord, held: tuple[Message, ...]) -> str | None:
    """Whether the request sends ``held``, in order, right after its system message."""
    body = sent_messages(call)
    if isinstance(body, str):
        return body
    sent = [m for m in body if m.get("role") != Role.SYSTEM.value][:len(held)]
    for index, wanted in enumerate(held):
        if index >= len(sent):
            return f"sends only {len(sent)} of the caller's {len(held)} messages"
        if sent[index] != wanted.wire:
            return (f"sends {sent[index].get('role')} {str(sent[index].get('content'))[:30]!r} "
                    f"where the caller's message {index} is {wanted.role.value} "
                    f"{str(wanted.wire.get('content'))[:30]!r}")
    return None


def _v2(message: str) -> Violation:
    return Violation("caller_history_untouched", "CTX-2", message)


# ---- CTX-1: the nudge counters belong to the session ------------------------------------------


@checker("nudge_counters_follow_the_record", ("CTX-1",),
         "each turn counts itself the session's n-th user turn, n from the stored user rows, "
         "and the memory review comes due exactly on every [10]th, across turns and restarts")
def nudge_counters_follow_the_record(obs: Observation) -> list[Violation]:
    started = {(e.session_id, e.turn_id): e for e in reversed(obs.events(EventKind.TURN_STARTED))}
    turn_calls = calls_by_turn(obs)
    out: list[Violation] = []
    for session_id in obs.record.session_ids():
        users = _turn_openers(obs.record.transcript(session_id))
        for ordinal, row in enumerate(users, start=1):
            if row.turn_id is None or row.row_id in obs.copied_row_ids:
                continue  # seeded or a compaction's copy: it counts, but no turn wrote it here
            event = started.get((session_id, row.turn_id))
            problem = _count_problem(obs, _started_record(event), ordinal,
                                     turn_calls.get(row.turn_id, []))
            if problem is not None:
                out.append(Violation("nudge_counters_follow_the_record", "CTX-1",
                                     f"turn {session_id}/{row.turn_id}, user row #{row.row_id}: "
                                     f"{problem}"))
    return out


def _turn_openers(rows: list[Message]) -> list[Message]:
    """The user rows that open a turn: a later user row of the same turn is a correction
    the turn took in (LOOP-4), not a user turn."""
    seen: set[str] = set()
    out = []
    for row in rows:
        if row.role is Role.USER and (row.turn_id is None or row.turn_id not in seen):
            out.append(row)
        if row.role is Role.USER and row.turn_id is not None:
            seen.add(row.turn_id)
    return out


def _started_record(event: Event | None) -> TurnStarted | None:
    if event is None:
        return None
    try:
        return TurnStarted.of(event)
    except ValidationError:
        return None


def _count_problem(obs: Observation, started: TurnStarted | None, ordinal: int,
                   calls: list[CallRecord]) -> str | None:
    if started is None:
        return "its turn.started event does not say which user turn it counted and whether " \
               "the memory review was due"
    counted, review = started.user_turn, started.memory_review
    if counted != ordinal:
        return (f"the turn counted itself user turn {counted}, the record makes it user turn "
                f"{ordinal}: the session's counters were reset or never hydrated")
    if not calls:
        return None  # nothing says which tools the turn offered
    interval = obs.limits.memory_nudge_interval
    due = interval > 0 and ordinal % interval == 0 and any(t.keeps_memory for t in calls[0].request.tools)
    if review != due:
        state = "due" if due else "not due"
        return (f"user turn {ordinal} with memory_nudge_interval={interval}: the memory review "
                f"was {state}, and the turn recorded memory_review={review}")
    return None
