"""Deterministic fake providers: reply builders, three fakes and script files.

Theory of operation
-------------------
A fake provider is anything with a synchronous ``complete(request) -> ProviderReply``
that signals failure by raising a ``ProviderError`` subclass, exactly as the engine's
``CallProvider`` effect promises. Three fakes cover the simulator's needs:

* ``ScriptedProvider``: a queue of steps (a reply, an error to raise, or a function of
  the request). Scenarios use it to say precisely what the model does at each call.
* ``FunctionProvider``: the reply is a function of the request, with no queue.
* ``GenerativeProvider``: a seeded, plausible model for sweeps: it calls the offered tools
  for a few rounds, then answers. It reads only the tail of the history since the last
  user message, so a call costs the same in a long conversation as in a short one.

Every fake records the requests it received and finishes each reply the same way
(``_FakeBase._finish``): tool calls without an id get ``call_1``, ``call_2``, … counted
per provider instance (or drawn from a seeded stream, ``draw_ids_from``); usage is taken
from ``request.prompt_tokens`` (the engine's own count, never a re-tokenisation) and
``tokens.count_text`` of what the reply says, and
``cached_tokens`` from ``PromptCache``: the leading messages the request shares with an
earlier one, as a real provider's prompt cache reports them.

Provider faults have builders of their own: ``lone_surrogate_text`` and
``split_pair_text`` (text that is not Unicode as it stands) and ``calls_sharing_id`` (calls
of one reply under one id). The engine must take such replies in by its intake rule
(``hermes_ref.reply_intake``); ``docs/simulator.md`` tabulates them.

A fake that is called when it has nothing left to say raises ``ScriptExhausted``, a
*harness* error (an ``AssertionError``, not a ``ProviderError``) so the engine's retry
logic can never swallow a broken test.

The HTTP face of these fakes (wire bodies, httpx and respx handlers, a real server on
127.0.0.1) is ``sim.provider_http``; this module knows nothing of HTTP.

Script files (``load_script``) are a JSON list of steps::

    [
      {"text": "Let me look.", "finish_reason": "stop"},
      {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
      {"tool_calls": [{"id": "call_x", "name": "shell", "arguments": "{\\"cmd\\": \\"ls\\"}"}],
       "content": "optional text beside the calls"},
      {"error": "rate_limited", "retry_after_s": 2},
      {"error": "server_error", "status": 503},
      {"error": "timeout"}, {"error": "context_overflow"}, {"error": "auth"},
      {"error": "rejected"}, {"error": "malformed"}
    ]

``arguments`` is an object (serialised with ``json.dumps``) or a string sent verbatim;
an error step may carry a ``"message"``; a reply step may carry ``"reasoning"``.

A reply step may also carry a provider fault under ``"fault"``: a text step
``"lone_surrogate"`` (a lone high surrogate appended to the text) or ``"split_pair"``
(U+1F600 appended as its two UTF-16 halves, which the HTTP face sends in two stream
deltas); a tool-call step ``"shared_id"`` (every call takes the first call's id, or
``call_0``). A lone surrogate can also be written straight into the JSON as ``"\\ud83d"``.
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hermes_ref.errors import (
    BadInput,
    ContextOverflow,
    MalformedReply,
    ProviderAuthError,
    ProviderError,
    ProviderRejected,
    ProviderServerError,
    ProviderTimeout,
    RateLimited,
)
from hermes_ref.models import Message, ProviderReply, Role, StreamDelta, ToolCall, ToolSpec, Usage
from hermes_ref.tokens import count_text
from hermes_ref.wire import ProviderRequest
from sim.summarizer import COMPRESSION_PURPOSE, Summarizer  # CMP-2
from sim.world import seeded_id


class ScriptError(AssertionError):
    """The test harness was used wrongly. Deliberately not a ProviderError."""


class ScriptExhausted(ScriptError):
    """A fake was called after its script ran out."""


# ---- terse reply builders -------------------------------------------------------------

CallSpec = ToolCall | tuple[str, Mapping[str, Any] | str]


def text(content: str, finish_reason: str = "stop") -> ProviderReply:
    """A plain text answer."""
    return ProviderReply(content=content, finish_reason=finish_reason)


def tool_calls(
    *calls: CallSpec, content: str | None = None, finish_reason: str = "tool_calls"
) -> ProviderReply:
    """A reply calling tools: ``tool_calls(("read_file", {"path": "a.txt"}))``.

    Arguments given as a dict are serialised with ``json.dumps``; a string is sent as is
    (handy for malformed-arguments scenarios). Ids are left empty here and assigned by the
    provider that returns the reply (``call_1``, ``call_2``, …), unless a ``ToolCall``
    with an id is given.
    """
    built = tuple(_as_tool_call(c) for c in calls)
    return ProviderReply(content=content, tool_calls=built, finish_reason=finish_reason)


def calls_sharing_id(call_id: str, *calls: CallSpec, content: str | None = None) -> ProviderReply:
    """A provider fault: tool calls that all carry the same ``call_id``.

    Some OpenAI-compatible servers number calls per request, or reuse one id for a whole
    batch, so two different calls of one reply arrive as ``call_0`` and ``call_0``.
    ``calls_sharing_id("call_0", ("read_file", {"path": "a.txt"}), ("read_file", {"path":
    "b.txt"}))`` is such a reply; the fake keeps explicit ids, so both reach the engine.
    """
    built = tuple(_as_tool_call(c).model_copy(update={"id": call_id}) for c in calls)
    return ProviderReply(content=content, tool_calls=built, finish_reason="tool_calls")


# A high surrogate with no low half: what a reply cut mid-emoji carries, or what a server
# sends as the JSON escape ``"\ud83d"`` on its own. It is not Unicode text.
LONE_SURROGATE = "\ud83d"


def utf16_halves(char: str) -> str:
    """An astral character as its two UTF-16 halves, each a code point of its own.

    This is what a stream fold that joins deltas naively gets when a server splits the
    character's surrogate pair across two deltas: ``"\\ud83d" + "\\ude00"`` instead of
    ``"\\U0001f600"``. ``sim.provider_http`` always sends such halves in separate deltas.
    """
    if len(char) != 1 or ord(char) < 0x10000:
        raise ScriptError(f"{char!r} is not one character outside the Basic Multilingual Plane")
    offset = ord(char) - 0x10000
    return chr(0xD800 + (offset >> 10)) + chr(0xDC00 + (offset & 0x3FF))


def lone_surrogate_text(before: str, after: str = "") -> ProviderReply:
    """A provider fault: a text answer with a lone surrogate between ``before`` and ``after``."""
    return text(before + LONE_SURROGATE + after)


def split_pair_text(before: str, after: str = "", char: str = "\U0001f600") -> ProviderReply:
    """A provider fault: a text answer whose ``char`` arrives as a split surrogate pair.

    In process the halves are two code points (see ``utf16_halves``); over HTTP a stream
    sends them in two deltas and a whole body as the two escapes ``\\ud83d\\ude00``.
    """
    return text(before + utf16_halves(char) + after)


def _as_tool_call(spec: CallSpec) -> ToolCall:
    if isinstance(spec, ToolCall):
        return spec
    name, args = spec
    return ToolCall(id="", name=name, arguments=args if isinstance(args, str) else json.dumps(args))


def completion_tokens(reply: ProviderReply) -> int:
    """What a reply costs, by the project's deterministic token rule."""
    total = count_text(reply.content) + count_text(reply.reasoning)
    for call in reply.tool_calls:
        total += count_text(call.name) + count_text(call.arguments)
    return total


