"""Restart recovery of session lanes (SES-7), as pure functions over routes and markers.

Theory of operation
-------------------
A process that stops gracefully leaves two kinds of durable markers: ``clean_exit`` (only
when its drain finished) and a restart count per key whose turn was still running
(``restarts:<key>``, incremented; keys not running are dropped). A hard crash leaves
neither. The next process start reads them once:

* without ``clean_exit``, every live lane active in the last ``restart_resume_window_s``
  becomes resume_pending with reason ``restart_interrupted`` (suspended and already
  pending lanes are skipped);
* a key whose count reached ``stuck_restart_threshold`` is suspended;
* the clean-exit marker and the counts of suspended keys are consumed, and the start is
  written to the lane log with whether it found the clean-exit marker, so a checker can
  tell which starts owed a marking pass.

A successful turn deletes its key's count. Every function here returns new values; the
router (``hermes_ref.router``) writes them through effects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hermes_ref.models import Frozen
from hermes_ref.session import Cause, Route

CLEAN_EXIT = "clean_exit"
RESTARTS = "restarts:"
RESTART_INTERRUPTED = "restart_interrupted"


class LaneEntry(Frozen):
    """One line of the lane log: a process start or stop, a running key at a stop, or a
    background process starting or ending for a key."""

    at: float
    # start_clean | start_unclean | stop | running | cleared (a successful turn reset the
    # key's restart count) | background_started | background_ended
    kind: str
    key: str = ""


def restart_marker(key: str) -> str:
    return f"{RESTARTS}{key}"


def restart_counts(markers: Mapping[str, float]) -> dict[str, int]:
    """The per-key restart counts among ``markers``."""
    return {name[len(RESTARTS):]: int(value) for name, value in markers.items()
            if name.startswith(RESTARTS)}


def recently_active(route: Route, now: float, window_s: float) -> bool:
    """Active within the window, neither suspended nor pending nor finalized nor pruned."""
    return (not route.suspended and not route.resume_pending and not route.expiry_finalized
            and not route.retired and route.updated_at >= now - window_s)


def mark_recently_active(routes: Iterable[Route], now: float, window_s: float) -> list[Route]:
    """The resume_pending revisions a start without the clean-exit marker writes."""
    return [route.revise(Cause.MARKED, now, resume_pending=True,
                         resume_reason=RESTART_INTERRUPTED, resume_marked_at=now)
            for route in routes if recently_active(route, now, window_s)]


def suspend_stuck(routes: Iterable[Route], counts: Mapping[str, int], threshold: int,
                  now: float) -> list[Route]:
    """The suspensions of keys still running across ``threshold`` restarts."""
    return [route.revise(Cause.SUSPENDED, now, suspended=True) for route in routes
            if counts.get(route.key, 0) >= threshold and not route.suspended
            and not route.expiry_finalized and not route.retired]


def shutdown_markers(markers: Mapping[str, float], running: Iterable[str],
                     drained: bool) -> dict[str, float | None]:
    """The marker updates of a graceful stop: running keys +1, the others dropped, and
    ``clean_exit`` only when the drain finished."""
    counts = restart_counts(markers)
    keep = set(running)
    updates: dict[str, float | None] = {restart_marker(k): None for k in counts if k not in keep}
    updates.update({restart_marker(k): float(counts.get(k, 0) + 1) for k in sorted(keep)})
    updates[CLEAN_EXIT] = 1.0 if drained else None
    return updates


def startup_updates(markers: Mapping[str, float],
                    suspended: Iterable[str] = ()) -> dict[str, float | None]:
    """A start consumes the clean-exit marker and the counts of the keys it suspended; the
    other counts stay, for the next graceful stop to raise or drop."""
    updates: dict[str, float | None] = {CLEAN_EXIT: None} if CLEAN_EXIT in markers else {}
    updates.update({restart_marker(key): None for key in suspended
                    if restart_marker(key) in markers})
    return updates
