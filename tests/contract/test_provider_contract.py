"""One provider contract, three ways of reaching the same fake.

``complete`` is an async callable parametrized over:

* ``direct``: the fake's synchronous ``complete``, as the simulator driver calls it;
* ``mock_transport``: ``HttpProvider`` → ``httpx.MockTransport`` → the fake's HTTP face;
* ``respx``: ``HttpProvider`` → a respx router → the same HTTP face;

and ``stream`` runs each path as a plain and as a streamed request. The test bodies are
identical for all six, which is the point: whatever the engine sees from the fake in the
simulator, it sees from the real HTTP client against the fake on the wire.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
import respx

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
from hermes_ref.models import Message, ProviderReply, Role, ToolCall, ToolSpec
from hermes_ref.reply_intake import admit_reply
from hermes_ref.shell.http_provider import HttpProvider
from hermes_ref.tokens import count_text, count_wire_messages
from hermes_ref.wire import ProviderRequest
from sim.provider import (
    ScriptedProvider,
    calls_sharing_id,
    lone_surrogate_text,
    split_pair_text,
    text,
    tool_calls,
)
from sim.provider_http import fake_transport, install_respx

BASE_URL = "http://provider.test/v1"
Complete = Callable[[ProviderRequest], Awaitable[ProviderReply]]


@pytest.fixture
def script() -> ScriptedProvider:
    """An empty script; each test adds the steps it needs."""
    return ScriptedProvider()


@pytest.fixture(params=[False, True], ids=["whole", "stream"])
def stream(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture(params=["direct", "mock_transport", "respx"])
async def complete(
    request: pytest.FixtureRequest, script: ScriptedProvider
) -> AsyncIterator[Complete]:
    """An async ``complete(request)`` that reaches ``script`` by the parametrized path."""
    if request.param == "direct":

        async def direct(req: ProviderRequest) -> ProviderReply:
            return script.complete(req)

        yield direct
    elif request.param == "mock_transport":
        async with httpx.AsyncClient(transport=fake_transport(script)) as client:
            yield HttpProvider(BASE_URL, client=client).complete
    else:
        with respx.mock() as router:
            install_respx(router, script, BASE_URL)
            async with HttpProvider(BASE_URL) as provider:
                yield provider.complete
    script.assert_consumed()


def make_request(stream: bool, *, tools: tuple[ToolSpec, ...] = ()) -> ProviderRequest:
    messages = (
        Message(role=Role.SYSTEM, content="You are terse."),
        Message(role=Role.USER, content="Read notes.txt, please."),
    )
    return ProviderRequest(
        model="sim-model",
        messages=messages,
        tools=tools,
        prompt_tokens=count_wire_messages([m.wire for m in messages]),
        stream=stream,
    )


READ_FILE = ToolSpec(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}},
                "required": ["path"]},
)


async def test_text_reply(complete: Complete, script: ScriptedProvider, stream: bool) -> None:
    """A text answer arrives with its content, finish reason and no tool calls."""
    script.add(text("Hello — it says: ünïcödé & \"quotes\"\nsecond line"))
    reply = await complete(make_request(stream))
    assert reply.content == "Hello — it says: ünïcödé & \"quotes\"\nsecond line"
    assert reply.finish_reason == "stop"
    assert reply.tool_calls == ()
    assert reply.model == "sim-model"


async def test_empty_text_stays_empty_string(
    complete: Complete, script: ScriptedProvider, stream: bool
) -> None:
    """An empty answer is "" (not None), so the empty-response ladder sees what was sent."""
    script.add(text(""))
    assert (await complete(make_request(stream))).content == ""


async def test_length_finish_reason(
    complete: Complete, script: ScriptedProvider, stream: bool
) -> None:
    """finish_reason "length" survives the trip."""
    script.add(text("cut off mid", finish_reason="length"))
    assert (await complete(make_request(stream))).finish_reason == "length"


async def test_reasoning_is_kept_apart_from_content(
    complete: Complete, script: ScriptedProvider, stream: bool
) -> None:
    """Reasoning text comes back in ``reasoning``, never mixed into ``content``."""
    script.add(ProviderReply(content="42", reasoning="think step by step"))
    reply = await complete(make_request(stream))
    assert (reply.content, reply.reasoning) == ("42", "think step by step")


async def test_tool_call_reply(complete: Complete, script: ScriptedProvider, stream: bool) -> None:
    """Tool calls keep their ids, names and order, and their arguments byte for byte."""
    odd_args = '{ "path" : "dïr/nötes.txt",\n  "n": 1.50, "esc": "\\u00e9\\"" }'
    script.add(tool_calls(
        ("read_file", {"path": "notes.txt"}),
        ToolCall(id="call_custom-9", name="read_file", arguments=odd_args),
        ("read_file", "{not json"),
        ("read_file", ""),
    ))
    reply = await complete(make_request(stream, tools=(READ_FILE,)))
    assert reply.finish_reason == "tool_calls"
    assert reply.content is None
    assert [c.id for c in reply.tool_calls] == ["call_1", "call_custom-9", "call_2", "call_3"]
    assert [c.name for c in reply.tool_calls] == ["read_file"] * 4
    assert [c.arguments for c in reply.tool_calls] == [
        '{"path": "notes.txt"}', odd_args, "{not json", ""
    ]


async def test_text_beside_tool_calls(
    complete: Complete, script: ScriptedProvider, stream: bool
) -> None:
    """Content sent alongside tool calls is kept."""
    script.add(tool_calls(("read_file", {"path": "a"}), content="Let me look."))
    reply = await complete(make_request(stream, tools=(READ_FILE,)))
    assert reply.content == "Let me look."
    assert [c.name for c in reply.tool_calls] == ["read_file"]


async def test_usage_counts(complete: Complete, script: ScriptedProvider, stream: bool) -> None:
    """Usage reports the request's prompt tokens and the reply's completion tokens."""
    script.add(text("four score and seven years"))
    request = make_request(stream)
    reply = await complete(request)
    assert reply.usage.prompt_tokens == request.prompt_tokens
    assert reply.usage.completion_tokens == count_text("four score and seven years")


async def test_fake_sees_the_request_that_was_sent(
    complete: Complete, script: ScriptedProvider, stream: bool
) -> None:
    """The fake records the request as sent: same wire form, same prompt token count."""
    script.add(text("ok"))
    request = make_request(stream, tools=(READ_FILE,))
    await complete(request)
    (seen,) = script.requests
    assert seen.wire() == request.wire()
    assert seen.prompt_tokens == request.prompt_tokens


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RateLimited("slow down", retry_after_s=2.0), RateLimited),
        (ProviderServerError("overloaded", status=503), ProviderServerError),
        (ProviderTimeout("too slow"), ProviderTimeout),
        (ContextOverflow("maximum context length is 8192 tokens"), ContextOverflow),
        (ProviderAuthError("bad key", status=401), ProviderAuthError),
        (ProviderRejected("unknown parameter", status=400), ProviderRejected),
        (MalformedReply("nonsense"), MalformedReply),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, ProviderError) else "",
)
async def test_errors_arrive_typed(
    complete: Complete,
    script: ScriptedProvider,
    stream: bool,
    error: ProviderError,
    expected: type[ProviderError],
) -> None:
    """Every provider failure reaches the caller as the same typed error."""
    script.add(error)
    with pytest.raises(expected) as caught:
        await complete(make_request(stream))
    assert caught.type is expected
    assert caught.value.transient == error.transient


async def test_rate_limit_keeps_retry_after(
    complete: Complete, script: ScriptedProvider, stream: bool
) -> None:
    """A 429 keeps the provider's Retry-After, including fractions of a second."""
    script.add(RateLimited("slow down", retry_after_s=2.0), RateLimited("x", retry_after_s=0.5))
    for wanted in (2.0, 0.5):
        with pytest.raises(RateLimited) as caught:
            await complete(make_request(stream))
        assert caught.value.retry_after_s == wanted


