"""The simulator's side of session lanes (SES): route and marker effects, and their narration.

Theory of operation
-------------------
``LaneHandlers`` is the part of ``SimDriver`` that performs the router's effects. Writes
(``PutRoute``, ``WriteLane``) are store writes of the process, carrying its pending events
like every write. ``RandomBits`` draws from the world's seeded chooser, sub-stream
``incarnation`` (or the one the effect names), and logs the draw, so incarnation ids
replay with the seed. ``LiveBackground`` is read from the store's lane log, where the
world records each background process it starts and ends (``Story.background``).

Every route write is narrated as one ``route`` line: the key, the revision, the cause and
the incarnation, so a snapshot shows each transition of a lane; a revision that begins
an incarnation is followed by the creation of its session row, in the same write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hermes_ref import effects as fx
from sim.world import LaneEffect, World


class LaneHandlers:
    """Mixed into ``SimDriver``; relies on its ``world`` and ``_write``."""

    world: World

    _write: Callable[..., Any]  # SimDriver's (declared here, defined there)
    process: Any  # SimDriver's process (its ``pid``)

    def lane_handlers(self) -> dict[type[Any], Callable[[Any], Any]]:
        store = self.world.store
        return {
            fx.RandomBits: self._random_bits,
            fx.LoadRoute: lambda e: store.get_route(e.key),
            fx.LoadRoutes: self._load_routes,
            fx.PutRoute: self._put_route,
            fx.LoadSession: lambda e: store.get_session(e.session_id),
            fx.ReadMarkers: lambda e: store.read_markers(),
            fx.WriteLane: self._write_lane,
            fx.LiveBackground: lambda e: store.live_background(),
        }

    def _random_bits(self, effect: fx.RandomBits) -> int:
        chooser = self.world.chooser
        value = chooser.stream(effect.stream).getrandbits(effect.bits)
        chooser.log.append((effect.stream, value))
        return value

    def _log_lane(self, what: str, key: str = "", revision: int = 0) -> None:
        """Log a lane effect in world order (SES-7: what a start pass read, and when)."""
        world = self.world
        world.lane_effects.append(LaneEffect(what, self.process.pid, world.effects_performed,
                                             key, revision))

    def _load_routes(self, effect: fx.LoadRoutes) -> Any:
        routes = self.world.store.latest_routes()
        self._log_lane("read")
        return routes

    def _put_route(self, effect: fx.PutRoute) -> bool:
        route = effect.route
        taken: bool = self._write(self.world.store.put_route, route, effect.end_session_id,
                                  effect.end_reason, effect.start)
        if taken:
            self._log_lane("route", route.key, route.revision)
        if self.world.timeline.enabled:
            flags = [name for name in ("suspended", "resume_pending", "was_auto_reset",
                                       "is_fresh_reset", "expiry_finalized", "retired",
                                       "notice_delivered")
                     if getattr(route, name)]
            ended = (f" ends {effect.end_session_id} ({effect.end_reason})"
                     if effect.end_session_id and effect.end_reason else "")
            state = "" if taken else " REFUSED (revision taken)"
            self.world.timeline.add(
                "route", f"{route.key} r{route.revision} {route.cause.value} -> "
                f"{route.session_id}{' [' + ','.join(flags) + ']' if flags else ''}"
                f"{ended}{state}")
            if taken and effect.start is not None:
                self.world.timeline.add("write", f"session   {effect.start.id} created")
        return taken

    def _write_lane(self, effect: fx.WriteLane) -> None:
        self._write(self.world.store.write_lane, effect.markers, effect.log)
        if any(entry.kind.startswith("start") for entry in effect.log):
            self._log_lane("start")
        if self.world.timeline.enabled:
            for entry in effect.log:
                self.world.timeline.add("lane", f"{entry.kind}{' ' + entry.key if entry.key else ''}")
            changed = ", ".join(f"{name}={'-' if value is None else f'{value:g}'}"
                                for name, value in effect.markers)
            if changed:
                self.world.timeline.add("markers", changed)
