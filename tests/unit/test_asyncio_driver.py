"""AsyncDriver end to end: aiosqlite store, HttpProvider over a fake transport, real tools."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_ref.effects import ExecuteTools, Jitter, MintId
from hermes_ref.engine import Engine
from hermes_ref.errors import PersistenceError, RateLimited
from hermes_ref.limits import Limits
from hermes_ref.models import Event, Message, ProviderReply, Role, ToolCall, ToolResult
from hermes_ref.outcomes import ExitReason, TurnResult
from hermes_ref.prologue import TurnInput
from hermes_ref.shell.driver import AsyncDriver
from hermes_ref.shell.http_provider import HttpProvider
from hermes_ref.shell.runtime import open_runtime
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from hermes_ref.shell.workspace_tools import WorkspaceTools
from hermes_ref.tool_specs import REFERENCE_TOOLS
from hermes_ref.wire import ProviderRequest
from sim.provider import ScriptedProvider, text, tool_calls
from sim.provider_http import fake_transport

BASE_URL = "http://provider.test/v1"


class SlowTools:
    """WorkspaceTools behind per-path delays (in the worker thread), counting overlap."""

    def __init__(self, inner: WorkspaceTools, delays: dict[str, float]) -> None:
        self.inner = inner
        self.delays = delays
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def run(self, call: ToolCall, *, watermark: int = 0, at: float = 0.0) -> ToolResult:
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            time.sleep(self.delays.get(str((call.parsed_arguments() or {}).get("path")), 0.0))
            return self.inner.run(call, watermark=watermark, at=at)
        finally:
            with self._lock:
                self.running -= 1


class HangingTools:
    """Calls on ``path`` block until released (or 10 s); everything else runs normally."""

    def __init__(self, inner: WorkspaceTools, path: str) -> None:
        self.inner = inner
        self.path = path
        self.release = threading.Event()

    def run(self, call: ToolCall, *, watermark: int = 0, at: float = 0.0) -> ToolResult:
        if (call.parsed_arguments() or {}).get("path") == self.path:
            self.release.wait(10.0)
        return self.inner.run(call, watermark=watermark, at=at)


class FailingToolCallsStore:
    """An AsyncStore that refuses the append of an assistant row with tool calls."""

    def __init__(self, inner: AsyncSqliteStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def append_messages(
        self, session_id: str, lease_token: int, messages: tuple[Message, ...]
    ) -> tuple[Message, ...]:
        if any(m.tool_calls for m in messages):
            raise PersistenceError("disk full at tool_calls", cause="injected_io_error")
        return await self.inner.append_messages(session_id, lease_token, messages)


@dataclass
class Rig:
    """One process's stack on tmp_path; ``turn`` runs one turn through the AsyncDriver."""

    store: AsyncSqliteStore
    script: ScriptedProvider
    tools: WorkspaceTools
    root: Path
    client: httpx.AsyncClient
    sleeps: list[float] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    engine: Engine = field(default_factory=lambda: Engine(tools=REFERENCE_TOOLS))

    def driver(self, **overrides: Any) -> AsyncDriver:
        async def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)

        options: dict[str, Any] = {
            "store": self.store, "provider": HttpProvider(BASE_URL, client=self.client),
            "tools": self.tools, "sleep": sleep, "on_event": self.events.append,
        }
        return AsyncDriver(**{**options, **overrides})

    async def turn(self, text_: str, session: str = "s-1", **overrides: Any) -> TurnResult:
        inp = TurnInput(session_id=session, text=text_)
        return await self.driver(**overrides).run(self.engine.run_turn(inp))

    async def transcript(self, session: str = "s-1") -> list[Message]:
        return (await self.store.snapshot()).transcript(session)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    root = tmp_path / "ws"
    root.mkdir()
    script = ScriptedProvider()
    store = await AsyncSqliteStore.open(tmp_path / "hermes.db")
    client = httpx.AsyncClient(transport=fake_transport(script))
    yield Rig(store, script, WorkspaceTools(root), root, client)
    await client.aclose()
    await store.close()


def shape(rows: list[Message]) -> list[tuple[str, bool]]:
    return [(m.role.value, bool(m.tool_calls)) for m in rows]


