"""Session lanes in the simulator's memory store: route revisions, markers, the lane log.

Theory of operation
-------------------
A mixin of ``MemoryStore`` with the same contract as the SQLite stores
(``hermes_ref.shell.sqlite_routes``):

* routes are an append-only log of revisions; ``put_route`` takes a revision only if it is
  its key's next one (compare-and-set) and, in the same commit, ends the session row it
  names (first reason wins, a missing row is left alone) and creates the row of the
  incarnation it begins (``start``, unless it exists). Nothing is deleted.
* markers are a small name -> value map (``clean_exit``, ``restarts:<key>``); ``write_lane``
  sets and drops markers and appends lane-log entries as one commit.
* ``live_background`` is read from the lane log: a key whose last background entry is a
  start has a live background process.

Every write commits the pending events, like every other write of the store.
"""

from __future__ import annotations

from hermes_ref.lane_restart import LaneEntry
from hermes_ref.models import Message, SessionRecord
from hermes_ref.ports import DurableRecord
from hermes_ref.session import Route


class RouteStoreMixin:
    """Route, marker and lane-log state of ``MemoryStore`` (SES)."""

    _sessions: dict[str, SessionRecord]
    _by_session: dict[str, list[Message]]

    def _init_routes(self) -> None:
        self._routes: list[Route] = []
        self._route_heads: dict[str, Route] = {}
        self._markers: dict[str, float] = {}
        self._lane_log: list[LaneEntry] = []

    def _commit_events(self) -> None:  # provided by MemoryStore
        raise NotImplementedError

    def put_route(self, route: Route, end_session_id: str | None = None,
                  end_reason: str | None = None, start: SessionRecord | None = None) -> bool:
        head = self._route_heads.get(route.key)
        if route.revision != (head.revision if head else 0) + 1:
            self._commit_events()
            return False  # another writer got there first: no route is written
        self._routes.append(route)
        self._route_heads[route.key] = route
        if end_session_id is not None and end_reason is not None:
            current = self._sessions.get(end_session_id)
            if current is not None and current.ended_at is None:
                self._sessions[end_session_id] = current.model_copy(
                    update={"ended_at": route.at, "end_reason": end_reason})
        if start is not None and start.id not in self._sessions:
            self._sessions[start.id] = start
            self._by_session.setdefault(start.id, [])
        self._commit_events()
        return True

    def get_route(self, key: str) -> Route | None:
        return self._route_heads.get(key)

    def latest_routes(self) -> tuple[Route, ...]:
        return tuple(self._route_heads[key] for key in sorted(self._route_heads))

    def read_markers(self) -> dict[str, float]:
        return dict(self._markers)

    def write_lane(self, markers: tuple[tuple[str, float | None], ...],
                   log: tuple[LaneEntry, ...] = ()) -> None:
        for name, value in markers:
            if value is None:
                self._markers.pop(name, None)
            else:
                self._markers[name] = value
        self._lane_log.extend(log)
        self._commit_events()

    def live_background(self) -> frozenset[str]:
        live: set[str] = set()
        for entry in self._lane_log:
            if entry.kind == "background_started":
                live.add(entry.key)
            elif entry.kind == "background_ended":
                live.discard(entry.key)
        return frozenset(live)

    def _with_routes(self, record: DurableRecord) -> DurableRecord:
        return record.model_copy(update={
            "routes": tuple(self._routes), "markers": tuple(sorted(self._markers.items())),
            "lane_log": tuple(self._lane_log)})
