"""One process's production stack in one call: store, provider, tools, engine, driver.

Theory of operation
-------------------
``open_runtime`` wires the real ports together::

    async with await open_runtime("hermes.db", base_url=url, workspace=root) as rt:
        result = await rt.run_turn("s-1", "What do my notes say?")

It opens an ``AsyncSqliteStore`` (synchronous=FULL), an ``HttpProvider`` (on the given
``httpx.AsyncClient`` if one is passed; it then stays the caller's to close) and
``WorkspaceTools`` confined to ``workspace`` (the current directory by default). The
``Engine`` advertises the reference tools and holds leases as this process
(``liveness.holder_identity``); the ``AsyncDriver`` takes its tool bounds from the same
``Limits``. ``run_turn`` builds a ``TurnInput`` and drives one turn; ``aclose`` closes the
provider and the store. If opening fails half-way, what was opened is closed again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from hermes_ref.engine import Engine
from hermes_ref.limits import Limits
from hermes_ref.models import Message
from hermes_ref.outcomes import TurnResult
from hermes_ref.prologue import TurnInput
from hermes_ref.shell import liveness
from hermes_ref.shell.driver import AsyncDriver
from hermes_ref.shell.http_provider import HttpProvider
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from hermes_ref.shell.workspace_tools import WorkspaceTools
from hermes_ref.tool_specs import REFERENCE_TOOLS

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


class Runtime:
    """An engine and the driver that runs it on real ports; see the module docstring."""

    def __init__(self, *, engine: Engine, driver: AsyncDriver, store: AsyncSqliteStore,
                 provider: HttpProvider, tools: WorkspaceTools) -> None:
        self.engine = engine
        self.driver = driver
        self.store = store
        self.provider = provider
        self.tools = tools
        self._closed = False

    async def run_turn(self, session_id: str, text: str, *,
                       history: Sequence[Message] | None = None, **kw: Any) -> TurnResult:
        """One turn; ``kw`` are the other ``TurnInput`` fields (``injected_context``, …).

        ``history`` is the caller's conversation so far: it seeds a session that has no
        transcript yet, and the caller's list is copied, never changed (CTX-2).
        """
        inp = TurnInput(session_id=session_id, text=text, history=history, **kw)
        return await self.driver.run(self.engine.run_turn(inp), key=session_id)

    def interrupt(self, session_id: str) -> bool:
        """FIN-4: the user stops the turn running on ``session_id`` (False: none runs)."""
        return self.driver.interrupt(session_id)

    def redirect(self, session_id: str, text: str) -> None:
        """LOOP-4: a correction for the turn running on ``session_id``, taken in at the top
        of its next loop iteration."""
        self.driver.redirect(session_id, text)

    async def aclose(self) -> None:
        """Close the provider (if it owns its client) and the store; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.provider.aclose()
        finally:
            await self.store.close()

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def open_runtime(
    db_path: str | Path,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    workspace: str | Path | None = None,
    http_client: httpx.AsyncClient | None = None,
    limits: Limits | None = None,
) -> Runtime:
    """Open the store, provider and tools and wire an engine and a driver to them."""
    limits = limits or Limits()
    tools = WorkspaceTools(Path(workspace) if workspace is not None else Path.cwd(),
                           output_chars_max=limits.tool_result_spill_chars)  # TOOL-7
    store = await AsyncSqliteStore.open(db_path)
    try:
        provider = HttpProvider(base_url or DEFAULT_BASE_URL, api_key, client=http_client)
    except BaseException:
        await store.close()
        raise
    engine = Engine(limits=limits, tools=REFERENCE_TOOLS, holder=liveness.holder_identity())
    driver = AsyncDriver(
        store=store, provider=provider, tools=tools,
        tool_workers_max=limits.tool_workers_max,
        tool_batch_deadline_s=limits.tool_batch_deadline_s,
    )
    return Runtime(engine=engine, driver=driver, store=store, provider=provider, tools=tools)
