"""Restart recovery of session lanes (SES-7), judged from the lane log and the route revisions.

Theory of operation
-------------------
The lane log says when each process started (with or without the clean-exit marker) and
stopped (with the keys whose turns were still running), and when a successful turn cleared
its key's restart count (``cleared``: the write after the turn, which a process that dies
right after the turn's last commit never makes, so its completion event alone proves
nothing; a clearing must follow a durable successful completion of that key since the last
clearing, stop or start, or the count was dropped for a turn that failed). From those
alone this checker derives, for every start, which lanes it owed a resume_pending mark (a
start without the marker: lanes active within ``restart_resume_window_s``, neither
suspended nor pending) and which it owed a suspension (still running across
``stuck_restart_threshold`` graceful stops in a row, with no cleared count between), and
demands exactly those revisions at that start: a mark missing is a violation as much as
one too many. A start whose process died before its pass ended (before the watcher pass
that follows it read the routes) is excused only the revisions it did not write: the
counts it had not yet consumed make an unwritten suspension the next start's to write.

Entries at one instant are ordered completions, clearings, stops, then starts; the revisions a
start owed are those at its instant with the start pass's causes, and the state it judged
is the last revision before the first one written by the start pass or the watcher pass
that follows it.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from hermes_ref.models import EventKind
from hermes_ref.session import Route
from sim.checkers.base import Observation, Violation, checker
from sim.checkers.lineage import roots

_PASS = ("restart_interrupted", "stuck")
_AFTER_START = (*_PASS, "expiry_finalized", "pruned")  # the start pass, then the watcher


def _timeline(obs: Observation) -> list[tuple[float, int, int, str, str]]:
    """(at, rank, seq, kind, key): successful turns, cleared counts, stops, running keys,
    starts.

    A turn's completion is filed under the session it ended on, which a rotation may have
    moved to a child no route names yet (CMP-5): it counts for the key whose route names
    any session of that lineage."""
    root = roots(obs.record)
    keys = {root.get(r.session_id, r.session_id): r.key for r in obs.record.routes}
    items: list[tuple[float, int, int, str, str]] = []
    for seq, event in enumerate(obs.record.events):
        lineage = root.get(event.session_id or "", event.session_id or "")
        if event.kind == EventKind.TURN_COMPLETED and event.data.get("failed") is False \
                and lineage in keys:
            items.append((event.at or 0.0, 0, seq, "ok", keys[lineage]))
    for seq, entry in enumerate(obs.record.lane_log):
        # the lane log's own order among its entries (one rank): it is the order of the writes
        rank = 1 if entry.kind in ("cleared", "stop", "running", "start_clean",
                                   "start_unclean") else None
        if rank is not None:
            items.append((entry.at, rank, seq, entry.kind, entry.key))
    return sorted(items)


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _before(revisions: list[Route], at: float, order: _Order) -> Route | None:
    """The key's revision in force as a start at ``at`` began: the last one before the
    first revision at ``at`` that a start pass or its watcher pass wrote, or that was
    written after the pass read the routes (a lane created at the start's instant, after
    it: effects share instants, and the world's effect order says which came first)."""
    found = None
    for route in revisions:
        if route.at > at or (route.at == at and (route.cause.value in _AFTER_START
                                                 or order.after_read(route))):
            break
        found = route
    return found


class _Order:
    """Where the world logged it (``Observation.lane_effects``), the effect at which one
    start pass loaded the routes it judged, and the effect of each route revision."""

    def __init__(self, obs: Observation, start: int) -> None:
        effects = obs.lane_effects or ()
        starts = [e for e in effects if e.what == "start"]
        self.read: int | None = None
        self.cut_short = False
        if start < len(starts):
            mine = starts[start]
            reads = [e.seq for e in effects if e.what == "read"
                     and e.pid == mine.pid and e.seq > mine.seq]
            self.read = reads[0] if reads else None
            # the pass ends where its watcher pass reads the routes again; a process that
            # died before that never finished it
            died = dict(obs.death_seqs).get(mine.pid)
            self.cut_short = died is not None and died > mine.seq and (
                len(reads) < 2 or died < reads[1])
        self.written = {(e.key, e.revision): e.seq for e in effects if e.what == "route"}

    def after_read(self, route: Route) -> bool:
        """The revision was written after the pass read the routes (unknown: not after)."""
        seq = self.written.get((route.key, route.revision))
        return self.read is not None and seq is not None and seq > self.read


def _judge_start(obs: Observation, at: float, clean: bool, streak: dict[str, int],
                 revisions: dict[str, list[Route]], order: _Order) -> list[Violation]:
    out: list[Violation] = []
    window, threshold = obs.limits.restart_resume_window_s, obs.limits.stuck_restart_threshold
    for key, routes in sorted(revisions.items()):
        pre = _before(routes, at, order)
        if pre is None:
            continue
        done = {r.cause.value for r in routes if r.at == at and r.cause.value in _PASS}
        active = (not pre.suspended and not pre.resume_pending and not pre.expiry_finalized
                  and not pre.retired and pre.updated_at >= at - window)
        want_mark = not clean and active
        # a pass its process did not live to finish owes nothing it did not write; what it
        # wrote it must still have owed, and an unwritten suspension falls to the next start
        if want_mark != ("restart_interrupted" in done) and not (want_mark and order.cut_short):
            out.append(Violation("restart_marking", "SES-7", f"start at {_when(at)} ("
                                 f"{'clean' if clean else 'no clean-exit marker'}): {key} "
                                 f"{'owed' if want_mark else 'got'} a resume_pending mark "
                                 f"(last active {at - pre.updated_at:g} s before)"))
        want_stuck = (streak[key] >= threshold and not pre.suspended
                      and not pre.expiry_finalized and not pre.retired)
        if want_stuck != ("stuck" in done) and not (want_stuck and order.cut_short):
            out.append(Violation("restart_marking", "SES-7", f"start at {_when(at)}: {key} was "
                                 f"running across {streak[key]} restarts and "
                                 f"{'was not' if want_stuck else 'was'} suspended"))
        if "stuck" in done:
            streak[key] = 0
    return out


@checker("restart_marking", ("SES-7",),
         "a start without the clean-exit marker marks the recently active lanes "
         "resume_pending; a lane running across the threshold of restarts is suspended")
def restart_marking(obs: Observation) -> list[Violation]:
    revisions: dict[str, list[Route]] = defaultdict(list)
    for route in sorted(obs.record.routes, key=lambda r: (r.key, r.revision)):
        revisions[route.key].append(route)
    streak: dict[str, int] = defaultdict(int)
    running: set[str] | None = None
    oks: dict[str, list[float]] = defaultdict(list)  # successful turns not yet behind a clearing
    cleared: dict[str, float] = {}  # each key's last clearing
    floor = 0.0  # the last stop or start
    starts = 0  # the starts judged so far: the next one is the lane log's start ``starts``
    out: list[Violation] = []
    for at, _, _, kind, key in _timeline(obs):
        if kind != "running" and running is not None:  # the stop's running keys are all in
            for other in list(streak):
                if other not in running:
                    streak[other] = 0
            for name in running:
                streak[name] += 1
            running = None
        if kind == "ok":
            oks[key].append(at)
        elif kind == "cleared":
            since = max(floor, cleared.get(key, 0.0))
            if not any(since <= t <= at for t in oks[key]):  # at one instant either order holds
                out.append(Violation("restart_marking", "SES-7", f"at {_when(at)} the restart "
                                     f"count of {key} was cleared with no successful turn of "
                                     "it since the last clearing, stop or start"))
            streak[key] = 0
            oks[key] = [t for t in oks[key] if t > at]
            cleared[key] = at
        elif kind == "stop":
            running = set()
            floor = at
        elif kind == "running" and running is not None:
            running.add(key)
        elif kind.startswith("start"):
            floor = at
            out += _judge_start(obs, at, kind == "start_clean", streak, revisions,
                                _Order(obs, starts))
            starts += 1
    return out
