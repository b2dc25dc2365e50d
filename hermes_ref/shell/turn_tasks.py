"""What the asyncio driver keeps per running coroutine: its refreshers and its interrupt.

Theory of operation
-------------------
``AsyncDriver.run`` may drive many turns at once on one loop (one per session in flight),
so nothing about a turn can live on the driver itself. Each ``run`` gets a ``RunState``,
reachable from the handlers through a context variable (asyncio copies the context into
each task, and ``run`` sets its own state first).

A lease refresher (``StartRefresher``) drives ``hermes_ref.lease.keep_lease`` through the
same driver, as a child of the turn's state (``Refresher``). When it reports a loss
(``InterruptTurn``) the turn's state is marked interrupted and every wait of it in progress
is woken: ``interruptible`` awaits every model call, tool batch and sleep of the turn in
the turn's own task, and ``raise_interrupt`` cancels that task where it waits, as
``asyncio.timeout`` does; the cancellation is taken back (``Task.uncancel``) and the turn
receives ``TurnInterrupted``. Later calls are refused before they start. A call that ends
without waiting (a model answering from memory, tools run inline) so costs no task, and
a client library that ties its state to the current task (anyio's cancel scopes in httpx)
starts and ends in the same one. ``stop`` cancels a refresher and waits for its end (stop,
then join); ``RunState.close`` does the same for every refresher a run leaves behind, so
none outlives its turn.

A refresher first sleeps; that sleep is a timer, and the refresher becomes a task only when
it ends. One stopped before (a turn shorter than the refresh interval) costs the timer's
cancellation and the closing of a coroutine that never ran past its first ``Sleep``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Generator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from hermes_ref.effects import Sleep
from hermes_ref.errors import TurnInterrupted

T = TypeVar("T")


@dataclass(eq=False)
class RunState:
    """One driven coroutine: the refreshers it started and whether it must stop."""

    parent: RunState | None = None
    interrupt: str | None = None
    waiting: set[asyncio.Task[Any]] = field(default_factory=set)  # tasks in an interruptible wait
    cancelled: set[asyncio.Task[Any]] = field(default_factory=set)  # ... that raise_interrupt cancelled
    refreshers: dict[int, Refresher] = field(default_factory=dict)
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
        for task in self.waiting - self.cancelled:
            self.cancelled.add(task)
            task.cancel()

    def clear_interrupt(self) -> None:
        self.interrupt = None

    async def stop(self, handle: int) -> bool:
        """Cancel refresher ``handle`` and wait for it to end; True if it lost the lease."""
        refresher = self.refreshers.pop(handle, None)
        if refresher is not None:
            await refresher.stop()
        lost = handle in self.lost
        self.lost.discard(handle)
        return lost

    async def close(self) -> None:
        """Stop every refresher left. A cancellation of the caller that comes meanwhile is
        raised once the last one has ended: none is left running because of it."""
        cancelled: BaseException | None = None
        for handle in list(self.refreshers):
            try:
                await self.stop(handle)
            except asyncio.CancelledError as error:
                cancelled = cancelled or error
        if cancelled is not None:
            raise cancelled


CURRENT: ContextVar[RunState] = ContextVar("hermes_ref_run_state")
_handles = iter(range(1, 1 << 62))


def next_handle() -> int:
    return next(_handles)


async def interruptible(state: RunState, work: Awaitable[T]) -> T:
    """Await ``work`` unless the run is interrupted first (then cancel it and raise).

    ``work`` runs in the caller's task; an interrupt cancels that task where it waits and
    is turned into ``TurnInterrupted`` here. A cancellation from anyone else stays one.
    """
    if state.interrupt is not None:
        if asyncio.iscoroutine(work):
            work.close()
        raise TurnInterrupted(state.interrupt, unsent=True)
    task = asyncio.current_task()
    if task is None:  # not in a task: nothing to cancel, so nothing can interrupt it
        return await work
    state.waiting.add(task)
    try:
        result = await work
    except asyncio.CancelledError:
        if not _ours(state, task):
            raise
        raise TurnInterrupted(state.interrupt or "interrupted") from None
    except Exception as failure:  # the work turned our cancellation into an error of its own
        if not _ours(state, task):
            raise
        raise TurnInterrupted(state.interrupt or "interrupted") from failure
    finally:
        state.waiting.discard(task)
    _ours(state, task)  # interrupted, but the work swallowed the cancellation and ended: keep it
    return result


def _ours(state: RunState, task: asyncio.Task[Any]) -> bool:
    """Was ``task`` cancelled by ``raise_interrupt`` alone? Takes that cancellation back."""
    if task not in state.cancelled:
        return False
    state.cancelled.discard(task)
    return task.uncancel() == 0


Drive = Callable[[Coroutine[Any, Any, Any]], Coroutine[Any, Any, Any]]


class Refresher:
    """A refresher: a timer while its first ``Sleep`` lasts, a task from its end on.

    ``drive(coro)`` is the driver's run of an engine coroutine (it performs every effect
    the coroutine yields). The keeper's first step is taken here: a ``Sleep`` becomes a
    timer, at whose end ``drive`` resumes the keeper in a task (the sleep's answer is None,
    what the task's first send gives). Any other first effect goes to ``drive`` at once.
    """

    def __init__(self, keeper: Coroutine[Any, Any, Any], drive: Drive) -> None:
        self._keeper, self._drive = keeper, drive
        self._task: asyncio.Task[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None
        loop = asyncio.get_running_loop()
        try:
            first = keeper.send(None)
        except StopIteration:
            return
        if isinstance(first, Sleep):
            self._timer = loop.call_later(first.seconds, self._wake)
        else:
            self._task = loop.create_task(drive(_Resumed(keeper, first).coroutine()))

    def _wake(self) -> None:
        self._timer = None
        self._task = asyncio.get_running_loop().create_task(self._drive(self._keeper))

    async def stop(self) -> None:
        """Cancel it and wait for its end (an error it ended with is raised here).

        The cancellation it ends with is ours and is taken in; one of the caller's own (its
        task was cancelled from outside while it waited here) is raised, after the
        refresher has ended all the same."""
        if self._timer is not None:  # still in its first sleep: nothing runs yet
            self._timer.cancel()
            self._timer = None
            self._keeper.close()
        elif self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                caller = asyncio.current_task()
                if caller is not None and caller.cancelling():
                    raise


class _Resumed(Generic[T]):
    """An engine coroutine whose first effect was taken by hand, for a driver to go on with.

    ``__await__`` yields that effect first, then passes every answer (a value sent or an
    error thrown) on to the coroutine and yields what it yields next.
    """

    def __init__(self, work: Coroutine[Any, Any, T], pending: Any) -> None:
        self._work, self._pending = work, pending

    async def coroutine(self) -> T:
        return await self

    def __await__(self) -> Generator[Any, Any, T]:
        work, pending = self._work, self._pending
        while True:
            try:
                sent = yield pending
            except GeneratorExit:  # closed by its driver (a crash)
                work.close()
                raise
            except BaseException as exc:  # an operating error, or a cancellation
                try:
                    pending = work.throw(exc)
                except StopIteration as done:
                    return cast(T, done.value)
            else:
                try:
                    pending = work.send(sent)
                except StopIteration as done:
                    return cast(T, done.value)
