"""One tool segment run on the virtual clock: a pool of workers, a start gate, a deadline.

Theory of operation
-------------------
``run_segment`` performs an ``ExecuteTools`` effect for ``SimDriver`` under the rules
of ``hermes_ref.tool_batch`` (TOOL-5), as a chain of ``Wait`` answers: at each instant
where something happens the runner does what is due, then waits for the next instant,
so other actors (a lease refresher, another process) run while the batch is in flight.
At one instant, in this order:

1. calls whose work ends now finish and free their worker; several ending at the same
   instant finish in an order drawn from the world's "tool_completion" sub-stream, so
   the order results come back in is the seed's, not the call order;
2. free workers go to the waiting calls in call order (the call is *ready*);
3. ready calls pass the start gate in call order (``may_start``: every earlier call has
   started, or the gate expired), and begin after their scripted start delay;
4. calls beginning now run their side effect (``SimTools.run_stamped``: the ledger
   entry gets the batch's record) and end ``duration`` later (never, when stuck). A call
   that begins after the batch's first instant is vouched for first (LEASE-4,
   ``tool_batch.vouch_again``): if the store says the turn's lease is gone (its process
   froze past it), the call never begins and the turn is interrupted.

A call scripted with ``stall_s`` (``SimTools.slow``) freezes the batch's process as it is
dispatched to wait out its start delay: the scheduler runs none of the process's actors
(its lease refresher included) for that long, the freeze is recorded in ``world.stalls``
(the lease checkers excuse a lapse in it) and in ``tools.late_stalls``, and the timeline
says so. This is the world of explored seed 39168 made on purpose (the explorer's
``frozen_late_start``): when the process wakes, the call is past its start and its lease
may be gone.

At the deadline whatever has not ended gets its timed-out result in place
(``tool_batch.timed_out``). A sequential segment is the same with one worker.
Durations come from ``SimTools.timing``; a hung tool (``hang``) reports its own timeout
after exactly the deadline, which still counts.

The timeline narrates results in call order when the batch ends, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hermes_ref import tool_batch
from hermes_ref.effects import ExecuteTools
from hermes_ref.errors import InvariantBroken
from hermes_ref.models import ToolCall, ToolResult
from hermes_ref.tool_batch import BatchBounds
from sim.scheduler import Wait
from sim.tools import BatchStamp

if TYPE_CHECKING:
    from sim.world import World

EPS = 1e-6  # the virtual clock counts from a large epoch: its float keeps about 1e-7 s


@dataclass
class _Slot:
    index: int
    call: ToolCall
    delay_s: float
    duration_s: float
    ready_s: float | None = None
    dispatched_s: float | None = None
    end_s: float | None = None
    started: bool = False
    done: bool = False

    @property
    def start_s(self) -> float | None:
        return None if self.dispatched_s is None else self.dispatched_s + self.delay_s


@dataclass
class SimBatch:
    world: World
    effect: ExecuteTools
    bounds: BatchBounds
    slots: list[_Slot]
    batch_no: int
    t0: float
    watermark: int
    pid: int | None = None  # the process running the batch, as its ledger entries say
    vouch: Callable[[], None] | None = None  # raises TurnInterrupted once the lease is gone
    finished: list[ToolResult] = field(default_factory=list)
    results: dict[int, ToolResult] = field(default_factory=dict)

    @property
    def now_s(self) -> float:
        return self.world.clock.now() - self.t0

    # -- one instant ----------------------------------------------------------------
    def step(self) -> Wait | tuple[ToolResult, ...]:
        now = self.now_s
        if now >= tool_batch.gives_up_at(self.bounds) - EPS:
            self._end_ending(now)
            return self._finish()
        changed = True
        while changed:
            changed = self._end_ending(now)
            changed = self._give_workers(now) or changed
            changed = self._dispatch(now) or changed
            changed = self._begin(now) or changed
        if all(s.done for s in self.slots):
            return self._finish()
        then = self._next_instant(now)
        if math.isinf(then):  # a stuck call and no deadline to cut it: the turn would hang
            raise InvariantBroken("a tool batch waits forever: a call never ends and the "
                                  "batch has no deadline")
        return Wait(max(0.0, then - now), self.step)

    def _end_ending(self, now: float) -> bool:
        ending = [s for s in self.slots if s.started and not s.done
                  and s.end_s is not None and s.end_s <= now + EPS]
        if len(ending) > 1:  # same instant: the seed says which finishes first
            keys = {s.index: self.world.chooser.fraction("tool_completion") for s in ending}
            ending.sort(key=lambda s: keys[s.index])
        for slot in ending:
            slot.done = True
            self.finished.append(self.results[slot.index])
        return bool(ending)

    def _busy(self) -> int:
        return sum(1 for s in self.slots if s.ready_s is not None and not s.done)

    def _give_workers(self, now: float) -> bool:
        width = self.bounds.workers(len(self.slots)) if self.effect.parallel else 1
        free = width - self._busy()
        waiting = [s for s in self.slots if s.ready_s is None]
        for slot in waiting[:max(0, free)]:
            slot.ready_s = now
        return free > 0 and bool(waiting)

    def _dispatch(self, now: float) -> bool:
        changed = False
        for slot in self.slots:
            if slot.ready_s is None or slot.dispatched_s is not None:
                continue
            earlier = all(s.started for s in self.slots[:slot.index])
            if tool_batch.may_start(slot.ready_s, now + EPS, earlier, self.bounds):
                slot.dispatched_s = now
                changed = True
                if slot.delay_s <= 0:
                    self._begin(now)  # a call that begins at once lets the next one pass
                else:
                    self._freeze_while_waiting(slot)
        return changed

    def _freeze_while_waiting(self, slot: _Slot) -> None:
        """The scripted freeze of a call that waits to begin (see the module docstring)."""
        world = self.world
        seconds = world.tools.late_stall_s(slot.call)
        if seconds <= 0 or self.pid is None:
            return
        world.tools.late_stalls.append((self.pid, *world.stall(self.pid, seconds)))
        world.timeline.add("FAULT", f"pid={self.pid} stalls for {seconds:g} s while "
                           f"{slot.call.id} waits {slot.delay_s:g} s to begin")

    def _begin(self, now: float) -> bool:
        changed = False
        for slot in self.slots:
            start = slot.start_s
            if slot.started or start is None or start > now + EPS:
                continue
            if self.vouch is not None and tool_batch.vouch_again(now):
                self.vouch()  # LEASE-4: the batch's own vouch was for its first instant
            slot.started, changed = True, True
            slot.end_s = now + slot.duration_s
            self.results[slot.index] = self._run(slot, now)
        return changed

    def _run(self, slot: _Slot, now: float) -> ToolResult:
        t0 = self.t0
        ended = None if math.isinf(slot.duration_s) else t0 + now + slot.duration_s
        stamp = BatchStamp(batch=self.batch_no, parallel=self.effect.parallel, batch_at=t0,
                           ready_at=t0 + (slot.ready_s or 0.0),
                           dispatched_at=t0 + (slot.dispatched_s or 0.0), ended_at=ended,
                           pid=self.pid, session_id=self.effect.session_id)
        return self.world.tools.run_stamped(slot.call, stamp, watermark=self.watermark,
                                            at=t0 + now)

    def _next_instant(self, now: float) -> float:
        times = [tool_batch.gives_up_at(self.bounds)]
        for slot in self.slots:
            if slot.done:
                continue
            if slot.started and slot.end_s is not None:
                times.append(slot.end_s)
            elif slot.dispatched_s is not None and slot.start_s is not None:
                times.append(slot.start_s)
            elif slot.ready_s is not None:
                times.append(tool_batch.release_s(slot.ready_s, self.bounds))
        later = [t for t in times if t > now + EPS]
        return min(later) if later else now

    # -- the end ----------------------------------------------------------------------
    def _finish(self) -> tuple[ToolResult, ...]:
        cut = [tool_batch.timed_out(s.call, self.bounds, started=s.started)
               for s in self.slots if not s.done]
        answer = tuple(self.finished) + tuple(cut)
        world = self.world
        if world.timeline.enabled:
            mode = "parallel" if self.effect.parallel else "sequential"
            by_id = {r.call_id: r for r in answer}
            for slot in self.slots:
                result = by_id[slot.call.id]
                state = "timed out" if not slot.done else "error" if result.is_error else "ok"
                world.timeline.add("tool", f"{mode:<10} {result.call_id} {result.name} {state}")
        return answer


def run_segment(world: World, effect: ExecuteTools, hung_s: float, pid: int | None = None,
                vouch: Callable[[], None] | None = None) -> Wait:
    """Start the segment's batch now; the answer arrives when it ends (see the docstring).

    ``hung_s`` is how long a hung tool takes to report its own timeout; ``pid`` is the
    process that runs it, named in its ledger entries (a stall of that process holds the
    batch back, which TOOL-5's start gate checker must tell from the engine's own wait);
    ``vouch`` raises ``TurnInterrupted`` when the turn's lease no longer holds.
    """
    bounds = effect.bounds.tighter(world.tool_workers_max, world.tool_batch_deadline_s)
    slots = []
    for index, call in enumerate(effect.calls):
        delay_s, duration_s = world.tools.timing(call)
        if world.tools.is_hung(call.name):
            duration_s = hung_s
        slots.append(_Slot(index, call, delay_s, duration_s))
    batch = SimBatch(world, effect, bounds, slots, len(world.batches), world.clock.now(),
                     world.store.watermark(), pid, vouch)
    world.batches.append(tuple(call.id for call in effect.calls))
    outcome = batch.step()  # the first calls start now, as the effect is performed
    return outcome if isinstance(outcome, Wait) else Wait(0.0, lambda: outcome)
