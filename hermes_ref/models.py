"""Frozen values that cross the engine's boundary.

Theory of operation
-------------------
Everything the engine stores, sends or receives is one of these values. They are
immutable: a history is a list of ``Message`` values, and "changing" a message means
building a new one with ``model_copy(update=...)``. Immutability is what lets the
engine reuse the wire form of historical messages instead of rebuilding it every call
(``Message.wire`` is computed once per value).

A ``Message`` carries three kinds of data:

* wire fields, which the provider sees: role, content, tool_calls, tool_call_id, name;
* the ``api_content`` sidecar: when a turn injects per-turn context into the user
  message, the exact text sent is stored here and replayed on later calls (WIRE-1);
* local bookkeeping, which never leaves the process (WIRE-3): row id, turn id,
  timestamps, finish reason, the scaffolding flag and the hidden flag.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, ClassVar, Generic, Literal, Self, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field

from hermes_ref.tokens import count_message

JsonDict = dict[str, Any]
T_co = TypeVar("T_co", covariant=True)


class computed_once(Generic[T_co]):
    """A value computed from a frozen model's fields on first access, then kept.

    ``functools.cached_property`` does the same, but on Python 3.11 it takes a lock per
    computation; every message computes its wire form and token count once, on the hot
    path, and frozen values need no lock. The value lives in the instance ``__dict__``,
    so later reads are plain attribute lookups; ``Frozen.model_copy`` drops it.
    """

    def __init__(self, fn: Callable[[Any], T_co]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> computed_once[T_co]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T_co: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = self.fn(obj)
        obj.__dict__[self.name] = value
        return value


class Frozen(BaseModel):
    """Base for every boundary value: immutable, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", ignored_types=(computed_once,))
    # names a subclass computes once from its fields (computed_once); a copy must not keep them
    cached_names: ClassVar[tuple[str, ...]] = ()

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A changed copy that never carries values cached from the old fields.

        Like pydantic's own ``model_copy`` this does not validate ``update``; unlike it,
        the shallow path is a plain dict copy, because the stores copy every row and
        event they commit and pydantic's generic copy dominated that cost.
        """
        if deep:
            twin = super().model_copy(update=update, deep=True)
            for name in self.cached_names:
                twin.__dict__.pop(name, None)
            return twin
        values = dict(self.__dict__)
        for name in self.cached_names:
            values.pop(name, None)
        fields_set = set(self.__pydantic_fields_set__)
        if update:
            values.update(update)
            fields_set.update(update)
        twin = object.__new__(type(self))
        object.__setattr__(twin, "__dict__", values)
        object.__setattr__(twin, "__pydantic_fields_set__", fields_set)
        object.__setattr__(twin, "__pydantic_extra__", None)
        object.__setattr__(twin, "__pydantic_private__", None)
        return twin


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class ScaffoldFlag(StrEnum):
    """Marks a synthetic message that drives a retry; such messages are never persisted (SCAF-1)."""

    EMPTY_RECOVERY = "empty_recovery_synthetic"
    EMPTY_TERMINAL_SENTINEL = "empty_terminal_sentinel"
    DROPPED_TOOLCALL_NUDGE = "dropped_toolcall_nudge"
    GRACE_SUMMARY = "budget_grace_prompt"
    THINKING_PREFILL = "thinking_prefill"  # LOOP-8 rung 4: the model's reasoning, handed back
    VERIFICATION_STOP = "verification_stop_synthetic"  # FIN-1's gate: the answer held back
    PRE_VERIFY = "pre_verify_synthetic"  # FIN-1's gate: the request to verify first


# The flags no engine path produces yet (a test keeps this list true).
SCAFFOLD_FLAGS_NOT_YET_PRODUCED: frozenset[ScaffoldFlag] = frozenset()


class ToolCall(Frozen):
    """One function call requested by the model; ``arguments`` is the raw JSON text."""

    id: str
    name: str
    arguments: str = "{}"

    def wire(self) -> JsonDict:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    cached_names: ClassVar[tuple[str, ...]] = ("arguments_object",)

    @computed_once
    def arguments_object(self) -> JsonDict | None:
        """The arguments parsed once (the planner, validator and runners all ask)."""
        try:
            value = json.loads(self.arguments) if self.arguments.strip() else {}
        except (ValueError, RecursionError):  # nested past the parser's limit: no object either
            return None
        return value if isinstance(value, dict) else None

    def parsed_arguments(self) -> JsonDict | None:
        """The arguments as a dict (a fresh shallow copy), or None when not a JSON object."""
        value = self.arguments_object
        return None if value is None else dict(value)


# Keys that may appear in a wire message; anything else is local bookkeeping (WIRE-3).
WIRE_MESSAGE_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})


class Message(Frozen):
    """One transcript entry. See the module docstring for which fields reach the wire."""

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    tool_name: str | None = None
    api_content: str | None = None
    # local bookkeeping, never sent
    row_id: int | None = None
    turn_id: str | None = None
    finish_reason: str | None = None
    created_at: float | None = None
    scaffold: ScaffoldFlag | None = None
    hidden: bool = False

    cached_names: ClassVar[tuple[str, ...]] = ("wire", "wire_json", "tokens")

    @computed_once
    def wire(self) -> JsonDict:
        """The chat-completions form of this message, computed once per value.

        The sidecar replaces ``content`` when present, so a later call resends the exact
        bytes an earlier call sent (WIRE-1).
        """
        out: JsonDict = {"role": self.role.value}
        text = self.api_content if self.api_content is not None else self.content
        out["content"] = text
        if self.tool_calls:
            out["tool_calls"] = [c.wire() for c in self.tool_calls]
        if self.role is Role.TOOL:
            out["tool_call_id"] = self.tool_call_id
            if self.tool_name:
                out["name"] = self.tool_name
        return out

    @computed_once
    def wire_json(self) -> bytes:
        """The wire form as JSON bytes, computed once: a request body reuses it (WIRE-1)."""
        return json.dumps(self.wire, allow_nan=False).encode("utf-8")

    @computed_once
    def tokens(self) -> int:
        """Deterministic token estimate of the wire form (see ``tokens.count_message``)."""
        return count_message(self.wire)

    @property
    def sent_tokens(self) -> int:
        """What this message adds to a request: ``tokens``, or none for a hidden row, which
        stays in the transcript but never goes on the wire (LOOP-4, ``loop.build_request``)."""
        return 0 if self.hidden else self.tokens

    @property
    def has_visible_text(self) -> bool:
        return bool(self.content and self.content.strip()) and not self.hidden

    def rewritten(self, content: str | None, **changes: Any) -> Message:
        """This message with new ``content`` and no ``api_content`` sidecar (WIRE-2).

        The one way to change a message's text once it exists: a tail filled with the
        answer (FIN-3), a footer added, a redaction, a truncation, a compaction summary.
        The sidecar holds the bytes sent for the *old* content; replaying it would resend
        what the rewrite removed, so it goes. The cost is one prompt-cache miss from this
        row on, never wrong bytes. ``changes`` updates other fields too (``hidden``,
        ``finish_reason``); it may not set ``api_content``.
        """
        if "api_content" in changes or "content" in changes:
            raise TypeError("Message.rewritten sets content and drops api_content itself")
        return self.model_copy(update={**changes, "content": content, "api_content": None})


class ToolKind(StrEnum):
    """How the segment planner treats a tool (TOOL-4)."""

    READER = "reader"          # path-scoped, may share a segment with other readers
    WRITER = "writer"          # path-scoped, closes a segment on any overlap
    PARALLEL_SAFE = "parallel_safe"
    INTERACTIVE = "interactive"  # always a barrier
    SEQUENTIAL = "sequential"


class ToolSpec(Frozen):
    name: str
    description: str
    parameters: JsonDict = Field(default_factory=lambda: {"type": "object", "properties": {}})
    kind: ToolKind = ToolKind.SEQUENTIAL
    side_effecting: bool = True
    refundable: bool = False   # a round that used only refundable tools refunds its budget unit
    keeps_memory: bool = False  # the memory review (CTX-1) runs with this tool

    def wire(self) -> JsonDict:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


Disposition = Literal["applied", "none", "unknown"]


class ToolResult(Frozen):
    """The outcome of one call. A tool error is a result, not a turn failure (TOOL-6)."""

    call_id: str
    name: str
    content: str
    is_error: bool = False
    disposition: Disposition = "applied"


class Usage(Frozen):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # of prompt_tokens, those the provider served from its prompt cache (the longest prefix
    # it had seen before); the wire calls it usage.prompt_tokens_details.cached_tokens
    cached_tokens: int = 0


class StreamDelta(Frozen):
    """One piece of a streamed reply, as the provider port delivered it (DEL-1, FIN-2).

    ``kind`` says which part of the reply it extends: ``text`` (visible content),
    ``reasoning`` (chain of thought: shown, never replayed), ``tool_call`` (a fragment of
    call ``index``: its id and name arrive once, its arguments in pieces), ``usage``, or
    ``finish`` (the finish reason: the model said it is done). ``reply_intake.accumulate``
    folds an ordered tuple of them into the reply.
    """

    kind: Literal["text", "reasoning", "tool_call", "usage", "finish"]
    text: str = ""  # the fragment: content, reasoning, arguments, or the finish reason
    index: int = 0  # tool_call: which call of the reply
    call_id: str | None = None
    name: str | None = None
    usage: Usage | None = None


class ProviderReply(Frozen):
    """A parsed chat-completions choice (streamed replies are assembled first)."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    reasoning: str | None = None
    usage: Usage = Usage()
    model: str = ""
    # the visible text that reached the user as deltas before the reply was assembled; a
    # reply whose assembled content came back empty can still answer with it (LOOP-8 rung 1)
    streamed_text: str = ""
    # a streamed reply: the deltas the port delivered, in order; the reply is their fold
    deltas: tuple[StreamDelta, ...] = ()


