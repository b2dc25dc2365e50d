"""Deterministic fake providers, and an HTTP face that lets real clients talk to them.

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
per provider instance; usage is taken from ``request.prompt_tokens`` (the engine's own
count, never a re-tokenisation) and ``tokens.count_text`` of what the reply says.

A fake that is called when it has nothing left to say raises ``ScriptExhausted``, a
*harness* error (an ``AssertionError``, not a ``ProviderError``) so the engine's retry
logic can never swallow a broken test.

The HTTP face (``answer_http``) turns a fake into an OpenAI-compatible endpoint: it parses
the request body back into a ``ProviderRequest`` and answers with a ``chat.completion``
JSON document, or SSE chunks when the body says ``"stream": true``; provider errors become
the status codes ``HttpProvider`` maps back. Three shells reuse it:

* ``fake_transport(provider)``: an ``httpx.MockTransport`` for an ``httpx.AsyncClient``;
* ``install_respx(router, provider, base_url)``: the same handler behind respx routes;
* ``serve_fake_provider(provider)``: a real ``ThreadingHTTPServer`` on 127.0.0.1.

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
"""

from __future__ import annotations

import json
import random
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
from pydantic import ValidationError

from hermes_ref.effects import ProviderRequest
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
from hermes_ref.models import (
    WIRE_MESSAGE_KEYS,
    Message,
    ProviderReply,
    Role,
    ToolCall,
    ToolSpec,
    Usage,
)
from hermes_ref.tokens import count_text, count_wire_messages

if TYPE_CHECKING:
    import respx


class FakeProvider(Protocol):
    """What the simulator driver and the HTTP face need from a fake."""

    def complete(self, request: ProviderRequest) -> ProviderReply: ...


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


# ---- the fakes ------------------------------------------------------------------------


class _FakeBase:
    """Request recording and reply finishing shared by every fake.

    A lock makes each call atomic, because ``serve_fake_provider`` calls from threads.
    """

    def __init__(self) -> None:
        self.requests: list[ProviderRequest] = []
        self._ids_issued = 0
        self._lock = threading.Lock()

    def complete(self, request: ProviderRequest) -> ProviderReply:
        with self._lock:
            self.requests.append(request)
            return self._finish(self._reply(request), request)

    def _reply(self, request: ProviderRequest) -> ProviderReply:
        raise NotImplementedError

    def _finish(self, reply: ProviderReply, request: ProviderRequest) -> ProviderReply:
        """Fill in ids, usage and model; values a step set explicitly are kept."""
        calls = tuple(c if c.id else c.model_copy(update={"id": self._next_id()})
                      for c in reply.tool_calls)
        usage = reply.usage
        if usage == Usage():
            usage = Usage(
                prompt_tokens=request.prompt_tokens, completion_tokens=completion_tokens(reply)
            )
        return reply.model_copy(
            update={"tool_calls": calls, "usage": usage, "model": reply.model or request.model}
        )

    def _next_id(self) -> str:
        self._ids_issued += 1
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
    "text": {"text", "finish_reason", "reasoning"},
    "tool_calls": {"tool_calls", "content", "finish_reason", "reasoning"},
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


def _reply_step(raw: Mapping[str, Any], where: str) -> ProviderReply:
    extras = {k: raw[k] for k in ("finish_reason", "reasoning") if k in raw}
    if "text" in raw:
        if not isinstance(raw["text"], str):
            raise BadInput(f"{where}: 'text' must be a string")
        return ProviderReply(content=raw["text"], **extras)
    calls = raw["tool_calls"]
    if not isinstance(calls, list) or not calls:
        raise BadInput(f"{where}: 'tool_calls' must be a non-empty list")
    built = [_call_from_json(c, f"{where}: tool_calls[{j}]") for j, c in enumerate(calls)]
    return ProviderReply(
        content=raw.get("content"), tool_calls=tuple(built),
        **{"finish_reason": "tool_calls", **extras},
    )


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


# ---- the HTTP face: wire body → request, reply → wire body -------------------------------------


