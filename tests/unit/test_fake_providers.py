"""The simulator's fake providers: scripts, functions, seeded generation, script files."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

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
from hermes_ref.models import Message, ProviderReply, Role, ToolCall, ToolSpec, Usage
from hermes_ref.tokens import count_text, count_wire_messages
from hermes_ref.wire import ProviderRequest
from sim.provider import (
    FunctionProvider,
    GenerativeProvider,
    ScriptedProvider,
    ScriptError,
    ScriptExhausted,
    load_script,
    text,
    tool_calls,
)
from sim.provider_http import handle_http, request_from_wire


def make_request(*messages: Message, tools: tuple[ToolSpec, ...] = ()) -> ProviderRequest:
    history = messages or (Message(role=Role.USER, content="hello"),)
    return ProviderRequest(model="m", messages=history, tools=tools, prompt_tokens=123)


def user(content: str) -> Message:
    return Message(role=Role.USER, content=content)


WRITE_FILE = ToolSpec(
    name="write_file",
    description="Write a file.",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "content": {"type": "string"},
            "mode": {"type": "string", "enum": ["w", "a"]},
            "overwrite": {"type": "boolean"},
        },
        "required": ["path", "content", "mode"],
    },
)
SEARCH = ToolSpec(
    name="search",
    description="Search.",
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"},
                       "filters": {"type": "object", "properties": {"lang": {"type": "string"}},
                                   "required": ["lang"]}},
        "required": ["query", "limit", "filters"],
    },
)


# ---- ScriptedProvider --------------------------------------------------------------------


def test_scripted_plays_steps_in_order_and_records_requests() -> None:
    """Steps are replies, errors and callables, played in order; every request is recorded."""
    provider = ScriptedProvider([
        text("first"),
        RateLimited("slow", retry_after_s=1),
        lambda request: text(f"saw {len(request.messages)} message(s)"),
    ])
    first = make_request(user("a"))
    assert provider.complete(first).content == "first"
    with pytest.raises(RateLimited):
        provider.complete(make_request(user("b")))
    assert provider.complete(make_request(user("c"), user("d"))).content == "saw 2 message(s)"
    assert provider.requests[0] is first
    assert [r.messages[-1].content for r in provider.requests] == ["a", "b", "d"]
    provider.assert_consumed()


def test_scripted_fails_loudly_on_unexpected_call() -> None:
    """A call after the script ran out raises ScriptExhausted naming the call and last message."""
    provider = ScriptedProvider([text("only one")])
    provider.complete(make_request())
    with pytest.raises(ScriptExhausted) as caught:
        provider.complete(make_request(user("and another thing")))
    message = str(caught.value)
    assert "#2" in message and "and another thing" in message
    assert not isinstance(caught.value, ProviderError)  # the engine cannot swallow it
    assert isinstance(caught.value, AssertionError)


def test_assert_consumed_names_leftovers() -> None:
    """assert_consumed raises when steps remain, saying how many."""
    provider = ScriptedProvider([text("a"), text("b"), text("c")])
    provider.complete(make_request())
    with pytest.raises(ScriptError, match="2 step"):
        provider.assert_consumed()


def test_tool_call_ids_count_per_provider() -> None:
    """Tool calls without an id get call_1, call_2, … per provider; given ids are kept."""
    script = [
        tool_calls(("a", {}), ("b", {"x": 1})),
        tool_calls(ToolCall(id="mine", name="c"), ("d", "{raw")),
    ]
    provider = ScriptedProvider(script)
    other = ScriptedProvider([tool_calls(("a", {}))])
    ids = [c.id for _ in script for c in provider.complete(make_request()).tool_calls]
    assert ids == ["call_1", "call_2", "mine", "call_3"]
    assert other.complete(make_request()).tool_calls[0].id == "call_1"


def test_tool_calls_builder_serialises_arguments() -> None:
    """Dict arguments are JSON text, string arguments are verbatim, finish is tool_calls."""
    reply = tool_calls(("f", {"path": "a b", "n": 2}), ("g", "{broken"))
    assert [c.arguments for c in reply.tool_calls] == ['{"path": "a b", "n": 2}', "{broken"]
    assert reply.finish_reason == "tool_calls"


def test_usage_comes_from_request_and_reply_text() -> None:
    """prompt_tokens is the request's own count; completion tokens count the reply's text."""
    provider = ScriptedProvider([
        text("twelve chars"),
        ProviderReply(content="x", usage=Usage(prompt_tokens=1, completion_tokens=2)),
    ])
    usage = provider.complete(make_request()).usage
    assert usage == Usage(prompt_tokens=123, completion_tokens=count_text("twelve chars"))
    assert provider.complete(make_request()).usage == Usage(prompt_tokens=1, completion_tokens=2)


def test_function_provider_computes_and_records() -> None:
    """FunctionProvider answers with fn(request) and records each request."""
    provider = FunctionProvider(lambda r: text((r.messages[-1].content or "").upper()))
    assert provider.complete(make_request(user("shout"))).content == "SHOUT"
    assert len(provider.requests) == 1


# ---- GenerativeProvider --------------------------------------------------------------------


def run_turn(provider: GenerativeProvider, tools: tuple[ToolSpec, ...]) -> list[ProviderReply]:
    """Drive one turn the way the engine would: call, run tools, call again, until text."""
    history: list[Message] = [user("do the thing")]
    replies: list[ProviderReply] = []
    for _ in range(10):
        reply = provider.complete(make_request(*history, tools=tools))
        replies.append(reply)
        if not reply.tool_calls:
            return replies
        history.append(Message(role=Role.ASSISTANT, tool_calls=reply.tool_calls))
        history += [Message(role=Role.TOOL, content="ok", tool_call_id=c.id, tool_name=c.name)
                    for c in reply.tool_calls]
    raise AssertionError("the generative provider never answered")


def test_generative_is_deterministic_for_a_seed() -> None:
    """Two providers with the same seed give the same replies to the same requests."""
    tools = (WRITE_FILE, SEARCH)
    first = run_turn(GenerativeProvider(seed=7, tool_rounds=3, parallel=2), tools)
    second = run_turn(GenerativeProvider(seed=7, tool_rounds=3, parallel=2), tools)
    assert first == second


def test_generative_calls_tools_then_answers() -> None:
    """It calls `parallel` tools for `tool_rounds` rounds, then answers counting the results."""
    replies = run_turn(GenerativeProvider(seed=1, tool_rounds=2, parallel=3), (WRITE_FILE,))
    assert [len(r.tool_calls) for r in replies] == [3, 3, 0]
    assert "6 tool results" in (replies[-1].content or "")


def test_generative_arguments_follow_the_schema() -> None:
    """Required properties get plausible values by type; optional ones are left out."""
    provider = GenerativeProvider(seed=3)
    (write,) = provider.complete(make_request(tools=(WRITE_FILE,))).tool_calls
    args = json.loads(write.arguments)
    assert args["path"] == "notes.txt"
    assert args["mode"] in ("w", "a")
    assert "overwrite" not in args
    (search,) = GenerativeProvider(seed=3).complete(make_request(tools=(SEARCH,))).tool_calls
    found = json.loads(search.arguments)
    assert found["query"] == "hello" and isinstance(found["limit"], int)
    assert isinstance(found["filters"]["lang"], str)


def test_generative_reads_only_the_current_turn() -> None:
    """Tool rounds from earlier turns do not count: only the tail since the last user message."""
    old_round = [Message(role=Role.ASSISTANT, tool_calls=(ToolCall(id="x", name="search"),)),
                 Message(role=Role.TOOL, content="r", tool_call_id="x")]
    history = [user("old")] + old_round * 500 + [user("new")]
    reply = GenerativeProvider(seed=0).complete(make_request(*history, tools=(SEARCH,)))
    assert len(reply.tool_calls) == 1


def test_generative_without_tools_answers() -> None:
    """Offered no tools, it answers with text at once."""
    reply = GenerativeProvider(seed=0, tool_rounds=5).complete(make_request())
    assert reply.tool_calls == () and "0 tool results" in (reply.content or "")


# ---- script files -----------------------------------------------------------------------------


def write_script(tmp_path: Path, steps: object) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(steps), encoding="utf-8")
    return path


def test_load_script_builds_every_step_kind(tmp_path: Path) -> None:
    """Every documented step kind loads into the matching reply or error."""
    path = write_script(tmp_path, [
        {"text": "hi", "finish_reason": "length"},
        {"tool_calls": [{"name": "f", "arguments": {"a": 1}}, {"id": "k", "name": "g",
                                                               "arguments": "{x"}]},
        {"error": "rate_limited", "retry_after_s": 2},
        {"error": "server_error", "status": 503},
        {"error": "timeout"}, {"error": "context_overflow"}, {"error": "auth"},
        {"error": "rejected", "message": "nope"}, {"error": "malformed"},
    ])
    provider = load_script(path)
    reply = provider.complete(make_request())
    assert (reply.content, reply.finish_reason) == ("hi", "length")
    calls = provider.complete(make_request()).tool_calls
    assert [(c.id, c.arguments) for c in calls] == [("call_1", '{"a": 1}'), ("k", "{x")]
    kinds: list[type[ProviderError]] = [RateLimited, ProviderServerError, ProviderTimeout,
                                        ContextOverflow, ProviderAuthError, ProviderRejected,
                                        MalformedReply]
    for kind in kinds:
        with pytest.raises(kind) as caught:
            provider.complete(make_request())
        assert caught.type is kind
        if isinstance(caught.value, RateLimited):
            assert caught.value.retry_after_s == 2
        if isinstance(caught.value, ProviderServerError):
            assert caught.value.status == 503
    provider.assert_consumed()


@pytest.mark.parametrize(
    ("steps", "names"),
    [
        ({"text": "hi"}, "a JSON list of steps"),
        ([{"text": "ok"}, {"error": "explode"}], "step 1: unknown error 'explode'"),
        ([{"text": "a", "error": "auth"}], "step 0: a step needs exactly one of"),
        ([{"tool_calls": [{"arguments": {}}]}], "step 0: tool_calls[0]: 'name' is missing"),
        ([{"tool_calls": []}], "step 0: 'tool_calls' must be a non-empty list"),
        ([{"text": "a", "colour": "red"}], "step 0: unknown key(s) ['colour']"),
        ([{"text": 5}], "step 0: 'text' must be a string"),
        ([{"text": "a", "finish_reason": 3}], "step 0: finish_reason"),
        ([{"error": "rate_limited", "retry_after_s": "soon"}], "retry_after_s must be a number"),
        ([{"error": "server_error", "status": 404}], "status must be an integer from 500"),
        (["hello"], "step 0: a step is an object"),
    ],
)
def test_load_script_errors_name_file_and_step(tmp_path: Path, steps: object, names: str) -> None:
    """A broken script is BadInput naming the file, the step index and what is wrong."""
    path = write_script(tmp_path, steps)
    with pytest.raises(BadInput) as caught:
        load_script(path)
    assert str(path) in str(caught.value)
    assert names in str(caught.value)


def test_load_script_rejects_bad_json_and_missing_file(tmp_path: Path) -> None:
    """Unreadable files and invalid JSON are BadInput naming the file."""
    broken = tmp_path / "broken.json"
    broken.write_text("[{", encoding="utf-8")
    with pytest.raises(BadInput, match=r"broken\.json: not valid JSON"):
        load_script(broken)
    with pytest.raises(BadInput, match=r"missing\.json: cannot read"):
        load_script(tmp_path / "missing.json")


# ---- the HTTP face ------------------------------------------------------------------------------


def post(body: bytes) -> httpx.Response:
    request = httpx.Request("POST", "http://fake.test/v1/chat/completions", content=body)
    return handle_http(ScriptedProvider([text("unused")]), request)


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"{nope", "the body is not JSON"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "'model' is missing"),
        (b'{"model": "m", "messages": []}', "'messages' is missing or not a non-empty array"),
        (b'{"model": "m", "messages": [{"role": "wizard"}]}', "messages[0].role is 'wizard'"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x", "row_id": 4}]}',
         "messages[0] has non-wire key(s) ['row_id']"),
        (b'{"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]}',
         "messages[0].tool_calls[0] is not an object with a 'function' object"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{}]}',
         "tools[0].function.name is missing"),
    ],
)
def test_malformed_request_body_is_a_400_naming_the_problem(body: bytes, names: str) -> None:
    """The fake endpoint answers a body it cannot use with a 400 that says why."""
    response = post(body)
    assert response.status_code == 400
    assert names in response.json()["error"]["message"]


def test_request_from_wire_round_trips() -> None:
    """A request's wire form parses back into an equal request (wire and token count)."""
    messages = (
        Message(role=Role.SYSTEM, content="sys"),
        user("go"),
        Message(role=Role.ASSISTANT, content=None,
                tool_calls=(ToolCall(id="c1", name="write_file", arguments='{"p": 1}'),)),
        Message(role=Role.TOOL, content="done", tool_call_id="c1", tool_name="write_file"),
    )
    original = ProviderRequest(
        model="m", messages=messages, tools=(WRITE_FILE,), max_tokens=50, stream=True,
        prompt_tokens=count_wire_messages([m.wire for m in messages]),
    )
    rebuilt = request_from_wire(json.loads(json.dumps(original.wire())))
    assert rebuilt.wire() == original.wire()
    assert rebuilt.messages == original.messages
    assert rebuilt.prompt_tokens == original.prompt_tokens


def test_unknown_route_is_404() -> None:
    """Paths other than chat/completions and models get a 404."""
    request = httpx.Request("POST", "http://fake.test/v1/embeddings", content=b"{}")
    assert handle_http(ScriptedProvider(), request).status_code == 404
