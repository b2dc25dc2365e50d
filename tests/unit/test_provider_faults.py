"""The fake's provider faults, in process, in script files and on the wire, and what the real
client and the production stack make of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes_ref.errors import BadInput
from hermes_ref.limits import Limits
from hermes_ref.models import Message, ProviderReply, Role
from hermes_ref.shell.chat_wire import StreamAssembler
from hermes_ref.shell.http_provider import HttpProvider
from hermes_ref.shell.runtime import open_runtime
from hermes_ref.wire import ProviderRequest
from sim.harness import Story
from sim.provider import (
    LONE_SURROGATE,
    SHARED_ID_DEFAULT,
    ScriptedProvider,
    ScriptError,
    calls_sharing_id,
    load_script,
    lone_surrogate_text,
    split_pair_text,
    utf16_halves,
)
from sim.provider_http import answer_http, completion_chunks, serve_fake_provider

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SMILE = "\U0001f600"


def make_request(stream: bool = False) -> ProviderRequest:
    return ProviderRequest(model="m", messages=(Message(role=Role.USER, content="hi"),),
                           tools=(), prompt_tokens=6, stream=stream)


def body_of(reply: ProviderReply, *, stream: bool) -> bytes:
    provider = ScriptedProvider([reply])
    answer = answer_http(provider, "POST", "/v1/chat/completions",
                         json.dumps(make_request(stream).wire()).encode())
    return b"".join(answer.chunks)


# ---- the catalogue in process ---------------------------------------------------------------


def test_fault_builders_make_the_replies_they_name() -> None:
    """lone_surrogate_text holds one high half, split_pair_text both halves as two code points,
    calls_sharing_id one id on every call."""
    assert lone_surrogate_text("a", "b").content == "a\ud83db"
    assert split_pair_text("a").content == "a\ud83d\ude00"
    assert utf16_halves(SMILE) == "\ud83d\ude00"
    reply = calls_sharing_id("call_0", ("read_file", {"path": "a"}), ("read_file", {"path": "b"}))
    finished = ScriptedProvider([reply]).complete(make_request())
    assert [c.id for c in finished.tool_calls] == ["call_0", "call_0"]  # the fake keeps them


def test_utf16_halves_refuses_a_character_that_has_none() -> None:
    """Only one character outside the Basic Multilingual Plane has two halves."""
    with pytest.raises(ScriptError, match="Basic Multilingual Plane"):
        utf16_halves("é")


def test_script_faults_load(tmp_path: Path) -> None:
    """The "fault" key appends a lone surrogate or split halves to a text step, and gives every
    call of a tool-call step the first call's id (or call_0)."""
    path = tmp_path / "faults.json"
    path.write_text(json.dumps([
        {"text": "a ", "fault": "lone_surrogate"},
        {"text": "b ", "fault": "split_pair"},
        {"text": "c \ud83d"},
        {"tool_calls": [{"id": "k", "name": "f"}, {"name": "g"}], "fault": "shared_id"},
        {"tool_calls": [{"name": "f"}, {"name": "g"}], "fault": "shared_id"},
    ]), encoding="utf-8")
    provider = load_script(path)
    got = [provider.complete(make_request()) for _ in range(5)]
    assert [r.content for r in got[:3]] == ["a " + LONE_SURROGATE, "b \ud83d\ude00",
                                            "c " + LONE_SURROGATE]
    assert [c.id for c in got[3].tool_calls] == ["k", "k"]
    assert [c.id for c in got[4].tool_calls] == [SHARED_ID_DEFAULT] * 2


@pytest.mark.parametrize(("step", "names"), [
    ({"text": "a", "fault": "shared_id"}, "unknown fault 'shared_id' in a 'text' step"),
    ({"tool_calls": [{"name": "f"}], "fault": "split_pair"}, "in a 'tool_calls' step"),
])
def test_a_fault_of_the_wrong_kind_is_bad_input(tmp_path: Path, step: object, names: str) -> None:
    """A fault that does not fit its step is BadInput naming the step and the faults it could be."""
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([step]), encoding="utf-8")
    with pytest.raises(BadInput, match="step 0: unknown fault") as caught:
        load_script(path)
    assert names in str(caught.value)


# ---- the catalogue on the wire --------------------------------------------------------------


def test_a_lone_surrogate_goes_out_as_its_raw_escape() -> None:
    """The whole body and the stream carry the JSON escape \\ud83d on its own."""
    assert b'"Nice \\ud83d"' in body_of(lone_surrogate_text("Nice "), stream=False)
    assert b'\\ud83d' in body_of(lone_surrogate_text("Nice "), stream=True)


