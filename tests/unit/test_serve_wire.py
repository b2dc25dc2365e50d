"""The served simulator's wire: what it accepts, what it refuses, and how it answers."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hermes_ref.models import Message, Role
from hermes_ref.shell.http_provider import HttpProvider
from hermes_ref.wire import ProviderRequest
from sim.serve import script as script_file
from sim.serve.server import SimServer, Simulator, start

USER = {"role": "user", "content": "hi"}


@pytest.fixture
def server() -> Iterator[SimServer]:
    simulator = Simulator(script_file.parse(
        {"seed": 3, "steps": [{"text": "answer", "repeat": "always"}]}))
    served = start(simulator, body_timeout_s=0.3)
    yield served
    served.stop()


def post(server: SimServer, body: object) -> httpx.Response:
    return httpx.post(f"{server.url}/chat/completions", json=body, timeout=5)


@pytest.mark.parametrize("messages", [
    [{"role": "developer", "content": "be brief"}, USER],
    [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                  {"type": "image_url", "image_url": {"url": "data:,"}}]}],
    [USER, {"role": "assistant", "content": "x", "reasoning_content": "thought", "refusal": None,
            "annotations": [], "audio": None, "function_call": None}, USER],
], ids=["developer-role", "content-parts", "assistant-extras"])
def test_every_shape_the_api_accepts_is_accepted(server: SimServer, messages: list[Any]) -> None:
    """developer role, content parts, and assistant messages with extra keys get a 200."""
    reply = post(server, {"model": "m", "messages": messages, "temperature": 0.2,
                          "unheard_of": True})
    assert reply.status_code == 200, reply.text
    assert server.simulator.settle()
    record = server.simulator.journal.records[-1]
    assert "unheard_of" in record["unknown"]


@pytest.mark.parametrize(("body", "param", "says"), [
    ({"messages": [USER]}, None, "you must provide a model parameter"),
    ({"model": "m"}, "messages", "Missing required parameter: 'messages'."),
    ({"model": "m", "messages": []}, "messages", "empty array"),
    ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role",
     "Invalid value: \"robot\""),
    ({"model": "m", "messages": [USER], "n": 0}, "n", "below minimum"),
    ({"model": "m", "messages": [USER, {"role": "tool", "tool_call_id": "c", "content": "r"}]},
     "messages[1].role", "must be a response to a preceding message"),
    ({"model": "m", "messages": [USER, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, USER]},
     "messages.[1].role", "did not have response messages: c1"),
], ids=["no-model", "no-messages", "empty", "bad-role", "n", "orphan-tool", "unanswered-call"])
def test_refusals_have_the_api_shape(server: SimServer, body: object, param: str | None,
                                     says: str) -> None:
    """Only what the API refuses is refused: 400 with message, type, param and code."""
    reply = post(server, body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert says in error["message"]


def test_usage_chunk_only_when_asked(server: SimServer) -> None:
    """A stream carries the usage chunk only with stream_options.include_usage."""
    def events(extra: dict[str, Any]) -> list[Any]:
        body = {"model": "m", "messages": [USER], "stream": True, **extra}
        lines = post(server, body).text.split("\n\n")
        return [json.loads(e[6:]) for e in lines if e.startswith("data: {")]

    assert not any("usage" in e for e in events({}))
    asked = events({"stream_options": {"include_usage": True}})
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["total_tokens"] > 0


def test_ids_and_created_are_deterministic_and_n_gives_choices(server: SimServer) -> None:
    """Ids differ per request but repeat per seed; created counts up; n gives n choices."""
    first = post(server, {"model": "m", "messages": [USER], "n": 3}).json()
    second = post(server, {"model": "m", "messages": [USER]}).json()
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    assert first["id"] != second["id"] and second["created"] == first["created"] + 1
    again = Simulator(script_file.parse({"seed": 3, "steps": [{"text": "x", "repeat": 2}]}))
    replay = start(again)
    try:
        assert post(replay, {"model": "m", "messages": [USER]}).json()["id"] == first["id"]
    finally:
        replay.stop()


def test_only_the_model_paths_answer(server: SimServer) -> None:
    """GET /v1/models and /v1/models/{id} answer; any other path ending in /models is a 404."""
    base = server.url.removesuffix("/v1")
    assert httpx.get(f"{base}/v1/models").json()["data"][0]["id"] == "sim-fake"
    assert httpx.get(f"{base}/v1/models/sim-fake").json()["id"] == "sim-fake"
    assert httpx.get(f"{base}/v1/models/other").status_code == 404
    assert httpx.get(f"{base}/api/v1/models").status_code == 404


def test_a_custom_tool_call_passed_back_is_accepted(server: SimServer) -> None:
    """An assistant message carrying a custom tool's call (name and input, no function) is
    a valid request, as the API takes it; one without a name is refused."""
    call = {"id": "c1", "type": "custom", "custom": {"name": "grep", "input": "TODO"}}
    messages = [USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "3 matches"}]
    assert post(server, {"model": "m", "messages": messages}).status_code == 200
    nameless = {**call, "custom": {"input": "TODO"}}
    messages[1] = {"role": "assistant", "content": None, "tool_calls": [nameless]}
    assert post(server, {"model": "m", "messages": messages}).status_code == 400


def test_a_model_id_with_a_slash_is_found_and_options_gets_json() -> None:
    """/v1/models/org/m-1 and its percent-encoded form find the model; OPTIONS gets the
    API's JSON 404, not an HTML page."""
    served = start(Simulator(script_file.parse(
        {"model": "org/m-1", "steps": [{"text": "answer", "repeat": "always"}]})))
    try:
        base = served.url.removesuffix("/v1")
        assert httpx.get(f"{base}/v1/models/org/m-1").json()["id"] == "org/m-1"
        assert httpx.get(f"{base}/v1/models/org%2Fm-1").json()["id"] == "org/m-1"
        options = httpx.options(f"{base}/v1/chat/completions")
        assert options.status_code == 404 and "error" in options.json()
    finally:
        served.stop()


