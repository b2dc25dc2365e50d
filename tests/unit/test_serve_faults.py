"""Every scripted fault over HTTP, met by the engine's own httpx client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hermes_ref.errors import (
    ContextOverflow,
    MalformedReply,
    ProviderAuthError,
    ProviderError,
    ProviderRejected,
    ProviderServerError,
    ProviderTimeout,
    RateLimited,
)
from hermes_ref.models import Message, Role, ToolSpec
from hermes_ref.shell.http_provider import HttpProvider
from hermes_ref.wire import ProviderRequest
from sim.serve import script as script_file
from sim.serve.server import SimServer, Simulator, start

SMILE = "\U0001f600"


def request(stream: bool, tools: bool = False) -> ProviderRequest:
    offered = (ToolSpec(name="read_file", description="read", parameters={"type": "object"}),)
    return ProviderRequest(model="m", messages=(Message(role=Role.USER, content="hi"),),
                           tools=offered if tools else (), prompt_tokens=5, stream=stream)


def serve(*steps: dict[str, Any]) -> tuple[SimServer, Simulator]:
    simulator = Simulator(script_file.parse(list(steps)))
    return start(simulator), simulator


@pytest.fixture
def served() -> Iterator[list[SimServer]]:
    servers: list[SimServer] = []
    yield servers
    for server in servers:
        server.stop()


async def call(served: list[SimServer], step: dict[str, Any], stream: bool,
               timeout_s: float = 5.0) -> Any:
    server, _ = serve(step)
    served.append(server)
    async with HttpProvider(server.url, timeout_s=timeout_s) as provider:
        return await provider.complete(request(stream))


BOTH = pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])


@BOTH
async def test_text_tool_calls_and_usage_arrive_whole(served: list[SimServer], stream: bool) -> None:
    """Text, a tool call with streamed argument fragments and scripted usage arrive intact.

    The engine's stream asks for no usage chunk (no ``stream_options``), so none is sent.
    """
    reply = await call(served, {"tool_calls": [{"name": "read_file", "arguments": {"path": "a"}}],
                                "content": "Looking.",
                                "usage": {"prompt_tokens": 11, "completion_tokens": 7}}, stream)
    assert reply.content == "Looking."
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("read_file", '{"path": "a"}')]
    assert reply.tool_calls[0].id.startswith("call_")
    usage = (reply.usage.prompt_tokens, reply.usage.completion_tokens)
    assert usage == ((0, 0) if stream else (11, 7))


@BOTH
async def test_null_content_and_empty_call_list_are_empty_replies(
        served: list[SimServer], stream: bool) -> None:
    """content null with no calls, and a literal empty tool_calls list, reach the client as such."""
    nothing = await call(served, {"content": None}, stream)
    assert (nothing.content, nothing.tool_calls, nothing.finish_reason) == (None, (), "stop")
    empty = await call(served, {"tool_calls": []}, stream)
    assert (empty.tool_calls, empty.finish_reason) == ((), "tool_calls")


@BOTH
async def test_text_faults_are_cleaned_by_the_client(served: list[SimServer], stream: bool) -> None:
    """A lone surrogate arrives as U+FFFD and a split pair as its one character."""
    lone = await call(served, {"text": "Nice ", "fault": "lone_surrogate"}, stream)
    pair = await call(served, {"text": "Great ", "fault": "split_pair"}, stream)
    assert (lone.content, pair.content) == ("Nice \ufffd", f"Great {SMILE}")


@pytest.mark.parametrize(
    ("step", "error", "says"),
    [
        ({"error": "rate_limited", "retry_after_s": 2}, RateLimited, "Rate limit"),
        ({"error": "server_error", "retry_after_s": 3}, ProviderServerError, "HTTP 500"),
        ({"error": "overloaded"}, ProviderServerError, "HTTP 529"),
        ({"error": "context_overflow"}, ContextOverflow, "maximum context length"),
        ({"error": "auth"}, ProviderAuthError, "HTTP 401"),
        ({"error": "forbidden"}, ProviderAuthError, "HTTP 403"),
        ({"error": "not_found"}, ProviderRejected, "HTTP 404"),
        ({"error": "too_large"}, ProviderRejected, "HTTP 413"),
        ({"error": "unprocessable", "code": "bad_thing", "param": "messages"}, ProviderRejected,
         "HTTP 422"),
        ({"error": "http", "status": 418, "body": "teapot"}, ProviderRejected, "teapot"),
        ({"error": "malformed"}, MalformedReply, "choices"),
    ],
)
@BOTH
async def test_error_steps_map_to_their_typed_errors(
        served: list[SimServer], stream: bool, step: dict[str, Any],
        error: type[ProviderError], says: str) -> None:
    """Each scripted status, header and body reaches the client as the error it means."""
    with pytest.raises(error) as caught:
        await call(served, step, stream)
    assert says in str(caught.value)
    if isinstance(caught.value, RateLimited):
        assert caught.value.retry_after_s == 2


@BOTH
async def test_a_cut_is_a_transient_server_error(served: list[SimServer], stream: bool) -> None:
    """A reply cut part-way (stream or whole body) is a transient error, never a short answer."""
    with pytest.raises(ProviderServerError) as caught:
        await call(served, {"text": "a long answer", "cut_after": 2}, stream)
    assert caught.value.transient


@BOTH
async def test_a_stall_is_a_timeout(served: list[SimServer], stream: bool) -> None:
    """A request that is never answered, or a stream that stalls, times out at the client."""
    with pytest.raises(ProviderTimeout):
        await call(served, {"error": "timeout", "stall_s": 2}, stream, timeout_s=0.2)
    if stream:
        with pytest.raises(ProviderTimeout):
            await call(served, {"text": "slow", "stall_after": 2, "stall_s": 2}, True, timeout_s=0.2)


async def test_slow_streams_and_delays_still_arrive(served: list[SimServer]) -> None:
    """A delay before answering and a slowdown between events change timing, not content."""
    reply = await call(served, {"text": "slowly", "delay_s": 0.05, "chunk_delay_s": 0.01}, True)
    assert reply.content == "slowly"


async def test_a_json_body_answers_a_stream_request(served: list[SimServer]) -> None:
    """A server that ignores stream: true and sends one JSON body is still understood."""
    assert (await call(served, {"text": "whole", "json_body": True}, True)).content == "whole"


async def test_an_error_inside_a_stream_is_a_server_error(served: list[SimServer]) -> None:
    """An error event after a few chunks ends the stream as a transient server error."""
    with pytest.raises(ProviderServerError):
        await call(served, {"text": "half an answer", "error_after": 2}, True)


async def test_routes_keep_side_calls_off_the_main_script(served: list[SimServer]) -> None:
    """A request without tools matched by a route never consumes the main loop's steps."""
    simulator = Simulator(script_file.parse({
        "steps": [{"text": "main answer"}],
        "routes": [{"name": "titles", "match": {"tools": False},
                    "steps": [{"text": "A title", "repeat": "always"}]}]}))
    server = start(simulator)
    served.append(server)
    async with HttpProvider(server.url, timeout_s=5) as provider:
        titles = [await provider.complete(request(False)) for _ in range(3)]
        main = await provider.complete(request(True, tools=True))
    assert [t.content for t in titles] == ["A title"] * 3
    assert main.content == "main answer"
    assert simulator.cursor.report().exact
