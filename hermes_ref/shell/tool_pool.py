"""Real concurrency for one tool segment: a bounded thread pool under the batch rules.

Theory of operation
-------------------
``run_segment`` performs an ``ExecuteTools`` effect for the asyncio driver under the
rules of ``hermes_ref.tool_batch`` (TOOL-5), with real threads:

* each batch gets its own ``ThreadPoolExecutor`` of ``bounds.workers(n)`` threads (one
  for a sequential segment), so a call that outlives the batch never takes a worker
  from the next batch, and the loop's default executor (about six threads on a
  two-core machine) never caps the batch below its bound;
* a semaphore hands the workers out in call order; a call holding one waits for the
  previous call to have started (its thread entered ``run``), at most ``bounds.gate_s``,
  then starts anyway (the start-order gate);
* the whole batch has ``bounds.deadline_s``: at the deadline every call not finished
  gets its timed-out result in place (``tool_batch.timed_out``: ``unknown`` if it had
  started, ``none`` if not). Its thread cannot be stopped and ends on its own (the
  workspace tools end their processes at their own timeouts); the pool is shut down
  without waiting for it. Starting is decided under one lock: a worker marks its call
  begun under it, and the batch, giving up, takes it to read the marks and to forbid
  any further start, so a call reported as not started never starts afterwards;
* a runner that raises (it should not: TOOL-6) gets its own error as the call's
  result, with disposition ``unknown``, not a timeout;
* a call that begins after the batch did is vouched for first (``vouch``, LEASE-4:
  ``tool_batch.vouch_again``), on the loop, before a worker thread takes it. A refusal
  (``TurnInterrupted``) ends the batch at once, as a deadline would, and is raised to
  the turn once the batch has given up, so that call and those after it never begin.

Results come back in call order (the effect allows any order, and the tool round
restores call order itself; the simulator hands them back as they finished).
``run_inline`` is the no-thread form for synchronous runners that must stay on the
loop: the calls run one after another and the deadline is checked between them,
since a running call cannot be interrupted; the lease is vouched for between them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from hermes_ref import tool_batch
from hermes_ref.models import ToolCall, ToolResult
from hermes_ref.ports import ToolRunner
from hermes_ref.tool_batch import BatchBounds
from hermes_ref.tool_specs import error_result


async def run_segment(tools: ToolRunner, clock: Callable[[], float], calls: tuple[ToolCall, ...],
                      watermark: int, bounds: BatchBounds, *, parallel: bool,
                      vouch: Callable[[], Awaitable[None]] | None = None
                      ) -> tuple[ToolResult, ...]:
    """Run ``calls`` in threads within ``bounds``; see the module docstring."""
    loop = asyncio.get_running_loop()
    began_at = time.monotonic()  # the lease was vouched for just before: a step of the wall
    # clock must not make a later call look as if it began at that instant
    width = bounds.workers(len(calls)) if parallel else 1
    pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="hermes-tool")
    slots = asyncio.Semaphore(width)
    started = [asyncio.Event() for _ in calls]
    began = [False] * len(calls)
    start_lock = threading.Lock()  # a call starts, or the batch gives up on it: one or the other
    gave_up = False
    finished: list[tuple[int, ToolResult]] = []

    def work(index: int, call: ToolCall) -> ToolResult | None:
        with start_lock:
            if gave_up:
                return None  # reported as not started: it must never start
            began[index] = True
        loop.call_soon_threadsafe(started[index].set)
        return _run_one(tools, call, watermark, clock)

    async def one(index: int, call: ToolCall) -> None:
        async with slots:  # the call is ready: it holds a worker
            if index:
                with contextlib.suppress(TimeoutError):  # the gate expired: start anyway
                    await asyncio.wait_for(started[index - 1].wait(), bounds.gate_s)
            if vouch is not None and tool_batch.vouch_again(time.monotonic() - began_at):
                await vouch()  # raises when the lease is gone: the call never begins
            result = await loop.run_in_executor(pool, work, index, call)
            if result is not None:
                finished.append((index, result))

    tasks = [asyncio.create_task(one(i, call)) for i, call in enumerate(calls)]
    try:
        await asyncio.wait(tasks, timeout=tool_batch.gives_up_at(bounds),
                           return_when=asyncio.FIRST_EXCEPTION)  # a refused vouch ends it
    finally:
        with start_lock:
            gave_up = True
            had_begun = list(began)
        for task in tasks:
            task.cancel()  # no-op for finished tasks; abandons calls past the deadline
        pool.shutdown(wait=False, cancel_futures=True)
        # let the cancelled tasks end now (a call's thread may run on, its result dropped),
        # so the batch leaves no task behind it
        await asyncio.gather(*tasks, return_exceptions=True)
    failures = [task.exception() for task in tasks if task.done() and not task.cancelled()]
    for failure in failures:  # every one retrieved, so none is reported as never retrieved
        if failure is not None:
            raise failure
    done = {index for index, _ in finished}
    cut = {i: tool_batch.timed_out(call, bounds, started=had_begun[i])
           for i, call in enumerate(calls) if i not in done}
    ran = dict(finished)
    return tuple(ran[i] if i in ran else cut[i] for i in range(len(calls)))


def _run_one(tools: ToolRunner, call: ToolCall, watermark: int,
             clock: Callable[[], float]) -> ToolResult:
    """One call; a runner that raises gets its own error as the call's result (TOOL-6)."""
    try:
        return tools.run(call, watermark=watermark, at=clock())
    except Exception as exc:  # the runner broke its promise never to raise: say how
        return error_result(call, f"{call.name} failed: {exc!r}", "unknown")


async def run_inline(tools: ToolRunner, clock: Callable[[], float], calls: tuple[ToolCall, ...],
                     watermark: int, bounds: BatchBounds,
                     vouch: Callable[[], Awaitable[None]] | None = None
                     ) -> tuple[ToolResult, ...]:
    """Synchronous tools on the loop, in order; the deadline and the lease are checked
    between calls."""
    began_at = time.monotonic()
    deadline = began_at + tool_batch.gives_up_at(bounds)
    results: list[ToolResult] = []
    for call in calls:
        if len(results) and time.monotonic() >= deadline:
            results.append(tool_batch.timed_out(call, bounds, started=False))
            continue
        if vouch is not None and tool_batch.vouch_again(time.monotonic() - began_at):
            await vouch()  # raises when the lease is gone: this call never begins
        results.append(_run_one(tools, call, watermark, clock))
    return tuple(results)
