"""One judge per invariant, over the neutral ``Record``.

Theory of operation
-------------------
Message rows arrive once, in the order they were written, sessions interleaved. The
row judges share one pass (a million rows must take seconds), each keeping its state in
the session's ``_Walk``; every other judge reads the sessions, admissions and leases.
What each decides, and the id it reports under:

    TOOL-2   an assistant row's tool calls cannot be read (so they cannot be paired)
    TOOL-3   a result that answers no call of the assistant row before it; a second
             result for one call; a call still unanswered when the next assistant row was
             written; two calls of one row under one id. Pairing is per round, as on the
             wire: a later round may reuse an id (servers that number calls per request do)
    TOOL-5   results not in the order of their calls
    FIN-4    a user row right after calls that were never answered: the boundary of the
             turn before was never closed (its tool sequence stayed open)
    FIN-5    a user row right after a tool row: no assistant row closed that turn
    SCAF-1   a synthetic retry message was stored
    tail     an ended session whose tail is open (unanswered calls FIN-4, a tool row
             FIN-8, a user row FIN-5) is a violation; the same tail in a session not
             ended is an *open turn* (in flight, or crashed), reported under the same id
    SES-2    a session ended without a reason, or given a reason but not ended
    CMP-5    a child whose parent is missing, a parent still live beside its child, a cycle
    ADM-4    more than one admission of a session started at once
    ADM-5    a terminal admission without an outcome
    LEASE-1  more than one lease row for a session; LEASE-2 a held lease that expires
             before it was acquired (a released one has no holder and expiry 0)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sim.audit.record import OPEN, VIOLATION, Finding, Record, Session


class _Walk:
    __slots__ = ("answered", "last", "last_id", "open")

    def __init__(self) -> None:
        self.open: dict[str, int] = {}  # unanswered call id → its assistant row's id
        self.answered: set[str] = set()  # call ids of the current round already answered
        self.last = ""  # the kind of the last row: user, tool, calls, assistant, system
        self.last_id = 0


def judge_rows(record: Record) -> tuple[list[Finding], dict[str, _Walk], int]:
    """The row judges; returns findings, each session's final walk, and the row count."""
    findings: list[Finding] = []
    add = findings.append
    walks: dict[str, _Walk] = {}
    count = 0
    for sid, rid, role, calls, answered, scaf in record.rows:
        count += 1
        walk = walks.get(sid)
        if walk is None:
            walk = walks[sid] = _Walk()
        if scaf:
            add(Finding(VIOLATION, "SCAF-1", sid, rid, f"a synthetic {role} message was stored"))
        if role == "tool":
            _tool_row(walk, sid, rid, answered, add)
        elif role == "assistant":
            _assistant_row(walk, sid, rid, calls, add)
        elif role == "user":
            if walk.open:
                add(Finding(VIOLATION, "FIN-4", sid, rid, "a user row right after unanswered "
                            f"call(s) {_ids(walk.open)}: the turn before never closed"))
                walk.open = {}
            elif walk.last == "tool":
                add(Finding(VIOLATION, "FIN-5", sid, rid, f"a user row right after tool row "
                            f"{walk.last_id}: no assistant row closed the turn before"))
            walk.last = "user"
        else:
            walk.last = role
        walk.last_id = rid
    return findings, walks, count


def _tool_row(walk: _Walk, sid: str, rid: int, answered: str | None,
              add: Callable[[Finding], None]) -> None:
    if answered is not None and answered in walk.open:
        first = next(iter(walk.open))
        if answered != first:
            add(Finding(VIOLATION, "TOOL-5", sid, rid,
                        f"the result of {answered} came before that of {first}"))
        del walk.open[answered]
        walk.answered.add(answered)
    elif answered is not None and answered in walk.answered:
        add(Finding(VIOLATION, "TOOL-3", sid, rid, f"a second result for call {answered}"))
    else:
        add(Finding(VIOLATION, "TOOL-3", sid, rid, f"a tool result for call {answered!r}, "
                    "which the assistant row before it did not make"))
    walk.last = "tool"


def _assistant_row(walk: _Walk, sid: str, rid: int, calls: tuple[str, ...] | None,
                   add: Callable[[Finding], None]) -> None:
    if walk.open:
        add(Finding(VIOLATION, "TOOL-3", sid, rid,
                    f"an assistant row while call(s) {_ids(walk.open)} had no result"))
    walk.open = {}
    walk.answered = set()
    if calls is None:
        add(Finding(VIOLATION, "TOOL-2", sid, rid,
                    "the row's tool_calls is not a list of calls with ids"))
        calls = ()
    for call_id in calls:
        if call_id in walk.open:
            add(Finding(VIOLATION, "TOOL-3", sid, rid,
                        f"two calls of the row share the id {call_id}"))
        walk.open[call_id] = rid
    walk.last = "calls" if calls else "assistant"


