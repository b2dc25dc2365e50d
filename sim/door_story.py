"""The admission door in a story: binding principals, submitting, draining, recovering.

Theory of operation
-------------------
``Story`` keeps a ``DoorState`` and delegates its door steps here (``Story.submit``,
``Story.drain``, ...). Each step runs one door coroutine (``hermes_ref.door``) through
the simulator driver of the story's current process, so a planned crash drops it like
any turn. After each step the story runs every checker, as after a turn.

A process needs a runtime epoch before it touches the queue: the first door step of a
process begins its own (``BeginEpoch``, recorded with its holder ``pid=..:pidns=..``,
which is also recovery), unless the story calls ``recover`` itself; ``recover`` on a
process that has an epoch recovers under it (``RecoverEpochs``) without beginning
another. A crash forgets the process's epoch with the process. Epochs are per process:
several processes of one world admit and drain side by side, and only the started
admissions of a process that died become unknown.

Several processes: ``start_submit`` and ``start_drain`` hand a door coroutine to a
process as an actor of its own (``driver.spawn``), to begin ``after_s`` from now, as
``processes.start_turn`` does for a turn; ``processes.run_all`` runs them with the turns,
and ``record_ended`` enters each in the ack log or the run log when it ends.

Every turn the drain runs is entered in the world's run log (``World.runs``) exactly as
``Story.turn`` enters its own, with the turn id the world minted and whether the process
died in it, so the turn checkers see door turns and plain turns alike. Every answer of
the door is in the world's ack log (``World.acks``, written by the driver when the
answer is handed over); the story adds what was submitted to the records of its step, and
a submission that got no answer at all is logged as silence (``answer=None``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Coroutine
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
from hermes_ref.effects import Sleep
from hermes_ref.engine import Engine
from sim.driver import SimDriver, finished
from sim.faults import Crashed
from sim.world import AckRecord, TurnRun

if TYPE_CHECKING:
    from sim.harness import Story
    from sim.processes import ProcessHandle
    from sim.scheduler import Actor

T = TypeVar("T")


@dataclass(eq=False)
class DoorActor:
    """A door coroutine handed to a process: a submission or one drain claim."""

    pid: int
    epoch: int
    session_id: str
    actor: Actor
    sub: door.Submission | None = None  # None: a drain
    recorded: bool = False


@dataclass
class DoorState:
    epochs: dict[int, int] = field(default_factory=dict)  # pid -> its runtime epoch
    pending: list[DoorActor] = field(default_factory=list)  # handed out, not yet recorded


def _run(story: Story, coro: Coroutine[Any, Any, T],
         handle: ProcessHandle | None = None) -> T | None:
    """Run a door coroutine on ``handle``'s process (the current one by default); None when
    the process died in it."""
    world = story.world
    pid = world.pid if handle is None else handle.pid
    try:
        return (SimDriver(world) if handle is None else handle.driver).run(coro)
    except Crashed:
        if pid == world.pid:
            story._engine = None  # the process is gone with everything it held
        story._door.epochs.pop(pid, None)
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


def epoch(story: Story, handle: ProcessHandle | None = None, *,
          check: bool = True) -> int | None:
    """The process's runtime epoch, beginning one if it has none yet."""
    known = story._door.epochs.get(story.world.pid if handle is None else handle.pid)
    if known is not None:
        return known
    start = recover(story, handle, check=check)
    return None if start is None else start.epoch


def recover(story: Story, handle: ProcessHandle | None = None, *,
            check: bool = True) -> EpochStart | None:
    """Recovery on the process (the current one by default): it begins its own epoch if it
    has none, else recovers under the one it has (nothing re-runs either way).

    ``check`` False: the step hands out an actor, and the record is checked by
    ``run_all`` once every actor ended (a check while other actors hold leases would
    judge turns in mid-flight)."""
    pid = story.world.pid if handle is None else handle.pid
    known = story._door.epochs.get(pid)
    coro = door.recover() if known is None else door.recover_dead(known)
    start = _run(story, coro, handle)
    if start is not None:
        story._door.epochs[pid] = start.epoch
    if check:
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
        result = step.result if step is not None else None
        world.runs.append(TurnRun(session, text, ids[0] if ids else None, step is None,
                                  world.write_failures - failures,
                                  result.retryable if result is not None else None,
                                  returned=result is not None,
                                  answer=result.final_response if result is not None else None))
    if step is not None and step.result is not None:
        world.timeline.add("result", f"{step.result.exit_reason.value}")
    story.check()
    return step


