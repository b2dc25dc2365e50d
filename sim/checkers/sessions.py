"""Session lanes (SES): keys, incarnation ids, resolution, notices, expiry, restarts.

Theory of operation
-------------------
Every reading here comes from the durable record: the route revisions (each one a row the
store took under its compare-and-set), the session rows, the lane log (process starts and
stops, background processes) and the event log, plus the provider's own call log for the
bytes sent. The rules are restated here in their own words, not imported from the engine:
a broken engine step cannot also break its judge.

A route revision ``r`` and the revision ``p`` before it of the same key are one move of
the lane; ``r.order`` is the resolution order the setting named when ``r`` was written,
so a story may switch orders between messages. The reset policy and the isolation
settings are read from the story's limits (stories keep them fixed once lanes exist).
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from hermes_ref.models import EventKind, Role
from hermes_ref.session import Route, SessionSource
from sim.checkers import lineage  # CMP-5: a route healed to its lineage's tip
from sim.checkers.base import Observation, Violation, checker

_ID = re.compile(r"^(\d{8}_\d{6})_[0-9a-f]{8}$")
_NOTICE = "[Session note: the previous conversation ended"
_STARTS = ("created", "reset", "user_reset")
_ROUTED = ("touched", "resumed", "reset")


def _pairs(obs: Observation) -> list[tuple[Route | None, Route]]:
    """Every revision with the one before it of the same key (None for a key's first)."""
    last: dict[str, Route] = {}
    out: list[tuple[Route | None, Route]] = []
    for route in sorted(obs.record.routes, key=lambda r: (r.key, r.revision)):
        out.append((lineage.healed(obs.record, last.get(route.key), route), route))
        last[route.key] = route
    return out


def _sessions(obs: Observation) -> dict[str, tuple[float | None, str | None]]:
    return {s.id: (s.ended_at, s.end_reason) for s in obs.record.sessions}


def _expected_key(source: SessionSource, group: bool, thread: bool) -> str:
    parts = ["agent", "main", source.platform, source.chat_type]
    if source.chat_type == "dm":
        parts += [p for p in (source.chat_id or source.participant, source.thread_id) if p]
    else:
        parts += [p for p in (source.chat_id, source.thread_id) if p]
        shared_thread = source.thread_id is not None and not thread
        if source.participant and group and not shared_thread:
            parts.append(source.participant)
    return ":".join(parts)


@checker("lane_keys", ("SES-1",),
         "each route's key is the layout of its source under the isolation settings")
def lane_keys(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    group, thread = obs.limits.group_sessions_per_user, obs.limits.thread_sessions_per_user
    keys = {s.id: s.key for s in obs.record.sessions}
    for route in obs.record.routes:
        want = _expected_key(route.source, group, thread)
        if route.key != want:
            out.append(Violation("lane_keys", "SES-1", f"route r{route.revision} of "
                                 f"{route.source.model_dump(exclude_none=True)} has key "
                                 f"{route.key!r}, the layout says {want!r}"))
        stored = keys.get(route.session_id)
        if stored is not None and stored != route.key:
            out.append(Violation("lane_keys", "SES-1", f"session {route.session_id} is stored "
                                 f"under key {stored!r}, routed under {route.key!r}"))
    return out


@checker("incarnation_ids", ("SES-2",),
         "incarnation ids are YYYYMMDD_HHMMSS_+8 hex of their start, unique, and a reset "
         "ends the old row with a reason without deleting it")
def incarnation_ids(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    sessions, seen = _sessions(obs), set[str]()
    for previous, route in _pairs(obs):
        if route.cause.value not in _STARTS:
            continue
        sid, name = route.session_id, "incarnation_ids"
        match = _ID.match(sid)
        stamp = datetime.fromtimestamp(route.at, tz=UTC).strftime("%Y%m%d_%H%M%S")
        if match is None or match.group(1) != stamp:
            out.append(Violation(name, "SES-2", f"incarnation {sid!r} of {route.key} is not "
                                 f"{stamp}_ + 8 hex"))
        if sid in seen:
            out.append(Violation(name, "SES-2", f"incarnation id {sid} is used twice"))
        seen.add(sid)
        if previous is not None and previous.session_id in sessions:
            ended_at, reason = sessions[previous.session_id]
            if ended_at is None or not reason or ended_at > route.at:
                out.append(Violation(name, "SES-2", f"{previous.session_id} was replaced by "
                                     f"{sid} but its row is not ended with a reason"))
    ran = {e.session_id for e in obs.record.events if e.kind == EventKind.TURN_STARTED}
    for sid in sorted((ran & {r.session_id for r in obs.record.routes}) - set(sessions)):
        out.append(Violation("incarnation_ids", "SES-2", f"session {sid} ran a turn and its "
                             "row is gone"))
    return out


# ---- SES-3: the priority of resolution -------------------------------------------------------


def _policy_reason(obs: Observation, updated_at: float, now: float) -> str | None:
    limits = obs.limits
    mode = limits.session_reset_mode
    if mode in ("idle", "both") and now - updated_at > limits.session_idle_minutes * 60:
        return "idle"
    if mode in ("daily", "both"):
        moment = datetime.fromtimestamp(now, tz=UTC)
        last = moment.replace(hour=limits.session_reset_at_hour, minute=0, second=0,
                              microsecond=0)
        if last > moment:
            last -= timedelta(days=1)
        if updated_at < last.timestamp():
            return "daily"
    return None


def _background(obs: Observation) -> dict[str, list[tuple[float, float | None]]]:
    """Each key's background-process spans (start, end or None), from the lane log."""
    spans: dict[str, list[tuple[float, float | None]]] = defaultdict(list)
    for entry in obs.record.lane_log:
        if entry.kind == "background_started":
            spans[entry.key].append((entry.at, None))
        elif entry.kind == "background_ended" and spans[entry.key]:
            start, end = spans[entry.key][-1]
            if end is None:
                spans[entry.key][-1] = (start, entry.at)
    return spans


def _live_at(spans: list[tuple[float, float | None]], at: float) -> bool:
    return any(start <= at and (end is None or end > at) for start, end in spans)


def _expected(obs: Observation, p: Route, r: Route, stale: bool, live: bool) -> tuple[str, str]:
    """What the order of ``r`` says a message on ``p`` does: (action, reason)."""
    policy = None if live else _policy_reason(obs, p.updated_at, r.at)
    rules = [("stale", stale, "new"), ("suspended", p.suspended, "new")]
    if r.order == "released_0_19":
        marked = p.resume_marked_at if p.resume_marked_at is not None else p.updated_at
        window = obs.limits.resume_freshness_window_s
        gate = (p.resume_pending and obs.limits.session_reset_mode != "none" and window > 0
                and r.at - marked > window)
        rules += [(policy or "", policy is not None, "new"),
                  ("resume_pending_expired", gate, "new"),
                  ("resume_pending", p.resume_pending, "resume")]
    else:
        rules += [("resume_pending", p.resume_pending, "resume"),
                  (policy or "", policy is not None, "new")]
    for reason, fires, action in rules:
        if fires:
            return action, reason
    return "keep", "touch"


def _wanted(obs: Observation, p: Route, r: Route, ended: tuple[float | None, str | None],
            got: str, live: bool) -> tuple[str, str]:
    """What the order says ``r`` does, with the incarnation stale when its row ended before
    the message. A reset ends the old row at its own instant with its own reason (SES-2), so
    that end is no staleness. A row ended at the message's instant for another reason (an
    agent evicted, ``agent_close``) may have ended just before the message or just after:
    the record orders neither within one instant, so either reading holds, and the one the
    lane's action agrees with is taken."""
    ended_at, why = ended
    gone = p.expiry_finalized or p.retired
    readings = [_expected(obs, p, r, gone or (ended_at is not None and ended_at < r.at), live)]
    if not gone and ended_at == r.at and why != r.auto_reset_reason:
        readings.append(_expected(obs, p, r, True, live))
    return next((w for w in readings if w[0] == got), readings[0])


@checker("resolution_priority", ("SES-3",),
         "each routed message moved its lane as the priority order says: stale > suspended "
         "> resume_pending > policy > keep (0.19.0: policy and its freshness gate first)")
def resolution_priority(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    sessions, spans = _sessions(obs), _background(obs)
    for p, r in _pairs(obs):
        if p is None or r.cause.value not in _ROUTED:
            continue
        got = {"reset": "new", "resumed": "resume", "touched": "keep"}[r.cause.value]
        if r.session_id != p.session_id and got != "new":
            got = "new (unmarked)"
        want, reason = _wanted(obs, p, r, sessions.get(p.session_id, (None, None)), got,
                               _live_at(spans.get(r.key, []), r.at))
        if got != want:
            out.append(Violation("resolution_priority", "SES-3",
                                 f"{r.key} r{r.revision} ({r.order}): the lane did {got}, the "
                                 f"order says {want} ({reason})"))
        elif want == "new" and reason in ("suspended", "idle", "daily",
                                          "resume_pending_expired") \
                and r.auto_reset_reason != reason:
            out.append(Violation("resolution_priority", "SES-3",
                                 f"{r.key} r{r.revision}: reset for {r.auto_reset_reason!r}, the "
                                 f"order says {reason!r}"))
        elif want == "resume" and r.resume_pending:
            out.append(Violation("resolution_priority", "SES-3",
                                 f"{r.key} r{r.revision}: resumed but resume_pending is still set"))
        elif want in ("keep", "resume") and r.updated_at != r.at:
            # a kept lane is touched by the message: its idle clock starts again at r.at
            out.append(Violation("resolution_priority", "SES-3",
                                 f"{r.key} r{r.revision}: kept the lane but left it last "
                                 f"active {r.at - r.updated_at:g} s before the message"))
    return out


# ---- SES-4: user resets and reset notices ---------------------------------------------------


def _notice_texts(obs: Observation, session_id: str) -> set[str]:
    """The distinct user messages sent for ``session_id`` that carry a reset notice."""
    found: set[str] = set()
    for call in obs.calls:
        if call.session_id != session_id:
            continue
        try:
            messages = call.sent.get("messages", [])
        except ValueError:
            continue
        for message in messages:
            text = message.get("content")
            if message.get("role") == "user" and isinstance(text, str) and _NOTICE in text:
                found.add(text)
    return found


@checker("reset_notice_once", ("SES-4",),
         "a user reset is fresh and silent; an automatic reset's notice is sent in exactly "
         "one user message and stored only in that row's api_content")
def reset_notice_once(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for previous, route in _pairs(obs):
        if route.cause.value not in _STARTS or previous is None:
            continue
        sid, name = route.session_id, "reset_notice_once"
        sent = _notice_texts(obs, sid)
        rows = [m for m in obs.record.transcript(sid) if m.role is Role.USER]
        if route.cause.value == "user_reset":
            if not route.is_fresh_reset or route.was_auto_reset or sent:
                out.append(Violation(name, "SES-4", f"user reset {sid} is not fresh and "
                                     f"silent (fresh={route.is_fresh_reset}, notices={len(sent)})"))
            continue
        if not route.was_auto_reset or not rows:
            continue
        carried = [m for m in rows if m.api_content and _NOTICE in m.api_content]
        if any(m.content and _NOTICE in m.content for m in rows):
            out.append(Violation(name, "SES-4", f"{sid}: a reset notice is stored as user text"))
        asked = any(call.session_id == sid for call in obs.calls)  # sent once there is a call
        if len(sent) != (1 if asked else 0) or len(carried) != 1 or carried[0] is not rows[0]:
            out.append(Violation(name, "SES-4", f"automatic reset {sid}: the notice went out in "
                                 f"{len(sent)} user messages and is in {len(carried)} rows "
                                 "(exactly one, the first)"))
    return out


# ---- SES-5 and SES-6: expiry ---------------------------------------------------------------------


@checker("expiry_finalized_once", ("SES-5",),
         "expiry finalization runs once per incarnation, ends its row with a reset reason, "
         "and no later revision keeps an ended incarnation")
def expiry_finalized_once(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    sessions, name = _sessions(obs), "expiry_finalized_once"
    counts: dict[str, int] = defaultdict(int)
    for p, r in _pairs(obs):
        if r.cause.value == "expiry_finalized":
            counts[r.session_id] += 1
            ended_at, reason = sessions.get(r.session_id, (r.at, "session_reset"))
            if ended_at is None or reason not in ("session_reset", "idle", "daily"):
                out.append(Violation(name, "SES-5", f"{r.session_id} was finalized but its row "
                                     f"is not reset-ended (end_reason={reason!r})"))
        if p is None or p.session_id != r.session_id or r.cause.value not in _ROUTED:
            continue
        ended_at = sessions.get(p.session_id, (None, None))[0]
        if p.expiry_finalized or p.retired or (ended_at is not None and ended_at < r.at):
            out.append(Violation(name, "SES-5", f"{r.key} r{r.revision} routes a message to "
                                 f"ended incarnation {r.session_id}"))
    for sid, count in sorted(counts.items()):
        if count > 1:
            out.append(Violation(name, "SES-5", f"{sid} was finalized {count} times"))
    return out


@checker("background_never_expires", ("SES-6",),
         "no lane expires, is finalized, pruned or reset by policy while it has a live "
         "background process")
def background_never_expires(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    spans = _background(obs)
    for _, r in _pairs(obs):
        expired = r.cause.value in ("expiry_finalized", "pruned") or (
            r.cause.value == "reset" and r.auto_reset_reason in ("idle", "daily"))
        if expired and _live_at(spans.get(r.key, []), r.at):
            what = {"expiry_finalized": "finalized", "pruned": "pruned"}.get(r.cause.value,
                                                                           "reset")
            out.append(Violation("background_never_expires", "SES-6",
                                 f"{r.key} was {what} by its policy while a background "
                                 "process was live"))
    return out
