"""Who watches the world: chat clients following sessions, and a worker's recovery round.

* ``clients`` (DEL-2): in half the worlds a chat client follows a session (a second one in
  a world in five), from the world's start. With ``disconnect`` drawn, its connection drops
  after 1-7 live events and it comes back once 1-5 more were committed while it was away,
  replaying each turn after the last number it saw (``sim.stream_client``).
* ``watch`` (ADM-5): a live process's worker notices a peer that died (``Recover``): the
  started admissions of dead epochs become unknown, and the session's queue pauses until
  an operator reconciles. After most kills a surviving process makes this round 2-40 s
  later, and now and then one makes it at a random time; each round is followed by a
  drain claim of every session, as a worker's next round would make.

Both are drawn from sub-streams of their own and are plain plan data.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from hermes_ref import door
from hermes_ref.models import Frozen
from sim import door_story
from sim.stream_client import SimClient

if TYPE_CHECKING:
    from sim.harness import Story
    from sim.processes import ProcessHandle


class Client(Frozen):
    """A chat client of ``session``; it drops after ``disconnect_after`` live events and
    comes back after ``away_for`` more were committed (None: it never drops)."""

    session: str
    name: str
    disconnect_after: int | None = Field(default=None, ge=1)
    away_for: int | None = Field(default=None, ge=1)


class Recover(Frozen):
    """The worker of ``process`` looks for dead peers: their started admissions become unknown."""

    op: Literal["recover"] = "recover"
    at_s: float = Field(ge=0)
    process: int = Field(ge=0)


def draw_clients(rng: random.Random, sessions: list[str], disconnect: bool) -> tuple[Client, ...]:
    """0-2 clients of the world's sessions; with ``disconnect`` each drops once and returns."""
    clients: list[Client] = []
    for n, chance in enumerate((0.5, 0.2), start=1):
        if not sessions or rng.random() >= chance:
            continue
        session, after, away = rng.choice(sessions), rng.randrange(1, 8), rng.randrange(1, 6)
        clients.append(Client(session=session, name=f"client-{n}",
                              disconnect_after=after if disconnect else None,
                              away_for=away if disconnect else None))
    return tuple(clients)


def draw_rounds(rng: random.Random, processes: int, kills: list[tuple[float, int]],
                sessions: list[str]) -> list[tuple[Recover, list[tuple[float, str]]]]:
    """Recovery rounds (after most kills, on another process; and now and then one at a
    random time), each with the drain claims (time, session) that follow it."""
    rounds: list[tuple[float, int]] = []
    for at, victim in kills:
        others = [p for p in range(processes) if p != victim]
        if others and rng.random() < 0.7:
            rounds.append((round(at + rng.uniform(2.0, 40.0), 1), rng.choice(others)))
    if rng.random() < 0.3:
        rounds.append((round(rng.uniform(20.0, 200.0), 1), rng.randrange(processes)))
    return [(Recover(at_s=at, process=process),
             [(round(at + rng.uniform(0.5, 5.0), 1), session) for session in sessions])
            for at, process in rounds]


def stage_clients(story: Story, clients: tuple[Client, ...]) -> None:
    for client in clients:
        SimClient.join(story.world, client.session, name=client.name,
                       disconnect_after=client.disconnect_after, away_for=client.away_for)


def stage_step(story: Story, step: object, handles: list[ProcessHandle]) -> bool:
    """Hand a recovery round out; False when ``step`` is none."""
    if not isinstance(step, Recover):
        return False
    recover_later(story, handles[step.process], after_s=step.at_s)
    return True


def recover_later(story: Story, handle: ProcessHandle, *, after_s: float) -> None:
    """``after_s`` from now the process's worker looks for dead peers, under its epoch."""
    world = story.world
    current = door_story.epoch(story, handle, check=False)

    def fire() -> None:
        if not handle.process.alive or current is None:
            world.timeline.add("recover", f"pid={handle.pid} is dead: no recovery round")
            return
        world.timeline.add("recover", f"pid={handle.pid} looks for dead peers")
        handle.driver.spawn(door.recover_dead(current), name="recover")
    world.scheduler.at(world.clock.now() + after_s, fire)


def reconnected(story: Story) -> bool:
    """Did a client drop and come back in the faulty phase (the fault fired)?"""
    return any(client.connection > 1 for client in story.world.clients)


def render_clients(clients: tuple[Client, ...]) -> list[str]:
    return [f"SimClient.join(s.world, {c.session!r}, name={c.name!r}, "
            f"disconnect_after={c.disconnect_after!r}, away_for={c.away_for!r})" for c in clients]


def render_step(step: object, names: tuple[str, ...]) -> str | None:
    if isinstance(step, Recover):
        return f"recover_later(s, {names[step.process]}, after_s={step.at_s!r})"
    return None
