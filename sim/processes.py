"""Stories with several processes: start them, give them turns, stall or kill them, run all.

Theory of operation
-------------------
``Story.turn`` runs one turn on the story's default process and waits for it. The steps
here let a story put several processes in one world (each with its own ``Engine``, so its
own caches and holder identity), hand turns to any of them, possibly later on the virtual
clock, and then run the world until every turn has ended. The scheduler interleaves the
processes' effects in the order the world's seed draws (``sim.scheduler``).

A *stall* (``freeze``) stops every actor of a process for a while without killing it: a
long GC pause, a stopped container, a laptop lid. Its lease can expire meanwhile and
another process can take it; when the stalled process wakes, the fence and its lease
refresher decide what it may still do. A *kill* drops the process at once, wherever its
actors are, exactly like a crash point.

Each turn is recorded in the world's runs when it ends, with the turn id its actor minted,
and the checkers run once the world is idle. A turn handed to a process that is already
dead (it crashed while the world was being set up, say) never runs: the timeline says so
and its handle is ended from the start, as the door drops what is handed to a dead process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hermes_ref.effects import Sleep
from hermes_ref.engine import Engine
from hermes_ref.models import Message
from hermes_ref.outcomes import TurnResult
from hermes_ref.prologue import TurnInput
from sim import door_story  # the door's actors (submissions, drain claims) run here too
from sim.checkers.context import CallerHistoryRun
from sim.driver import SimDriver, finished
from sim.faults import Crashed
from sim.scheduler import Actor
from sim.world import SimProcess, TurnRun

if TYPE_CHECKING:
    from sim.harness import Story


@dataclass(eq=False)
class ProcessHandle:
    """One simulated agent process of a story."""

    process: SimProcess
    engine: Engine
    driver: SimDriver

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass(eq=False)
class TurnHandle:
    """A turn handed to a process; ``result`` is set when it ends (None: its process died)."""

    session_id: str
    text: str
    actor: Actor
    recorded: bool = False
    result: TurnResult | None = None
    history: list[Message] | None = None  # the caller's own list, kept to look at later (CTX-2)
    held: tuple[Message, ...] = ()  # what that list held when the turn was handed out
    rows_before: int = 0  # the session's durable rows then

    @property
    def done(self) -> bool:
        return self.actor.done


@dataclass
class Processes:
    """The story's extra processes and the turns handed to them, not yet recorded."""

    handles: dict[int, ProcessHandle] = field(default_factory=dict)
    pending: list[TurnHandle] = field(default_factory=list)
    waits: list[Callable[[], bool]] = field(default_factory=list)  # more the world waits on


def start(story: Story) -> ProcessHandle:
    world = story.world
    process = world.start_process()
    engine = Engine(limits=story._limits, tools=story._tools, holder=world.holder_of(process.pid),
                    phase_observer=world.timeline.phase)
    handle = ProcessHandle(process, engine, SimDriver(world, process))
    story._processes.handles[process.pid] = handle
    world.timeline.add("process", f"pid={process.pid} started")
    return handle


def default(story: Story) -> ProcessHandle:
    """The story's own process (the one ``Story.turn`` uses), as a handle."""
    world = story.world
    process = world.processes[world.pid]
    return ProcessHandle(process, story.engine, SimDriver(world, process))


async def _handed(story: Story, engine: Engine, inp: TurnInput, after_s: float,
                  box: list[TurnHandle]) -> TurnResult:
    """A turn handed a caller's history notes the session's durable rows as it begins
    (``box`` holds its handle, filled before the actor first runs)."""
    if after_s > 0:
        await Sleep(after_s)
    box[0].rows_before = len(story.transcript(inp.session_id))
    return await engine.run_turn(inp)


async def _later(seconds: float, engine: Engine, inp: TurnInput) -> TurnResult:
    await Sleep(seconds)
    return await engine.run_turn(inp)


