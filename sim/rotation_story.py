"""Stories that compact a session at a point they choose (CMP-5, CMP-6).

Theory of operation
-------------------
The engine compacts when its preflight says so (``hermes_ref.compaction``); a story about
the durable side of compaction wants it at a known point with a known result. So these
steps run one turn exactly like ``Engine.run_turn`` (prologue, loop, finalizer) with one
more step between the prologue and the loop: ``rotation.commit_compaction`` on the list
``compact`` makes from the turn's working list. Everything else is the engine's own
code; the compacted list is the story's, which is the point.

``compaction_turn`` runs it on the story's own process and waits; ``start_compaction_turn``
hands it to any process, to run with ``Story.run_all``, so two processes can race.
Each turn is recorded in the world's runs like any other.

``keep_last(n)`` is the compaction these stories use: a summary row (a user message
naming how many rows it replaces) followed by the last ``n`` messages, widened so a tool
call and its results are never split (CMP-3).
"""

from __future__ import annotations

from collections.abc import Callable

from hermes_ref import finalizer, loop, prologue, rotation
from hermes_ref.engine import Engine
from hermes_ref.models import Message, Role
from hermes_ref.outcomes import TurnResult
from hermes_ref.phases import PhaseTracker
from hermes_ref.prologue import TurnInput
from sim.checkers.rotation import CompactionRun
from sim.driver import SimDriver
from sim.faults import Crashed
from sim.harness import Story, _brief
from sim.processes import ProcessHandle, TurnHandle, default

Compactor = Callable[[tuple[Message, ...]], tuple[Message, ...]]
SUMMARY_PREFIX = "[Summary of earlier conversation]"


def keep_last(n: int) -> Compactor:
    """A summary row, then the last ``n`` messages (more if that would split a tool group)."""
    def compact(messages: tuple[Message, ...]) -> tuple[Message, ...]:
        start = max(0, len(messages) - n)
        while start > 0 and messages[start].role is Role.TOOL:
            start -= 1  # a result never loses its call
        dropped = messages[:start]
        summary = Message(role=Role.USER, content=f"{SUMMARY_PREFIX} {len(dropped)} earlier "
                          "messages: " + "; ".join((m.content or "")[:20] for m in dropped))
        return (summary, *(m.model_copy(update={"row_id": None}) for m in messages[start:]))
    return compact


async def run_compacting(engine: Engine, inp: TurnInput, compact: Compactor) -> TurnResult:
    """``Engine.run_turn`` with ``commit_compaction`` between the prologue and the loop."""
    tracker = PhaseTracker(engine.phase_observer)
    deps = prologue.PrologueDeps(engine.limits, engine.tools, engine.holder, engine.caches,
                                 tracker)
    ctx = await prologue.build_turn_context(inp, deps)
    if isinstance(ctx, TurnResult):
        return ctx
    if not ctx.ended:
        await rotation.commit_compaction(ctx, compact(ctx.transcript.messages()))
    if not ctx.ended:
        await loop.run_loop(ctx)
    return await finalizer.finalize(ctx)


def compaction_turn(s: Story, text: str, compact: Compactor, *,
                    session: str = "s-1") -> TurnResult | None:
    """One compacting turn on the story's own process; None when the process crashed."""
    world, engine = s.world, s.engine
    world.timeline.add("turn", f"{session} {text!r} compacting")
    minted, failures = len(world.minted_turns), world.write_failures
    inp = TurnInput(session_id=session, text=text)
    try:
        result: TurnResult | None = SimDriver(world).run(run_compacting(engine, inp, compact))
    except Crashed:
        s._engine = None  # the process is gone with everything it held
        result = None
    ids = world.minted_turns[minted:]
    world.runs.append(CompactionRun(session, text, ids[0] if ids else None, result is None,
                                    world.write_failures - failures))
    if result is not None:
        world.timeline.add("result", f"{result.exit_reason.value} "
                           f"final={_brief(result.final_response)}")
    s.check()
    return result


def start_compaction_turn(s: Story, text: str, compact: Compactor, *, session: str = "s-1",
                          process: ProcessHandle | None = None) -> TurnHandle:
    """Hand a compacting turn to ``process`` (the story's own by default); it runs when the
    story calls ``run_all``."""
    handle = process or default(s)
    inp = TurnInput(session_id=session, text=text)
    s.world.timeline.add("turn", f"pid={handle.pid} {session} {text!r} compacting")
    turn = TurnHandle(session, text, handle.driver.spawn(run_compacting(handle.engine, inp,
                                                                        compact)))
    s._processes.pending.append(turn)
    _handed.setdefault(id(s.world), []).append(turn)
    return turn


# the compacting turns handed out in each world (by id), until ``run_all`` marks their runs
_handed: dict[int, list[TurnHandle]] = {}


def run_all(s: Story) -> None:
    """``Story.run_all``, then the runs of the compacting turns marked as such, and checked."""
    s.run_all()
    mine = {t.actor.turn_id for t in _handed.pop(id(s.world), [])}
    runs = s.world.runs
    for index, run in enumerate(runs):
        if run.turn_id in mine and not isinstance(run, CompactionRun):
            runs[index] = CompactionRun(run.session_id, run.text, run.turn_id, run.crashed,
                                        run.write_failures)
    s.check()
