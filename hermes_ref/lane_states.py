"""The states of a session lane's route and the only moves between them (SES).

Theory of operation
-------------------
A route revision is in one state, derived from its flags (``state_of``): live,
resume_pending, suspended, expiry_finalized, pruned. Each revision is written for a
``Cause``; ``TRANSITIONS`` lists every (state, cause, state) a revision may make, and
``check_move`` refuses anything else with ``IllegalTransition``: an engine bug, never
handled. Ending an incarnation (a reset) moves its last state to ``ended``, and the new
incarnation starts ``live``. docs/sessions.md carries ``render_mermaid``'s output
verbatim, so the picture cannot drift from the table.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from hermes_ref.errors import IllegalTransition


class Cause(StrEnum):
    """Why a route revision was written."""

    CREATED = "created"            # first incarnation of the key
    RESET = "reset"                # a new incarnation replaced the old one (see reason)
    USER_RESET = "user_reset"      # the user asked for a new conversation
    TOUCHED = "touched"            # keep and touch
    RESUMED = "resumed"            # resume_pending cleared, same id
    MARKED = "restart_interrupted"  # start without a clean-exit marker
    SUSPENDED = "stuck"            # active across too many restarts
    FINALIZED = "expiry_finalized"  # the expiry watcher ended the incarnation
    PRUNED = "pruned"              # the watcher retired a lane idle past the prune age



class LaneFlags(Protocol):
    """The flags of a route revision a state is read from."""

    @property
    def suspended(self) -> bool: ...
    @property
    def resume_pending(self) -> bool: ...
    @property
    def expiry_finalized(self) -> bool: ...
    @property
    def retired(self) -> bool: ...


class LaneState(StrEnum):
    LIVE = "live"
    RESUME_PENDING = "resume_pending"
    SUSPENDED = "suspended"
    FINALIZED = "expiry_finalized"
    PRUNED = "pruned"
    ENDED = "ended"


def state_of(route: LaneFlags) -> LaneState:
    if route.retired:
        return LaneState.PRUNED
    if route.expiry_finalized:
        return LaneState.FINALIZED
    if route.suspended:
        return LaneState.SUSPENDED
    return LaneState.RESUME_PENDING if route.resume_pending else LaneState.LIVE


LaneMove = tuple[LaneState, str, LaneState]
TRANSITIONS: tuple[LaneMove, ...] = (
    (LaneState.LIVE, Cause.TOUCHED, LaneState.LIVE),
    (LaneState.LIVE, Cause.MARKED, LaneState.RESUME_PENDING),
    (LaneState.LIVE, Cause.SUSPENDED, LaneState.SUSPENDED),
    (LaneState.LIVE, Cause.FINALIZED, LaneState.FINALIZED),
    (LaneState.LIVE, Cause.RESET, LaneState.ENDED),
    (LaneState.LIVE, Cause.USER_RESET, LaneState.ENDED),
    (LaneState.LIVE, Cause.PRUNED, LaneState.PRUNED),
    (LaneState.RESUME_PENDING, Cause.RESUMED, LaneState.LIVE),
    (LaneState.RESUME_PENDING, Cause.SUSPENDED, LaneState.SUSPENDED),
    (LaneState.RESUME_PENDING, Cause.FINALIZED, LaneState.FINALIZED),
    (LaneState.RESUME_PENDING, Cause.RESET, LaneState.ENDED),
    (LaneState.RESUME_PENDING, Cause.USER_RESET, LaneState.ENDED),
    (LaneState.RESUME_PENDING, Cause.PRUNED, LaneState.PRUNED),
    (LaneState.SUSPENDED, Cause.FINALIZED, LaneState.FINALIZED),
    (LaneState.SUSPENDED, Cause.RESET, LaneState.ENDED),
    (LaneState.SUSPENDED, Cause.USER_RESET, LaneState.ENDED),
    (LaneState.FINALIZED, Cause.RESET, LaneState.ENDED),
    (LaneState.FINALIZED, Cause.USER_RESET, LaneState.ENDED),
    (LaneState.FINALIZED, Cause.PRUNED, LaneState.PRUNED),
    (LaneState.PRUNED, Cause.RESET, LaneState.ENDED),
    (LaneState.PRUNED, Cause.USER_RESET, LaneState.ENDED),
)
_MOVES = frozenset(TRANSITIONS)


def check_move(old: LaneState, new: LaneState, cause: str) -> None:
    """Refuse a move the table does not list (an engine bug, never handled)."""
    if (old, cause, new) not in _MOVES:
        raise IllegalTransition(f"a lane in state {old.value} cannot move to {new.value} "
                                f"by {cause}")


def render_mermaid() -> str:
    """``TRANSITIONS`` as a mermaid state diagram (docs/sessions.md carries it verbatim)."""
    lines = ["stateDiagram-v2", "    [*] --> live: created"]
    for old, cause, new in TRANSITIONS:
        lines.append(f"    {old.value} --> {new.value}: {cause}")
    lines.append("    ended --> [*]")
    return "\n".join(lines)
