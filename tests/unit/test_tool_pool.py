"""The asyncio driver's tool pool: at most [8] threads at once, results in call order, the
batch deadline cutting a stuck call, and a driver ceiling tightening the turn's bounds (TOOL-5)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from hermes_ref.models import ToolCall, ToolResult
from hermes_ref.shell import tool_pool
from hermes_ref.tool_batch import BatchBounds


class Sleepy:
    """A runner whose calls sleep ``seconds`` (forever for ids in ``stuck``), counting overlap."""

    def __init__(self, seconds: float, stuck: frozenset[str] = frozenset()) -> None:
        self.seconds, self.stuck = seconds, stuck
        self.lock = threading.Lock()
        self.running = self.most_at_once = 0
        self.release = threading.Event()
        self.started: list[str] = []

    def run(self, call: ToolCall, *, watermark: int = 0, at: float = 0.0) -> ToolResult:
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self.started.append(call.id)
        try:
            if call.id in self.stuck:
                self.release.wait(30)
            else:
                time.sleep(self.seconds)
        finally:
            with self.lock:
                self.running -= 1
        return ToolResult(call_id=call.id, name=call.name, content=f"done {call.id}")


def _calls(n: int) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(id=f"c{i}", name="read_file", arguments="{}") for i in range(n))


def test_twelve_calls_run_eight_at_a_time_and_answer_in_call_order() -> None:
    """Twelve 0.2 s calls take two rounds on eight threads; results come in call order."""
    tools = Sleepy(0.2)
    began = time.monotonic()
    results = asyncio.run(tool_pool.run_segment(tools, time.time, _calls(12), 0, BatchBounds(),
                                                parallel=True))
    took = time.monotonic() - began
    assert [r.call_id for r in results] == [f"c{i}" for i in range(12)]
    assert tools.most_at_once == 8  # eight at once, never more: twelve calls take two rounds
    assert took > 0.38, took  # two rounds of 0.2 s at the least (no upper bound: load varies)
    assert set(tools.started[:8]) == {f"c{i}" for i in range(8)}  # the first eight go first


def test_a_stuck_call_is_cut_at_the_deadline_and_the_others_count() -> None:
    """At the deadline the stuck call gets the timed-out result in place; the batch returns."""
    tools = Sleepy(0.05, stuck=frozenset({"c1"}))
    began = time.monotonic()
    try:
        results = asyncio.run(tool_pool.run_segment(
            tools, time.time, _calls(3), 0, BatchBounds(deadline_s=0.5), parallel=True))
    finally:
        tools.release.set()
    took = time.monotonic() - began
    assert [r.call_id for r in results] == ["c0", "c1", "c2"]
    assert results[1].is_error and results[1].disposition == "unknown"
    assert "timed out after 0.5s" in results[1].content
    assert results[0].content == "done c0" and results[2].content == "done c2"
    # it returned at the deadline: waiting for the stuck call would have taken its 30 s
    assert 0.5 <= took < 10.0, took


def test_a_driver_ceiling_tightens_the_turns_bounds() -> None:
    """The driver's own ceiling wins where it is tighter; the gate stays the turn's."""
    bounds = BatchBounds(8, 420.0, 120.0).tighter(2, 10.0)
    assert (bounds.workers_max, bounds.deadline_s, bounds.gate_s) == (2, 10.0, 5.0)
    tools = Sleepy(0.05)
    asyncio.run(tool_pool.run_segment(tools, time.time, _calls(5), 0, bounds, parallel=True))
    assert tools.most_at_once == 2


def test_a_sequential_segment_runs_one_call_at_a_time() -> None:
    """A sequential segment never overlaps its calls, even with workers to spare."""
    tools = Sleepy(0.02)
    asyncio.run(tool_pool.run_segment(tools, time.time, _calls(3), 0, BatchBounds(),
                                      parallel=False))
    assert tools.most_at_once == 1


class Raising(Sleepy):
    """A runner whose every call raises."""

    def run(self, call: ToolCall, *, watermark: int = 0, at: float = 0.0) -> ToolResult:
        raise RuntimeError(f"the runner broke on {call.id}")


def test_a_runner_that_raises_gets_its_own_error_as_the_result() -> None:
    """A raising runner's call ends with that error as its tool result, not a timeout (TOOL-6)."""
    began = time.monotonic()
    results = asyncio.run(tool_pool.run_segment(Raising(0.0), time.time, _calls(2), 0,
                                                BatchBounds(deadline_s=5.0), parallel=True))
    assert time.monotonic() - began < 1.0
    for i, result in enumerate(results):
        assert result.is_error and result.disposition == "unknown", result.content
        assert f"the runner broke on c{i}" in result.content and "timed out" not in result.content


def test_a_call_a_worker_took_but_had_not_begun_at_the_deadline_never_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that dequeued its call before the deadline, and reaches it only after the
    batch gave up, must not run it once the call is reported as not started."""
    took, go = threading.Event(), threading.Event()

    class LateStart(ThreadPoolExecutor):
        """Each worker, holding its call, waits for ``go`` before it enters the call."""

        def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
            def late(*inner: Any) -> Any:
                took.set()
                go.wait(5)
                return fn(*inner)
            return super().submit(late, *args, **kwargs)

    monkeypatch.setattr(tool_pool, "ThreadPoolExecutor", LateStart)
    tools = Sleepy(0.0)

    async def batch_then_release() -> tuple[ToolResult, ...]:
        try:
            return await tool_pool.run_segment(
                tools, time.time, _calls(1), 0, BatchBounds(deadline_s=0.2), parallel=True)
        finally:
            go.set()  # the worker goes on while the loop still runs, as in a live driver
            await asyncio.sleep(0.2)

    results = asyncio.run(batch_then_release())
    assert took.is_set()
    reported_started = results[0].disposition == "unknown"
    assert reported_started or tools.started == [], (
        f"reported {results[0].content!r}, yet the call then ran")
