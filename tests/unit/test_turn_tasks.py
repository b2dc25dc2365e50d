"""The asyncio driver's per-run bookkeeping: interruptible waits and lazy lease refreshers."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from hermes_ref.effects import Now, Sleep
from hermes_ref.errors import TurnInterrupted
from hermes_ref.shell import turn_tasks
from hermes_ref.shell.turn_tasks import Refresher, RunState, interruptible


async def test_an_interrupt_ends_the_wait_in_the_waiting_task_itself() -> None:
    """The work is cancelled in the caller's task and the caller gets TurnInterrupted."""
    state, seen = RunState(), []

    async def work() -> str:
        seen.append(asyncio.current_task())
        await asyncio.Event().wait()
        return "unreachable"

    async def turn() -> str:
        return await interruptible(state, work())

    task = asyncio.create_task(turn())
    await asyncio.sleep(0)
    state.raise_interrupt("interrupted_by_user")
    with pytest.raises(TurnInterrupted, match="interrupted_by_user"):
        await task
    assert seen == [task] and task.cancelling() == 0 and not state.waiting


async def test_work_that_turns_the_interrupt_into_its_own_error_is_interrupted() -> None:
    """A client library may answer the cancellation with an error of its own: the turn is
    still told it was interrupted, and the task keeps no cancellation of ours."""
    state = RunState()

    async def work() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("connection torn down") from None
        return "unreachable"

    async def turn() -> tuple[str, int, bool]:
        try:
            await interruptible(state, work())
        except TurnInterrupted as stop:
            me = asyncio.current_task()
            assert me is not None
            return str(stop), me.cancelling(), me in state.cancelled
        return "not interrupted", 0, False

    task = asyncio.create_task(turn())
    await asyncio.sleep(0)
    state.raise_interrupt("interrupted_by_user")
    reason, cancelling, kept = await task
    assert "interrupted_by_user" in reason and cancelling == 0 and not kept


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    """Cancelled by its owner as well as interrupted: the task ends cancelled."""
    state = RunState()
    task = asyncio.create_task(interruptible(state, asyncio.Event().wait()))
    await asyncio.sleep(0)
    state.raise_interrupt("lost")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_work_that_ends_without_waiting_is_not_interruptible_meanwhile() -> None:
    """A coroutine that never suspends returns its value; an interrupt before it refuses it."""
    state = RunState()

    async def answer() -> int:
        return 42

    assert await interruptible(state, answer()) == 42
    state.raise_interrupt("lost")
    refused = answer()
    with pytest.raises(TurnInterrupted):
        await interruptible(state, refused)
    assert refused.cr_frame is None  # closed, never run


class Drive:
    """A stand-in for the driver's run: answers ``Now`` with 1.0 and ``Sleep`` with None;
    cancelled, it closes the coroutine, as ``AsyncDriver._step`` does."""

    def __init__(self) -> None:
        self.effects: list[Any] = []

    async def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        value: Any = None
        while True:
            try:
                effect = coro.send(value)
            except StopIteration as stop:
                return stop.value
            self.effects.append(effect)
            if isinstance(effect, Sleep):
                try:
                    await asyncio.sleep(effect.seconds)
                except BaseException:  # cancelled: the coroutine is dropped, as the driver does
                    coro.close()
                    raise
            value = 1.0 if isinstance(effect, Now) else None


async def keeper(beats: list[float]) -> None:
    while True:
        await Sleep(0.01)
        beats.append(await Now())


class Drives(Drive):
    """A ``Drive`` that also keeps the coroutines it was asked to drive (one per task)."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[Coroutine[Any, Any, Any]] = []

    async def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        self.started.append(coro)
        return await super().run(coro)


async def test_a_refresher_is_a_timer_until_its_first_sleep_ends() -> None:
    """No task while the first sleep lasts; at its end the driver goes on with the keeper."""
    beats: list[float] = []
    drive = Drives()
    refresher = Refresher(keeper(beats), drive.run)
    await asyncio.sleep(0)
    assert drive.started == [] and drive.effects == []
    await asyncio.sleep(0.05)
    assert beats and len(drive.started) == 1
    await refresher.stop()
    assert drive.started[0].cr_frame is None  # its task ended with it


async def test_a_refresher_stopped_in_its_first_sleep_never_runs() -> None:
    """Stopping it cancels the timer and closes the keeper where it waits."""
    beats: list[float] = []
    coro = keeper(beats)
    drive = Drives()
    refresher = Refresher(coro, drive.run)
    await refresher.stop()
    await asyncio.sleep(0.03)
    assert beats == [] and coro.cr_frame is None and drive.started == []


async def test_a_keeper_that_does_not_begin_with_a_sleep_is_driven_at_once() -> None:
    """Any other first effect goes to the driver, which performs it and goes on."""
    async def eager(beats: list[float]) -> None:
        beats.append(await Now())
        await keeper(beats)

    beats: list[float] = []
    drive = Drive()
    refresher = Refresher(eager(beats), drive.run)
    await asyncio.sleep(0.03)
    assert beats[:2] == [1.0, 1.0] and isinstance(drive.effects[0], Now)
    await refresher.stop()


async def test_a_cancel_of_the_caller_while_it_stops_a_refresher_stays_a_cancel() -> None:
    """The refresher's own cancellation is taken in; one of the stopping task's is not,
    and the refresher has ended by the time it is raised (stop, then join)."""
    beats: list[float] = []
    drive = Drives()
    refresher = Refresher(keeper(beats), drive.run)
    await asyncio.sleep(0.03)  # past its first sleep: a task now
    assert len(drive.started) == 1
    stopper = asyncio.create_task(refresher.stop())
    await asyncio.sleep(0)  # the stopper has cancelled the refresher and waits for its end
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert drive.started[0].cr_frame is None


async def test_a_run_cancelled_while_closing_stops_every_refresher_first() -> None:
    """``RunState.close`` goes on to the last refresher before it raises the cancel."""
    state = RunState()
    drive = Drives()
    for _ in range(3):
        state.refreshers[turn_tasks.next_handle()] = Refresher(keeper([]), drive.run)
    await asyncio.sleep(0.03)
    assert len(drive.started) == 3
    closer = asyncio.create_task(state.close())
    await asyncio.sleep(0)
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert state.refreshers == {}
    assert all(coro.cr_frame is None for coro in drive.started)


def test_handles_are_distinct() -> None:
    """Each refresher gets a handle of its own."""
    assert turn_tasks.next_handle() != turn_tasks.next_handle()