def test_a_split_pair_travels_in_two_deltas() -> None:
    """The stream sends the high half as the end of one delta and the low half as the next."""
    pieces = [c["choices"][0]["delta"].get("content") for c in completion_chunks(
        split_pair_text("Great ", "!")) if c["choices"]]
    pieces = [p for p in pieces if p is not None]
    at = pieces.index("\ud83d")
    assert pieces[at + 1].startswith("\ude00") and "".join(pieces) == "Great \ud83d\ude00!"
    stream = body_of(split_pair_text("Great ", "!"), stream=True)
    assert b'"content": "\\ud83d"' in stream and b'"content": "\\ude00!"' in stream


def test_calls_sharing_an_id_go_out_under_their_own_index() -> None:
    """Both calls reach the wire, each with its own stream index and the shared id."""
    reply = calls_sharing_id("call_0", ("f", {}), ("g", {}))
    heads = [c["choices"][0]["delta"]["tool_calls"][0] for c in completion_chunks(reply)
             if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
             and "id" in c["choices"][0]["delta"]["tool_calls"][0]]
    assert [(h["index"], h["id"]) for h in heads] == [(0, "call_0"), (1, "call_0")]


def test_the_stream_fold_joins_a_pair_split_across_deltas() -> None:
    """StreamAssembler makes the two halves one character, and a lone half U+FFFD."""
    assembler = StreamAssembler()
    for piece in ("Great ", "\\ud83d", "\\ude00!", "\\ud83d"):
        assembler.feed_line('data: {"choices": [{"delta": {"content": "' + piece + '"}}]}')
        assembler.feed_line("")
    assembler.feed_line("data: [DONE]")
    assert assembler.finish().content == f"Great {SMILE}!\ufffd"


# ---- the real client against the real server --------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_http_provider_takes_the_text_faults_in_as_text(stream: bool) -> None:
    """Over a socket a lone surrogate arrives as U+FFFD and a split pair as its character."""
    script = ScriptedProvider([lone_surrogate_text("Nice ", "!"), split_pair_text("Great ", "!")])
    server, url = serve_fake_provider(script)
    try:
        async with HttpProvider(url, timeout_s=5) as provider:
            lone = await provider.complete(make_request(stream))
            pair = await provider.complete(make_request(stream))
    finally:
        server.shutdown()
    assert (lone.content, pair.content) == ("Nice \ufffd!", f"Great {SMILE}!")
    assert server.harness_errors == []


async def test_production_stack_records_the_answer_it_delivers(tmp_path: Path) -> None:
    """Through open_runtime and the real server, a lone surrogate answer is delivered and stored
    as the same text, and calls that share an id each keep their own result."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("alpha")
    (root / "b.txt").write_text("beta")
    script = ScriptedProvider([
        calls_sharing_id("call_0", ("read_file", {"path": "a.txt"}),
                         ("read_file", {"path": "b.txt"})),
        lone_surrogate_text("alpha, beta ", "!"),
    ])
    server, url = serve_fake_provider(script)
    try:
        async with await open_runtime(tmp_path / "rt.db", base_url=url, workspace=root,
                                      limits=Limits(backoff_base_s=0.0)) as rt:
            result = await rt.run_turn("s-1", "Read a.txt and b.txt.")
            rows = (await rt.store.snapshot()).transcript("s-1")
    finally:
        server.shutdown()
    assert result.completed and not result.failed
    assert result.final_response == "alpha, beta \ufffd!"
    assert rows[-1].role is Role.ASSISTANT and rows[-1].content == result.final_response
    assert [c.id for c in rows[1].tool_calls] == ["call_0", "call_0_d2"]
    assert [(r.tool_call_id, r.content) for r in rows if r.role is Role.TOOL] == [
        ("call_0", "     1|alpha"), ("call_0_d2", "     1|beta")]
    assert server.harness_errors == []


# ---- the fixture script -----------------------------------------------------------------------


def test_fault_script_fixture_drives_turns_that_keep_the_record_sound(tmp_path: Path) -> None:
    """fixtures/scripts/provider_faults.json plays two turns; every checker holds."""
    story = Story(store_kind="sqlite", workdir=tmp_path, trace=False)
    story.files({"notes.txt": "buy milk"})
    provider = load_script(FIXTURES / "scripts" / "provider_faults.json")
    story.use_provider(provider)
    try:
        first = story.turn("Copy my notes.")
        second = story.turn("How did that go?")
        story.check()
        calls = story.transcript()[1].tool_calls
    finally:
        story.world.store.close()
    assert first is not None and first.final_response == "Copied your notes \ufffd"
    assert second is not None and second.final_response == f"It went well {SMILE}"
    assert [c.id for c in calls] == ["call_0", "call_0_d2"]
    provider.assert_consumed()
    assert not story.violations, [str(v) for v in story.violations]
