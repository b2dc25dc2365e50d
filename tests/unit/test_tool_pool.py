"""The asyncio driver's tool pool: at most [8] threads at once, results in call order, the
batch deadline cutting a stuck call, and a driver ceiling tightening the turn's bounds (TOOL-5)."""

from __future__ import annotations

import asyncio
import threading
import time

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
    assert tools.most_at_once == 8
    assert 0.38 < took < 1.0, took
    assert tools.started[:8] == [f"c{i}" for i in range(8)]


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
    assert 0.5 <= took < 0.9, took


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
