"""The neutral value every judge reads, whatever schema the database had.

Theory of operation
-------------------
A reader turns its tables into a ``Record``: the sessions (id, parent, ended?, end
reason), an iterator of message rows in the order they were written, and, where the
schema has them, admissions and leases. A message row is a plain tuple, because a
million of them must be judged in seconds::

    (session_id, message_id, role, call_ids, answered_id, scaffolding)

``call_ids`` is the tuple of tool-call ids an assistant row carries (``None`` when its
tool-call column cannot be read), ``answered_id`` the ``tool_call_id`` of a tool row, and
``scaffolding`` whether the row is a synthetic retry message that must never be stored.

A ``Finding`` is what a judge says: a *violation* of an invariant, or an *open turn* (a
session not ended whose tail shows a turn in flight or crashed), with the session, the
message id and the invariant id.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

Row = tuple[str, int, str, "tuple[str, ...] | None", "str | None", bool]

VIOLATION = "violation"
OPEN = "open"


@dataclass(frozen=True)
class Session:
    id: str
    parent_id: str | None
    ended: bool
    end_reason: str | None


@dataclass(frozen=True)
class Admission:
    id: str
    session_id: str
    seq: int
    status: str
    outcome: str | None


@dataclass(frozen=True)
class Lease:
    session_id: str
    holder: str | None
    acquired_at: float
    expires_at: float


@dataclass
class Record:
    schema: str
    version: int | None
    sessions: dict[str, Session]
    rows: Iterator[Row]
    admissions: list[Admission] | None = None  # None: the schema has no admissions
    leases: list[Lease] | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Finding:
    kind: str  # VIOLATION or OPEN
    invariant: str
    session: str
    message_id: int | None
    detail: str

    def line(self) -> str:
        mark = "VIOLATION" if self.kind == VIOLATION else "OPEN TURN"
        where = f"message {self.message_id}" if self.message_id is not None else "-"
        return f"{mark:<9} {self.invariant:<7} session {self.session} {where}: {self.detail}"

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "invariant": self.invariant, "session": self.session,
                "message_id": self.message_id, "detail": self.detail}