def request_from_wire(body: object) -> ProviderRequest:
    """Rebuild the ``ProviderRequest`` a chat-completions body encodes; BadInput if unusable.

    Message keys outside the wire set are refused, so a fake behind HTTP also checks that
    no local bookkeeping (row ids, flags) leaks onto the wire (WIRE-3).
    """
    if not isinstance(body, dict):
        raise BadInput("the body is not a JSON object")
    model, raw_messages = body.get("model"), body.get("messages")
    if not isinstance(model, str) or not model:
        raise BadInput("'model' is missing or not a string")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise BadInput("'messages' is missing or not a non-empty array")
    messages = tuple(_message_from_wire(m, f"messages[{i}]") for i, m in enumerate(raw_messages))
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise BadInput("'tools' is not an array")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        raise BadInput("'max_tokens' is not an integer")
    return ProviderRequest(
        model=model,
        messages=messages,
        tools=tuple(_tool_from_wire(t, f"tools[{i}]") for i, t in enumerate(tools)),
        prompt_tokens=count_wire_messages([m.wire for m in messages]),
        max_tokens=max_tokens,
        stream=body.get("stream") is True,
    )


def _message_from_wire(raw: object, where: str) -> Message:
    if not isinstance(raw, dict):
        raise BadInput(f"{where} is not an object")
    unknown = sorted(set(raw) - WIRE_MESSAGE_KEYS)
    if unknown:
        raise BadInput(f"{where} has non-wire key(s) {unknown}")
    if raw.get("role") not in {r.value for r in Role}:
        raise BadInput(f"{where}.role is {raw.get('role')!r}, not a chat role")
    for key in ("content", "tool_call_id", "name"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise BadInput(f"{where}.{key} is not a string")
    calls = raw.get("tool_calls") or []
    if not isinstance(calls, list):
        raise BadInput(f"{where}.tool_calls is not an array")
    built = (_call_from_wire(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls))
    return Message(
        role=Role(raw["role"]),
        content=raw.get("content"),
        tool_calls=tuple(built),
        tool_call_id=raw.get("tool_call_id"),
        tool_name=raw.get("name"),
    )


def _call_from_wire(raw: object, where: str) -> ToolCall:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(function, dict):
        raise BadInput(f"{where} is not an object with a 'function' object")
    for key, value in (("id", raw.get("id")), ("function.name", function.get("name")),
                       ("function.arguments", function.get("arguments"))):
        if not isinstance(value, str):
            raise BadInput(f"{where}.{key} is missing or not a string")
    return ToolCall(id=raw["id"], name=function["name"], arguments=function["arguments"])


def _tool_from_wire(raw: object, where: str) -> ToolSpec:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise BadInput(f"{where}.function.name is missing or not a string")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise BadInput(f"{where}.function.parameters is not an object")
    description = function.get("description") or ""
    return ToolSpec(name=function["name"], description=str(description), parameters=parameters)


_COMPLETION_ID = "chatcmpl-sim"  # constant: ids and times come from the driver, not the fake


def completion_json(reply: ProviderReply) -> dict[str, Any]:
    """A reply as OpenAI's non-streaming ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [c.wire() for c in reply.tool_calls]
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    return {
        "id": _COMPLETION_ID, "object": "chat.completion", "created": 0, "model": reply.model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
        "usage": _usage_json(reply.usage),
    }


def completion_chunks(reply: ProviderReply) -> list[dict[str, Any]]:
    """A reply as the ``chat.completion.chunk`` objects of a stream, in order.

    Text is cut into a few deltas and tool-call arguments into fragments, so a client
    that only handles one delta per field fails here, as it would against a real server.
    """
    deltas: list[dict[str, Any]] = [{"role": "assistant"}]
    deltas += [{"reasoning_content": piece} for piece in _pieces(reply.reasoning)]
    deltas += [{"content": piece} for piece in _pieces(reply.content)]
    for i, call in enumerate(reply.tool_calls):
        head = {"index": i, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": ""}}
        deltas.append({"tool_calls": [head]})
        deltas += [{"tool_calls": [{"index": i, "function": {"arguments": piece}}]}
                   for piece in _pieces(call.arguments) if piece]
    chunks = [_chunk(reply, [{"index": 0, "delta": d, "finish_reason": None}]) for d in deltas]
    chunks.append(_chunk(reply, [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]))
    chunks.append({**_chunk(reply, []), "usage": _usage_json(reply.usage)})
    return chunks


def _chunk(reply: ProviderReply, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": _COMPLETION_ID, "object": "chat.completion.chunk", "created": 0,
            "model": reply.model, "choices": choices}


def _pieces(value: str | None, count: int = 3) -> list[str]:
    """``value`` cut into at most ``count`` pieces; "" stays one empty piece, None none."""
    if value is None:
        return []
    size = max(1, -(-len(value) // count))
    return [value[i:i + size] for i in range(0, len(value), size)] or [""]


def _usage_json(usage: Usage) -> dict[str, int]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


# ---- the HTTP face: one transport-neutral answer, three shells -------------------------------


@dataclass(frozen=True)
class HttpAnswer:
    """What the fake endpoint says: status, headers and body chunks (one per SSE event).

    ``stall`` means "never answer", which is how a ``ProviderTimeout`` looks from a client.
    """

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    chunks: tuple[bytes, ...] = ()
    stall: bool = False

    @property
    def streamed(self) -> bool:
        return ("content-type", "text/event-stream") in self.headers


def _json_answer(status: int, payload: object, *extra: tuple[str, str]) -> HttpAnswer:
    headers = (("content-type", "application/json"), *extra)
    return HttpAnswer(status, headers, (json.dumps(payload).encode("utf-8"),))


def _error_answer(status: int, message: str, kind: str, code: str | None = None,
                  *extra: tuple[str, str]) -> HttpAnswer:
    error = {"message": message, "type": kind, "code": code}
    return _json_answer(status, {"error": error}, *extra)


def answer_http(provider: FakeProvider, method: str, path: str, body: bytes) -> HttpAnswer:
    """Serve one HTTP request: POST …/chat/completions and GET …/models.

    A ``ScriptError`` from the fake is not an HTTP answer: it propagates to the caller.
    """
    if method == "GET" and path.rstrip("/").endswith("/models"):
        return _json_answer(200, {"object": "list", "data": [
            {"id": "sim-fake", "object": "model", "created": 0, "owned_by": "sim"}]})
    if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
        return _error_answer(404, f"no route for {method} {path}", "not_found")
    try:
        request = request_from_wire(json.loads(body))
    except (ValueError, RecursionError) as exc:  # BadInput is not a ValueError
        return _error_answer(400, f"the body is not JSON: {exc}", "invalid_request_error")
    except BadInput as exc:
        return _error_answer(400, str(exc), "invalid_request_error")
    try:
        reply = provider.complete(request)
    except ProviderError as exc:
        return _answer_for_error(exc)
    if not request.stream:
        return _json_answer(200, completion_json(reply))
    events = [b"data: " + json.dumps(c).encode("utf-8") + b"\n\n" for c in completion_chunks(reply)]
    headers = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))
    return HttpAnswer(200, headers, (*events, b"data: [DONE]\n\n"))


def _answer_for_error(exc: ProviderError) -> HttpAnswer:
    """The HTTP form of a provider error, chosen so ``HttpProvider`` maps it straight back."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, RateLimited):
        wait = exc.retry_after_s
        extra = () if wait is None else (("retry-after", f"{wait:g}"),)
        return _error_answer(429, message, "rate_limit_exceeded", None, *extra)
    if isinstance(exc, ProviderTimeout):
        return HttpAnswer(0, stall=True)
    if isinstance(exc, ContextOverflow):
        return _error_answer(400, message, "invalid_request_error", "context_length_exceeded")
    if isinstance(exc, ProviderAuthError):
        status = exc.status if exc.status in (401, 403) else 401
        return _error_answer(status, message, "authentication_error", "invalid_api_key")
    if isinstance(exc, ProviderRejected):
        return _error_answer(400, message, "invalid_request_error")
    if isinstance(exc, MalformedReply):
        # A 200 whose body is no completion: the client has to notice on its own.
        return _json_answer(200, {"object": "chat.completion", "choices": []})
    status = exc.status if exc.status is not None and 500 <= exc.status <= 599 else 500
    return _error_answer(status, message, "server_error")


def handle_http(provider: FakeProvider, request: httpx.Request) -> httpx.Response:
    """The fake as an httpx handler, for ``httpx.MockTransport`` or a respx side effect.

    A stall (``ProviderTimeout``) is raised as ``httpx.ReadTimeout``, as a real client
    would experience it.
    """
    answer = answer_http(provider, request.method, request.url.path, request.content)
    if answer.stall:
        raise httpx.ReadTimeout("the fake provider did not answer", request=request)
    return httpx.Response(answer.status, headers=list(answer.headers),
                          content=b"".join(answer.chunks))


def fake_transport(provider: FakeProvider) -> httpx.MockTransport:
    """``httpx.AsyncClient(transport=fake_transport(p))`` talks to the fake in-process."""
    return httpx.MockTransport(lambda request: handle_http(provider, request))


def install_respx(router: respx.MockRouter, provider: FakeProvider, base_url: str) -> None:
    """Send every request under ``base_url`` on a respx router to the fake::

        with respx.mock() as router:
            install_respx(router, provider, "http://provider.test/v1")
            reply = await HttpProvider("http://provider.test/v1").complete(request)

    It is one route (not one per path) so respx's default ``assert_all_called`` holds
    for a test that never asks for ``/models``; unknown paths get the fake's 404.
    """

    def side_effect(request: httpx.Request) -> httpx.Response:
        return handle_http(provider, request)

    router.route(url__startswith=base_url.rstrip("/") + "/").mock(side_effect=side_effect)


# ---- a real HTTP server on 127.0.0.1 -------------------------------------------------------------


class FakeProviderServer(ThreadingHTTPServer):
    """A stdlib HTTP server in front of a fake; ``shutdown()`` stops and closes it.

    A ``ProviderTimeout`` holds the connection for ``stall_s`` without answering, so give
    the client a shorter timeout. A ``ScriptError`` is answered with a 500 and kept in
    ``harness_errors``: a test should assert that list is empty, because the client only
    sees a (retryable) server error.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], provider: FakeProvider, stall_s: float) -> None:
        super().__init__(address, _FakeProviderHandler)
        self.provider = provider
        self.stall_s = stall_s
        self.harness_errors: list[ScriptError] = []
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # A short poll interval keeps shutdown() quick; it is how often serve_forever
        # checks for the stop request.
        self._thread = threading.Thread(target=self.serve_forever, args=(0.05,),
                                        name="fake-provider", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self.stopping.set()  # releases stalled handlers at once
        super().shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join()


class _FakeProviderHandler(BaseHTTPRequestHandler):
    server: FakeProviderServer
    protocol_version = "HTTP/1.0"  # one request per connection; a stream ends with the close

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        try:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            answer = answer_http(self.server.provider, method, self.path, body)
        except ScriptError as exc:
            self.server.harness_errors.append(exc)
            answer = _error_answer(500, f"harness error: {exc}", "harness_error")
        except ValueError:
            answer = _error_answer(400, "bad content-length", "invalid_request_error")
        if answer.stall:
            self.server.stopping.wait(self.server.stall_s)
            return  # close without a response
        self.send_response(answer.status)
        for name, value in answer.headers:
            self.send_header(name, value)
        if not answer.streamed:
            self.send_header("content-length", str(sum(len(c) for c in answer.chunks)))
        self.end_headers()
        for chunk in answer.chunks:
            self.wfile.write(chunk)
            self.wfile.flush()  # each SSE event leaves now, as a real stream would

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read the fake's recorded requests, not an access log."""


def serve_fake_provider(
    provider: FakeProvider, host: str = "127.0.0.1", port: int = 0, *, stall_s: float = 5.0
) -> tuple[FakeProviderServer, str]:
    """Start a real server in a daemon thread; returns it and its base URL (``…/v1``)."""
    server = FakeProviderServer((host, port), provider, stall_s)
    server.start()
    bound_host, bound_port = server.server_address[:2]
    return server, f"http://{bound_host!s}:{bound_port}/v1"