class SessionRecord(Frozen):
    """One incarnation of a session lane (a row of ``sessions``)."""

    id: str
    key: str
    platform: str = "cli"
    chat_type: str = "dm"
    parent_session_id: str | None = None
    system_prompt: str
    started_at: float
    ended_at: float | None = None
    end_reason: str | None = None


class Lease(Frozen):
    """A held turn lease. ``token`` is a fencing token: it grows with every grant."""

    session_id: str
    holder: str
    token: int
    acquired_at: float
    expires_at: float


class Opening(Frozen):
    """A turn's first rows, offered with its lease request so one commit makes both durable.

    No external effect separates the grant from the user row (both must be durable before
    the first model call), so they may share a transaction, but only when nothing else
    has to be written between them: the store writes ``rows``, fenced by the new grant,
    when this request creates the session, or when the grant's token is
    ``expected_token``, the successor of the asker's last token, so that nobody held the
    lease in between and the history the asker has cached is the durable one
    (``applies``). Otherwise it grants alone and the turn writes its rows as before.
    ``events`` (the turn's ``turn.started``, which describes the grant and the user row)
    are committed with the rows and only with them, so that the record never holds the row
    without the event that says how the turn counted it (CTX-1).
    """

    rows: tuple[Message, ...]
    expected_token: int = 0  # 0: only for a session this request creates
    events: tuple[Event, ...] = ()  # the turn's first events, as they will be if it applies

    def applies(self, session_id: str, created: bool, lease: Lease | None) -> bool:
        if lease is None or lease.session_id != session_id or not self.rows:
            return False  # no grant, or a rotated session's tip: the turn syncs first (CMP-5)
        if self.expected_token == 0:  # a session the asker has not seen: only a new one
            return created and lease.token == 1
        return not created and lease.token == self.expected_token


