"""The session router: a message's source in, the live incarnation out (SES), through effects.

Theory of operation
-------------------
``route(source, limits)`` builds the key, reads the key's newest route revision, the
incarnation's session row and the live background processes, and lets the pure
``session.resolve`` decide. Then it writes one revision with ``PutRoute``:

* keep / resume: the same incarnation, touched (and resume_pending cleared);
* new: a fresh id from the clock and ``RandomBits``; the same transaction ends the old
  session row with the reason (ended rows stay: SES-2) and creates the new one's row,
  with its system prompt (CTX-3, CTX-4), as Hermes creates the session when it routes.
  An incarnation is never named without its row: a reset that follows at once, before
  the turn of the message routed to it has run, still finds the row to end.

``PutRoute`` is a compare-and-set on the key's revision: when another writer got there
first the router reads again and decides again (``route_attempts_max`` times), so one key
has one transition at a time and two racing messages agree on one incarnation.

The reset notice of an automatic reset goes into the turn as injected context, so it is
sent inside the first user message of the new incarnation and is durable there (that
row's ``api_content``, WIRE-1) and nowhere else. Whether it is still due is read from the
record: due until the incarnation has a stored row (``session.notice_due``).

``watch`` is the expiry watcher's pass: ``finalize_expired`` (SES-5), then
``prune_idle`` (SES-6); ``start`` and ``shutdown`` are
the restart rules (SES-7, ``lane_restart``). The turn itself still takes a ``TurnInput``;
``turn_input`` makes one from a ``Routed``.
"""

from __future__ import annotations

from typing import Any

from hermes_ref import lane_restart, prologue, rotation, session
from hermes_ref.effects import (
    LiveBackground,
    LoadMessages,
    LoadRoute,
    LoadRoutes,
    LoadSession,
    LoadTip,
    Now,
    PutRoute,
    RandomBits,
    ReadMarkers,
    WriteLane,
)
from hermes_ref.errors import BadInput, PersistenceError
from hermes_ref.lane_restart import LaneEntry
from hermes_ref.limits import Limits
from hermes_ref.models import Frozen, SessionRecord, ToolSpec
from hermes_ref.outcomes import TurnResult
from hermes_ref.prologue import TurnInput
from hermes_ref.session import Action, Cause, Order, ResetMode, ResetPolicy, Route, SessionSource

ID_DRAWS_MAX = 3  # fresh ids drawn before giving up on a collision (practically never)
FINALIZED_END_REASON = "session_reset"  # how the expiry watcher ends a row (SES-5)
PRUNED_END_REASON = "pruned"  # how a pruned lane's row is ended (SES-6)


class Routed(Frozen):
    """Where a message goes: the route revision written for it, the rule that decided it,
    and the reset notice to inject, if one is due."""

    route: Route
    rule: str
    notice: str | None = None


class Startup(Frozen):
    clean: bool
    marked: tuple[str, ...] = ()
    suspended: tuple[str, ...] = ()


def policy_of(limits: Limits) -> ResetPolicy:
    return ResetPolicy(mode=ResetMode(limits.session_reset_mode),
                       idle_minutes=limits.session_idle_minutes,
                       at_hour=limits.session_reset_at_hour)


def session_key(source: SessionSource, limits: Limits) -> str:
    return session.build_session_key(source, group_per_user=limits.group_sessions_per_user,
                                     thread_per_user=limits.thread_sessions_per_user)


def turn_input(routed: Routed, text: str, **extra: Any) -> TurnInput:
    """The engine's input for a routed message; the notice rides as injected context."""
    route = routed.route
    return TurnInput(session_id=route.session_id, session_key=route.key, text=text,
                     platform=route.source.platform, injected_context=routed.notice, **extra)


async def route(source: SessionSource, limits: Limits, tools: tuple[ToolSpec, ...]) -> Routed:
    """Resolve ``source`` to its live incarnation, writing one route revision; ``tools`` are
    the engine's, named in the system prompt of an incarnation the route begins."""
    key = session_key(source, limits)
    for _ in range(limits.route_attempts_max):
        routed = await _route_once(source, key, limits, tools)
        if routed is not None:
            return routed
    raise PersistenceError(f"route {key!r}: lost the compare-and-set "
                           f"{limits.route_attempts_max} times", cause="route_contention")


