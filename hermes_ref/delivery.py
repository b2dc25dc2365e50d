"""Delivery: which committed events a client is handed, live and after a reconnect (DEL-2).

Theory of operation
-------------------
Every event of a turn carries ``turn_seq``, its place in the turn (1, 2, ...), stamped by
the driver when the event is emitted, beside the store-wide ``seq`` the store assigns at
commit. A client knows a turn by ``(session_id, turn_id)`` and remembers the last
``turn_seq`` it was handed.

Two rules make a client's view equal the durable record, exactly once:

* **Only what is committed is handed out.** Events are pending until a write commits
  them, and a crash drops pending events. A driver therefore publishes events to its
  ``Hub`` only after the write that committed them returned (``Hub.publish``), never
  when they are emitted: a client can never have seen an event that the record lacks.
* **A reconnect replays strictly after the last number seen.** ``replay(events, ...,
  after_seq)`` is every committed event of the turn with ``turn_seq > after_seq``, in
  order. Greater, not greater-or-equal: the event numbered ``after_seq`` was already
  handed out, and handing it again would show its text twice.

Every store's ``events_after(session_id, turn_id, after_seq)`` answers with ``replay``
over its committed events (the SQLite stores ask for ``turn_seq >= first_to_replay(n)``),
so the simulated and the SQLite stores keep one rule.
A subscriber that was live and then reconnects gets, from ``replay``, what it missed
while away; events it is handed live are the ones committed after that.

Everything here is pure: no I/O, no clock; a callback is called synchronously.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hermes_ref.models import Closing, Event, Opening

Listener = Callable[[Event], None]


def first_to_replay(after_seq: int) -> int:
    """The first number a client that has seen up to ``after_seq`` has not seen."""
    return after_seq + 1


def replay(events: Iterable[Event], session_id: str, turn_id: str, after_seq: int) -> tuple[Event, ...]:
    """The committed events of one turn after ``after_seq``, in ``turn_seq`` order."""
    first = first_to_replay(after_seq)
    mine = [e for e in events if e.session_id == session_id and e.turn_id == turn_id
            and e.turn_seq is not None and e.turn_seq >= first]
    return tuple(sorted(mine, key=lambda e: e.turn_seq or 0))


@dataclass(eq=False)
class Subscription:
    """One live subscriber: a session (and optionally one turn of it) and its callback."""

    session_id: str
    turn_id: str | None
    listener: Listener
    active: bool = True

    def wants(self, event: Event) -> bool:
        return self.active and event.session_id == self.session_id and (
            self.turn_id is None or event.turn_id == self.turn_id)


@dataclass
class Hub:
    """Live subscriptions of one process; a driver publishes only committed events."""

    subscriptions: list[Subscription] = field(default_factory=list)

    def subscribe(self, session_id: str, listener: Listener, turn_id: str | None = None,
                  ) -> Subscription:
        sub = Subscription(session_id, turn_id, listener)
        self.subscriptions.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        sub.active = False
        self.subscriptions = [s for s in self.subscriptions if s is not sub]

    def publish(self, committed: Iterable[Event]) -> None:
        """Hand events that a write has just committed to whoever subscribed to them."""
        if not self.subscriptions:
            return
        for event in committed:
            for sub in list(self.subscriptions):
                if sub.wants(event):
                    sub.listener(event)


class TurnSeqs:
    """The driver's per-turn counters: the next ``turn_seq`` of each turn it emits for.

    A turn's counter is dropped at its completion event, its last (DEL-1), so a
    long-running process keeps one small entry per turn in flight.
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], int] = {}

    def stamp(self, event: Event, now: float) -> Event:
        """The event with its ``at`` (if unset) and its ``turn_seq`` (if unset)."""
        update: dict[str, object] = {}
        if event.at is None:
            update["at"] = now
        if event.turn_seq is None:
            # by turn alone: a turn that a rotation moves to a child session keeps counting
            key = ("", event.turn_id)  # (CMP-5); turn ids are unique within a store
            seq = self._last.get(key, 0) + 1
            self._last[key] = seq
            update["turn_seq"] = seq
            if event.kind == "turn.completed":
                self._last.pop(key, None)
        return event.model_copy(update=update) if update else event

    def number_opening(self, opening: Opening | None, now: float) -> Opening | None:
        """An ``Opening`` whose events are numbered now, as ``Emit`` would number them: they
        are the turn's first, and they commit with the grant or not at all."""
        if opening is None or not opening.events:
            return opening
        return opening.model_copy(update={"events": self._numbered(opening.events, now)})

    def number_closing(self, closing: Closing, now: float) -> Closing:
        """A ``Closing`` whose events are numbered now, as ``Emit`` would number them: they
        are the turn's last (its counter ends with the completion)."""
        if not closing.events:
            return closing
        return closing.model_copy(update={"events": self._numbered(closing.events, now)})

    def _numbered(self, events: tuple[Event, ...], now: float) -> tuple[Event, ...]:
        return tuple(self.stamp(e, now) for e in events)

    def settle_closing(self, closing: Closing, committed: bool) -> None:
        """Events of a closing that did not commit never existed: the turn's counter goes back
        to where it stood, and the ending the turn then emits is numbered from there."""
        if committed or not closing.events:
            return
        first = closing.events[0]
        key, before = ("", first.turn_id), (first.turn_seq or 1) - 1
        if before > 0:
            self._last[key] = before
        else:
            self._last.pop(key, None)

    def settle_opening(self, opening: Opening | None, committed: bool) -> None:
        """Events of an opening that did not commit never existed: the turn's counter is
        dropped, so the turn numbers the events it emits itself from 1 again."""
        if opening is not None and opening.events and not committed:
            self._last.pop(("", opening.events[0].turn_id), None)
