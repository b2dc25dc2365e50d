"""The turn, end to end: prologue → main loop → finalizer.

Theory of operation
-------------------
``Engine.run_turn`` is the whole story of one turn, and it reads top to bottom::

    ctx = await prologue.build_turn_context(inp, deps)   # session, lease, history, user row
    await loop.run_loop(ctx)                              # model calls and tool rounds
    return await finalizer.finalize(ctx)                  # tail closure, events, release

It is a coroutine that only awaits effects, so any driver can run it. One ``Engine``
instance plays the part of one agent process: it caches per-session state between turns
(see ``context.SessionCache``). A restart is a new instance with empty caches, which
must rebuild everything it needs from the durable record.

Modules are reached through their module objects (``loop.run_loop``), not imported
names, so that the test harness can swap in a deliberately broken variant of one step
(a *sabotage*) and prove that the checkers notice.
"""

from __future__ import annotations

from hermes_ref import finalizer, loop, prologue
from hermes_ref.compression import CompressionState
from hermes_ref.context import SessionCache
from hermes_ref.errors import BadInput
from hermes_ref.limits import Limits
from hermes_ref.models import ToolSpec
from hermes_ref.outcomes import TurnResult
from hermes_ref.phases import PhaseObserver, PhaseTracker
from hermes_ref.prologue import TurnInput


class Engine:
    """One agent process's turn engine (no I/O: drivers perform its effects)."""

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        tools: tuple[ToolSpec, ...] = (),
        holder: str = "pid=0",
        phase_observer: PhaseObserver | None = None,
    ) -> None:
        self.limits = limits or Limits()
        self.tools = tools
        self.holder = holder
        self.phase_observer = phase_observer
        self.caches: dict[str, SessionCache] = {}
        # CMP-4 across CMP-5: the compression memory of each child a turn of this engine
        # rotated to, until a turn there gives it a cache (``rotation.switch_to`` enters it)
        self.carried: dict[str, CompressionState] = {}

    def request_compaction(self, session_id: str) -> None:
        """CMP-4: a manual compaction of ``session_id`` before its next turn's first call.

        It runs even in the cooldown after a failed summary, and after ineffective passes;
        only a session this engine has already served can be asked for, or a child a turn of
        it rotated to (CMP-5), whose compression memory it carries to that child's first turn.
        """
        cache = self.caches.get(session_id)
        memory = cache.compression if cache is not None else self.carried.get(session_id)
        if memory is None:
            raise BadInput(f"session {session_id!r} has had no turn in this process: "
                           "there is nothing to compact")
        memory.manual_pending = True

    async def run_turn(self, inp: TurnInput) -> TurnResult:
        tracker = PhaseTracker(self.phase_observer)
        deps = prologue.PrologueDeps(self.limits, self.tools, self.holder, self.caches, tracker,
                                     self.carried)
        ctx = await prologue.build_turn_context(inp, deps)
        if isinstance(ctx, TurnResult):
            return ctx
        if not ctx.ended:
            await loop.run_loop(ctx)
        return await finalizer.finalize(ctx)