def _ids(open_calls: dict[str, int]) -> str:
    return ", ".join(open_calls)


def judge_tails(sessions: dict[str, Session], walks: dict[str, _Walk]) -> Iterator[Finding]:
    """An open tail: a violation in an ended session, an open turn in a live one."""
    for sid, walk in walks.items():
        session = sessions.get(sid)
        ended = session is not None and session.ended
        kind = VIOLATION if ended else OPEN
        state = "ended with" if ended else "open turn:"
        if walk.open:
            yield Finding(kind, "FIN-4", sid, walk.last_id,
                          f"{state} unanswered call(s) {_ids(walk.open)} at the tail")
        elif walk.last == "tool":
            yield Finding(kind, "FIN-8", sid, walk.last_id, f"{state} a tool row at the tail")
        elif walk.last == "user":
            note = " (FIN-5 allows it only after a context-pressure failure)" if ended else ""
            yield Finding(kind, "FIN-5", sid, walk.last_id,
                          f"{state} a user row at the tail{note}")


def judge_sessions(record: Record, walks: dict[str, _Walk]) -> Iterator[Finding]:
    """SES-2 (an end has a reason) and CMP-5 (lineage); rows of unknown sessions too."""
    sessions = record.sessions
    for sid in walks:
        if sid not in sessions:
            yield Finding(VIOLATION, "CMP-5", sid, None, "messages of a session with no row")
    for session in sessions.values():
        if session.ended and not session.end_reason:
            yield Finding(VIOLATION, "SES-2", session.id, None, "ended without a reason")
        if not session.ended and session.end_reason:
            yield Finding(VIOLATION, "SES-2", session.id, None,
                          f"has end reason {session.end_reason!r} but was never ended")
        yield from _lineage(session, sessions)


def _lineage(session: Session, sessions: dict[str, Session]) -> Iterator[Finding]:
    if session.parent_id is None:
        return
    parent = sessions.get(session.parent_id)
    if parent is None:
        yield Finding(VIOLATION, "CMP-5", session.id, None,
                      f"its parent session {session.parent_id} does not exist")
        return
    if not parent.ended:
        yield Finding(VIOLATION, "CMP-5", parent.id, None,
                      f"still live beside its child session {session.id}")
    seen = {session.id}
    node: Session | None = parent
    while node is not None and node.parent_id is not None:
        if node.id in seen:
            yield Finding(VIOLATION, "CMP-5", session.id, None, "its lineage is a cycle")
            return
        seen.add(node.id)
        node = sessions.get(node.parent_id)


def judge_admissions(record: Record) -> Iterator[Finding]:
    """ADM-4 (one started at a time per session) and ADM-5 (terminal carries an outcome)."""
    started: dict[str, str] = {}
    for admission in record.admissions or ():
        if admission.status == "started":
            if admission.session_id in started:
                yield Finding(VIOLATION, "ADM-4", admission.session_id, None,
                              f"admissions {started[admission.session_id]} and {admission.id} "
                              "are both started")
            started[admission.session_id] = admission.id
        if admission.status == "terminal" and not admission.outcome:
            yield Finding(VIOLATION, "ADM-5", admission.session_id, None,
                          f"admission {admission.id} is terminal without an outcome")


def judge_leases(record: Record) -> Iterator[Finding]:
    """LEASE-1 (one lease per session) and LEASE-2 (it expires after it was acquired)."""
    held: set[str] = set()
    for lease in record.leases or ():
        if lease.session_id in held:
            yield Finding(VIOLATION, "LEASE-1", lease.session_id, None, "two lease rows")
        held.add(lease.session_id)
        if lease.holder is not None and lease.expires_at < lease.acquired_at:
            yield Finding(VIOLATION, "LEASE-2", lease.session_id, None,
                          "the lease expires before it was acquired")


def judge(record: Record) -> tuple[list[Finding], int]:
    """Every judge over one record: the findings (in a stable order) and the rows read."""
    findings, walks, count = judge_rows(record)
    findings += judge_tails(record.sessions, walks)
    findings += judge_sessions(record, walks)
    findings += judge_admissions(record)
    findings += judge_leases(record)
    return findings, count
