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

import json
from collections.abc import Generator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Generic, TypeVar

from hermes_ref.errors import ProviderRejected
from hermes_ref.models import (
    Event,
    Lease,
    LeaseGrant,
    Message,
    ProviderReply,
    SessionRecord,
    ToolCall,
    ToolResult,
    ToolSpec,
)

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


@dataclass(frozen=True, slots=True)
class RewriteMessage(Effect[Message]):
    """Replace the content of one stored row (tail closure fills an empty assistant row)."""

    lease_token: int
    session_id: str
    row_id: int
    content: str
    label: Site
    kind: ClassVar[str] = "rewrite_message"

    @property
    def site(self) -> Site:
        return self.label


# ---- the outside world ------------------------------------------------------------------


class WireBody:
    """One request body, held as the immutable bytes it is made of, joined on demand.

    The bytes are ``opening``, then ``parts`` joined with ", ", then ``closing``: the very
    bytes objects the request was serialized into, fixed when the body was built, so
    joining them later gives the bytes that were (or would have been) sent, whatever
    changed since. Building one copies no history; the join and its parse happen once,
    when someone reads them. ``WireBody(raw)`` holds bytes that are already whole.
    """

    __slots__ = ("_bytes", "_parsed", "closing", "opening", "parts")

    def __init__(self, opening: bytes, parts: tuple[bytes, ...] = (), closing: bytes = b"") -> None:
        self.opening, self.parts, self.closing = opening, parts, closing
        self._bytes: bytes | None = None
        self._parsed: Any = None

    def __bytes__(self) -> bytes:
        if self._bytes is None:
            self._bytes = self.opening + b", ".join(self.parts) + self.closing
        return self._bytes

    def parsed(self) -> Any:
        """The bytes parsed as JSON (raises ``ValueError`` when they are not JSON); shared."""
        if self._parsed is None:
            self._parsed = json.loads(bytes(self))
        return self._parsed


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """One chat-completions request. ``messages`` are API copies; ``body`` is what is sent."""

    model: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    prompt_tokens: int
    max_tokens: int | None = None
    stream: bool = False
    purpose: str = "turn"  # "turn" | "grace" (the finalizer's tool-less summary call)

    def wire_body(self) -> WireBody:
        """The request body, exactly the bytes that cross the wire, as the pieces they join.

        This is the one serialization of a request: ``HttpProvider`` posts its bytes
        (``body``), the simulator records it with each call, and the wire checkers
        (WIRE-1, WIRE-3, CTX-2) parse those bytes, so a leak anywhere on the way out is a
        leak they see. History messages are frozen, so each one's JSON
        (``Message.wire_json``) is computed once, and a request that extends an earlier
        one reuses that one's list of them (``_wire_parts``): the per-call cost of a long
        history is a tuple of references, and one join of bytes only where bytes are
        wanted. A body that JSON cannot carry (NaN, a value with no JSON form) is
        ``ProviderRejected`` here, before anything is sent.
        """
        try:
            rest = self._head()
            parts = _wire_parts(self.messages)
        except (TypeError, ValueError) as exc:
            raise ProviderRejected(f"request body cannot be encoded as JSON: {exc}") from exc
        return WireBody(b'{"messages": [', parts, b"], " + rest[1:])

    def body(self) -> bytes:
        """The request body as the bytes ``HttpProvider`` posts (``wire_body``, joined)."""
        return bytes(self.wire_body())

    def _head(self) -> bytes:
        """Everything but the messages, as a JSON object; the same tools give the same bytes."""
        key = (self.model, id(self.tools), self.max_tokens, self.stream)
        hit = _HEADS.get(key)
        if hit is not None and hit[0] is self.tools:  # ``is``: the id is of a live tuple
            return hit[1]
        head: dict[str, Any] = {"model": self.model}
        if self.tools:
            head["tools"] = [t.wire() for t in self.tools]
        if self.max_tokens is not None:
            head["max_tokens"] = self.max_tokens
        if self.stream:
            head["stream"] = True
        rest = json.dumps(head, allow_nan=False).encode("utf-8")
        _remember(_HEADS, key, (self.tools, rest))
        return rest

    def wire(self) -> dict[str, Any]:
        """The body parsed back: a view of the bytes ``body`` sends, never a second builder."""
        parsed: dict[str, Any] = json.loads(self.body())
        return parsed


# Memos of ``ProviderRequest.wire_body``, a few entries each: a turn's requests grow by appending
# to one history, so the previous request's messages are the next one's first. Each entry
# holds the very values it was made from and is used only for those (compared, so an id is
# never taken for a value), so a stale or racing entry costs a recomputation, never a
# wrong byte.
_MEMO_SLOTS = 8
_PARTS: dict[int, tuple[tuple[Message, ...], tuple[bytes, ...]]] = {}
_HEADS: dict[tuple[str, int, int | None, bool], tuple[tuple[ToolSpec, ...], bytes]] = {}


def _wire_parts(messages: tuple[Message, ...]) -> tuple[bytes, ...]:
    """Each message's wire JSON, in order, extending those of a request this one extends.

    Entries are keyed by the first message (a session's system prompt) and reused when
    their messages are the first ones of ``messages``.
    """
    if not messages:
        return ()
    key = id(messages[0])
    hit = _PARTS.get(key)
    # Tuple equality tries ``is`` first, element by element, in C; messages equal in every
    # field have the same wire JSON, so an equal (not identical) prefix is as good.
    if hit is not None and len(hit[0]) <= len(messages) and messages[:len(hit[0])] == hit[0]:
        parts = hit[1] + tuple([m.wire_json for m in messages[len(hit[0]):]])
    else:
        parts = tuple([m.wire_json for m in messages])
    _remember(_PARTS, key, (messages, parts))
    return parts


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    if key not in memo and len(memo) >= _MEMO_SLOTS:
        memo.clear()  # many histories at once: start over rather than track ages
    memo[key] = value


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