async def test_one_tool_round_is_durable_and_really_runs(rig: Rig) -> None:
    """A write_file round: durable transcript, real file, persist-before-execute, events."""
    rig.script.add(tool_calls(("write_file", {"path": "notes.txt", "content": "hi"})),
                   text("Saved."))
    result = await rig.turn("Save a note.")
    assert result.exit_reason is ExitReason.TEXT_RESPONSE and result.completed
    assert result.final_response == "Saved."
    rows = await rig.transcript()
    assert shape(rows) == [("user", False), ("assistant", True), ("tool", False),
                           ("assistant", False)]
    assert rows[2].tool_call_id == rows[1].tool_calls[0].id == "call_1"
    assert (rig.root / "notes.txt").read_text() == "hi"
    [entry] = rig.tools.ledger
    assert rows[1].row_id is not None and entry.watermark >= rows[1].row_id
    kinds = [e.kind for e in (await rig.store.snapshot()).events]
    assert {"turn.started", "turn.exit", "turn.completed"} <= set(kinds)
    assert [e.kind for e in rig.events] == kinds


async def test_second_turn_reuses_history(rig: Rig) -> None:
    """The second turn's request carries the first turn's rows; six rows are durable."""
    rig.script.add(text("First answer."), text("Second answer."))
    await rig.turn("first question")
    result = await rig.turn("second question")
    assert result.final_response == "Second answer."
    sent = [(m.role, m.content) for m in rig.script.requests[-1].messages]
    assert sent[1:] == [(Role.USER, "first question"), (Role.ASSISTANT, "First answer."),
                        (Role.USER, "second question")]
    assert len(await rig.transcript()) == 4


async def test_rate_limit_is_retried_after_the_driver_sleeps(rig: Rig) -> None:
    """A 429 with Retry-After is slept through the injected sleep, then retried."""
    rig.script.add(RateLimited("slow down", retry_after_s=0.5), text("Fine now."))
    result = await rig.turn("hello")
    assert result.completed and result.final_response == "Fine now."
    assert rig.sleeps == [0.5]
    assert len(rig.script.requests) == 2


async def test_parallel_reads_overlap_and_return_in_call_order(rig: Rig) -> None:
    """Three read_file calls run at once; the slowest-first results stay in call order."""
    for name in ("a.txt", "b.txt", "c.txt"):
        (rig.root / name).write_text(f"content of {name}\n")
    slow = SlowTools(rig.tools, {"a.txt": 0.3, "b.txt": 0.2, "c.txt": 0.1})
    rig.script.add(tool_calls(*(("read_file", {"path": p}) for p in ("a.txt", "b.txt", "c.txt"))),
                   text("Read them."))
    result = await rig.turn("read all three", tools=slow)
    assert result.completed
    tool_rows = [m for m in await rig.transcript() if m.role is Role.TOOL]
    assert [m.tool_call_id for m in tool_rows] == ["call_1", "call_2", "call_3"]
    assert ["content of a.txt" in (tool_rows[0].content or ""),
            "content of b.txt" in (tool_rows[1].content or ""),
            "content of c.txt" in (tool_rows[2].content or "")] == [True, True, True]
    assert slow.most_at_once == 3
    assert [e.call_id for e in rig.tools.ledger] == ["call_3", "call_2", "call_1"]


async def test_a_hung_tool_times_out_while_the_others_finish(rig: Rig) -> None:
    """Past the batch deadline the hung call is unknown; its neighbours have results."""
    for name in ("a.txt", "b.txt", "c.txt"):
        (rig.root / name).write_text(name)
    hanging = HangingTools(rig.tools, "b.txt")
    driver = rig.driver(tools=hanging, tool_batch_deadline_s=0.2)
    calls = tuple(ToolCall(id=f"c{i}", name="read_file", arguments=f'{{"path": "{p}"}}')
                  for i, p in enumerate(("a.txt", "b.txt", "c.txt")))

    async def segment() -> tuple[ToolResult, ...]:
        return await ExecuteTools(0, "s-1", calls, parallel=True)

    try:
        results = await driver.run(segment())
    finally:
        hanging.release.set()
    assert [r.call_id for r in results] == ["c0", "c1", "c2"]
    assert not results[0].is_error and not results[2].is_error
    assert results[1].is_error and results[1].disposition == "unknown"
    assert "timed out after 0.2s" in results[1].content


