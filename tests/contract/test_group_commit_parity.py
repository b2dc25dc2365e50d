"""Turns of many sessions in flight at once leave the record that the same turns one by one leave.

The asyncio driver on one ``AsyncSqliteStore`` runs 16 sessions' turns twice: concurrently
(``asyncio.gather``, so their writes are group-committed) and sequentially, on separate
files. Each session's transcript, its events' kinds and the tool ledger must be equal, and
every tool call must have run only after its call row was committed (TOOL-1: the
watermark the tool saw is at least the row's id).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from hermes_ref.engine import Engine
from hermes_ref.models import Message, ProviderReply, Role, ToolCall
from hermes_ref.outcomes import TurnResult
from hermes_ref.ports import DurableRecord
from hermes_ref.prologue import TurnInput
from hermes_ref.shell.driver import AsyncDriver
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from hermes_ref.tool_specs import REFERENCE_TOOLS
from hermes_ref.wire import ProviderRequest
from sim.tools import SimTools

SESSIONS = tuple(f"s-{i:02d}" for i in range(16))
WAVES = ("first", "second")


class Fake:
    """A user message gets a read of that session's file (an id of its own); a result, text."""

    async def complete(self, request: ProviderRequest) -> ProviderReply:
        last = request.messages[-1]
        if last.role is Role.USER:
            session, wave = str(last.content).split()[-2:]
            call = ToolCall(id=f"call-{session}-{wave}", name="read_file",
                            arguments=json.dumps({"path": f"{session}.txt"}))
            return ProviderReply(tool_calls=(call,), finish_reason="tool_calls")
        return ProviderReply(content=f"read: {last.content}", finish_reason="stop")


def _rows(record: DurableRecord, session: str) -> list[tuple[Any, ...]]:
    def row(m: Message) -> tuple[Any, ...]:
        return (m.role.value, m.content, tuple((c.id, c.name, c.arguments) for c in m.tool_calls),
                m.tool_call_id)
    return [row(m) for m in record.transcript(session)]


async def _run(db: Path, together: bool) -> tuple[DurableRecord, SimTools, int, int]:
    tools = SimTools({f"{s}.txt": f"notes of {s}" for s in SESSIONS})
    store = await AsyncSqliteStore.open(db, holder_alive=lambda holder: True)
    engine = Engine(tools=REFERENCE_TOOLS, holder="pid=1")
    driver = AsyncDriver(store=store, provider=Fake(), tools=tools, tools_in_thread=False)

    def turn(session: str, wave: str) -> Awaitable[TurnResult]:
        return driver.run(engine.run_turn(TurnInput(session, f"read notes {session} {wave}")))

    try:
        for wave in WAVES:
            if together:
                results = await asyncio.gather(*(turn(s, wave) for s in SESSIONS))
            else:
                results = [await turn(s, wave) for s in SESSIONS]
            assert all(r.final_response and not r.failed for r in results)
        return await store.snapshot(), tools, store.commits, store.group_commit.largest
    finally:
        await store.close()


def _check_tools_ran_after_their_rows(record: DurableRecord, tools: SimTools) -> None:
    """TOOL-1: each tool saw a committed watermark at or above its call row's id."""
    row_of = {c.id: stored.message.row_id or 0 for stored in record.messages
              for c in stored.message.tool_calls}
    assert len(tools.ledger) == len(SESSIONS) * len(WAVES)
    for entry in tools.ledger:
        assert entry.watermark >= row_of[entry.call_id] > 0, entry.call_id


async def test_sixteen_concurrent_sessions_leave_the_sequential_record(tmp_path: Path) -> None:
    """16 sessions' turns in flight at once: same transcripts, events and tools as one by one."""
    together, t_tools, t_commits, largest = await _run(tmp_path / "together.db", True)
    alone, a_tools, a_commits, alone_largest = await _run(tmp_path / "alone.db", False)
    for session in SESSIONS:
        assert _rows(together, session) == _rows(alone, session)
        assert len(_rows(alone, session)) == 4 * len(WAVES)
        assert ([e.kind for e in together.events if e.session_id == session]
                == [e.kind for e in alone.events if e.session_id == session])
    ledger = sorted((e.call_id, e.name, e.arguments, e.outcome) for e in t_tools.ledger)
    assert ledger == sorted((e.call_id, e.name, e.arguments, e.outcome) for e in a_tools.ledger)
    _check_tools_ran_after_their_rows(together, t_tools)
    _check_tools_ran_after_their_rows(alone, a_tools)
    assert alone_largest == 1 and largest > 1  # one by one, no write ever had company
    assert t_commits < a_commits
