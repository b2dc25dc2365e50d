"""What the asyncio driver keeps per running coroutine: its refreshers and its interrupt.

Theory of operation
-------------------
``AsyncDriver.run`` may drive many turns at once on one loop (one per session in flight),
so nothing about a turn can live on the driver itself. Each ``run`` gets a ``RunState``,
reachable from the handlers through a context variable (asyncio copies the context into
each task, and ``run`` sets its own state first).

A lease refresher (``StartRefresher``) is an asyncio task that drives
``hermes_ref.lease.keep_lease`` through the same driver, as a child of the turn's state.
When it reports a loss (``InterruptTurn``) the turn's state is marked interrupted and
every wait of it in progress is woken: ``interruptible`` runs every model call, tool batch
and sleep of the turn as a task and waits on one future (a gate) that the task's end or the
interrupt opens, whichever comes first, so the turn's pending call is cancelled at once and
it receives ``TurnInterrupted``; later calls are refused before they start. (A gate and a
done callback cost half of ``asyncio.wait`` over the task and an event waiter's task.)
``stop`` cancels a refresher and awaits it (stop, then join); ``RunState.close`` does the
same for every refresher a run leaves behind, so none outlives its turn.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hermes_ref.errors import TurnInterrupted

T = TypeVar("T")


@dataclass(eq=False)
class RunState:
    """One driven coroutine: the refreshers it started and whether it must stop."""

    parent: RunState | None = None
    interrupt: str | None = None
    gates: set[asyncio.Future[None]] = field(default_factory=set)  # the waits in progress
    refreshers: dict[int, asyncio.Task[Any]] = field(default_factory=dict)
    lost: set[int] = field(default_factory=set)
    handle: int = 0  # this state's handle in its parent (a refresher's)
    corrections: list[str] = field(default_factory=list)  # LOOP-4: sent to this run, undrained

    def root(self) -> RunState:
        """The run a refresher belongs to: the turn, whose corrections and interrupts these are."""
        state = self
        while state.parent is not None:
            state = state.parent
        return state

    def raise_interrupt(self, reason: str) -> None:
        self.interrupt = reason
        for gate in self.gates:
            _open(gate)

    def clear_interrupt(self) -> None:
        self.interrupt = None

    async def stop(self, handle: int) -> bool:
        """Cancel refresher ``handle`` and wait for it to end; True if it lost the lease."""
        task = self.refreshers.pop(handle, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        lost = handle in self.lost
        self.lost.discard(handle)
        return lost

    async def close(self) -> None:
        for handle in list(self.refreshers):
            await self.stop(handle)


CURRENT: ContextVar[RunState] = ContextVar("hermes_ref_run_state")
_handles = iter(range(1, 1 << 62))


def next_handle() -> int:
    return next(_handles)


async def interruptible(state: RunState, work: Awaitable[T]) -> T:
    """Await ``work`` unless the run is interrupted first (then cancel it and raise)."""
    if state.interrupt is not None:
        if asyncio.iscoroutine(work):
            work.close()
        raise TurnInterrupted(state.interrupt, unsent=True)
    task = asyncio.ensure_future(work)
    gate: asyncio.Future[None] = task.get_loop().create_future()
    task.add_done_callback(lambda _: _open(gate))
    state.gates.add(gate)
    try:
        await gate  # opened by the task's end or by ``raise_interrupt``
    finally:
        state.gates.discard(gate)
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise TurnInterrupted(state.interrupt or "interrupted")


def _open(gate: asyncio.Future[None]) -> None:
    if not gate.done():  # already opened, or cancelled with the caller
        gate.set_result(None)