async def test_a_hung_tool_in_a_turn_still_ends_with_an_answer(rig: Rig) -> None:
    """The timed-out result is recorded as the call's result and the model answers."""
    (rig.root / "a.txt").write_text("a")
    hanging = HangingTools(rig.tools, "b.txt")
    rig.script.add(tool_calls(("read_file", {"path": "a.txt"}), ("read_file", {"path": "b.txt"})),
                   text("One of them hung."))
    try:
        result = await rig.turn("read", tools=hanging, tool_batch_deadline_s=0.2)
    finally:
        hanging.release.set()
    assert result.completed
    tool_rows = [m for m in await rig.transcript() if m.role is Role.TOOL]
    assert [m.tool_call_id for m in tool_rows] == ["call_1", "call_2"]
    assert "timed out" in (tool_rows[1].content or "")


async def test_store_failure_on_tool_calls_runs_no_tool(rig: Rig) -> None:
    """A refused tool_calls append ends the turn session_persistence_failed; nothing ran."""
    rig.script.add(tool_calls(("write_file", {"path": "x.txt", "content": "x"})))
    result = await rig.turn("write", store=FailingToolCallsStore(rig.store))
    assert result.exit_reason is ExitReason.PERSISTENCE_FAILED and result.failed
    assert rig.tools.ledger == []
    assert not (rig.root / "x.txt").exists()
    assert all(not m.tool_calls for m in await rig.transcript())


async def test_inline_tools_run_without_threads(rig: Rig) -> None:
    """tools_in_thread=False runs the tools on the loop thread and gives the same rows."""
    seen: list[str] = []
    inner = rig.tools

    class Spy:
        def run(self, call: ToolCall, *, watermark: int = 0, at: float = 0.0) -> ToolResult:
            seen.append(threading.current_thread().name)
            return inner.run(call, watermark=watermark, at=at)

    rig.script.add(tool_calls(("write_file", {"path": "n.txt", "content": "x"})), text("ok"))
    result = await rig.turn("write", tools=Spy(), tools_in_thread=False)
    assert result.completed and seen == [threading.current_thread().name]