async def test_rate_limit_without_retry_after(
    complete: Complete, script: ScriptedProvider, stream: bool
) -> None:
    """A 429 without Retry-After has retry_after_s None."""
    script.add(RateLimited("slow down"))
    with pytest.raises(RateLimited) as caught:
        await complete(make_request(stream))
    assert caught.value.retry_after_s is None


async def test_server_error_keeps_status(
    complete: Complete, script: ScriptedProvider, stream: bool
) -> None:
    """A 5xx keeps its status code."""
    script.add(ProviderServerError("bad gateway", status=502))
    with pytest.raises(ProviderServerError) as caught:
        await complete(make_request(stream))
    assert caught.value.status == 502


async def test_calls_after_an_error_still_work(
    complete: Complete, script: ScriptedProvider, stream: bool
) -> None:
    """An error does not poison the provider: the next call gets the next reply."""
    script.add(ProviderServerError("down", status=500), text("back up"))
    with pytest.raises(ProviderServerError):
        await complete(make_request(stream))
    assert (await complete(make_request(stream))).content == "back up"


async def test_provider_faults_are_taken_in_alike(
    complete: Complete, script: ScriptedProvider, stream: bool
) -> None:
    """A lone surrogate, a split pair and calls sharing an id become the same reply on every
    path once the engine takes them in (the HTTP paths clean text already on arrival)."""
    script.add(lone_surrogate_text("Nice ", "!"), split_pair_text("Great ", "!"),
               calls_sharing_id("call_0", ("read_file", {"path": "a.txt"}),
                                ("read_file", {"path": "b.txt"})))
    lone, pair, calls = [admit_reply(await complete(make_request(stream))) for _ in range(3)]
    assert (lone.content, pair.content) == ("Nice \ufffd!", "Great \U0001f600!")
    assert [(c.id, c.arguments) for c in calls.tool_calls] == [
        ("call_0", '{"path": "a.txt"}'), ("call_0_d2", '{"path": "b.txt"}')]