def start_turn(story: Story, text: str, *, session: str, process: ProcessHandle | None,
               after_s: float, platform: str | None, injected: str | None = None,
               history: list[Message] | None = None) -> TurnHandle:
    handle = process or default(story)
    inp = TurnInput(session_id=session, text=text, platform=platform or "cli",
                    injected_context=injected, history=history)
    if not handle.process.alive:  # it died before it was handed the turn: it starts nothing
        story.world.timeline.add("turn", f"pid={handle.pid} is dead: nothing handed to it")
        return TurnHandle(session, text, _never_ran(handle.driver), recorded=True)
    when = f" in {after_s:g} s" if after_s > 0 else ""
    extra = f" history={len(history)}" if history is not None else ""
    story.world.timeline.add("turn", f"pid={handle.pid} {session} {text!r}{extra}{when}")
    if history is None:
        coro: Any = handle.engine.run_turn(inp) if after_s <= 0 else _later(after_s, handle.engine, inp)
        turn = TurnHandle(session, text, handle.driver.spawn(coro))
    else:  # what the session held is read when the turn begins, not when it is handed out
        box: list[TurnHandle] = []
        actor = handle.driver.spawn(_handed(story, handle.engine, inp, after_s, box))
        turn = TurnHandle(session, text, actor, history=history, held=tuple(history))
        box.append(turn)
    story._processes.pending.append(turn)
    return turn


def _never_ran(driver: SimDriver) -> Actor:
    """The actor of a turn handed to a dead process: ended before it began, as the actors
    its process had when it died ended where they stood (its result stays None)."""
    async def nothing() -> None:
        return None
    coro = nothing()
    coro.close()
    return Actor(0, "turn", driver, coro, done=True, crashed="dead before it was handed out")


def run_all(story: Story) -> None:
    """Step the world until every turn and door actor handed out has ended, then check
    the record."""
    scheduler, ends = story.world.scheduler, -1
    while _unfinished(story):
        if not scheduler.step():
            break
        if scheduler.ends != ends:  # only a step that ended an actor has an end to record
            ends = scheduler.ends
            _record_ended(story)
            door_story.record_ended(story)
    _record_ended(story)
    door_story.record_ended(story)
    story.check()


def _unfinished(story: Story) -> bool:
    """Some turn or door actor handed out has not ended, or something else the world
    waits on is not over (asked after every step: plain loops, no generators)."""
    for turn in story._processes.pending:
        if not turn.done:
            return True
    if door_story.busy(story):
        return True
    for wait in story._processes.waits:  # noqa: SIM110 (as above)
        if wait():
            return True
    return False


def _record_ended(story: Story) -> None:
    world = story.world
    for turn in story._processes.pending:
        if not turn.done or turn.recorded:
            continue
        turn.recorded = True
        try:
            turn.result = finished(turn.actor)
        except Crashed:
            turn.result = None
        turn_id = turn.actor.turn_id
        failed = world.write_failures_by_turn.get(turn_id, 0) if turn_id is not None else 0
        args = (turn.session_id, turn.text, turn_id, turn.result is None, failed)
        retry = turn.result.retryable if turn.result is not None else None
        returned = turn.result is not None
        answer = turn.result.final_response if turn.result is not None else None
        world.runs.append(
            TurnRun(*args, retryable=retry, returned=returned, answer=answer)
            if turn.history is None else
            CallerHistoryRun(*args, retryable=retry, caller=turn.history, held=turn.held,
                             rows_before=turn.rows_before, returned=returned, answer=answer))
        if turn.result is not None:
            answer = turn.result.final_response
            shown = "None" if answer is None else repr(answer[:40])
            world.timeline.add("result", f"{turn.result.turn_id} "
                               f"{turn.result.exit_reason.value} final={shown}")
    story._processes.pending[:] = [t for t in story._processes.pending if not t.recorded]


def freeze(story: Story, process: ProcessHandle, seconds: float, after_s: float) -> None:
    """From ``after_s`` on, no actor of the process runs for ``seconds``."""
    world = story.world

    def stall() -> None:
        world.stall(process.pid, seconds)
        world.timeline.add("FAULT", f"pid={process.pid} stalls for {seconds:g} s")
    world.scheduler.at(world.clock.now() + after_s, stall)


def kill(story: Story, process: ProcessHandle, after_s: float) -> None:
    """``after_s`` from now the process dies, wherever its actors are (SIGKILL)."""
    world = story.world

    def die() -> None:
        if process.process.alive:
            process.driver.crash_process("SIGKILL")
    world.scheduler.at(world.clock.now() + after_s, die)