def raw(server: SimServer, head: bytes, body: bytes = b"") -> bytes:
    host, port = server.server_address[:2]
    with socket.create_connection((str(host), int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n" + body)
        return sock.recv(65536)


@pytest.mark.parametrize(("head", "body", "status"), [
    (b"Content-Length: -5\r\n", b"", b"400"),
    (b"Content-Length: 100\r\n", b"{}", b"400"),
    (b"Content-Length: 99999999999\r\n", b"", b"413"),
], ids=["negative", "short-body", "huge"])
def test_a_lying_content_length_is_answered_not_hung(server: SimServer, head: bytes, body: bytes,
                                                     status: bytes) -> None:
    """A negative, overlong or huge Content-Length gets an error status; no thread hangs."""
    assert raw(server, head, body).split(b" ")[1] == status
    assert post(server, {"model": "m", "messages": [USER]}).status_code == 200


def test_a_negative_chunk_size_is_refused_and_journaled(server: SimServer) -> None:
    """A chunked body with a signed chunk size gets a 400, and the request stops counting
    as in flight (so the server can still go idle and stop)."""
    answer = raw(server, b"Transfer-Encoding: chunked\r\n", b"-5\r\nhello\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400")
    assert server.simulator.settle(timeout_s=2.0)


def test_a_reset_connection_ends_quietly(server: SimServer, capsys: pytest.CaptureFixture[str]) -> None:
    """A client that resets its keep-alive connection leaves no traceback on the server."""
    host, port = server.server_address[:2]
    sock = socket.create_connection((str(host), int(port)), timeout=5)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.recv(65536)
    sock.close()  # SO_LINGER 0: a reset instead of a clean close
    assert httpx.get(f"http://{host}:{port}/v1/models").status_code == 200
    assert "Traceback" not in capsys.readouterr().err


def engine_call(lines: bytes | dict[str, Any]) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(lines, bytes):
            return httpx.Response(200, content=lines, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=lines)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    request = ProviderRequest(model="m", messages=(Message(role=Role.USER, content="hi"),),
                              tools=(), prompt_tokens=1, stream=isinstance(lines, bytes))
    return HttpProvider("http://x/v1", client=client).complete(request)


async def test_client_strips_a_bom_and_reads_choices_by_index() -> None:
    """The engine's client drops a leading BOM and takes choice 0 by its index."""
    sse = ("\ufeffdata: " + json.dumps({"choices": [
        {"index": 1, "delta": {"content": "other"}},
        {"index": 0, "delta": {"content": "mine"}}]}) + "\n\ndata: [DONE]\n\n").encode()
    assert (await engine_call(sse)).content == "mine"
    whole = {"choices": [{"index": 1, "message": {"role": "assistant", "content": "other"}},
                         {"index": 0, "message": {"role": "assistant", "content": "mine"}}]}
    assert (await engine_call(whole)).content == "mine"
