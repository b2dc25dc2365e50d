"""The request body: the one serialization of a model call.

Theory of operation
-------------------
A ``ProviderRequest`` is what the loop asks the model; its body bytes are what crosses
the wire. There is exactly one builder of those bytes (``ProviderRequest.wire_body``):
``HttpProvider`` posts them, the simulator records them with each call, and the wire
checkers (WIRE-1, WIRE-3, CTX-2) parse the recorded bytes, so a leak anywhere on the way
out is a leak they see. ``wire()`` is only a parse of those bytes, never a second builder.

History messages are frozen, so each one's JSON (``Message.wire_json``) is computed once,
and a request that extends an earlier one reuses that one's list of parts: the per-call
cost of a long history is a tuple of references, and one join of bytes where bytes are
wanted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hermes_ref.errors import ProviderRejected
from hermes_ref.models import Message, ToolSpec


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
        """The bytes parsed as JSON (raises ``ValueError`` when they are not JSON); shared.

        A body this module built is parsed in two halves: the messages array, and the rest
        of the object (the model and the tools: most of the bytes, and the same bytes in
        every request of a route), whose parse is kept by value (``_parse_rest``). The
        array is one JSON value wherever it stands, and the rest begins with a key, so
        whenever both halves parse alone this is the parse of the joined bytes (a
        ``messages`` key in the rest wins, as it does there); any other body is parsed
        whole, exactly as ``json.loads`` reads it. The parse is shared by every reader, and
        the rest's values by every body of the route: readers must not change them.
        """
        if self._parsed is None:
            if self.opening == _OPENING and self.closing.startswith(b'], "'):
                self._parsed = self._by_halves()
            if self._parsed is None:
                self._parsed = json.loads(bytes(self))
        return self._parsed

    def _by_halves(self) -> Any:
        try:
            rest = _parse_rest(self.closing)
            if not isinstance(rest, dict):
                return None
            messages = json.loads("[" + b", ".join(self.parts).decode("utf-8") + "]")
        except ValueError:
            return None
        return {"messages": messages, **rest}  # a "messages" in the rest wins, as in a parse


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
        return WireBody(_OPENING, parts, b"], " + rest[1:])

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


_OPENING = b'{"messages": ['
_RESTS: dict[bytes, Any] = {}


def _parse_rest(closing: bytes) -> Any:
    """``closing`` (``], "model": …}``) parsed as the object it ends, kept by value: the
    same bytes parse the same way. Both halves are read as UTF-8, as ``json.loads`` reads
    a whole body that opens with ``_OPENING``: its encoding is never guessed from a half.
    Raises ``ValueError`` when they are not JSON."""
    hit = _RESTS.get(closing)
    if hit is None:
        hit = json.loads("{" + closing[2:].decode("utf-8"))
        _remember(_RESTS, closing, hit)
    return hit


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    if key not in memo and len(memo) >= _MEMO_SLOTS:
        memo.clear()  # many histories at once: start over rather than track ages
    memo[key] = value
