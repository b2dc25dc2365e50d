"""The HTTP face of the fake providers: an OpenAI-compatible endpoint in front of a fake.

Theory of operation
-------------------
Real HTTP clients (``HttpProvider``, and through it the asyncio driver) reach a fake from
``sim.provider`` through this module: the fake stays the only model and HTTP is only its
wire. Two conversions:

* **wire → request**: ``request_from_wire`` rebuilds the ``ProviderRequest`` a
  chat-completions body encodes, refusing anything the engine would never send
  (``BadInput``), including message keys outside the wire set (WIRE-3);
* **reply → wire**: ``completion_json`` is the non-streaming ``chat.completion`` object,
  ``completion_chunks`` the ``chat.completion.chunk`` objects of a stream, with text and
  tool-call arguments cut into several deltas as a real server would. Provider faults go
  out as such a server sends them: a lone surrogate as its raw ``\\ud83d`` escape, the
  halves of a split pair in two deltas, calls sharing an id each under its own index.

``answer_http`` is the one transport-neutral answer: it parses the request body and
answers with a ``chat.completion`` JSON document, or SSE chunks when the body says
``"stream": true``; provider errors become the status codes ``HttpProvider`` maps back.
Three shells reuse it:

* ``fake_transport(provider)``: an ``httpx.MockTransport`` for an ``httpx.AsyncClient``;
* ``install_respx(router, provider, base_url)``: the same handler behind respx routes;
* ``serve_fake_provider(provider)``: a real ``ThreadingHTTPServer`` on 127.0.0.1.

``hermes-ref sim serve`` (and its alias ``fake-provider serve``) is the served simulator of
``sim.serve``, which plays script files with every wire fault; this module stays the HTTP
face of the in-process fakes, strict on purpose (it refuses non-wire keys, WIRE-3).

A ``ScriptError`` from the fake is never an HTTP answer: the in-process shells let it
propagate, and the real server answers 500 and keeps it in ``harness_errors``.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import httpx

from hermes_ref.compaction import COMPRESSION_PURPOSE, SUMMARIZER_PROMPT  # CMP-2
from hermes_ref.errors import (
    BadInput,
    ContextOverflow,
    MalformedReply,
    ProviderAuthError,
    ProviderError,
    ProviderRejected,
    ProviderTimeout,
    RateLimited,
)
from hermes_ref.models import WIRE_MESSAGE_KEYS, Message, ProviderReply, Role, ToolCall, ToolSpec, Usage
from hermes_ref.ports import Provider
from hermes_ref.tokens import count_wire_messages
from hermes_ref.wire import ProviderRequest
from sim.provider import ScriptError

if TYPE_CHECKING:
    import respx


# ---- wire body → request, reply → wire body ------------------------------------------------


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
        purpose=_purpose(messages),
    )


def _purpose(messages: tuple[Message, ...]) -> str:
    """CMP-2: the wire carries no purpose; compaction's summary request is known by its own
    system prompt, so a served fake hands it to its summarizer as the in-process one does."""
    first = messages[0]
    return COMPRESSION_PURPOSE if first.role is Role.SYSTEM \
        and first.content == SUMMARIZER_PROMPT else "turn"


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
    """``value`` cut into a few pieces; "" stays one empty piece, None none.

    It is cut into at most ``count`` even pieces, and also between the two halves of every
    surrogate pair written as two code points (``sim.provider.split_pair_text``), so the
    halves travel in two deltas, each one a lone ``\\udXXX`` escape on the wire, as a
    server that streams UTF-16 code units sends them. Real text has no such halves.
    """
    if value is None:
        return []
    size = max(1, -(-len(value) // count))
    even = [value[i:i + size] for i in range(0, len(value), size)] or [""]
    return [part for piece in even for part in _BETWEEN_HALVES.split(piece)]


# The empty match between a high and a low surrogate code point: where a pair is cut.
_BETWEEN_HALVES = re.compile(r"(?<=[\ud800-\udbff])(?=[\udc00-\udfff])")


def _usage_json(usage: Usage) -> dict[str, Any]:
    """Usage as the API reports it; the prefix the fake had cached is in the details."""
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


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


def answer_http(provider: Provider, method: str, path: str, body: bytes) -> HttpAnswer:
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


def handle_http(provider: Provider, request: httpx.Request) -> httpx.Response:
    """The fake as an httpx handler, for ``httpx.MockTransport`` or a respx side effect.

    A stall (``ProviderTimeout``) is raised as ``httpx.ReadTimeout``, as a real client
    would experience it.
    """
    answer = answer_http(provider, request.method, request.url.path, request.content)
    if answer.stall:
        raise httpx.ReadTimeout("the fake provider did not answer", request=request)
    return httpx.Response(answer.status, headers=list(answer.headers),
                          content=b"".join(answer.chunks))


def fake_transport(provider: Provider) -> httpx.MockTransport:
    """``httpx.AsyncClient(transport=fake_transport(p))`` talks to the fake in-process."""
    return httpx.MockTransport(lambda request: handle_http(provider, request))


def install_respx(router: respx.MockRouter, provider: Provider, base_url: str) -> None:
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
    request_queue_size = 1024  # the stdlib's 5 turns a burst of connections into a 1 s tail

    def __init__(self, address: tuple[str, int], provider: Provider, stall_s: float) -> None:
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
    provider: Provider, host: str = "127.0.0.1", port: int = 0, *, stall_s: float = 5.0
) -> tuple[FakeProviderServer, str]:
    """Start a real server in a daemon thread; returns it and its base URL (``…/v1``)."""
    server = FakeProviderServer((host, port), provider, stall_s)
    server.start()
    bound_host, bound_port = server.server_address[:2]
    return server, f"http://{bound_host!s}:{bound_port}/v1"
