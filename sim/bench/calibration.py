"""The calibration row: the floor of the effect machinery, measured in the same process.

Theory of operation
-------------------
A simulated memory turn spends its time in three places: the effect machinery (each
``await`` of an effect suspends the engine's coroutine through ``Effect.__await__``, the
driver's loop resumes it with ``send`` or ``throw``), the engine's own work between two
effects, and the simulated world that answers each effect. The calibration row measures
the first alone, on the very same sequence of effects, so the memory row can be read as
a share of what this machine could possibly do with that sequence. Absolute turns/s move
2-3x between machines of one class; the share is steadier.

1. **Record** (once, untimed). One turn of the memory rig (``SyncRig`` on a fresh
   ``MemoryStore``, a fresh session after one warm-up turn, as the memory row runs them)
   goes through ``RecordingDriver``: a wrapper of ``sim.driver.SimDriver`` that hands
   ``SimDriver.run`` a proxy coroutine (``_Recorder``). The proxy forwards ``send``,
   ``throw`` and ``close`` to the engine's coroutine and writes down each effect the
   engine yields and what the driver answers it with: the value it sends back, or the
   ``OperatingError`` it throws. ``SimDriver`` is not changed and cannot tell; the turn is
   checked like every timed turn (``check_turn``). The result is a ``Tape``.
2. **Replay** (timed). ``replay(tape)`` is a bare coroutine that awaits the recorded
   effect objects, in order, and returns the recorded result: the same number and kinds
   of effects carrying the same message values, with no engine logic between them.
   ``run_tape`` is the minimal driver loop that steps it: ``send``/``throw`` exactly as
   ``SimDriver.run`` does, answering the i-th effect with the i-th recorded answer (and
   refusing an effect that is not the recorded one), with no world and no handlers.
3. **Time** it like a throughput row: ``warmup_turns`` untimed replays, then as many as fit
   in ``rep_s``, ``reps`` times; one replay is one calibration turn.

``memory_share_of_calibration`` (in ``sim.bench.ratios``) is memory turns/s over
calibration turns/s: the fraction of the effect machinery's own rate that a whole
simulated turn reaches.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

from hermes_ref.effects import Effect
from hermes_ref.outcomes import TurnResult
from sim.bench.rig import Sizes, SyncRig, check_turn
from sim.bench.rows import GcClock, Throughput
from sim.driver import SimDriver
from sim.store import MemoryStore

__all__ = ["RecordingDriver", "ReplayMismatch", "Step", "Tape", "calibration_throughput",
           "record", "replay", "run_tape"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Step:
    """One recorded effect and the driver's answer: a value sent back, or an error thrown."""

    effect: Effect[Any]
    value: Any
    error: BaseException | None


@dataclass(frozen=True)
class Tape:
    """The effect sequence of one recorded turn, and the turn's result."""

    steps: tuple[Step, ...]
    result: TurnResult

    @cached_property
    def effects(self) -> tuple[Effect[Any], ...]:
        return tuple(step.effect for step in self.steps)

    def kinds(self) -> tuple[str, ...]:
        return tuple(type(effect).__name__ for effect in self.effects)


class ReplayMismatch(RuntimeError):
    """The replayed coroutine yielded something other than the recorded effect."""


# -- record -------------------------------------------------------------------------------


class _Recorder(Coroutine[Effect[Any], Any, T]):
    """A coroutine that forwards to ``inner`` and writes down every effect and its answer.

    The answer to an effect is what the driver passes to the *next* ``send`` or ``throw``,
    so each call first closes the pending step, then resumes the engine.
    """

    def __init__(self, inner: Coroutine[Any, Any, T]) -> None:
        self._inner = inner
        self._pending: Effect[Any] | None = None
        self.steps: list[Step] = []

    @property
    def unanswered(self) -> bool:
        return self._pending is not None

    def _answered(self, value: Any, error: BaseException | None) -> None:
        if self._pending is not None:
            self.steps.append(Step(self._pending, value, error))
            self._pending = None

    def _yielded(self, effect: Effect[Any]) -> Effect[Any]:
        self._pending = effect
        return effect

    def send(self, value: Any) -> Effect[Any]:
        self._answered(value, None)
        return self._yielded(self._inner.send(value))

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Effect[Any]:
        if isinstance(typ, BaseException):
            error = typ  # what SimDriver.run throws: an instance
        elif isinstance(val, BaseException):
            error = val
        else:
            error = typ() if val is None else typ(val)
        self._answered(None, error)
        return self._yielded(self._inner.throw(error))

    def close(self) -> None:
        self._inner.close()

    def __await__(self) -> Generator[Any, None, T]:
        raise TypeError("a recorder is driven by SimDriver.run, not awaited")


class RecordingDriver:
    """``SimDriver`` wrapped: runs a coroutine through it and keeps the ``Tape``."""

    def __init__(self, driver: SimDriver) -> None:
        self.driver = driver

    def run(self, coro: Coroutine[Any, Any, TurnResult]) -> Tape:
        recorder = _Recorder(coro)
        result = self.driver.run(recorder)
        if recorder.unanswered:
            raise RuntimeError("the turn ended with an unanswered effect")
        return Tape(tuple(recorder.steps), result)


def record(session_id: str = "calibration") -> Tape:
    """Record one scripted memory turn: fresh world, one warm-up turn, a fresh session."""
    rig = SyncRig(MemoryStore())
    check_turn(rig.turn("warm"))
    tape = RecordingDriver(rig.driver).run(rig.turn_coro(session_id))
    check_turn(tape.result)
    rig.store.close()
    return tape


# -- replay -------------------------------------------------------------------------------


async def _awaiting(effects: tuple[Effect[Any], ...], result: T) -> T:
    for effect in effects:
        await effect
    return result


def replay(tape: Tape) -> Coroutine[Any, Any, TurnResult]:
    """A bare coroutine that awaits the tape's effect objects in order, then returns its result."""
    return _awaiting(tape.effects, tape.result)


def run_tape(coro: Coroutine[Any, Any, T], steps: tuple[Step, ...]) -> T:
    """Step ``coro`` as ``SimDriver.run`` does, answering each effect from ``steps``.

    The identity check is one comparison per effect: it keeps the replay honest (the same
    effect objects, in order) at a cost far below the resumption it guards.
    """
    value: Any = None
    error: BaseException | None = None
    answers = iter(steps)
    while True:
        try:
            effect = coro.send(value) if error is None else coro.throw(error)
        except StopIteration as stop:
            if next(answers, None) is not None:
                raise ReplayMismatch("the coroutine finished before the tape") from None
            return stop.value  # type: ignore[no-any-return]
        step = next(answers, None)
        if step is None or effect is not step.effect:
            coro.close()
            raise ReplayMismatch(f"unexpected effect {type(effect).__name__}")
        value, error = step.value, step.error
        if error is not None:
            error = error.with_traceback(None)  # a replayed error must not grow a traceback


def calibration_throughput(tape: Tape, sizes: Sizes) -> Throughput:
    """Replays per second, timed like ``sim.bench.rows.sync_throughput`` (one replay = one turn)."""
    out = Throughput()
    steps = tape.steps
    for _ in range(sizes.reps):
        for _ in range(sizes.warmup_turns):
            run_tape(replay(tape), steps)
        gc.collect()
        with GcClock() as gc_clock:
            n = 0
            start = time.perf_counter()
            deadline = start + sizes.rep_s
            while True:
                run_tape(replay(tape), steps)
                n += 1
                now = time.perf_counter()
                if now >= deadline:
                    break
        out.add(n, now - start, 0, gc_clock.total_s)
    return out
