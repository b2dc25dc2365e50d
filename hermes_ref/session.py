"""Session lanes: keys, incarnation ids, the route entry and how a message resolves it (SES).

Theory of operation
-------------------
A *lane* is where a conversation lives: one session key per (platform, chat type, chat,
thread, participant) as the isolation settings decide (SES-1). A lane has a sequence of
*incarnations*; each is a session row with an id ``YYYYMMDD_HHMMSS_`` + 8 hex made from
the driver's clock and random bits (SES-2). The *route* of a key says which incarnation
is live and carries its flags (suspended, resume_pending, was_auto_reset, is_fresh_reset,
expiry_finalized, ...). Routes are revisions: every change is a new ``Route`` value with
``revision + 1``, and the store accepts it only if it is the next revision of its key (a
compare-and-set), so a key has one writer at a time and its whole history stays readable.

Resolving a message is one pure decision, ``resolve``: the first rule of ``PRIORITY`` that
fires wins. The reference order is the documented one (stale > suspended > resume_pending
> policy expiry > keep); the released 0.19.0 order evaluates the policy before
resume_pending and adds a freshness gate (``Order.RELEASED_0_19``). ``stale`` is a guard in
front of both: a route whose incarnation is already ended never revives it (SES-5).

The route's states and the only moves between them are ``lane_states.TRANSITIONS``;
``Route.revise`` refuses any other move (an engine bug).
Restart recovery (SES-7) lives in ``hermes_ref.lane_restart``; the coroutines that perform
all of this through effects live in ``hermes_ref.router``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import model_validator

from hermes_ref.errors import BadInput, IllegalTransition
from hermes_ref.lane_states import Cause as Cause  # re-exported: part of the route's vocabulary
from hermes_ref.lane_states import LaneState as LaneState
from hermes_ref.lane_states import check_move, state_of
from hermes_ref.models import Frozen

NAMESPACE = "agent:main"
CHAT_TYPES = ("dm", "group", "channel", "thread")
_SEGMENT = re.compile(r"^[A-Za-z0-9_.@+~-]{1,128}$")  # no colon, slash, space or dot-dot
INCARNATION_ID = re.compile(r"^\d{8}_\d{6}_[0-9a-f]{8}$")
RESET_NOTICE = ("[Session note: the previous conversation ended ({reason}); "
                "this is a new conversation.]")
# end reasons that make the next message an automatic reset (with its notice)
AUTO_RESET_REASONS = frozenset({"session_reset", "idle", "daily", "suspended",
                                "resume_pending_expired"})
USER_RESET_REASON = "new_session"


def _segment(what: str, value: str) -> str:
    if not _SEGMENT.match(value) or ".." in value:
        raise BadInput(f"malformed session source: {what} {value!r} is not a key segment "
                       "(letters, digits and _.@+~- only, at most 128)")
    return value


class SessionSource(Frozen):
    """Where a message came from; every part is one key segment or None."""

    platform: str
    chat_type: str = "dm"
    chat_id: str | None = None
    thread_id: str | None = None
    participant: str | None = None

    @model_validator(mode="after")
    def _check(self) -> SessionSource:
        _segment("platform", self.platform)
        if self.chat_type not in CHAT_TYPES:
            raise BadInput(f"malformed session source: chat type {self.chat_type!r} is not "
                           f"one of {', '.join(CHAT_TYPES)}")
        for what in ("chat_id", "thread_id", "participant"):
            value = getattr(self, what)
            if value is not None:
                _segment(what, value)
        return self


def build_session_key(source: SessionSource, *, group_per_user: bool = True,
                      thread_per_user: bool = False) -> str:
    """SES-1: ``agent:main:{platform}:{chat_type}[:{chat_id}][:{thread_id}][:{participant}]``.

    A DM with a chat id carries no participant; one without uses the participant (or the
    thread) in its place. A group or channel isolates per participant when
    ``group_per_user``, except in a thread, which is shared unless ``thread_per_user``.
    """
    head = [NAMESPACE, source.platform, source.chat_type]
    if source.chat_type == "dm":
        who = source.chat_id or source.participant
        return ":".join(head + [part for part in (who, source.thread_id) if part])
    isolated = group_per_user and not (source.thread_id and not thread_per_user)
    parts = [source.chat_id, source.thread_id, source.participant if isolated else None]
    return ":".join(head + [part for part in parts if part])


def check_session_key(key: str) -> str:
    """A key this engine could have built, or BadInput naming what is wrong with it."""
    parts = key.split(":")
    if ":".join(parts[:2]) != NAMESPACE or len(parts) < 4 or len(parts) > 7:
        raise BadInput(f"malformed session key {key!r}: expected "
                       f"{NAMESPACE}:<platform>:<chat_type>[:<part>...]")
    if parts[3] not in CHAT_TYPES:
        raise BadInput(f"malformed session key {key!r}: unknown chat type {parts[3]!r}")
    for part in parts[2:]:
        if not _SEGMENT.match(part) or ".." in part:
            raise BadInput(f"malformed session key {key!r}: bad segment {part!r}")
    return key


def incarnation_id(now_s: float, bits: int) -> str:
    """SES-2: ``YYYYMMDD_HHMMSS_`` (UTC, from the driver's clock) + 8 hex of random bits."""
    stamp = datetime.fromtimestamp(now_s, tz=UTC).strftime("%Y%m%d_%H%M%S")
    return f"{stamp}_{bits & 0xFFFFFFFF:08x}"


# ---- reset policy ------------------------------------------------------------------------


class ResetMode(StrEnum):
    IDLE = "idle"
    DAILY = "daily"
    BOTH = "both"
    NONE = "none"


class ResetPolicy(Frozen):
    mode: ResetMode = ResetMode.NONE
    idle_minutes: int = 1440
    at_hour: int = 4


def policy_reason(policy: ResetPolicy, updated_at: float, now: float) -> str | None:
    """``idle`` when quiet longer than ``idle_minutes``; ``daily`` when last active before
    the most recent ``at_hour``:00 (UTC); ``both`` checks idle first; ``none`` never."""
    if policy.mode in (ResetMode.IDLE, ResetMode.BOTH) and \
            now > updated_at + policy.idle_minutes * 60:
        return "idle"
    if policy.mode in (ResetMode.DAILY, ResetMode.BOTH):
        moment = datetime.fromtimestamp(now, tz=UTC)
        boundary = moment.replace(hour=policy.at_hour, minute=0, second=0, microsecond=0)
        if moment.hour < policy.at_hour:
            boundary -= timedelta(days=1)
        if updated_at < boundary.timestamp():
            return "daily"
    return None


def expiry_reason(policy: ResetPolicy, updated_at: float, now: float,
                  background_live: bool) -> str | None:
    """SES-6: a lane with a live background process never expires; else the policy decides."""
    if background_live:
        return None
    return policy_reason(policy, updated_at, now)


# ---- the route: one revision of a key's entry ----------------------------------------------


class Route(Frozen):
    """One revision of a key's session entry."""

    key: str
    revision: int
    session_id: str
    cause: Cause
    at: float
    source: SessionSource
    created_at: float
    updated_at: float
    suspended: bool = False
    resume_pending: bool = False
    resume_reason: str | None = None
    resume_marked_at: float | None = None
    was_auto_reset: bool = False
    auto_reset_reason: str | None = None
    is_fresh_reset: bool = False
    expiry_finalized: bool = False
    retired: bool = False  # pruned: the route no longer routes (the next message starts anew)
    notice_delivered: bool = False
    order: str = "reference"  # the resolution order in force when this revision was written

    def revise(self, cause: Cause, at: float, **changes: Any) -> Route:
        """The next revision of this entry (same incarnation)."""
        check_move(state_of(self), state_of(self.model_copy(update=changes)), cause)
        return self.model_copy(update={"revision": self.revision + 1, "cause": cause,
                                       "at": at, **changes})


def first_route(key: str, source: SessionSource, session_id: str, now: float, *,
                previous: Route | None, cause: Cause, reason: str | None, order: str) -> Route:
    """The revision that starts an incarnation (the key's first, or after a reset)."""
    if previous is not None:
        check_move(state_of(previous), LaneState.ENDED, cause)
    auto = cause is Cause.RESET and reason in AUTO_RESET_REASONS
    return Route(key=key, revision=(previous.revision + 1) if previous else 1,
                 session_id=session_id, cause=cause, at=now, source=source, created_at=now,
                 updated_at=now, was_auto_reset=auto, auto_reset_reason=reason if auto else None,
                 is_fresh_reset=cause is Cause.USER_RESET, order=order)


def notice_due(route: Route, has_rows: bool) -> bool:
    """SES-4: an automatic reset's notice goes with the incarnation's first user row only.

    Once a row is durable the notice is part of it (the user row's ``api_content``) and is
    never injected again; until then (the first turn crashed before writing it) it is due.
    """
    return route.was_auto_reset and not route.notice_delivered and not has_rows


def finalization_due(route: Route, policy: ResetPolicy, now: float,
                     background_live: bool) -> bool:
    """SES-5: the expiry watcher finalizes an expired incarnation once, never again."""
    return not route.expiry_finalized and \
        expiry_reason(policy, route.updated_at, now, background_live) is not None


def prune_due(route: Route, now: float, prune_after_s: float, background_live: bool) -> bool:
    """SES-6: a lane idle past the prune age is retired, unless it is suspended or has a live
    background process; a prune age of 0 or less never prunes."""
    return (prune_after_s > 0 and not route.retired and not route.suspended
            and not background_live and route.updated_at < now - prune_after_s)


def reset_notice(route: Route) -> str:
    return RESET_NOTICE.format(reason=route.auto_reset_reason or "reset")


# ---- resolution ------------------------------------------------------------------------------


class Action(StrEnum):
    NEW = "new"        # end the incarnation, start another (new id)
    RESUME = "resume"  # keep the id, clear resume_pending
    KEEP = "keep"      # keep the id, touch updated_at


class Order(StrEnum):
    REFERENCE = "reference"
    RELEASED_0_19 = "released_0_19"


class Situation(Frozen):
    """Everything a resolution reads: the route, the clock and the world around it."""

    route: Route
    now: float
    policy: ResetPolicy
    background_live: bool
    ended_reason: str | None  # the incarnation's session row is already ended
    freshness_window_s: float = 3600.0


class Decision(Frozen):
    rule: str
    action: Action
    reason: str | None


def _stale(s: Situation) -> str | None:
    route = s.route
    return s.ended_reason or ("session_reset" if route.expiry_finalized else None) or (
        "pruned" if route.retired else None)


def _suspended(s: Situation) -> str | None:
    return "suspended" if s.route.suspended else None


def _resume_pending(s: Situation) -> str | None:
    return (s.route.resume_reason or "restart_interrupted") if s.route.resume_pending else None


def _policy(s: Situation) -> str | None:
    return expiry_reason(s.policy, s.route.updated_at, s.now, s.background_live)


def _resume_freshness(s: Situation) -> str | None:
    """0.19.0 only: a resume marker older than the window resets the lane (mode != none)."""
    route = s.route
    if not route.resume_pending or s.policy.mode is ResetMode.NONE or s.freshness_window_s <= 0:
        return None
    marked = route.resume_marked_at if route.resume_marked_at is not None else route.updated_at
    return "resume_pending_expired" if s.now - marked > s.freshness_window_s else None


def _keep(s: Situation) -> str | None:
    return "touch"


RULES: dict[str, tuple[Callable[[Situation], str | None], Action]] = {
    "stale": (_stale, Action.NEW),
    "suspended": (_suspended, Action.NEW),
    "resume_pending": (_resume_pending, Action.RESUME),
    "policy": (_policy, Action.NEW),
    "resume_freshness": (_resume_freshness, Action.NEW),
    "keep": (_keep, Action.KEEP),
}

PRIORITY: dict[Order, tuple[str, ...]] = {
    Order.REFERENCE: ("stale", "suspended", "resume_pending", "policy", "keep"),
    Order.RELEASED_0_19: ("stale", "suspended", "policy", "resume_freshness", "resume_pending",
                          "keep"),
}


def resolve(situation: Situation, order: Order = Order.REFERENCE) -> Decision:
    """SES-3: the first rule of ``PRIORITY[order]`` that fires decides."""
    for name in PRIORITY[order]:
        test, action = RULES[name]
        reason = test(situation)
        if reason is not None:
            return Decision(rule=name, action=action, reason=reason)
    raise IllegalTransition(f"no rule of order {order.value} decided")  # "keep" always fires


def render_priority() -> str:
    """The priority orders as a markdown table (docs/sessions.md carries it verbatim)."""
    rows = ["| order | rules, first that fires wins |", "|---|---|"]
    for order, names in PRIORITY.items():
        cells = " > ".join(f"{name} ({RULES[name][1].value})" for name in names)
        rows.append(f"| `{order.value}` | {cells} |")
    return "\n".join(rows)

