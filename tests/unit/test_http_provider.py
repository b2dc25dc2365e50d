"""HttpProvider at its edges: bodies it must refuse, headers it must read, real sockets."""

from __future__ import annotations

import json
from collections.abc import Callable
from email.utils import parsedate_to_datetime

import httpx
import pytest

from hermes_ref.errors import (
    ContextOverflow,
    MalformedReply,
    ProviderAuthError,
    ProviderRejected,
    ProviderServerError,
    ProviderTimeout,
    RateLimited,
    StreamCut,
)
from hermes_ref.models import Message, Role
from hermes_ref.shell.chat_wire import parse_retry_after
from hermes_ref.shell.http_provider import HttpProvider, encode_body
from hermes_ref.wire import ProviderRequest
from sim.provider import ScriptedProvider, text, tool_calls
from sim.provider_http import serve_fake_provider

BASE_URL = "http://provider.test/v1"
Handler = Callable[[httpx.Request], httpx.Response]


def make_request(stream: bool = False) -> ProviderRequest:
    return ProviderRequest(
        model="m", messages=(Message(role=Role.USER, content="hi"),), tools=(),
        prompt_tokens=6, stream=stream,
    )


def provider_for(handler: Handler, clock: Callable[[], float] = lambda: 0.0) -> HttpProvider:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return HttpProvider(BASE_URL, client=client, clock=clock)


def answer(status: int, body: object, **headers: str) -> Handler:
    """A handler that always answers ``body`` (bytes/str verbatim, anything else as JSON)."""
    if isinstance(body, bytes | str):
        content = body if isinstance(body, bytes) else body.encode()
    else:
        content = json.dumps(body).encode()
        headers.setdefault("content-type", "application/json")
    return lambda request: httpx.Response(status, content=content, headers=headers)


def sse(*lines: str) -> Handler:
    body = "".join(line + "\n" for line in lines).encode()
    return answer(200, body, **{"content-type": "text/event-stream"})


def completion(message: dict[str, object]) -> dict[str, object]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


