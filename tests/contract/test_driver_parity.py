"""The simulator driver and the asyncio driver perform effects the same way.

The same engine scenario runs twice: through ``SimDriver`` on a ``World`` (MemoryStore,
SimTools, the fake provider called directly) and through ``AsyncDriver`` on an
``AsyncSqliteStore`` file, SimTools as the ToolRunner and the fake provider behind
``HttpProvider`` + ``fake_transport``. Durable transcripts, exit reasons, event kinds,
tool ledgers, the resulting files and the request bodies must be identical: the bytes
the simulator records with each call are the bytes ``HttpProvider`` posts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_ref.engine import Engine
from hermes_ref.errors import ProviderServerError
from hermes_ref.models import Message
from hermes_ref.ports import DurableRecord
from hermes_ref.prologue import TurnInput
from hermes_ref.shell.driver import AsyncDriver
from hermes_ref.shell.http_provider import HttpProvider
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from hermes_ref.tool_specs import REFERENCE_TOOLS
from sim.clock import DEFAULT_EPOCH_S
from sim.driver import SimDriver
from sim.provider import ScriptedProvider, Step, text, tool_calls
from sim.provider_http import handle_http
from sim.store import MemoryStore
from sim.tools import SimTools
from sim.world import World

SESSION = "s-1"
HOLDER = "pid=1"


@dataclass(frozen=True)
class Case:
    turns: tuple[str, ...]
    script: Callable[[], list[Step]]
    files: dict[str, str]


CASES = {
    "write_then_text": Case(
        turns=("Save a note.", "Thanks, anything else?"),
        script=lambda: [tool_calls(("write_file", {"path": "notes.txt", "content": "hi"})),
                        text("Saved it."), text("Nothing else.")],
        files={},
    ),
    "parallel_reads_after_a_503": Case(
        turns=("Compare a and b.",),
        script=lambda: [ProviderServerError("busy", status=503),
                        tool_calls(("read_file", {"path": "a.txt"}),
                                   ("read_file", {"path": "b.txt"})),
                        text("They differ.")],
        files={"a.txt": "alpha\n", "b.txt": "beta\n"},
    ),
    "write_by_absolute_path_after_read": Case(
        turns=("Rewrite a by its full path.",),
        script=lambda: [tool_calls(("read_file", {"path": "a.txt"}),
                                   ("write_file", {"path": "/workspace/a.txt", "content": "new"}),
                                   ("read_file", {"path": "b.txt"})),
                        text("Rewritten.")],
        files={"a.txt": "alpha\n", "b.txt": "beta\n"},
    ),
}


@dataclass
class Outcome:
    record: DurableRecord
    exits: list[str]
    tools: SimTools
    bodies: list[bytes]

    def rows(self) -> list[tuple[Any, ...]]:
        return [_row(m) for m in self.record.transcript(SESSION)]

    def event_kinds(self) -> set[str]:
        return {e.kind for e in self.record.events}


def _row(m: Message) -> tuple[Any, ...]:
    calls = tuple((c.id, c.name, c.arguments) for c in m.tool_calls)
    return (m.role.value, m.content, calls, m.tool_call_id)


def run_sim(case: Case) -> Outcome:
    world = World(store=MemoryStore(), provider=ScriptedProvider(case.script()),
                  tools=SimTools(dict(case.files)), trace=False)
    engine = Engine(tools=REFERENCE_TOOLS, holder=HOLDER)
    exits = [SimDriver(world).run(engine.run_turn(TurnInput(SESSION, t))).exit_reason.value
             for t in case.turns]
    return Outcome(world.store.snapshot(), exits, world.tools, [c.body for c in world.calls])


async def run_async(case: Case, db: Path) -> Outcome:
    tools = SimTools(dict(case.files))
    engine = Engine(tools=REFERENCE_TOOLS, holder=HOLDER)
    store = await AsyncSqliteStore.open(db, holder_alive=lambda holder: True)

    async def no_sleep(seconds: float) -> None:
        return None

    fake, bodies = ScriptedProvider(case.script()), list[bytes]()

    def posted(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        return handle_http(fake, request)

    try:
        async with httpx.AsyncClient(transport=httpx.MockTransport(posted)) as client:
            # the simulator's clock at the first turn, for the driver and the store's fence:
            # the prompt records when the session started (CTX-3's volatile layer), so equal
            # bodies need equal clocks
            store.clock = lambda: DEFAULT_EPOCH_S
            driver = AsyncDriver(store=store, provider=HttpProvider("http://fake/v1", client=client),
                                 tools=tools, sleep=no_sleep, clock=store.clock)
            exits = [(await driver.run(engine.run_turn(TurnInput(SESSION, t)))).exit_reason.value
                     for t in case.turns]
        return Outcome(await store.snapshot(), exits, tools, bodies)
    finally:
        await store.close()


@pytest.mark.parametrize("name", sorted(CASES))
async def test_both_drivers_leave_the_same_record(name: str, tmp_path: Path) -> None:
    """Same scenario, both drivers: transcripts, exits, event kinds, ledgers, files, bodies equal."""
    case = CASES[name]
    sim = run_sim(case)
    real = await run_async(case, tmp_path / "parity.db")
    assert real.rows() == sim.rows()
    assert real.exits == sim.exits == ["text_response"] * len(case.turns)
    assert real.event_kinds() == sim.event_kinds()
    assert [e.kind for e in real.record.events] == [e.kind for e in sim.record.events]
    assert {"turn.started", "turn.exit", "turn.completed"} <= real.event_kinds()
    # calls of one parallel batch finish in any order on the real driver's threads; the
    # watermark (the call row's durable id) ties each entry to its round, so sorting
    # compares the same entries without asking for one completion order
    ledger = sorted((e.call_id, e.name, e.arguments, e.watermark, e.outcome) for e in sim.tools.ledger)
    assert sorted((e.call_id, e.name, e.arguments, e.watermark, e.outcome)
                  for e in real.tools.ledger) == ledger
    assert real.tools.snapshot_files() == sim.tools.snapshot_files()
    assert real.bodies == sim.bodies and len(sim.bodies) > len(sim.exits)
    assert len(sim.rows()) >= 4