# ---- prompt-cache accounting --------------------------------------------------------------


class PromptCache:
    """The prefix cache a real provider keeps, counted the way the engine counts tokens.

    A provider reuses the work it did for a prompt prefix it has seen before and reports
    how much of a new prompt it served that way (``usage.prompt_tokens_details.cached_tokens``).
    All it can see of a conversation is the requests themselves, so that is all this reads:
    a request's cached tokens are those of the longest run of leading messages it shares,
    byte for byte, with any earlier request that had the same model and tools. The first
    message is the session's system prompt (CTX-3 keeps it fixed, and its context layer
    names the session), so in practice the run is shared with earlier requests of the same
    conversation only. A message counts whole, at ``Message.tokens`` (the engine's own
    estimate), or not at all: the engine has no finer count, and a prefix that ends inside
    a message is where the bytes changed anyway.

    The prefixes seen are kept as a trie of message bytes, so a request costs one dict step
    per message; a request that extends the previous one starts where that one ended.
    """

    def __init__(self) -> None:
        self._root: dict[bytes, _CacheNode] = {}
        self._last: tuple[bytes, tuple[Message, ...], _CacheNode, int] | None = None
        self._heads: dict[int, tuple[tuple[ToolSpec, ...], str, bytes]] = {}

    def observe(self, request: ProviderRequest) -> int:
        """Cached tokens of ``request`` against every earlier one; then remember it."""
        messages, head, start = request.messages, self._head(request), 0
        last = self._last
        if last is not None and last[0] == head and len(last[1]) <= len(messages) \
                and messages[:len(last[1])] == last[1]:
            node, start, cached = last[2], len(last[1]), last[3]
        else:
            node, cached = self._root.setdefault(head, _CacheNode()), 0
        hit, total = True, cached  # a request that extends the last is all cached up to start
        for message in messages[start:]:
            child = node.children.get(message.wire_json)
            if child is None:
                hit, child = False, node.children.setdefault(message.wire_json, _CacheNode())
            elif hit:
                cached += message.tokens
            total += message.tokens
            node = child
        self._last = (head, messages, node, total)
        return min(cached, request.prompt_tokens)

    def _head(self, request: ProviderRequest) -> bytes:
        """Model and tools: a prompt the provider caches starts with them."""
        hit = self._heads.get(id(request.tools))
        if hit is not None and hit[0] is request.tools and hit[1] == request.model:
            return hit[2]
        head = json.dumps([request.model, [t.wire() for t in request.tools]]).encode("utf-8")
        if len(self._heads) >= 8:  # a new tuple per request (the HTTP face): start over
            self._heads.clear()
        self._heads[id(request.tools)] = (request.tools, request.model, head)
        return head