async def test_turn_exit_line_is_logged_once(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    """FIN-7: one INFO line with reason, calls, budget, last role and answer length."""
    rig.script.add(text("Hello there."))
    logger = logging.getLogger("test.asyncio_driver")
    with caplog.at_level(logging.INFO, logger="test.asyncio_driver"):
        await rig.turn("hi", log=logger)
    lines = [r for r in caplog.records if r.getMessage().startswith("turn exit")]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert lines[0].getMessage() == (
        "turn exit reason=text_response api_calls=1 budget=1/90 last_role=assistant "
        "response_len=12")


async def test_small_effects_ids_and_randomness(rig: Rig) -> None:
    """MintId and Jitter (a fraction in [0, 1)) are answered by the driver itself."""

    async def story() -> tuple[str, float, float]:
        return await MintId("turn"), await Jitter(), await Jitter()

    minted, first, second = await rig.driver().run(story())
    assert minted.startswith("turn-") and len(minted) == len("turn-") + 12
    assert 0.0 <= first < 1.0 and 0.0 <= second < 1.0 and first != second


async def test_unknown_effect_is_a_type_error(rig: Rig) -> None:
    """An effect the driver has no handler for is a bug, not an operating error."""

    class Strange:
        def __await__(self) -> Any:
            return (yield self)

    async def story() -> None:
        await Strange()

    with pytest.raises(TypeError, match="cannot perform Strange"):
        await rig.driver().run(story())


async def test_cancelling_a_turn_drops_the_coroutine(rig: Rig) -> None:
    """A cancelled turn is a crash: the coroutine is closed and nothing more is written."""
    entered = asyncio.Event()

    class Stuck:
        async def complete(self, request: ProviderRequest) -> ProviderReply:
            entered.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    coro = rig.engine.run_turn(TurnInput(session_id="s-1", text="hello"))
    task = asyncio.create_task(rig.driver(provider=Stuck()).run(coro))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert coro.cr_frame is None  # closed, not merely suspended
    assert shape(await rig.transcript()) == [("user", False)]
    assert "turn.exit" not in {e.kind for e in (await rig.store.snapshot()).events}


class SlowModel:
    """Answers "done" after ``delay_s`` of real time; ``sent`` counts the calls."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.sent = 0

    async def complete(self, request: ProviderRequest) -> ProviderReply:
        self.sent += 1
        await asyncio.sleep(self.delay_s)
        return ProviderReply(content="done", finish_reason="stop")


class FailingRefreshStore:
    """An AsyncStore whose lease refreshes fail (the store no longer vouches for the turn)."""

    def __init__(self, inner: AsyncSqliteStore) -> None:
        self.inner = inner
        self.refreshes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def refresh_lease(self, lease: Any, now: float, ttl_s: float) -> Any:
        self.refreshes += 1
        raise PersistenceError("disk gone at the refresh", cause="injected_io_error")


def short_lease(rig: Rig) -> None:
    rig.engine = Engine(tools=REFERENCE_TOOLS, limits=Limits(lease_refresh_s=0.05))


class TasksMade:
    """The tasks created on the running loop while the block runs (a task factory)."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[Any]] = []
        self._loop = asyncio.get_running_loop()
        self._before = self._loop.get_task_factory()

    def __enter__(self) -> TasksMade:
        def count(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            task = asyncio.Task(coro, loop=loop, **kwargs)
            self.tasks.append(task)
            return task

        self._loop.set_task_factory(count)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.set_task_factory(self._before)


async def test_a_turn_longer_than_the_refresh_interval_refreshes_its_lease(rig: Rig) -> None:
    """The refresher's first sleep ends during a slow model call: the lease is extended."""
    short_lease(rig)
    with TasksMade() as made:
        result = await rig.turn("hello", provider=SlowModel(0.3))
    assert result.final_response == "done" and result.completed
    [grant] = (await rig.store.snapshot()).lease_grants
    assert grant.expires_at > grant.acquired_at + rig.engine.limits.lease_ttl_s
    assert made.tasks and all(t.done() for t in made.tasks)  # nothing outlives the turn


async def test_a_refresher_that_loses_the_lease_interrupts_the_model_call(rig: Rig) -> None:
    """A failed refresh stops the turn at once: the pending call is cancelled, not awaited."""
    short_lease(rig)
    store, model = FailingRefreshStore(rig.store), SlowModel(10.0)
    started = time.monotonic()
    result = await rig.turn("hello", provider=model, store=store)
    assert time.monotonic() - started < 5.0 and store.refreshes == 1 and model.sent == 1
    assert result.exit_reason is ExitReason.INTERRUPTED
    assert "session turn lease lost" in (result.exit_detail or "")


async def test_a_turn_shorter_than_the_refresh_interval_leaves_no_refresher(rig: Rig) -> None:
    """The refresher never got past its first sleep: no task was made for it."""
    rig.script.add(text("Quick."))
    with TasksMade() as made:
        result = await rig.turn("hello")
    assert result.final_response == "Quick."
    assert not [t for t in made.tasks if "keep_lease" in repr(t.get_coro())]
    assert all(t.done() for t in made.tasks)


async def test_open_runtime_runs_a_turn(tmp_path: Path) -> None:
    """open_runtime wires store, provider, tools, engine and driver; aclose closes them."""
    root = tmp_path / "ws"
    root.mkdir()
    script = ScriptedProvider([tool_calls(("write_file", {"path": "r.txt", "content": "r"})),
                               text("Done.")])
    async with httpx.AsyncClient(transport=fake_transport(script)) as client:
        limits = Limits(backoff_base_s=0.0)
        async with await open_runtime(tmp_path / "rt.db", base_url=BASE_URL, workspace=root,
                                      http_client=client, limits=limits) as rt:
            result = await rt.run_turn("s-9", "write r")
            assert result.completed and result.final_response == "Done."
            assert (root / "r.txt").read_text() == "r"
            assert len((await rt.store.snapshot()).transcript("s-9")) == 4
    assert script.remaining == 0

