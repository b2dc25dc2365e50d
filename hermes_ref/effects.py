"""The vocabulary of the boundary: every way the engine touches the world.

Theory of operation
-------------------
The engine core never performs I/O. Where it needs the clock, the provider, the store,
a tool or the event stream, it ``await``s an effect value::

    reply = await CallProvider(request)
    rows = await AppendMessages(lease.token, session_id, (assistant_row,), Site.TOOL_CALLS)

An effect's ``__await__`` yields the effect itself to whoever drives the coroutine and
returns what the driver sends back. A driver (``hermes_ref.shell.driver`` for asyncio,
``sim.driver`` for the simulator) performs the effect and resumes the coroutine with
the result, or throws an ``OperatingError`` into it. A crash is the driver dropping the
coroutine between two effects: nothing after that point reaches the store.

Effects are frozen slotted dataclasses, not pydantic models: a turn awaits a dozen of
them and they never cross a process boundary, so validation would buy nothing.

Effects at a boundary of the turn carry a ``site`` from the closed set ``Site``: every
durable write ("user", "tool_calls", "tool_results", "final", ...) and tool execution
("tools"). The same enum names the simulator's crash points (``before:<site>``,
``after:<site>``) and its store-failure plans, so a fault can only be aimed at a site
some effect has.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Generic, TypeVar

from hermes_ref.models import (
    Event,
    Lease,
    LeaseGrant,
    Message,
    ProviderReply,
    SessionRecord,
    ToolCall,
    ToolResult,
)
from hermes_ref.wire import ProviderRequest

T = TypeVar("T")


class Site(StrEnum):
    """Where a durable write or a tool execution happens, in turn order."""

    LEASE = "lease"
    RECOVERY = "recovery"
    USER = "user"
    TOOL_CALLS = "tool_calls"
    TOOLS = "tools"
    TOOL_RESULTS = "tool_results"
    FINAL = "final"
    TAIL_CLOSURE = "tail_closure"
    BOUNDARY = "boundary"
    RELEASE = "release"
    EVENTS = "events"


class Effect(Generic[T]):
    """A request to the driver whose answer has type ``T``."""

    __slots__ = ()
    kind: ClassVar[str] = "effect"

    def __await__(self) -> Generator[Effect[T], Any, T]:
        result: T = yield self
        return result

    @property
    def site(self) -> Site | None:
        """The boundary this effect stands at, or None for clock, ids, provider and events."""
        return None


# ---- clock, ids, randomness: owned by the driver so runs replay ---------------------


@dataclass(frozen=True, slots=True)
class Now(Effect[float]):
    """Seconds since the epoch, from the driver's clock."""

    kind: ClassVar[str] = "now"


@dataclass(frozen=True, slots=True)
class Sleep(Effect[None]):
    """Wait; the simulator jumps its virtual clock instead."""

    seconds: float
    kind: ClassVar[str] = "sleep"


@dataclass(frozen=True, slots=True)
class Jitter(Effect[float]):
    """A fraction in [0, 1) from the driver's random source (seeded in the simulator)."""

    kind: ClassVar[str] = "jitter"


@dataclass(frozen=True, slots=True)
class MintId(Effect[str]):
    """A fresh id such as ``turn-7`` or ``call-3``; unique within one store."""

    prefix: str
    kind: ClassVar[str] = "mint_id"


# ---- the durable record ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadMessages(Effect[tuple[Message, ...]]):
    """Stored messages of a session with ``row_id > after_row_id``, in row order."""

    session_id: str
    after_row_id: int = 0
    kind: ClassVar[str] = "load_messages"


@dataclass(frozen=True, slots=True)
class OpenTurn(Effect[LeaseGrant]):
    """Ensure the session row from ``record`` and take its lease, in one transaction.

    The stored row wins over ``record`` (its prompt is the one replayed: CTX-3), and the
    row exists before the lease that refers to it (CTX-4). One commit instead of two: a
    turn's first write both creates its lane and claims it, so no other process ever sees
    a new session without its first holder. Later polls of a busy lease use AcquireLease.
    """

    record: SessionRecord
    holder: str
    now: float
    ttl_s: float
    kind: ClassVar[str] = "open_turn"

    @property
    def site(self) -> Site:
        return Site.LEASE


@dataclass(frozen=True, slots=True)
class AcquireLease(Effect[Lease | None]):
    """Take the session's turn lease if it is free, expired or held by a dead process.

    None when a live holder has it. The store decides liveness (LEASE-3): the production
    store checks the holder's pid, the simulated one asks the world.
    """

    session_id: str
    holder: str
    now: float
    ttl_s: float
    kind: ClassVar[str] = "acquire_lease"

    @property
    def site(self) -> Site:
        return Site.LEASE


@dataclass(frozen=True, slots=True)
class ReleaseLease(Effect[None]):
    lease: Lease
    kind: ClassVar[str] = "release_lease"

    @property
    def site(self) -> Site:
        return Site.RELEASE


@dataclass(frozen=True, slots=True)
class AppendMessages(Effect[tuple[Message, ...]]):
    """Commit rows; returns them with their row ids. Fenced by the lease token."""

    lease_token: int
    session_id: str
    messages: tuple[Message, ...]
    label: Site
    kind: ClassVar[str] = "append_messages"

    @property
    def site(self) -> Site:
        return self.label


# ---- the outside world ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallProvider(Effect[ProviderReply]):
    """One model call. Raises a ``ProviderError`` subclass on failure."""

    request: ProviderRequest
    session_id: str = ""
    turn_id: str = ""
    kind: ClassVar[str] = "call_provider"


@dataclass(frozen=True, slots=True)
class ResolvePaths(Effect[tuple[str | None, ...]]):
    """Where the tools would act for each path argument, in the order asked.

    The answer for each path is the workspace-relative path the tools themselves would
    touch (absolute in-root paths made relative, symlinks followed, ``"."`` for the root),
    or None when the tools would refuse it (outside the workspace, a symlink loop). The
    segment planner compares these answers, not the strings the model wrote (TOOL-4):
    only the tool world knows that ``/root/a.txt`` and ``link.txt`` are ``a.txt``. It is
    answered by the same resolver the tools act through, so planning and acting agree.
    """

    paths: tuple[str, ...]
    kind: ClassVar[str] = "resolve_paths"


@dataclass(frozen=True, slots=True)
class ExecuteTools(Effect[tuple[ToolResult, ...]]):
    """Run one segment of calls; results come back in call order (TOOL-5)."""

    lease_token: int
    session_id: str
    calls: tuple[ToolCall, ...]
    parallel: bool
    kind: ClassVar[str] = "execute_tools"

    @property
    def site(self) -> Site:
        return Site.TOOLS


@dataclass(frozen=True, slots=True)
class Emit(Effect[None]):
    """Publish an event to the stream; the store logs it with the next commit.

    An event whose ``at`` is None is stamped by the driver with its clock, so emitting
    needs no separate ``Now`` effect.
    """

    event: Event
    kind: ClassVar[str] = "emit"


@dataclass(frozen=True, slots=True)
class FlushEvents(Effect[None]):
    """Commit the pending events now: a turn that writes no row still leaves its exit line."""

    kind: ClassVar[str] = "flush_events"

    @property
    def site(self) -> Site:
        return Site.EVENTS