class _CacheNode:
    __slots__ = ("children",)

    def __init__(self) -> None:
        self.children: dict[bytes, _CacheNode] = {}


# ---- the fakes ------------------------------------------------------------------------


class _FakeBase:
    """Request recording and reply finishing shared by every fake.

    A lock makes each call atomic, because ``sim.provider_http.serve_fake_provider`` calls
    from threads.
    """

    def __init__(self) -> None:
        self.requests: list[ProviderRequest] = []
        self._ids_issued = 0
        self._id_stream: random.Random | None = None  # set: call ids drawn, not counted
        self._ids_taken: set[str] = set()
        self._lock = threading.Lock()
        self.prompt_cache = PromptCache()
        self.summarizer = Summarizer()  # CMP-2: the auxiliary model answers compaction's requests

    def complete(self, request: ProviderRequest) -> ProviderReply:
        with self._lock:
            if request.purpose == COMPRESSION_PURPOSE:  # never a step of the turn's script
                return self.summarizer.complete(request)
            self.requests.append(request)
            reply = self._reply(request)  # a request that fails leaves nothing cached
            return self._finish(reply, request, self.prompt_cache.observe(request))

    def _reply(self, request: ProviderRequest) -> ProviderReply:
        raise NotImplementedError

    def _finish(self, reply: ProviderReply, request: ProviderRequest,
                cached_tokens: int = 0) -> ProviderReply:
        """Fill in ids, usage and model; values a step set explicitly are kept."""
        calls = tuple(c if c.id else c.model_copy(update={"id": self._next_id()})
                      for c in reply.tool_calls)
        usage = reply.usage
        if usage == Usage():
            usage = Usage(
                prompt_tokens=request.prompt_tokens, completion_tokens=completion_tokens(reply),
                cached_tokens=cached_tokens,
            )
        return reply.model_copy(
            update={"tool_calls": calls, "usage": usage, "model": reply.model or request.model}
        )

    def draw_ids_from(self, stream: random.Random) -> None:
        """Draw the call ids from ``stream`` (``call_`` and six hex digits, drawn again on a
        collision) instead of counting them: an explored world's ids come from its seed."""
        self._id_stream = stream

    def _next_id(self) -> str:
        self._ids_issued += 1
        if self._id_stream is not None:
            return seeded_id(self._id_stream, "call_", self._ids_taken)
        return f"call_{self._ids_issued}"


Step = ProviderReply | ProviderError | Callable[[ProviderRequest], ProviderReply]


