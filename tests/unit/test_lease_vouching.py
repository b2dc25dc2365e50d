"""LEASE-4 for acts the store cannot fence: the asyncio driver asks the store before a model
call or a tool run goes out under a turn's lease, and refuses it once the lease is gone."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hermes_ref.effects import CallProvider, ExecuteTools
from hermes_ref.errors import TurnInterrupted
from hermes_ref.models import Message, ProviderReply, Role, SessionRecord, ToolCall, ToolResult
from hermes_ref.shell.driver import AsyncDriver
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from hermes_ref.wire import ProviderRequest

TTL_S = 300.0


class CountingProvider:
    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ProviderRequest) -> ProviderReply:
        self.calls += 1
        return ProviderReply(content="hello", finish_reason="stop")


class CountingTools:
    def __init__(self) -> None:
        self.runs = 0

    def run(self, call: ToolCall) -> ToolResult:
        self.runs += 1
        return ToolResult(tool_call_id=call.id, content="ok")


REQUEST = ProviderRequest(model="m", messages=(Message(role=Role.USER, content="hi"),),
                          tools=(), prompt_tokens=1)


async def _world(tmp_path: Path) -> tuple[AsyncSqliteStore, list[float], int]:
    now = [1_000.0]
    store = await AsyncSqliteStore.open(tmp_path / "vouch.db")
    store.clock = lambda: now[0]
    record = SessionRecord(id="s-1", key="agent:main:cli:dm", system_prompt="p",
                           started_at=now[0])
    grant = await store.open_turn(record, "pid=1:pidns=x:turn=turn-1:platform=cli", now[0], TTL_S)
    assert grant.lease is not None
    return store, now, grant.lease.token


async def test_a_model_call_goes_out_while_the_lease_holds(tmp_path: Path) -> None:
    store, now, token = await _world(tmp_path)
    provider = CountingProvider()
    driver = AsyncDriver(store=store, provider=provider, tools=CountingTools(), clock=lambda: now[0])
    try:
        now[0] += TTL_S - 1
        reply = await driver.run(_call(token))
        assert reply.content == "hello" and provider.calls == 1
    finally:
        await store.close()


async def test_a_model_call_after_the_expiry_is_refused(tmp_path: Path) -> None:
    store, now, token = await _world(tmp_path)
    provider = CountingProvider()
    driver = AsyncDriver(store=store, provider=provider, tools=CountingTools(), clock=lambda: now[0])
    try:
        now[0] += TTL_S + 1  # the process was frozen past its lease
        with pytest.raises(TurnInterrupted, match="lease lost"):
            await driver.run(_call(token))
        assert provider.calls == 0
    finally:
        await store.close()


async def test_a_tool_run_after_the_expiry_is_refused(tmp_path: Path) -> None:
    store, now, token = await _world(tmp_path)
    tools = CountingTools()
    driver = AsyncDriver(store=store, provider=CountingProvider(), tools=tools,
                         clock=lambda: now[0], tools_in_thread=False)
    try:
        now[0] += TTL_S + 1
        with pytest.raises(TurnInterrupted, match="lease lost"):
            await driver.run(_tools(token))
        assert tools.runs == 0
    finally:
        await store.close()


async def test_a_call_without_a_lease_is_not_checked(tmp_path: Path) -> None:
    """Token 0: no lease to vouch for (a call outside any turn's lease)."""
    store, now, _ = await _world(tmp_path)
    provider = CountingProvider()
    driver = AsyncDriver(store=store, provider=provider, tools=CountingTools(), clock=lambda: now[0])
    try:
        now[0] += TTL_S * 10
        await driver.run(_call(0))
        assert provider.calls == 1
    finally:
        await store.close()


async def _call(token: int) -> ProviderReply:
    return await CallProvider(REQUEST, "s-1", "turn-1", token)


async def _tools(token: int) -> tuple[ToolResult, ...]:
    call = ToolCall(id="call_1", name="read_file", arguments='{"path": "a.txt"}')
    return await ExecuteTools(token, "s-1", (call,), parallel=False)


async def test_the_store_answers_on_the_loop_and_sees_another_writers_grant(tmp_path: Path) -> None:
    """The check is one read on the loop (no hop to the writer's thread), and it reads what
    another connection committed: once a second process took the expired lease, the first
    holder's token no longer holds."""
    store, now, token = await _world(tmp_path)
    hops: list[str] = []
    real_hop = store._hop

    async def counted(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        hops.append(fn.__name__)
        return await real_hop(fn, *args, **kwargs)
    store._hop = counted  # type: ignore[method-assign]
    other = await AsyncSqliteStore.open(tmp_path / "vouch.db")
    try:
        assert await store.lease_holds("s-1", token) and hops == []
        now[0] += TTL_S + 1
        other.clock = lambda: now[0]
        taken = await other.acquire_lease("s-1", "pid=2:pidns=x:turn=turn-2:platform=cli",
                                          now[0], TTL_S)
        assert taken is not None and taken.token == token + 1
        assert not await store.lease_holds("s-1", token)
        assert await store.lease_holds("s-1", taken.token) and hops == []
    finally:
        await other.close()
        await store.close()


async def test_a_read_the_loop_cannot_make_at_once_goes_to_the_worker(tmp_path: Path) -> None:
    """A reader that would have to wait (it raises) hands the check to the writer's thread."""
    store, _now, token = await _world(tmp_path)

    class Busy:
        def execute(self, *args: object) -> None:
            raise sqlite3.OperationalError("database is locked")

        def close(self) -> None:
            pass
    store._reader = Busy()  # type: ignore[assignment]
    try:
        assert await store.lease_holds("s-1", token)
        assert not await store.lease_holds("s-1", token + 1)
    finally:
        await store.close()


class FreezingTools:
    """Each call stands for a process frozen past the lease while it ran: the clock moves
    one TTL and a second on."""

    def __init__(self, now: list[float]) -> None:
        self.now = now
        self.ran: list[str] = []

    def run(self, call: ToolCall, *, watermark: int = 0, at: float = 0.0) -> ToolResult:
        self.ran.append(call.id)
        self.now[0] += TTL_S + 1
        return ToolResult(call_id=call.id, name=call.name, content="ok")


@pytest.mark.parametrize("in_thread", [False, True])
async def test_a_call_that_begins_after_the_expiry_is_refused(tmp_path: Path,
                                                              in_thread: bool) -> None:
    """A sequential batch vouched for as it began: its second call, which would begin after
    the lease expired, is vouched for again and never begins."""
    store, now, token = await _world(tmp_path)
    tools = FreezingTools(now)
    driver = AsyncDriver(store=store, provider=CountingProvider(), tools=tools,
                         clock=lambda: now[0], tools_in_thread=in_thread)
    calls = tuple(ToolCall(id=f"call_{i}", name="read_file", arguments='{"path": "a.txt"}')
                  for i in (1, 2))

    async def batch() -> tuple[ToolResult, ...]:
        return await ExecuteTools(token, "s-1", calls, parallel=False)
    try:
        with pytest.raises(TurnInterrupted, match="gone before the tool call"):
            await driver.run(batch())
        assert tools.ran == ["call_1"]
    finally:
        await store.close()


async def test_a_parallel_call_that_waits_for_a_worker_past_the_expiry_is_refused(
        tmp_path: Path) -> None:
    """A parallel batch with one worker: the second and third calls wait for it while the
    first runs past the lease's expiry. The second is vouched for again and refused; the
    third never begins; the refusal reaches the turn as an interrupt after the batch was
    sent (``unsent`` false), and the batch leaves no task behind."""
    import asyncio

    store, now, token = await _world(tmp_path)
    tools = FreezingTools(now)
    driver = AsyncDriver(store=store, provider=CountingProvider(), tools=tools,
                         clock=lambda: now[0], tools_in_thread=True, tool_workers_max=1)
    calls = tuple(ToolCall(id=f"call_{i}", name="read_file", arguments='{"path": "a.txt"}')
                  for i in (1, 2, 3))

    async def batch() -> tuple[ToolResult, ...]:
        return await ExecuteTools(token, "s-1", calls, parallel=True)
    try:
        with pytest.raises(TurnInterrupted, match="gone before the tool call") as stopped:
            await driver.run(batch())
        assert tools.ran == ["call_1"]
        assert stopped.value.unsent is False
        current = asyncio.current_task()
        assert [t for t in asyncio.all_tasks() if t is not current and not t.done()] == []
    finally:
        await store.close()
