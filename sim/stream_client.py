"""A simulated client of a session's event stream: live, disconnected, reconnected (DEL-2).

Theory of operation
-------------------
A ``SimClient`` follows one session the way a chat UI follows a gateway. It subscribes
to the world's live feed (``World.hub``: only committed events are published there) and
records every event it is handed, with how it came (``live`` or ``replay``). It knows a
turn by the first event of it that it sees, and remembers the last ``turn_seq`` it was
handed per turn.

It disconnects after ``disconnect_after`` live events (scripted, or drawn from the
world's seed with ``seeded``): from then on nothing is handed to it. It reconnects
either after ``away_for`` more events were committed while it was away, or when the
story says so (``reconnect``, e.g. after the producing process crashed and a new one
started). A reconnect asks the store for each known turn's events after its last number
(``events_after``, the replay a real client makes with its cursor) and then listens live
again. The world drives it at commit points only: a due reconnect is made after the
feed has finished publishing a commit (``settle``), never in the middle of one, so the
replay and the live feed meet at a commit boundary, as a client's replay-then-subscribe
does under the store's lock.

Everything a client saw is kept in ``seen``; the checkers judge it against the durable
log (``sim.checkers.streaming``). The client never deduplicates or reorders what it is
handed: whatever the engine hands it twice, it shows twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hermes_ref.delivery import Subscription
from hermes_ref.models import Event
from sim.world import World


@dataclass(frozen=True, slots=True)
class Seen:
    """One event as a client was handed it."""

    event: Event
    via: Literal["live", "replay"]
    connection: int  # 1 for the first connection, 2 after the first reconnect, ...


@dataclass(eq=False)
class SimClient:
    world: World
    session_id: str
    name: str = "client-1"
    disconnect_after: int | None = None  # live events before it drops; None: never
    away_for: int | None = None  # committed events missed before it comes back; None: story
    seen: list[Seen] = field(default_factory=list)
    last_seq: dict[str, int] = field(default_factory=dict)  # turn id -> last turn_seq handed
    connection: int = 1
    connected: bool = True
    missed: int = 0  # events committed while it was away (the world counts them)
    _sub: Subscription | None = None
    _due: bool = False

    @classmethod
    def join(cls, world: World, session_id: str, *, name: str = "client-1",
             disconnect_after: int | None = None, away_for: int | None = None) -> SimClient:
        """A client of ``session_id``, subscribed from now on and listed in the world."""
        client = cls(world, session_id, name, disconnect_after, away_for)
        client._sub = world.hub.subscribe(session_id, client._handed)
        world.clients.append(client)
        world.timeline.add("client", f"{client.name} follows {session_id}")
        return client

    @classmethod
    def seeded(cls, world: World, session_id: str, name: str = "client-1") -> SimClient:
        """A client whose disconnect point and absence are drawn from the world's seed."""
        draw = world.chooser.stream(f"client:{name}")
        return cls.join(world, session_id, name=name, disconnect_after=draw.randrange(1, 8),
                        away_for=draw.randrange(1, 6))

    def _handed(self, event: Event) -> None:
        if not self.connected:
            self.missed += 1
            if self.away_for is not None and self.missed >= self.away_for:
                self._due = True  # made in ``settle``, once this commit is fully published
            return
        self._take(event, "live")
        live = sum(1 for s in self.seen if s.via == "live")
        if self.disconnect_after is not None and live >= self.disconnect_after \
                and self.connection == 1:
            self.connected = False
            self.world.timeline.add("client", f"{self.name} disconnects after "
                                    f"{self._cursor()}")

    def _take(self, event: Event, via: Literal["live", "replay"]) -> None:
        self.seen.append(Seen(event, via, self.connection))
        if event.turn_seq is not None:
            self.last_seq[event.turn_id] = max(self.last_seq.get(event.turn_id, 0),
                                               event.turn_seq)

    def disconnect(self) -> None:
        """The connection drops (its server process died, say); nothing is handed meanwhile."""
        self.connected = False
        self.world.timeline.add("client", f"{self.name} disconnected at {self._cursor()}")

    def settle(self) -> None:
        """A commit has been published: make a reconnect that fell due meanwhile."""
        if self._due:
            self.reconnect()

    def reconnect(self) -> None:
        """Come back: replay each known turn after its last number, and each turn of the
        session that began while it was away from its first, then listen live."""
        self._due = False
        self.connection += 1
        replayed, cursor = 0, self._cursor()
        for turn_id in self._began_while_away():
            self.last_seq.setdefault(turn_id, 0)
        for turn_id, last in list(self.last_seq.items()):
            for event in self.world.store.events_after(self.session_id, turn_id, last):
                self._take(event, "replay")
                replayed += 1
        self.connected = True
        self.world.timeline.add("client", f"{self.name} reconnects after {cursor}: "
                                f"{replayed} replayed")

    def _began_while_away(self) -> list[str]:
        """Turns of the session it was never handed an event of, though their events were
        committed after its last one (the session's turn list a client asks for anew)."""
        if not self.missed:
            return []
        seen = max((s.event.seq or 0 for s in self.seen), default=0)
        return list(dict.fromkeys(e.turn_id for e in self.world.store.snapshot().events
                                  if e.session_id == self.session_id and (e.seq or 0) > seen
                                  and e.turn_id not in self.last_seq))

    def _cursor(self) -> str:
        return ", ".join(f"{t}#{n}" for t, n in self.last_seq.items()) or "nothing"

    def text(self, turn_id: str, call: int | None = None) -> str:
        """The visible text this client was shown for a turn (one call of it, if given)."""
        return "".join(str(s.event.data.get("text", "")) for s in self.seen
                       if s.event.turn_id == turn_id and s.event.kind == "delta.text"
                       and (call is None or s.event.data.get("call") == call))