# ---- malformed 2xx bodies ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"<html>oops</html>", "body is not JSON"),
        (b"", "body is empty"),
        ([1, 2], "body is not an object"),
        ({"object": "chat.completion"}, "choices is missing or empty"),
        ({"choices": []}, "choices is missing or empty"),
        ({"choices": [{"finish_reason": "stop"}]}, "choices[0].message is missing"),
        (completion({"content": 7}), "choices[0].message.content is not a string"),
        (completion({"tool_calls": {"id": "x"}}), "choices[0].message.tool_calls is not an array"),
        (
            completion({"tool_calls": [CALL, {"id": "call_2", "function": {"arguments": "{}"}}]}),
            "choices[0].message.tool_calls[1].function.name is missing",
        ),
        (
            completion({"tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}),
            "choices[0].message.tool_calls[0].id is missing",
        ),
        (
            completion({"tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}]}),
            "choices[0].message.tool_calls[0].function.arguments is not a string",
        ),
        (
            completion({"tool_calls": [{**CALL, "function": {"name": "f"}}]}),
            "choices[0].message.tool_calls[0].function.arguments is missing",
        ),
        ({**completion({"content": "x"}), "usage": {"prompt_tokens": "9"}},
         "usage.prompt_tokens is not a non-negative integer"),
    ],
)
async def test_malformed_body_names_the_field(body: object, names: str) -> None:
    """A 2xx body that is not a usable completion is a MalformedReply naming the bad field."""
    with pytest.raises(MalformedReply) as caught:
        await provider_for(answer(200, body)).complete(make_request())
    assert names in str(caught.value)


@pytest.mark.parametrize(
    ("lines", "names"),
    [
        (["this is not sse", "", "data: [DONE]"], "stream line 1 is not a server-sent-event field"),
        (["data: {not json", "", "data: [DONE]"], "stream event 1 is not JSON"),
        (["", ""], "without 'data: [DONE]'"),
        (['data: {"choices": {"delta": {}}}', "", "data: [DONE]"],
         "stream event 1: choices is not an array"),
        (['data: {"choices": [{"delta": {"tool_calls": [{"id": "c"}]}}]}', "", "data: [DONE]"],
         "stream event 1: choices[0].delta.tool_calls[0].index is not a non-negative integer"),
        (
            ['data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c",'
             ' "function": {"arguments": "{}"}}]}}]}', "", "data: [DONE]"],
            "choices[0].delta.tool_calls[index=0].function.name is missing",
        ),
        (
            ['data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c",'
             ' "function": {"name": "f", "arguments": 5}}]}}]}', "", "data: [DONE]"],
            "choices[0].delta.tool_calls[0].function.arguments is not a string",
        ),
    ],
)
async def test_malformed_stream_names_the_problem(lines: list[str], names: str) -> None:
    """A broken SSE stream is a MalformedReply that says which line, event or field."""
    with pytest.raises(MalformedReply) as caught:
        await provider_for(sse(*lines)).complete(make_request(stream=True))
    assert names in str(caught.value)


async def test_stream_tolerates_comments_and_split_data_lines() -> None:
    """SSE comments are skipped and a data payload split over lines is joined."""
    handler = sse(
        ": keep-alive", "event: chunk",
        'data: {"choices": [{"delta": {"content": "he"}}]}', "",
        'data: {"choices": [{"delta":', 'data:  {"content": "llo"}, "finish_reason": "stop"}]}', "",
        "data: [DONE]", "",
        "data: this is after DONE and ignored",
    )
    reply = await provider_for(handler).complete(make_request(stream=True))
    assert (reply.content, reply.finish_reason) == ("hello", "stop")


async def test_error_event_mid_stream_is_transient() -> None:
    """An error event inside a 200 stream is a transient server error."""
    handler = sse('data: {"error": {"message": "upstream died", "type": "server_error"}}', "")
    with pytest.raises(ProviderServerError, match="upstream died") as caught:
        await provider_for(handler).complete(make_request(stream=True))
    assert caught.value.status is None


async def test_json_answer_to_a_stream_request_is_accepted() -> None:
    """A server that ignores "stream": true and sends one JSON completion still works."""
    handler = answer(200, completion({"content": "whole"}))
    assert (await provider_for(handler).complete(make_request(stream=True))).content == "whole"


async def test_missing_finish_reason_is_inferred() -> None:
    """A missing finish_reason becomes "tool_calls" when the reply calls tools."""
    body = {"choices": [{"message": {"content": None, "tool_calls": [CALL]}}]}
    reply = await provider_for(answer(200, body)).complete(make_request())
    assert reply.finish_reason == "tool_calls"


# ---- status codes and headers ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, {"error": {"message": "This model's maximum context length is 8192 tokens"}},
         ContextOverflow),
        (400, {"error": {"code": "context_length_exceeded", "message": "too long"}},
         ContextOverflow),
        (400, {"error": {"message": "temperature must be <= 2"}}, ProviderRejected),
        (401, {"error": "invalid key"}, ProviderAuthError),
        (403, b"forbidden", ProviderAuthError),
        (404, b"<html>not found</html>", ProviderRejected),
        (502, b"<html>bad gateway</html>", ProviderServerError),
        (302, b"", ProviderRejected),
    ],
)
async def test_status_mapping(status: int, body: object, expected: type[Exception]) -> None:
    """Each non-2xx status maps to its typed error and keeps the status code."""
    with pytest.raises(expected) as caught:
        await provider_for(answer(status, body)).complete(make_request())
    assert caught.type is expected
    assert getattr(caught.value, "status", None) == status


async def test_retry_after_http_date() -> None:
    """Retry-After as an HTTP-date is turned into seconds from the provider's clock."""
    when = "Wed, 21 Oct 2015 07:28:00 GMT"
    now = parsedate_to_datetime(when).timestamp() - 30
    handler = answer(429, {"error": {"message": "slow"}}, **{"retry-after": when})
    with pytest.raises(RateLimited) as caught:
        await provider_for(handler, clock=lambda: now).complete(make_request())
    assert caught.value.retry_after_s == 30.0


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("7", 7.0), (" 1.5 ", 1.5), ("soon", None), ("-3", None), ("nan", None), (None, None),
     ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0), ("Wed, 21 Oct 2015 07:28:10 -0000", 10.0)],
)
def test_parse_retry_after(header: str | None, seconds: float | None) -> None:
    """Retry-After parses delta-seconds and HTTP-dates; junk and negatives give None."""
    now = parsedate_to_datetime("Wed, 21 Oct 2015 07:28:00 GMT").timestamp()
    assert parse_retry_after(header, now=now) == seconds