class ScriptedProvider(_FakeBase):
    """Plays a queue of steps, one per call; see the module docstring."""

    def __init__(self, steps: Iterable[Step] = ()) -> None:
        super().__init__()
        self._steps: deque[Step] = deque(steps)

    def add(self, *steps: Step) -> ScriptedProvider:
        """Append steps (a fixture can build the provider before the test scripts it)."""
        self._steps.extend(steps)
        return self

    @property
    def remaining(self) -> int:
        return len(self._steps)

    def assert_consumed(self) -> None:
        """Raise ``ScriptError`` if steps are left, i.e. the engine called less than scripted."""
        if self._steps:
            raise ScriptError(
                f"ScriptedProvider: {len(self._steps)} step(s) never used after "
                f"{len(self.requests)} call(s)"
            )

    def _reply(self, request: ProviderRequest) -> ProviderReply:
        if not self._steps:
            raise ScriptExhausted(
                f"ScriptedProvider: unexpected call #{len(self.requests)}, the script is "
                f"exhausted; last message of the request: {_describe_last(request)}"
            )
        step = self._steps.popleft()
        if isinstance(step, ProviderError):
            raise step
        if isinstance(step, ProviderReply):
            return step
        return step(request)


def _describe_last(request: ProviderRequest) -> str:
    if not request.messages:
        return "(no messages)"
    last = request.messages[-1]
    body = last.content if last.content is not None else f"{len(last.tool_calls)} tool call(s)"
    return f"{last.role.value}: {body[:120]!r}"


class FunctionProvider(_FakeBase):
    """Answers every call with ``fn(request)``; ``fn`` may raise a ProviderError."""

    def __init__(self, fn: Callable[[ProviderRequest], ProviderReply]) -> None:
        super().__init__()
        self._fn = fn

    def _reply(self, request: ProviderRequest) -> ProviderReply:
        return self._fn(request)


# Short, recognisable values for common string parameters; anything else gets name-N.
_STRING_SAMPLES = {
    "path": "notes.txt", "file": "notes.txt", "filename": "notes.txt", "file_path": "notes.txt",
    "command": "echo hello", "cmd": "echo hello", "query": "hello", "pattern": "hello",
    "content": "hello from the simulator", "text": "hello from the simulator",
    "url": "https://example.com/",
}
_SCHEMA_DEPTH_MAX = 3


class GenerativeProvider(_FakeBase):
    """A seeded model: ``tool_rounds`` rounds of ``parallel`` tool calls, then an answer.

    Same seed and same requests give the same replies: every choice comes from the
    instance's own ``random.Random(seed)``.
    """

    def __init__(self, seed: int, tool_rounds: int = 1, parallel: int = 1) -> None:
        super().__init__()
        self.seed = seed
        self.tool_rounds = tool_rounds
        self.parallel = parallel
        self._rng = random.Random(seed)

    def _reply(self, request: ProviderRequest) -> ProviderReply:
        rounds, results = _tail_since_user(request.messages)
        if request.tools and rounds < self.tool_rounds:
            picked = [self._rng.choice(request.tools) for _ in range(self.parallel)]
            return tool_calls(*((t.name, self._arguments(t.parameters)) for t in picked))
        opener = self._rng.choice(("Done.", "All set.", "Finished."))
        noun = "tool result" if results == 1 else "tool results"
        return text(f"{opener} I saw {results} {noun}.")

    def _arguments(self, schema: Mapping[str, Any], depth: int = 0) -> dict[str, Any]:
        """Values for the required properties of an object schema."""
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = schema.get("required")
        names = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
        return {name: self._value(name, properties.get(name), depth) for name in names}

    def _value(self, name: str, schema: object, depth: int) -> Any:
        schema = schema if isinstance(schema, dict) else {}
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return self._rng.choice(enum)
        kind = schema.get("type")
        if isinstance(kind, list):  # ["string", "null"] → the first non-null type
            kind = next((k for k in kind if k != "null"), None)
        if kind == "integer":
            return self._rng.randint(1, 10)
        if kind == "number":
            return self._rng.randint(1, 100) / 10
        if kind == "boolean":
            return self._rng.random() < 0.5
        if kind == "array":
            deeper = depth < _SCHEMA_DEPTH_MAX
            return [self._value(name, schema.get("items"), depth + 1)] if deeper else []
        if kind == "object":
            return self._arguments(schema, depth + 1) if depth < _SCHEMA_DEPTH_MAX else {}
        return _STRING_SAMPLES.get(name.lower()) or f"{name}-{self._rng.randint(1, 99)}"