def _last_claimed(story: Story, session: str) -> AdmissionRow | None:
    """The session's most recent claim, as the store holds it (its process died in it)."""
    claimed = [r for r in story.world.store.admission_rows()
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


# ---- door coroutines as actors of a process (several processes, one door) -----------------


async def _later(seconds: float, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``make()``'s coroutine, ``seconds`` from now (made only then: a process that dies
    first leaves nothing un-awaited behind)."""
    if seconds > 0:
        await Sleep(seconds)
    return await make()


async def _claim_once(engine: Engine, session: str, current: int, poll_s: float,
                      tries: int) -> door.DrainStep:
    """One drain step; while another admission of the session is in flight (``busy``),
    wait ``poll_s`` and ask again, ``tries`` times at most."""
    step = await door.drain_step(engine, session, current)
    for _ in range(tries):
        if not step.busy:
            break
        await Sleep(poll_s)
        step = await door.drain_step(engine, session, current)
    return step


def start_submit(story: Story, handle: ProcessHandle, sub: door.Submission,
                 after_s: float) -> DoorActor | None:
    """Hand ``sub`` to the door on ``handle``'s process, ``after_s`` from now."""
    if _dead(story, handle, "submit"):
        return None
    current = epoch(story, handle, check=False)
    if current is None:
        return None
    when = f" in {after_s:g} s" if after_s > 0 else ""
    story.world.timeline.add("submit", f"pid={handle.pid} {sub.principal_id!r} "
                             f"{sub.request_id!r} to {sub.session_id!r}: "
                             f"{_payload(sub.payload)}{when}")
    coro = _later(after_s, lambda: door.admit(sub, story._limits, current))
    handed = DoorActor(handle.pid, current, str(sub.session_id),
                       handle.driver.spawn(coro, name="submit"), sub=sub)
    story._door.pending.append(handed)
    return handed


def start_drain(story: Story, handle: ProcessHandle, session: str, after_s: float,
                poll_s: float, tries: int) -> DoorActor | None:
    """One drain claim of ``session`` on ``handle``'s process, ``after_s`` from now."""
    if _dead(story, handle, "drain"):
        return None
    current = epoch(story, handle, check=False)
    if current is None:
        return None
    when = f" in {after_s:g} s" if after_s > 0 else ""
    story.world.timeline.add("drain", f"pid={handle.pid} {session}{when}")
    coro = _later(after_s, lambda: _claim_once(handle.engine, session, current, poll_s, tries))
    handed = DoorActor(handle.pid, current, session, handle.driver.spawn(coro, name="drain"))
    story._door.pending.append(handed)
    return handed


def _dead(story: Story, handle: ProcessHandle, what: str) -> bool:
    """A dead process starts nothing: what is handed to it is dropped, and said so."""
    if handle.process.alive:
        return False
    story.world.timeline.add(what, f"pid={handle.pid} is dead: nothing handed to it")
    return True


def busy(story: Story) -> bool:
    """Some door actor handed out has not ended yet."""
    for handed in story._door.pending:  # noqa: SIM110 (asked after every step: no generator)
        if not handed.actor.done:
            return True
    return False


def record_ended(story: Story) -> None:
    """Enter each door actor that ended in the ack log or the run log (once)."""
    for handed in story._door.pending:
        if handed.actor.done and not handed.recorded:
            handed.recorded = True
            _record_submit(story, handed) if handed.sub is not None \
                else _record_drain(story, handed)
    story._door.pending[:] = [d for d in story._door.pending if not d.recorded]


def _result(handed: DoorActor) -> Any:
    try:
        return finished(handed.actor)
    except Crashed:
        return None


def _record_submit(story: Story, handed: DoorActor) -> None:
    """The submitter's answer (the very value the door acknowledged) gets its submission."""
    world, answer = story.world, _result(handed)
    if answer is None:
        return  # its process died: the submitter heard nothing (as with a crash point)
    for i, rec in enumerate(world.acks):
        if rec.answer is answer:
            world.acks[i] = dataclasses.replace(rec, submitted=handed.sub)
            return
    world.acks.append(AckRecord(answer=None, mark=world.store.admission_mark(),
                                submitted=handed.sub))


def _record_drain(story: Story, handed: DoorActor) -> None:
    """A claim that ran (or died in) a turn is in the run log, like ``Story.turn``'s."""
    world, step = story.world, _result(handed)
    row = step.admission if isinstance(step, door.DrainStep) else _claimed_by(story, handed)
    turn_id = handed.actor.turn_id
    if row is None and turn_id is None:
        return
    failed = world.write_failures_by_turn.get(turn_id, 0) if turn_id is not None else 0
    result = step.result if isinstance(step, door.DrainStep) else None
    world.runs.append(TurnRun(handed.session_id, row.text if row is not None else "", turn_id,
                              step is None, failed,
                              result.retryable if result is not None else None,
                              returned=result is not None,
                              answer=result.final_response if result is not None else None))
    if isinstance(step, door.DrainStep) and step.result is not None:
        world.timeline.add("result", f"pid={handed.pid} {step.result.turn_id} "
                           f"{step.result.exit_reason.value}")


def _claimed_by(story: Story, handed: DoorActor) -> AdmissionRow | None:
    """The admission this actor's turn ran (settled under its turn id before a crash after
    the settle), else the unsettled one of the session that this actor's epoch claimed."""
    rows = story.world.store.admission_rows()
    turn_id = handed.actor.turn_id
    ran = next((r for r in rows if turn_id is not None and r.turn_id == turn_id), None)
    if ran is not None:
        return ran
    return next((r for r in rows
                 if r.session_id == handed.session_id and r.owner_epoch == handed.epoch
                 and r.claims and r.settled_tick is None), None)