async def _route_once(source: SessionSource, key: str, limits: Limits,
                      tools: tuple[ToolSpec, ...]) -> Routed | None:
    now = await Now()
    current = await LoadRoute(key)
    if current is None:
        return await _begin(None, source, key, limits, tools, now, Cause.CREATED, None,
                            "created")
    record = await LoadSession(current.session_id)
    if record is not None and rotation.lease_follows_tip(record.end_reason):  # CMP-5
        current, record = await _tip_of(current, record)
    ended = record.end_reason if record is not None and record.ended_at is not None else None
    live = key in await LiveBackground()
    situation = session.Situation(route=current, now=now, policy=policy_of(limits),
                                  background_live=live, ended_reason=ended,
                                  freshness_window_s=limits.resume_freshness_window_s)
    decision = session.resolve(situation, Order(limits.session_resolution_order))
    if decision.action is Action.NEW:
        return await _begin(current, source, key, limits, tools, now, Cause.RESET,
                            decision.reason, decision.rule, end=None if ended else decision.reason)
    return await _continue(current, decision, limits, now)


async def _tip_of(current: Route, record: SessionRecord) -> tuple[Route, SessionRecord]:
    """CMP-5: a route that names a session compaction rotated away is decided on the lineage's
    live tip; the revision this message writes then names the tip (the route heals)."""
    tip = await LoadTip(current.session_id)
    if tip is None or tip.id == current.session_id:
        return current, record
    return current.model_copy(update={"session_id": tip.id}), tip


async def _fresh_id(now: float) -> str:
    for _ in range(ID_DRAWS_MAX):
        candidate = session.incarnation_id(now, await RandomBits(32))
        if await LoadSession(candidate) is None:
            return candidate
    raise PersistenceError(f"no unused incarnation id after {ID_DRAWS_MAX} draws",
                           cause="id_collision")


async def _begin(current: Route | None, source: SessionSource, key: str, limits: Limits,
                 tools: tuple[ToolSpec, ...], now: float, cause: Cause, reason: str | None,
                 rule: str, end: str | None = None) -> Routed | None:
    """Start an incarnation: its route and its session row, the prompt built first (CTX-4),
    and the old one's row ended, in one write."""
    new = session.first_route(key, source, await _fresh_id(now), now, previous=current,
                              cause=cause, reason=reason,
                              order=limits.session_resolution_order)
    row = prologue.new_session_row(new.session_id, key, source.platform, tools, now,
                                   source.chat_type)
    if not await PutRoute(new, *ending(current, end), start=row):
        return None
    notice = session.reset_notice(new) if session.notice_due(new, has_rows=False) else None
    return Routed(route=new, rule=rule, notice=notice)


def ending(current: Route | None, reason: str | None) -> tuple[str | None, str | None]:
    """The row a new incarnation's write ends, and why: the old one (SES-2), if it is live."""
    if current is None or reason is None:
        return None, None
    return current.session_id, reason


async def _continue(current: Route, decision: session.Decision, limits: Limits,
                    now: float) -> Routed | None:
    """Keep the incarnation: touch it, clear resume_pending, settle the notice."""
    has_rows = False
    if current.was_auto_reset and not current.notice_delivered:
        has_rows = bool(await LoadMessages(current.session_id, 0))
    changes: dict[str, Any] = {"updated_at": now, "order": limits.session_resolution_order}
    cause = Cause.TOUCHED
    if decision.action is Action.RESUME:
        cause = Cause.RESUMED
        changes.update(resume_pending=False, resume_reason=None, resume_marked_at=None)
    if has_rows:
        changes["notice_delivered"] = True
    revised = current.revise(cause, now, **changes)
    if not await PutRoute(revised):
        return None
    due = session.notice_due(current, has_rows)
    return Routed(route=revised, rule=decision.rule,
                  notice=session.reset_notice(current) if due else None)


async def reset(source: SessionSource, limits: Limits, tools: tuple[ToolSpec, ...]) -> Routed:
    """A user-requested reset: a new incarnation, ``is_fresh_reset``, no notice (SES-4)."""
    key = session_key(source, limits)
    for _ in range(limits.route_attempts_max):
        now = await Now()
        current = await LoadRoute(key)
        if current is not None:  # CMP-5: the reset ends the lineage's live tip, as routing does
            record = await LoadSession(current.session_id)
            if record is not None and rotation.lease_follows_tip(record.end_reason):
                current, _ = await _tip_of(current, record)
        routed = await _begin(current, source, key, limits, tools, now,
                              Cause.USER_RESET if current else Cause.CREATED, None, "user_reset",
                              end=session.USER_RESET_REASON)
        if routed is not None:
            return routed
    raise PersistenceError(f"reset {key!r}: lost the compare-and-set", cause="route_contention")