def _tail_since_user(messages: tuple[Message, ...]) -> tuple[int, int]:
    """(assistant tool-call messages, tool results) after the last user message.

    Walks backwards and stops at the user message, so the cost is the current turn's
    tail, not the whole conversation.
    """
    rounds = results = 0
    for message in reversed(messages):
        if message.role is Role.USER:
            break
        if message.role is Role.ASSISTANT and message.tool_calls:
            rounds += 1
        elif message.role is Role.TOOL:
            results += 1
    return rounds, results


# ---- script files -------------------------------------------------------------------------

_ERROR_KINDS: dict[str, Callable[[str, Mapping[str, Any]], ProviderError]] = {
    "rate_limited": lambda m, s: RateLimited(m, retry_after_s=s.get("retry_after_s")),
    "server_error": lambda m, s: ProviderServerError(m, status=s.get("status", 500)),
    "timeout": lambda m, s: ProviderTimeout(m),
    "context_overflow": lambda m, s: ContextOverflow(m, status=400),
    "auth": lambda m, s: ProviderAuthError(m, status=401),
    "rejected": lambda m, s: ProviderRejected(m, status=400),
    "malformed": lambda m, s: MalformedReply(m),
}
_STEP_KEYS = {
    "text": {"text", "finish_reason", "reasoning", "fault"},
    "tool_calls": {"tool_calls", "content", "finish_reason", "reasoning", "fault"},
    "error": {"error", "message", "retry_after_s", "status"},
}