class Closing(Frozen):
    """A turn's last rows and its ending, offered with the release so one commit makes
    them all durable (FIN-6, LEASE-6).

    Once the refresher is stopped and its interrupt cleared, nothing external separates
    the final answer row from the release: the store writes ``rows`` fenced by the lease,
    then ``events`` (the exit line and the completion, which describe those rows), then
    releases the lease in a savepoint of its own. A release that fails leaves the rows and
    the ending committed and the lease to lapse (``Closed.release_failure``). Rows that
    fail commit nothing, the events neither: the finalizer then ends the turn as one whose
    final write failed, with the ending that is true of it.
    """

    rows: tuple[Message, ...]
    events: tuple[Event, ...] = ()  # the turn's last events, as they will be if the rows commit


class Closed(Frozen):
    """What closing a turn committed: the rows with their ids, and why the release in the
    same transaction did not happen, if it did not (the rows and the ending stand)."""

    stored: tuple[Message, ...]
    release_failure: tuple[str, str] | None = None  # (cause, message)


class LeaseGrant(Frozen):
    """What opening a turn got: the session row (created now or not), the lease if free, and
    the opening rows stored with it (``Opening``), or why they could not be."""

    session: SessionRecord
    created: bool
    lease: Lease | None
    opened: tuple[Message, ...] = ()
    opening_failure: tuple[str, str] | None = None  # (cause, message): the grant stands


class Compacted(Frozen):
    """What a committed compaction left (CMP-5): the session the messages now live in (a
    rotation's child, or the same session compacted in place), its live rows with their new
    row ids, and the lease that fences them (a rotation carries the lease to the child)."""

    session: SessionRecord
    rows: tuple[Message, ...]
    lease: Lease


class EventKind(StrEnum):
    """The closed set of a turn's events (DEL-1), in the order a turn emits them."""

    TURN_STARTED = "turn.started"
    TURN_OVERLAP = "turn.overlap"    # CTX-9: started before the previous turn's final persist
    DELTA_TEXT = "delta.text"        # DEL-1: a streamed piece of visible text
    DELTA_REASONING = "delta.reasoning"  # shown while streaming, never replayed
    DELTA_TOOL_CALL = "delta.tool_call"  # a fragment of a streamed tool call
    TOOL_PROGRESS = "tool.progress"  # one per segment whose results are durable
    TURN_EXIT = "turn.exit"          # the exit line (FIN-7): ``outcomes.ExitLine``
    TURN_COMPLETED = "turn.completed"  # the final answer (DEL-1): ``outcomes.Completion``


class Event(Frozen):
    """One entry of a turn's event stream (DEL-1); ``seq`` is assigned by the store."""

    session_id: str
    turn_id: str
    kind: EventKind
    data: JsonDict = Field(default_factory=dict)
    at: float | None = None  # None: the driver stamps it with its clock when it is emitted
    seq: int | None = None
    # DEL-2: this event's place in its turn (1, 2, ...), stamped by the driver at emit time
    turn_seq: int | None = None
