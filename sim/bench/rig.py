"""The scripted turn every benchmark row runs, and the rigs that run it.

Theory of operation
-------------------
Every row runs one scripted turn: the user says
"hi", the model calls one fast tool (``read_file`` of a 2-byte file in ``SimTools``), the
tool result goes back, the model answers "done". That is two model calls, one tool call
and four stored messages per turn. The fake model is in process and looks only at the
last message, so its cost does not grow with the history.

* ``SyncRig``: a simulated ``World`` (``MemoryStore`` or ``SqliteStore``), the engine and
  ``SimDriver``; ``turn(session_id)`` runs one turn, ``turn_coro(session_id)`` only builds
  the engine's coroutine for it (the calibration drives that one through its recorder).
* ``AsyncRig``: an ``AsyncSqliteStore`` (``synchronous=FULL``) on a file, the engine and
  ``AsyncDriver``, with the same fake behind ``async def complete``.
* ``check_turn`` refuses a turn that did not end as scripted, so no row ever times a
  failure.

``Sizes`` says how much every row measures; ``sim.bench`` names the standard sizes.
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes_ref.engine import Engine
from hermes_ref.models import ProviderReply, Role
from hermes_ref.outcomes import TurnResult
from hermes_ref.prologue import TurnInput
from hermes_ref.shell import liveness
from hermes_ref.shell.driver import AsyncDriver
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from hermes_ref.tool_specs import REFERENCE_TOOLS
from hermes_ref.wire import ProviderRequest
from sim.driver import SimDriver
from sim.provider import FunctionProvider, text, tool_calls
from sim.tools import SimTools
from sim.world import CrashableStore, World


@dataclass(frozen=True)
class Sizes:
    """How much to measure; see ``sim.bench`` and the docstrings of the rows."""

    name: str = "full"
    reps: int = 5                # repetitions of every throughput row and ceiling
    rep_s: float = 1.0           # seconds per repetition
    warmup_turns: int = 100      # untimed turns on each fresh rig
    scaling_turns: int = 200     # turns in the one-session scaling run
    scaling_window: int = 10     # early = first N turns, late = last N turns
    scaling_reps: int = 3
    fsync_turns: int = 200       # turns of the strace probe (a second probe runs 0)
    profile_turns: int = 2000    # turns of the cProfile run (memory row)
    schedule_turns: int = 20     # turns per fresh world in the memory row (one fault schedule)
    fsync_timeout_s: float = 120.0
    pair_chunks: int = 10        # chunks of a paired rep (SQLite rows), a ceiling slice between
    ceiling_slice_s: float = 0.02  # seconds of each commit ceiling slice
    sessions_chunk_s: float = 0.15  # seconds of each chunk of the many-sessions row


# -- the scripted turn --------------------------------------------------------------------

_CALL = tool_calls(("read_file", {"path": "notes.txt"}))
_DONE = text("done")


def _reply(request: ProviderRequest) -> ProviderReply:
    """The fake model: looks only at the tail (user -> call the tool; else answer)."""
    return _CALL if request.messages[-1].role is Role.USER else _DONE


def _tools() -> SimTools:
    return SimTools({"notes.txt": "ok"})


class _AsyncFake:
    """The same fake behind ``async def complete`` for the asyncio driver."""

    def __init__(self) -> None:
        self._fake = FunctionProvider(_reply)

    async def complete(self, request: ProviderRequest) -> ProviderReply:
        return self._fake.complete(request)


def check_turn(result: TurnResult) -> None:
    """Raise unless the turn ended as scripted: a row never times a failing turn."""
    if result.final_response != "done" or result.failed:
        raise RuntimeError(
            f"bench turn did not complete as scripted: exit={result.exit_reason} "
            f"detail={result.exit_detail!r} response={result.final_response!r}"
        )


@dataclass
class SyncRig:
    """A simulated world ready to run turns; ``turn(session_id)`` runs one."""

    store: CrashableStore
    world: World = field(init=False)
    engine: Engine = field(init=False)
    driver: SimDriver = field(init=False)

    def __post_init__(self) -> None:
        self.world = World(store=self.store, provider=FunctionProvider(_reply), tools=_tools(),
                           trace=False)
        self.engine = Engine(tools=REFERENCE_TOOLS, holder=self.world.holder)
        self.driver = SimDriver(self.world)

    def turn_coro(self, session_id: str) -> Coroutine[Any, Any, TurnResult]:
        return self.engine.run_turn(TurnInput(session_id=session_id, text="hi"))

    def turn(self, session_id: str) -> TurnResult:
        return self.driver.run(self.turn_coro(session_id))

    def commits(self) -> int:
        return int(getattr(self.store, "commits", 0))


class AsyncRig:
    """An ``AsyncSqliteStore`` (FULL) + ``AsyncDriver`` + engine on a file."""

    def __init__(self, store: AsyncSqliteStore) -> None:
        self.store = store
        self.driver = AsyncDriver(store=store, provider=_AsyncFake(), tools=_tools(),
                                  tools_in_thread=False)
        self.engine = Engine(tools=REFERENCE_TOOLS, holder=liveness.holder_identity())

    @classmethod
    async def open(cls, path: Path) -> AsyncRig:
        return cls(await AsyncSqliteStore.open(path, synchronous="FULL"))

    async def turn(self, session_id: str) -> TurnResult:
        return await self.driver.run(self.engine.run_turn(TurnInput(session_id=session_id, text="hi")))

    async def close(self) -> None:
        await self.store.close()