async def test_connect_error_is_transient_server_error() -> None:
    """A refused connection is a transient ProviderServerError with no status."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ProviderServerError) as caught:
        await provider_for(refuse).complete(make_request())
    assert caught.value.status is None and caught.value.transient
    assert isinstance(caught.value.__cause__, httpx.ConnectError)


async def test_timeout_keeps_its_cause() -> None:
    """An httpx timeout becomes ProviderTimeout with the httpx exception as its cause."""

    def stall(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("no answer", request=request)

    with pytest.raises(ProviderTimeout) as caught:
        await provider_for(stall).complete(make_request(stream=True))
    assert isinstance(caught.value.__cause__, httpx.ConnectTimeout)


async def test_request_shape_and_auth_header() -> None:
    """The body is exactly ``ProviderRequest.body()``, posted to …/chat/completions with a key."""
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=completion({"content": "ok"}))

    client = httpx.AsyncClient(transport=httpx.MockTransport(record))
    provider = HttpProvider(BASE_URL + "/", api_key="sk-test", client=client)
    await provider.complete(make_request())
    (request,) = seen
    assert str(request.url) == BASE_URL + "/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.content == make_request().body() == encode_body(make_request())
    assert json.loads(request.content) == make_request().wire()


async def test_unencodable_request_is_rejected_before_sending() -> None:
    """A request whose body cannot be JSON (NaN) is rejected without touching the network."""
    request = ProviderRequest(
        model="m", messages=(Message(role=Role.USER, content="hi"),), tools=(),
        prompt_tokens=1, max_tokens=float("nan"),  # type: ignore[arg-type]
    )
    with pytest.raises(ProviderRejected, match="cannot be encoded"):
        await provider_for(answer(200, completion({"content": "x"}))).complete(request)


# ---- a real server over 127.0.0.1 ------------------------------------------------------------


async def test_real_server_answers_real_client() -> None:
    """serve_fake_provider answers HttpProvider over a socket, whole and streamed."""
    script = ScriptedProvider([
        text("over a real socket"),
        tool_calls(("read_file", {"path": "notes.txt"}), ("read_file", {"path": "b.txt"})),
    ])
    server, url = serve_fake_provider(script)
    try:
        assert url.startswith("http://127.0.0.1:")
        async with HttpProvider(url, timeout_s=5) as provider:
            whole = await provider.complete(make_request())
            streamed = await provider.complete(make_request(stream=True))
        async with httpx.AsyncClient() as client:
            models = (await client.get(url + "/models")).json()
    finally:
        server.shutdown()
    assert whole.content == "over a real socket"
    assert [(c.id, c.arguments) for c in streamed.tool_calls] == [
        ("call_1", '{"path": "notes.txt"}'), ("call_2", '{"path": "b.txt"}')]
    assert models["data"][0]["id"] == "sim-fake"
    assert server.harness_errors == []
    script.assert_consumed()


async def test_real_server_stall_is_a_client_timeout() -> None:
    """A scripted timeout makes the real server stall until the client times out."""
    server, url = serve_fake_provider(ScriptedProvider([ProviderTimeout("stall")]), stall_s=5)
    try:
        async with HttpProvider(url, timeout_s=0.2) as provider:
            with pytest.raises(ProviderTimeout):
                await provider.complete(make_request())
    finally:
        server.shutdown()


async def test_real_server_reports_harness_errors() -> None:
    """An unexpected call to the real server is recorded, not silently retried away."""
    server, url = serve_fake_provider(ScriptedProvider())
    try:
        async with HttpProvider(url, timeout_s=5) as provider:
            with pytest.raises(ProviderServerError):
                await provider.complete(make_request())
    finally:
        server.shutdown()
    assert "unexpected call #1" in str(server.harness_errors[0])


async def test_closed_server_is_a_connect_error() -> None:
    """After shutdown the port refuses connections: a transient server error."""
    server, url = serve_fake_provider(ScriptedProvider())
    server.shutdown()
    async with HttpProvider(url, timeout_s=5) as provider:
        with pytest.raises(ProviderServerError) as caught:
            await provider.complete(make_request())
    assert caught.value.status is None



async def test_a_stream_that_closes_mid_answer_is_a_cut_with_its_deltas() -> None:
    """Closed cleanly, but before its finish chunk and [DONE]: a cut (retried), not malformed."""
    lines = ['data: {"choices": [{"delta": {"content": "hi"}}]}', ""]
    with pytest.raises(StreamCut) as caught:
        await provider_for(sse(*lines)).complete(make_request(stream=True))
    assert [d.text for d in caught.value.deltas] == ["hi"]
