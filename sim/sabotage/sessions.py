"""Broken session lanes: threads split per user or never, short ids, an old row left open,
a new row left to the first turn, the released order in the reference's place, a daily
reset at midnight or an hour late inside the reset hour, a kept lane left untouched, a
notice on every message or never, a finalized row closed as an eviction, a closed row
revived, background processes ignored by expiry and by pruning, a restart window read in
minutes and a stuck threshold off by one (SES-1..SES-7)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

from hermes_ref import lane_restart, router, session
from hermes_ref.effects import PutRoute
from hermes_ref.models import SessionRecord
from hermes_ref.outcomes import TurnResult
from hermes_ref.session import Cause, Order, Route, SessionSource, Situation
from sim.sabotage.base import sabotage


def _threads_per_user() -> list[AbstractContextManager[Any]]:
    original = session.build_session_key

    def split(source: SessionSource, *, group_per_user: bool = True,
              thread_per_user: bool = False) -> str:
        return original(source, group_per_user=group_per_user, thread_per_user=True)
    return [mock.patch.object(session, "build_session_key", split)]


sabotage("threads_split_per_user", ("SES-1",),
         "the key builder ignores the thread setting: every participant of a thread gets "
         "a lane of their own")(_threads_per_user)


def _threads_always_shared() -> list[AbstractContextManager[Any]]:
    original = session.build_session_key

    def shared(source: SessionSource, *, group_per_user: bool = True,
               thread_per_user: bool = False) -> str:
        return original(source, group_per_user=group_per_user, thread_per_user=False)
    return [mock.patch.object(session, "build_session_key", shared)]


sabotage("thread_setting_ignored", ("SES-1",),
         "the key builder ignores thread_sessions_per_user: a thread stays one shared lane "
         "when the setting asks for a lane per participant")(_threads_always_shared)


def _six_hex_ids() -> list[AbstractContextManager[Any]]:
    def short(now_s: float, bits: int) -> str:
        stamp = datetime.fromtimestamp(now_s, tz=UTC).strftime("%Y%m%d_%H%M%S")
        return f"{stamp}_{bits & 0xFFFFFF:06x}"  # the agent-side format
    return [mock.patch.object(session, "incarnation_id", short)]


sabotage("six_hex_incarnation_ids", ("SES-2",),
         "incarnation ids take the agent-side 6 hex digits instead of 8")(_six_hex_ids)


def _old_row_left_open() -> list[AbstractContextManager[Any]]:
    def nothing(current: Route | None, reason: str | None) -> tuple[str | None, str | None]:
        return None, None
    return [mock.patch.object(router, "ending", nothing)]


sabotage("reset_leaves_the_old_row_open", ("SES-2",),
         "a reset writes the new incarnation's route but never ends the old session row")(
    _old_row_left_open)


def _row_left_to_the_first_turn() -> list[AbstractContextManager[Any]]:
    def route_only(route: Route, end_session_id: str | None = None, end_reason: str | None = None,
                   start: SessionRecord | None = None) -> PutRoute:
        return PutRoute(route, end_session_id, end_reason)  # "the first turn creates the row"
    return [mock.patch.object(router, "PutRoute", route_only)]


sabotage("route_leaves_the_row_to_the_turn", ("SES-2",),
         "a route that begins an incarnation writes no session row, leaving it to the first "
         "turn, so a reset before that turn runs has no row to end")(_row_left_to_the_first_turn)


def _released_order_in_reference() -> list[AbstractContextManager[Any]]:
    swapped = ("stale", "suspended", "policy", "resume_pending", "keep")
    return [mock.patch.dict(session.PRIORITY, {Order.REFERENCE: swapped})]


sabotage("policy_before_resume_pending", ("SES-3",),
         "the reference order evaluates the reset policy before resume_pending, as 0.19.0 "
         "does")(_released_order_in_reference)


def _daily_at_midnight() -> list[AbstractContextManager[Any]]:
    original = session.policy_reason

    def midnight(policy: session.ResetPolicy, updated_at: float, now: float) -> str | None:
        return original(policy.model_copy(update={"at_hour": 0}), updated_at, now)
    return [mock.patch.object(session, "policy_reason", midnight)]


sabotage("daily_reset_at_midnight", ("SES-3",),
         "the daily policy resets at midnight whatever the configured hour")(_daily_at_midnight)


def _boundary_hour_late() -> list[AbstractContextManager[Any]]:
    def an_hour_late(policy: session.ResetPolicy, updated_at: float, now: float) -> str | None:
        if policy.mode in (session.ResetMode.IDLE, session.ResetMode.BOTH) and \
                now > updated_at + policy.idle_minutes * 60:
            return "idle"
        if policy.mode in (session.ResetMode.DAILY, session.ResetMode.BOTH):
            moment = datetime.fromtimestamp(now, tz=UTC)
            boundary = moment.replace(hour=policy.at_hour, minute=0, second=0, microsecond=0)
            if moment.hour <= policy.at_hour:  # <= for <: the reset hour counts as the day before
                boundary -= timedelta(days=1)
            if updated_at < boundary.timestamp():
                return "daily"
        return None
    return [mock.patch.object(session, "policy_reason", an_hour_late)]


sabotage("daily_boundary_an_hour_late", ("SES-3",),
         "during the reset hour itself the daily boundary is taken from the day before, so a "
         "lane last active just before it is kept")(_boundary_hour_late)


def _kept_untouched() -> list[AbstractContextManager[Any]]:
    original = Route.revise

    def revise(self: Route, cause: Cause, at: float, **changes: Any) -> Route:
        if cause in (Cause.TOUCHED, Cause.RESUMED):
            changes.pop("updated_at", None)  # "a read is not activity"
        return original(self, cause, at, **changes)
    return [mock.patch.object(Route, "revise", revise)]


sabotage("kept_lane_not_touched", ("SES-3",),
         "a message that keeps its lane does not touch it, so the idle clock runs from the "
         "lane's last reset and an active lane expires as idle")(_kept_untouched)


def _notice_every_time() -> list[AbstractContextManager[Any]]:
    def always(route: Route, has_rows: bool) -> bool:
        return route.was_auto_reset and not route.notice_delivered
    return [mock.patch.object(session, "notice_due", always)]


sabotage("notice_on_every_message", ("SES-4",),
         "an automatic reset's notice is injected until the flag is set, not only before "
         "the first row")(_notice_every_time)


def _notice_dropped() -> list[AbstractContextManager[Any]]:
    original = router.turn_input

    def silent(routed: router.Routed, text: str, **extra: Any) -> Any:
        return original(routed.model_copy(update={"notice": None}), text, **extra)
    return [mock.patch.object(router, "turn_input", silent)]


sabotage("reset_notice_never_sent", ("SES-4",),
         "the turn is built from the route alone and the automatic reset's notice is never "
         "sent")(_notice_dropped)


def _finalized_as_closed() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(router, "FINALIZED_END_REASON", "agent_close")]


sabotage("finalized_row_closed_not_reset", ("SES-5",),
         "expiry finalization ends the row as agent_close (an evicted agent), not as a "
         "reset")(_finalized_as_closed)


def _stale_by_flag_only() -> list[AbstractContextManager[Any]]:
    def flag_only(s: Situation) -> str | None:
        return "session_reset" if s.route.expiry_finalized else None
    return [mock.patch.dict(session.RULES, {"stale": (flag_only, session.Action.NEW)})]


sabotage("stale_route_revives_closed_row", ("SES-5",),
         "routing trusts the route's flags and never looks at the session row, so a row "
         "closed elsewhere is written to again")(_stale_by_flag_only)


def _background_ignored() -> list[AbstractContextManager[Any]]:
    def policy_only(policy: session.ResetPolicy, updated_at: float, now: float,
                    background_live: bool) -> str | None:
        return session.policy_reason(policy, updated_at, now)
    return [mock.patch.object(session, "expiry_reason", policy_only)]


sabotage("background_process_ignored", ("SES-6",),
         "expiry reads the policy alone: a lane with a live background process expires "
         "too")(_background_ignored)


def _prune_ignores_background() -> list[AbstractContextManager[Any]]:
    original = session.prune_due

    def age_only(route: Route, now: float, prune_after_s: float, background_live: bool) -> bool:
        return original(route, now, prune_after_s, False)
    return [mock.patch.object(session, "prune_due", age_only)]


sabotage("prune_ignores_background", ("SES-6",),
         "pruning looks at the lane's age alone and retires a lane whose background "
         "process is still running")(_prune_ignores_background)


def _window_in_minutes() -> list[AbstractContextManager[Any]]:
    original = lane_restart.recently_active

    def minutes(route: Route, now: float, window_s: float) -> bool:
        return original(route, now, window_s * 60)
    return [mock.patch.object(lane_restart, "recently_active", minutes)]


sabotage("restart_window_in_minutes", ("SES-7",),
         "the restart resume window is read as minutes, so lanes idle for an hour are "
         "marked resume_pending")(_window_in_minutes)


def _threshold_off_by_one() -> list[AbstractContextManager[Any]]:
    original = lane_restart.suspend_stuck

    def strict(routes: Any, counts: Any, threshold: int, now: float) -> list[Route]:
        return original(routes, counts, threshold + 1, now)
    return [mock.patch.object(lane_restart, "suspend_stuck", strict)]


sabotage("stuck_threshold_off_by_one", ("SES-7",),
         "a lane is suspended only after more restarts than the threshold (> for >=)")(
    _threshold_off_by_one)


def _cleared_after_any_turn() -> list[AbstractContextManager[Any]]:
    original = router.after_turn

    async def after_turn(routed: router.Routed, result: TurnResult | None) -> None:
        if result is not None and result.failed:  # "a turn came back: the lane is not stuck"
            result = result.model_copy(update={"failed": False})
        await original(routed, result)
    return [mock.patch.object(router, "after_turn", after_turn)]


sabotage("failed_turn_clears_the_restart_count", ("SES-7",),
         "a turn that failed clears its lane's restart count as a successful one does, so a "
         "lane stuck across restarts is never suspended")(_cleared_after_any_turn)
