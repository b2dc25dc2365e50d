"""One simulated world: clock, chooser, store, provider, tools, faults and the timeline.

Theory of operation
-------------------
The world is everything outside the engine, and it outlives engine instances: when the
simulated process crashes, the world keeps its committed store, its tool ledger and its
clock, and a fresh ``Engine`` is started against it. Only what the engine held in memory
(and the store's pending writes) is lost.

The timeline is the narrated record of a run: one short line per phase change, effect,
durable write, fault and checker verdict. Scenarios snapshot it, so it contains only
deterministic values (virtual time relative to the start, ids from the world).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hermes_ref.models import Event, ProviderReply
from hermes_ref.phases import Phase
from hermes_ref.ports import Provider, Store
from hermes_ref.wire import ProviderRequest, WireBody
from sim.choices import Chooser
from sim.clock import VirtualClock
from sim.faults import FaultPlan, FaultState
from sim.tools import SimTools


@dataclass(frozen=True, slots=True)
class CallRecord:
    """What the provider was asked and answered: the world's own record of one call.

    ``wire_body`` holds the bytes that went out (as the pieces they were joined from, fixed
    at call time); ``request`` is the engine's value behind them, kept for the readings
    that need local fields (purpose, scaffolding flags).
    """

    seq: int                  # the driver's effect counter when the call was made
    session_id: str
    turn_id: str
    request: ProviderRequest
    reply: ProviderReply | None
    error: str | None
    watermark: int            # committed message high-water mark at call time
    at: float                 # virtual time of the call
    retry_after_s: float | None  # the Retry-After a RateLimited error carried, else None
    wire_body: WireBody       # the request body as sent (``ProviderRequest.wire_body``)

    @property
    def body(self) -> bytes:
        """The bytes that went out, exactly what ``HttpProvider`` would have posted."""
        return bytes(self.wire_body)

    @property
    def sent(self) -> Any:
        """The recorded bytes parsed: what the wire checkers judge, never the request object.

        Parsed once per record (checkers run after every step); the value is shared, so
        readers must not change it. Raises ``ValueError`` when the bytes are not JSON.
        """
        return self.wire_body.parsed()


@dataclass(frozen=True, slots=True)
class TurnRun:
    """One turn the harness asked a process to run, as the world saw it (not the engine).

    The turn id is the one the world minted while the turn ran; ``crashed`` says the
    process died during it; ``write_failures`` counts store writes the world failed.
    """

    session_id: str
    text: str
    turn_id: str | None
    crashed: bool
    write_failures: int = 0


class CrashableStore(Store, Protocol):
    def crash(self) -> None: ...
    def reopen(self) -> None: ...


@dataclass
class Timeline:
    """Narrated lines of one run; disabled timelines cost one attribute check per effect."""

    clock: VirtualClock
    enabled: bool = True
    lines: list[str] = field(default_factory=list)
    start_s: float = 0.0

    def __post_init__(self) -> None:
        self.start_s = self.clock.now()

    def add(self, kind: str, text: str) -> None:
        if self.enabled:
            elapsed = self.clock.now() - self.start_s
            self.lines.append(f"{elapsed:9.3f}  {kind:<8} {text}")

    def phase(self, old: Phase, new: Phase) -> None:
        if self.enabled:
            self.add("phase", f"{old.value} -> {new.value}")

    def render(self) -> str:
        return "\n".join(self.lines) + ("\n" if self.lines else "")


@dataclass
class World:
    store: CrashableStore
    provider: Provider
    tools: SimTools
    seed: int = 0
    faults: FaultPlan = field(default_factory=FaultPlan)
    trace: bool = True
    id_base: int = 0
    clock: VirtualClock = field(default_factory=VirtualClock)
    tool_batch_deadline_s: float = 420.0  # a hung tool costs this much virtual time (TOOL-5)
    stream: list[Event] = field(default_factory=list)
    subscribers: list[Callable[[Event], None]] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    batches: list[tuple[str, ...]] = field(default_factory=list)  # call ids run together
    tool_workers_max: int = 8
    crash_seqs: list[int] = field(default_factory=list)
    runs: list[TurnRun] = field(default_factory=list)  # every turn the harness ran, in order
    minted_turns: list[str] = field(default_factory=list)  # turn ids, in minting order
    write_failures: int = 0  # store writes the world failed on purpose, so far
    on_crash: Callable[[str], None] | None = None  # called first at a crash point

    def __post_init__(self) -> None:
        self.chooser = Chooser(self.seed)
        self.fault_state = FaultState(self.faults)
        self.timeline = Timeline(self.clock, enabled=self.trace)
        self._ids = self.id_base
        self.crashes = 0
        self.pid = 1  # the simulated process id; a restart starts a new one

    def mint_id(self, prefix: str) -> str:
        self._ids += 1
        minted = f"{prefix}-{self._ids}"
        if prefix == "turn":
            self.minted_turns.append(minted)
        return minted

    def crash(self, point: str, seq: int) -> None:
        """The process dies: pending writes are gone; the committed record stays."""
        self.crashes += 1
        self.crash_seqs.append(seq)
        self.store.crash()
        self.store.reopen()  # the file survives; what reads it next is a new connection
        self.timeline.add("CRASH", point)

    def restart(self) -> str:
        """A new process: returns its holder identity (the old pid is now dead)."""
        self.pid += 1
        self.timeline.add("restart", f"process pid={self.pid}")
        return self.holder

    @property
    def holder(self) -> str:
        return f"pid={self.pid}"

    def holder_alive(self, holder: str) -> bool:
        """LEASE-3 in the simulator: only the current process is alive."""
        return holder.split(":", 1)[0] == self.holder
