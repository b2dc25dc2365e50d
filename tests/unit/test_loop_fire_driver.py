"""The asyncio driver under fire: per-model routing, credential renewal, interrupts and
corrections, on the real aiosqlite store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hermes_ref.engine import Engine
from hermes_ref.errors import ProviderAuthError, ProviderServerError
from hermes_ref.limits import Limits, ProviderRoute
from hermes_ref.models import ProviderReply, Role
from hermes_ref.outcomes import ExitReason, TurnResult
from hermes_ref.prologue import TurnInput
from hermes_ref.shell.driver import AsyncDriver
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from hermes_ref.shell.workspace_tools import WorkspaceTools
from hermes_ref.tool_specs import REFERENCE_TOOLS
from hermes_ref.wire import ProviderRequest
from sim.provider import ScriptedProvider, text, tool_calls

FALLBACK = ProviderRoute(model="fallback-model", context_window_tokens=8_000)


class AsyncFake:
    """A scripted fake behind the async provider port, with a credential renewal."""

    def __init__(self, *steps: object, gate: asyncio.Event | None = None) -> None:
        self.inner = ScriptedProvider(list(steps))  # type: ignore[arg-type]
        self.refreshes = 0
        self.gate = gate
        self.called = asyncio.Event()

    async def complete(self, request: ProviderRequest) -> ProviderReply:
        self.called.set()
        if self.gate is not None:
            await self.gate.wait()
        return self.inner.complete(request)

    async def refresh_credentials(self) -> None:
        self.refreshes += 1


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[AsyncSqliteStore]:
    opened = await AsyncSqliteStore.open(tmp_path / "hermes.db")
    yield opened
    await opened.close()


async def _no_sleep(seconds: float) -> None:
    return None


def _driver(store: AsyncSqliteStore, tmp_path: Path, primary: AsyncFake,
            **providers: AsyncFake) -> AsyncDriver:
    return AsyncDriver(store=store, provider=primary, providers=providers,
                       tools=WorkspaceTools(tmp_path), sleep=_no_sleep, tools_in_thread=False)


async def _turn(driver: AsyncDriver, limits: Limits, words: str) -> TurnResult:
    engine = Engine(limits=limits, tools=REFERENCE_TOOLS, holder="pid=1:pidns=test")
    return await driver.run(engine.run_turn(TurnInput(session_id="s-1", text=words)), key="s-1")


async def test_a_fallback_model_is_routed_to_its_own_provider(store: AsyncSqliteStore,
                                                              tmp_path: Path) -> None:
    """Retries spent on the primary, the turn's next request goes to the fallback's port."""
    primary = AsyncFake(*(ProviderServerError("down", status=503) for _ in range(4)))
    fallback = AsyncFake(text("From the fallback."))
    driver = _driver(store, tmp_path, primary, **{FALLBACK.model: fallback})
    result = await _turn(driver, Limits(fallback_providers=(FALLBACK,)), "Hello?")
    assert result.final_response == "From the fallback."
    assert [r.model for r in fallback.inner.requests] == [FALLBACK.model]


async def test_an_auth_error_renews_the_credentials_through_the_port(
        store: AsyncSqliteStore, tmp_path: Path) -> None:
    """One renewal through the provider's refresh_credentials, then the call succeeds."""
    primary = AsyncFake(ProviderAuthError("expired", status=401), text("Hello again."))
    result = await _turn(_driver(store, tmp_path, primary), Limits(), "Hello?")
    assert (result.final_response, primary.refreshes) == ("Hello again.", 1)


async def test_interrupt_stops_the_run_of_that_session(store: AsyncSqliteStore,
                                                       tmp_path: Path) -> None:
    """interrupt(key) ends the model call in flight; the turn ends interrupted."""
    gate = asyncio.Event()
    primary = AsyncFake(text("Too late."), gate=gate)
    driver = _driver(store, tmp_path, primary)
    running = asyncio.ensure_future(_turn(driver, Limits(), "Take your time."))
    await asyncio.wait_for(primary.called.wait(), 5)
    assert driver.interrupt("s-1") and not driver.interrupt("s-2")
    result = await asyncio.wait_for(running, 5)
    assert result.exit_reason is ExitReason.INTERRUPTED and not result.completed


async def test_a_queued_correction_becomes_a_user_row(store: AsyncSqliteStore,
                                                      tmp_path: Path) -> None:
    """redirect(session, text) is drained at the loop's top and stored as a user row."""
    primary = AsyncFake(text("Using b."))
    driver = _driver(store, tmp_path, primary)
    driver.redirect("s-1", "Use b instead.")
    result = await _turn(driver, Limits(), "Use a.")
    rows = (await store.snapshot()).transcript("s-1")
    assert result.final_response == "Using b."
    assert [(m.role, m.content, m.hidden) for m in rows[1:3]] == [
        (Role.ASSISTANT, "", True), (Role.USER, "Use b instead.", False)]


async def test_a_correction_finds_its_run_by_the_name_it_was_started_on(
        store: AsyncSqliteStore, tmp_path: Path) -> None:
    """A correction sent while the turn runs goes to the run named ``key``, as an interrupt
    does, not to the session id the turn is on now: after a mid-turn rotation (CMP-5) the
    turn's session is the child, and the user still addresses the id the run began on. The
    run here is named apart from its session, as a rotated run is."""
    gate = asyncio.Event()
    (tmp_path / "a.txt").write_text("a")
    primary = AsyncFake(tool_calls(("read_file", {"path": "a.txt"})), text("Using b."), gate=gate)
    driver = _driver(store, tmp_path, primary)
    engine = Engine(limits=Limits(), tools=REFERENCE_TOOLS, holder="pid=1:pidns=test")
    running = asyncio.ensure_future(driver.run(
        engine.run_turn(TurnInput(session_id="s-1", text="Use a.")), key="s-0"))
    await asyncio.wait_for(primary.called.wait(), 5)
    driver.redirect("s-0", "Use b instead.")
    gate.set()
    await asyncio.wait_for(running, 5)
    users = [m.content for m in (await store.snapshot()).transcript("s-1") if m.role is Role.USER]
    assert "Use b instead." in users
    assert not driver._corrections  # nothing left queued for a later turn
