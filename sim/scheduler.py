"""Several simulated processes in one world: actors, waits and the seeded interleaving.

Theory of operation
-------------------
An *actor* is one engine coroutine (a turn, a lease refresher, a door's drain step) that
belongs to one simulated *process*. The scheduler owns every actor of the world. At each
step it looks at the actors that can run now and picks one: when only one can, that one;
when several can, the world's seeded chooser picks (sub-stream ``schedule``), so the
interleaving of several processes is part of the seed and a seed replays exactly. The
chosen actor's driver performs exactly one of its effects; effects are atomic, so two
actors never interleave inside one store write.

An effect that takes time (a sleep, a tool batch, a slow provider reply) does not move
the clock itself: its handler answers with a ``Wait`` (how long, and what to do when the
time is up), and the actor is parked until that deadline. When no actor can run, the
virtual clock jumps to the earliest deadline (ties go to the actor that has waited
longest, then to the oldest actor). Between those jumps time stands still, so every
other actor, a lease refresher for instance, gets its turn at its own deadline even while
a 420 s tool batch is in flight.

A crash takes down one process: every actor of that process is closed where it stands
(an engine coroutine is only ever suspended at an effect, so nothing after that point
runs) and the process's pending writes are dropped; the other processes run on.

An *interrupt* is a mark on a turn actor (a lost lease raises one). It is delivered as a
``TurnInterrupted`` error from the next effect that would take time or call out (a model
call, a tool batch, a sleep), and at once if the actor is parked in one of those.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sim.driver import SimDriver


@dataclass(frozen=True, slots=True)
class Wait:
    """An effect's answer that arrives ``seconds`` from now: ``then()`` computes it.

    ``then`` may itself return another ``Wait`` (a tool batch of several waves), and it
    may raise an ``OperatingError``, which the actor then receives.
    """

    seconds: float
    then: Callable[[], Any]


@dataclass(eq=False)
class Actor:
    """One coroutine of one process, and what it is waiting for."""

    seq: int
    name: str
    driver: SimDriver
    coro: Coroutine[Any, Any, Any]
    parent: Actor | None = None
    value: Any = None
    error: BaseException | None = None
    wait: Wait | None = None
    wake_at: float = 0.0
    pending: Any = None          # the effect a parked actor waits on
    interrupt: str | None = None  # why the turn must stop (kept until the turn clears it)
    done: bool = False
    crashed: str | None = None    # the crash point that took its process down
    turn_id: str | None = None    # the first turn id this actor minted (a turn's own id)
    result: Any = None
    raised: BaseException | None = None
    children: list[Actor] = field(default_factory=list)

    @property
    def runnable(self) -> bool:
        return not self.done and self.wait is None

    @property
    def pid(self) -> int:
        return self.driver.process.pid


class Scheduler:
    """Every actor of one world; ``run_until`` steps them in seeded order."""

    def __init__(self, pick: Callable[[int], int], now: Callable[[], float],
                 advance_to: Callable[[float], None]) -> None:
        self._pick = pick
        self._now = now
        self._advance_to = advance_to
        self._seq = 0
        self.ends = 0  # actors that ended so far (a step that ends none changes no log of ends)
        self.actors: list[Actor] = []
        self._ready: list[Actor] = []
        self._parked: list[tuple[float, int, int, Actor]] = []  # (deadline, park order, seq)
        self._parks = 0
        self._frozen: dict[int, float] = {}  # pid -> until when none of its actors runs
        self._frozen_until = 0.0  # the end of the latest stall: after it, no actor is frozen
        self._timers: list[tuple[float, int, Callable[[], None]]] = []  # (at, order, what)

    def spawn(self, driver: SimDriver, coro: Coroutine[Any, Any, Any], name: str,
              parent: Actor | None = None) -> Actor:
        self._seq += 1
        actor = Actor(self._seq, name, driver, coro, parent=parent)
        if parent is not None:
            parent.children.append(actor)
        self.actors.append(actor)
        self._ready.append(actor)
        return actor

    # -- parking --------------------------------------------------------------------
    def park(self, actor: Actor, effect: Any, wait: Wait) -> None:
        actor.wait, actor.pending = wait, effect
        actor.wake_at = self._now() + max(0.0, wait.seconds)
        self._parks += 1
        heapq.heappush(self._parked, (actor.wake_at, self._parks, actor.seq, actor))
        self._discard_ready(actor)

    def unpark(self, actor: Actor) -> None:
        """Make a parked actor runnable now (its wait was cut short)."""
        actor.wait, actor.pending = None, None
        if actor not in self._ready:
            self._ready.append(actor)

    def retire(self, actor: Actor) -> None:
        actor.wait, actor.pending = None, None
        self._discard_ready(actor)

    def _discard_ready(self, actor: Actor) -> None:
        if actor in self._ready:
            self._ready.remove(actor)

    def freeze(self, pid: int, until: float) -> None:
        """No actor of process ``pid`` runs before ``until`` (a stalled, not a dead, process)."""
        self._frozen[pid] = max(until, self._frozen.get(pid, 0.0))
        self._frozen_until = max(self._frozen_until, until)

    def at(self, when: float, what: Callable[[], None]) -> None:
        """Do ``what`` (a harness action: stall or kill a process) at virtual time ``when``."""
        self._parks += 1
        heapq.heappush(self._timers, (when, self._parks, what))

    def _thawed(self, actor: Actor) -> bool:
        return self._frozen.get(actor.pid, 0.0) <= self._now()

    # -- stepping -------------------------------------------------------------------
    def run_until(self, done: Callable[[], bool]) -> None:
        """Step actors until ``done()`` holds or nothing is left to run."""
        while not done():
            if not self.step():
                return

    def step(self) -> bool:
        """Advance one actor by one effect (or wake the next parked one); False when idle."""
        ready = self._ready
        for a in ready:  # runnable only; a list is made again only when one is not
            if a.done or a.wait is not None:
                ready = self._ready = [a for a in ready if not a.done and a.wait is None]
                break
        stalled = self._frozen_until > self._now()  # some stall is not over: leave its actors out
        active = [a for a in ready if self._thawed(a)] if stalled else ready
        if not active:
            return self._wake_next(frozen=[a for a in ready if a not in active])
        actor = active[0] if len(active) == 1 else active[self._pick(len(active))]
        actor.driver.advance(actor)
        if actor.done or actor.wait is not None:
            self._discard_ready(actor)
        return True

    def _wake_next(self, frozen: list[Actor] | None = None) -> bool:
        """Move the clock to the next thing that can happen and let it happen: a timer, a
        parked actor's deadline, or the end of a stall, whichever comes first."""
        thaw = min((self._frozen[a.pid] for a in frozen), default=None) if frozen else None
        while True:
            self._settle_top()
            if self._timers and self._timer_first(thaw):
                when, _, what = heapq.heappop(self._timers)
                if when > self._now():
                    self._advance_to(when)
                what()
                return True
            if self._parked and (thaw is None or self._parked[0][0] < thaw):
                deadline, _, _, actor = heapq.heappop(self._parked)
                if deadline > self._now():
                    self._advance_to(deadline)
                actor.driver.resume(actor)
                if actor.runnable and actor not in self._ready:
                    self._ready.append(actor)
                return True
            if thaw is not None:
                self._advance_to(max(thaw, self._now()))
                return True
            return False

    def _settle_top(self) -> None:
        """Drop stale entries off the top of the parked heap; move a stalled process's
        deadlines to the end of its stall (then look again)."""
        while self._parked:
            deadline, _, _, actor = self._parked[0]
            if actor.done or actor.wait is None or actor.wake_at != deadline:
                heapq.heappop(self._parked)  # finished, crashed, or woken early
                continue
            until = self._frozen.get(actor.pid, 0.0)
            if until <= deadline:
                return
            heapq.heappop(self._parked)
            actor.wake_at = until
            self._parks += 1
            heapq.heappush(self._parked, (until, self._parks, actor.seq, actor))

    def _timer_first(self, thaw: float | None) -> bool:
        """Is the earliest timer due no later than anything else that could happen? (The
        parked heap's top is settled: live, and past any stall of its process.)"""
        when = self._timers[0][0]
        if self._parked and when > self._parked[0][0]:
            return False
        return thaw is None or when <= thaw

    def drop_process(self, pid: int, point: str) -> None:
        """Every live actor of process ``pid`` ends where it stands (it crashed at ``point``)."""
        for actor in self.live():
            if actor.pid == pid:
                actor.coro.close()
                actor.done, actor.crashed = True, point
                self.ends += 1
                self.retire(actor)

    def live(self) -> list[Actor]:
        return [a for a in self.actors if not a.done]