def load_script(path: str | Path) -> ScriptedProvider:
    """A ``ScriptedProvider`` from a JSON script file (format in the module docstring).

    Raises ``BadInput`` naming the file, the step index and what is wrong.
    """
    try:
        raw: object = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read the script: {exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(raw, list):
        raise BadInput(f"{path}: a script is a JSON list of steps, got {type(raw).__name__}")
    return ScriptedProvider(_step_from_json(s, f"{path}: step {i}") for i, s in enumerate(raw))


def _step_from_json(raw: object, where: str) -> Step:
    if not isinstance(raw, dict):
        raise BadInput(f"{where}: a step is an object, got {type(raw).__name__}")
    kinds = [k for k in _STEP_KEYS if k in raw]
    if len(kinds) != 1:
        raise BadInput(f"{where}: a step needs exactly one of 'text', 'tool_calls', 'error'")
    unknown = sorted(set(raw) - _STEP_KEYS[kinds[0]])
    if unknown:
        raise BadInput(f"{where}: unknown key(s) {unknown} in a {kinds[0]!r} step")
    if kinds[0] == "error":
        return _error_step(raw, where)
    try:
        return _reply_step(raw, where)
    except ValidationError as exc:  # e.g. a finish_reason that is not a string
        first = exc.errors()[0]
        raise BadInput(f"{where}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from exc


def _error_step(raw: Mapping[str, Any], where: str) -> ProviderError:
    kind = raw["error"]
    if kind not in _ERROR_KINDS:
        raise BadInput(f"{where}: unknown error {kind!r}; expected one of {sorted(_ERROR_KINDS)}")
    retry = raw.get("retry_after_s")
    if retry is not None and (isinstance(retry, bool) or not isinstance(retry, int | float)):
        raise BadInput(f"{where}: retry_after_s must be a number")
    status = raw.get("status")
    if status is not None and (not isinstance(status, int) or not 500 <= status <= 599):
        raise BadInput(f"{where}: status must be an integer from 500 to 599")
    message = raw.get("message", f"scripted {kind}")
    return _ERROR_KINDS[kind](str(message), raw)


# What a ``"fault"`` key appends to a text step: the provider faults of text.
_TEXT_FAULTS = {"lone_surrogate": LONE_SURROGATE, "split_pair": utf16_halves("\U0001f600")}
# The provider faults of a tool-call step.
_CALL_FAULTS = frozenset({"shared_id"})
SHARED_ID_DEFAULT = "call_0"  # the shared id when the first call names none


def _reply_step(raw: Mapping[str, Any], where: str) -> ProviderReply:
    extras = {k: raw[k] for k in ("finish_reason", "reasoning") if k in raw}
    fault = raw.get("fault")
    if "text" in raw:
        if not isinstance(raw["text"], str):
            raise BadInput(f"{where}: 'text' must be a string")
        _check_fault(fault, set(_TEXT_FAULTS), "text", where)
        suffix = _TEXT_FAULTS[fault] if fault is not None else ""
        return ProviderReply(content=raw["text"] + suffix, **extras)
    calls = raw["tool_calls"]
    if not isinstance(calls, list) or not calls:
        raise BadInput(f"{where}: 'tool_calls' must be a non-empty list")
    _check_fault(fault, set(_CALL_FAULTS), "tool_calls", where)
    built = [_call_from_json(c, f"{where}: tool_calls[{j}]") for j, c in enumerate(calls)]
    if fault == "shared_id":  # every call takes the first call's id
        shared = built[0].id or SHARED_ID_DEFAULT
        built = [c.model_copy(update={"id": shared}) for c in built]
    return ProviderReply(
        content=raw.get("content"), tool_calls=tuple(built),
        **{"finish_reason": "tool_calls", **extras},
    )


def _check_fault(fault: object, known: set[str], kind: str, where: str) -> None:
    if fault is not None and fault not in known:
        raise BadInput(f"{where}: unknown fault {fault!r} in a {kind!r} step; "
                       f"expected one of {sorted(known)}")


def _call_from_json(raw: object, where: str) -> ToolCall:
    if not isinstance(raw, dict):
        raise BadInput(f"{where}: a tool call is an object")
    unknown = sorted(set(raw) - {"id", "name", "arguments"})
    if unknown:
        raise BadInput(f"{where}: unknown key(s) {unknown}")
    name, args = raw.get("name"), raw.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise BadInput(f"{where}: 'name' is missing or not a non-empty string")
    if not isinstance(args, dict | str):
        raise BadInput(f"{where}: 'arguments' must be an object or a string")
    arguments = args if isinstance(args, str) else json.dumps(args)
    return ToolCall(id=str(raw.get("id") or ""), name=name, arguments=arguments)


# ---- streaming: a reply as the deltas a streaming server sends -----------------------------


def stream_deltas(reply: ProviderReply, pieces: int = 3) -> tuple[StreamDelta, ...]:
    """``reply`` as the ordered deltas of a stream, as a chat-completions server sends them.

    Reasoning first, then the text, each cut into at most ``pieces`` even parts (and
    between the halves of a split surrogate pair, which travel in two deltas), then each
    tool call (a head with its id and name, then its arguments in pieces), then the finish
    reason and the usage: the very deltas ``sim.provider_http.completion_chunks`` sends,
    so both drivers see one stream. ``hermes_ref.reply_intake.accumulate`` of the result gives back the
    reply (cleaned), so a stream cut after delta ``n`` delivered exactly ``n`` of these.
    """
    out: list[StreamDelta] = [StreamDelta(kind="reasoning", text=p)
                              for p in _stream_pieces(reply.reasoning, pieces)]
    out += [StreamDelta(kind="text", text=p) for p in _stream_pieces(reply.content, pieces)]
    for i, call in enumerate(reply.tool_calls):  # the head (id, name), then the arguments
        out.append(StreamDelta(kind="tool_call", index=i, call_id=call.id, name=call.name))
        out += [StreamDelta(kind="tool_call", index=i, text=f)
                for f in _stream_pieces(call.arguments, pieces) if f]
    out.append(StreamDelta(kind="finish", text=reply.finish_reason))
    out.append(StreamDelta(kind="usage", usage=reply.usage))
    return tuple(out)


_BETWEEN_HALVES = re.compile(r"(?<=[\ud800-\udbff])(?=[\udc00-\udfff])")


def _stream_pieces(value: str | None, count: int) -> list[str]:
    """``value`` in at most ``count`` even pieces, cut also between surrogate halves."""
    if value is None:
        return []
    size = max(1, -(-len(value) // count))
    even = [value[i:i + size] for i in range(0, len(value), size)] or [""]
    return [part for piece in even for part in _BETWEEN_HALVES.split(piece)]
