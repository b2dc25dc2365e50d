"""The admission door in a story: binding principals, submitting, draining, recovering.

Theory of operation
-------------------
``Story`` keeps a ``DoorState`` and delegates its door steps here (``Story.submit``,
``Story.drain``, ...). Each step runs one door coroutine (``hermes_ref.door``) through
the simulator driver of the story's current process, so a planned crash drops it like
any turn. After each step the story runs every checker, as after a turn.

A process needs a runtime epoch before it touches the queue: the first door step of a
process begins one (``BeginEpoch``, which is also recovery), unless the story calls
``recover`` itself. A crash forgets the process's epoch with the process.

Every turn the drain runs is entered in the world's run log (``World.runs``) exactly as
``Story.turn`` enters its own, with the turn id the world minted and whether the process
died in it, so the turn checkers see door turns and plain turns alike. Every answer of
the door is in the world's ack log (``World.acks``, written by the driver when the
answer is handed over); the story adds what was submitted to the records of its step, and
a submission that got no answer at all is logged as silence (``answer=None``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from hermes_ref import door
from hermes_ref.admission import (
    Ack,
    AdmissionRow,
    Binding,
    BindingRole,
    EpochStart,
    Move,
    PrincipalKind,
    Refusal,
)
from sim.driver import SimDriver
from sim.faults import Crashed
from sim.world import AckRecord, TurnRun

if TYPE_CHECKING:
    from sim.harness import Story

T = TypeVar("T")


@dataclass
class DoorState:
    epochs: dict[int, int] = field(default_factory=dict)  # pid -> its runtime epoch


def _run(story: Story, coro: Coroutine[Any, Any, T]) -> T | None:
    """Run a door coroutine on the current process; None when the process died in it."""
    try:
        return SimDriver(story.world).run(coro)
    except Crashed:
        story._engine = None  # the process is gone with everything it held
        story._door.epochs.pop(story.world.pid, None)
        return None


def bind(story: Story, principal: str, session: str, role: str, kind: str) -> None:
    """Set up a lane with a bound principal (the session row first, as a platform would)."""
    world = story.world
    if world.store.get_session(session) is None:
        world.store.ensure_session(story.session_record(session))
    binding = Binding(principal_id=principal, kind=PrincipalKind(kind), session_id=session,
                      role=BindingRole(role))
    world.store.bind_principal(binding)
    world.timeline.add("bind", f"{principal} ({kind}) to {session} as {role}")


def epoch(story: Story) -> int | None:
    """The current process's runtime epoch, beginning one if it has none yet."""
    known = story._door.epochs.get(story.world.pid)
    if known is not None:
        return known
    start = recover(story)
    return None if start is None else start.epoch


def recover(story: Story) -> EpochStart | None:
    """Begin a new runtime epoch for the current process (recovery: nothing re-runs)."""
    start = _run(story, door.recover())
    if start is not None:
        story._door.epochs[story.world.pid] = start.epoch
    story.check()
    return start


def submit(story: Story, sub: door.Submission) -> Ack | Refusal | None:
    """Hand ``sub`` to the door; None when the process died before answering."""
    world = story.world
    current = epoch(story)
    if current is None:
        return None
    world.timeline.add("submit", f"{sub.principal_id!r} {sub.request_id!r} to "
                       f"{sub.session_id!r}: {_payload(sub.payload)}")
    heard = len(world.acks)
    answer = _run(story, door.admit(sub, story._limits, current))
    fresh = world.acks[heard:]
    world.acks[heard:] = [dataclasses.replace(r, submitted=sub) for r in fresh]
    if answer is not None and not fresh:  # the door returned without answering the submitter
        world.acks.append(AckRecord(answer=None, mark=world.store.admission_mark(),
                                    submitted=sub))
    story.check()
    return answer


def drain(story: Story, session: str, steps: int | None) -> list[door.DrainStep]:
    """Run drain steps until the queue is empty or paused, ``steps`` of them at most."""
    done: list[door.DrainStep] = []
    while steps is None or len(done) < steps:
        current = epoch(story)
        if current is None:
            break
        step = _drain_once(story, session, current)
        if step is None:
            break
        done.append(step)
        if step.admission is None:
            break
    return done


def _drain_once(story: Story, session: str, current: int) -> door.DrainStep | None:
    world, engine = story.world, story.engine
    world.timeline.add("drain", session)
    minted, failures = len(world.minted_turns), world.write_failures
    step = _run(story, door.drain_step(engine, session, current))
    ids = world.minted_turns[minted:]
    if ids or step is None:
        row = step.admission if step is not None else _last_claimed(story, session)
        text = row.text if row is not None else ""
        world.runs.append(TurnRun(session, text, ids[0] if ids else None, step is None,
                                  world.write_failures - failures))
    if step is not None and step.result is not None:
        world.timeline.add("result", f"{step.result.exit_reason.value}")
    story.check()
    return step


def _last_claimed(story: Story, session: str) -> AdmissionRow | None:
    """The session's most recent claim, as the store holds it (its process died in it)."""
    claimed = [r for r in story.world.store.snapshot().admissions
               if r.session_id == session and r.claimed_tick is not None]
    return max(claimed, key=lambda r: r.claimed_tick or 0, default=None)


def resolve(story: Story, principal: str, session: str, admission_id: str,
            move: Move) -> AdmissionRow | Refusal | None:
    """An explicit reconcile or cancel, by ``principal``."""
    current = epoch(story)
    if current is None:
        return None
    answer = _run(story, door.resolve(principal, session, admission_id, current, move))
    if isinstance(answer, Refusal):
        story.world.timeline.add("refuse", f"{move.value} {admission_id}: {answer.code}")
    story.check()
    return answer


def _payload(payload: object) -> str:
    text = repr(payload)
    return text if len(text) <= 72 else text[:71] + "…"
