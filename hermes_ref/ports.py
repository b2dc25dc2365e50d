"""What a driver needs from the world: the store, the provider and the tools.

Theory of operation
-------------------
Drivers perform effects through these ports. There are two shapes of each port: a
synchronous one for the simulator (and the stdlib-sqlite store it can use), and an
asynchronous one for the asyncio driver. The methods are the same, one for one, so a
single contract suite (tests/contract) checks every implementation.

``DurableRecord`` is the read side used by checkers: a plain snapshot of everything
committed, read from the store itself and never from the engine's memory.

Store rules every implementation keeps:

* ``append_messages`` and ``rewrite_message`` are fenced: they raise ``LeaseLost`` unless
  ``lease_token`` is the token of the session's current lease (LEASE-4).
* Each write method is one transaction; when it returns, the write is durable.
* Events logged with ``log_event`` are pending until the next write commits (or
  ``flush_events`` runs); a crash drops pending events, never committed rows.
* ``end_session`` only ends a live row: the first reason wins.
* ``ensure_session`` returns the stored row, creating it from the given one if absent,
  atomically; it also commits any pending events. ``open_turn`` does that and takes the
  session's lease in the same transaction (a turn's first write).
* ``watermark`` is the highest committed message row id; tools record it when they run,
  which is how persist-before-execute is checked without trusting the engine.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import Field

from hermes_ref.models import (
    Event,
    Frozen,
    Lease,
    LeaseGrant,
    Message,
    ProviderReply,
    SessionRecord,
    ToolCall,
    ToolResult,
)
from hermes_ref.wire import ProviderRequest


class StoredMessage(Frozen):
    session_id: str
    message: Message


class LeaseRow(Frozen):
    session_id: str
    holder: str | None
    token: int
    acquired_at: float
    expires_at: float


class DurableRecord(Frozen):
    """Everything committed, in commit order where order exists."""

    sessions: tuple[SessionRecord, ...] = ()
    messages: tuple[StoredMessage, ...] = ()
    events: tuple[Event, ...] = ()
    leases: tuple[LeaseRow, ...] = ()
    admissions: tuple[dict[str, object], ...] = Field(default=())

    def transcript(self, session_id: str) -> list[Message]:
        return [m.message for m in self.messages if m.session_id == session_id]

    def session_ids(self) -> list[str]:
        return [s.id for s in self.sessions]


class Store(Protocol):
    """Synchronous store port (simulator)."""

    def create_session(self, record: SessionRecord) -> None: ...
    def ensure_session(self, record: SessionRecord) -> tuple[SessionRecord, bool]: ...
    def get_session(self, session_id: str) -> SessionRecord | None: ...
    def end_session(self, session_id: str, reason: str, at: float) -> None: ...
    def load_messages(self, session_id: str, after_row_id: int = 0) -> tuple[Message, ...]: ...
    def append_messages(
        self, session_id: str, lease_token: int, messages: tuple[Message, ...]
    ) -> tuple[Message, ...]: ...
    def rewrite_message(
        self, session_id: str, lease_token: int, row_id: int, content: str
    ) -> Message: ...
    def acquire_lease(
        self, session_id: str, holder: str, now: float, ttl_s: float
    ) -> Lease | None: ...
    def open_turn(
        self, record: SessionRecord, holder: str, now: float, ttl_s: float
    ) -> LeaseGrant: ...
    def release_lease(self, lease: Lease) -> None: ...
    def log_event(self, event: Event) -> None: ...
    def flush_events(self) -> None: ...
    def watermark(self) -> int: ...
    def snapshot(self) -> DurableRecord: ...
    def close(self) -> None: ...


class AsyncStore(Protocol):
    """Asynchronous store port (asyncio driver); same contract as ``Store``."""

    async def create_session(self, record: SessionRecord) -> None: ...
    async def ensure_session(self, record: SessionRecord) -> tuple[SessionRecord, bool]: ...
    async def get_session(self, session_id: str) -> SessionRecord | None: ...
    async def end_session(self, session_id: str, reason: str, at: float) -> None: ...
    async def load_messages(
        self, session_id: str, after_row_id: int = 0
    ) -> tuple[Message, ...]: ...
    async def append_messages(
        self, session_id: str, lease_token: int, messages: tuple[Message, ...]
    ) -> tuple[Message, ...]: ...
    async def rewrite_message(
        self, session_id: str, lease_token: int, row_id: int, content: str
    ) -> Message: ...
    async def acquire_lease(
        self, session_id: str, holder: str, now: float, ttl_s: float
    ) -> Lease | None: ...
    async def open_turn(
        self, record: SessionRecord, holder: str, now: float, ttl_s: float
    ) -> LeaseGrant: ...
    async def release_lease(self, lease: Lease) -> None: ...
    async def log_event(self, event: Event) -> None: ...
    async def flush_events(self) -> None: ...
    async def watermark(self) -> int: ...
    async def snapshot(self) -> DurableRecord: ...
    async def close(self) -> None: ...


class LedgerEntry(Frozen):
    """One real side effect, recorded by the tool world when it happens."""

    call_id: str
    name: str
    arguments: str
    watermark: int  # the store's committed message high-water mark at execution time
    at: float
    outcome: str = "applied"


class Provider(Protocol):
    """Synchronous provider port (simulator fakes)."""

    def complete(self, request: ProviderRequest) -> ProviderReply: ...


class AsyncProvider(Protocol):
    """Asynchronous provider port (asyncio driver; ``HttpProvider``); same contract."""

    async def complete(self, request: ProviderRequest) -> ProviderReply: ...


class ToolRunner(Protocol):
    """Synchronous tool port: runs one call; a tool error is a result, never a raise."""

    def run(self, call: ToolCall, *, watermark: int, at: float) -> ToolResult: ...