async def lane_of(key: str) -> Route:
    """The current route of a known key; BadInput for a malformed or unknown one."""
    found = await LoadRoute(session.check_session_key(key))
    if found is None:
        raise BadInput(f"unknown session: no route for key {key!r}")
    return found


# ---- the expiry watcher (SES-5, SES-6) ---------------------------------------------------


class Watch(Frozen):
    """What one pass of the watcher did: the keys it finalized and the keys it pruned."""

    finalized: tuple[str, ...] = ()
    pruned: tuple[str, ...] = ()


async def watch(limits: Limits) -> Watch:
    """One pass of the expiry watcher: finalize what expired, then retire what is idle past
    the prune age. Neither touches a lane with a live background process (SES-6)."""
    finalized = await finalize_expired(limits)
    return Watch(finalized=finalized, pruned=await prune_idle(limits))


async def finalize_expired(limits: Limits) -> tuple[str, ...]:
    """Finalize every expired live incarnation once: flag it and end its row (session_reset)."""
    now = await Now()
    routes = await LoadRoutes()
    live = await LiveBackground()
    policy, done = policy_of(limits), []
    for current in routes:
        if current.retired or not session.finalization_due(current, policy, now,
                                                           current.key in live):
            continue
        record = await LoadSession(current.session_id)
        if record is not None and record.ended_at is not None:
            continue  # already ended: nothing to finalize
        revised = current.revise(Cause.FINALIZED, now, expiry_finalized=True,
                                 order=limits.session_resolution_order)
        if await PutRoute(revised, current.session_id, FINALIZED_END_REASON):
            done.append(current.key)
    return tuple(done)


async def prune_idle(limits: Limits) -> tuple[str, ...]:
    """Retire every lane idle past ``session_prune_after_s``; its row is ended ``pruned``."""
    now = await Now()
    routes = await LoadRoutes()
    live = await LiveBackground()
    done = []
    for current in routes:
        if not session.prune_due(current, now, limits.session_prune_after_s,
                                 current.key in live):
            continue
        revised = current.revise(Cause.PRUNED, now, retired=True,
                                 order=limits.session_resolution_order)
        if await PutRoute(revised, current.session_id, PRUNED_END_REASON):
            done.append(current.key)
    return tuple(done)


# ---- process start and stop (SES-7) ---------------------------------------------------------


async def start(limits: Limits) -> Startup:
    """A process start: mark and suspend as ``lane_restart`` says, then consume the markers.

    The start is logged first, so a crash during the pass still shows a start; the counts
    it read are consumed last, so such a crash leaves them for the next start.
    """
    now = await Now()
    markers = await ReadMarkers()
    clean = lane_restart.CLEAN_EXIT in markers
    await WriteLane((), (LaneEntry(at=now, kind="start_clean" if clean else "start_unclean"),))
    routes = {r.key: r for r in await LoadRoutes()}
    marked = [] if clean else lane_restart.mark_recently_active(
        routes.values(), now, limits.restart_resume_window_s)
    written = await _put_each(marked)
    routes.update({r.key: r for r in written})
    stuck = lane_restart.suspend_stuck(routes.values(), lane_restart.restart_counts(markers),
                                       limits.stuck_restart_threshold, now)
    suspended = tuple(r.key for r in await _put_each(stuck))
    updates = lane_restart.startup_updates(markers, suspended)
    if updates:
        await WriteLane(tuple(updates.items()))
    return Startup(clean=clean, marked=tuple(r.key for r in written), suspended=suspended)


async def _put_each(routes: list[Route]) -> list[Route]:
    """Write each revision; the ones another writer beat are left out."""
    written = []
    for revised in routes:
        if await PutRoute(revised):
            written.append(revised)
    return written


async def shutdown(running: tuple[str, ...], drained: bool) -> None:
    """A graceful stop: count the keys still running; leave ``clean_exit`` if drained."""
    now = await Now()
    markers = await ReadMarkers()
    updates = lane_restart.shutdown_markers(markers, running, drained)
    log = (LaneEntry(at=now, kind="stop"),
           *(LaneEntry(at=now, kind="running", key=key) for key in running))
    await WriteLane(tuple(updates.items()), log)


async def after_turn(routed: Routed, result: TurnResult | None) -> None:
    """A successful turn clears its key's restart count, and the lane log says so: a process
    that dies between the turn's last commit and this write keeps the count."""
    if result is None or result.failed:
        return
    key = routed.route.key
    name = lane_restart.restart_marker(key)
    if name in await ReadMarkers():
        await WriteLane(((name, None),), (LaneEntry(at=await Now(), kind="cleared", key=key),))
