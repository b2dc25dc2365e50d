"""The wire and tool checkers read the world's own record: recorded bytes, turns, landed paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role
from hermes_ref.ports import DurableRecord
from hermes_ref.tool_specs import TOOLS_BY_NAME
from hermes_ref.wire import ProviderRequest, WireBody
from sim.checkers import Observation, Violation
from sim.checkers.wire import no_private_keys_on_wire
from sim.harness import Story
from sim.provider import text, tool_calls
from sim.sabotage import SABOTAGES
from sim.world import CallRecord


def record_of(body: bytes) -> CallRecord:
    request = ProviderRequest(model="m", messages=(Message(role=Role.USER, content="hi"),),
                              tools=(), prompt_tokens=1)
    return CallRecord(1, "s-1", "turn-1", request, None, None, 0, 0.0, None, WireBody(body))


def wire_findings(body: bytes) -> list[str]:
    obs = Observation(record=DurableRecord(), ledger=(), calls=(record_of(body),),
                      crash_seqs=(), limits=Limits())
    return [v.message for v in no_private_keys_on_wire(obs)]


def ids_of(found: list[Violation], invariant: str) -> list[str]:
    return [v.message for v in found if v.invariant == invariant]


# -- WIRE-3 judges the bytes, not the request object ----------------------------------------
def test_wire_checker_finds_a_key_only_the_bytes_carry() -> None:
    """A clean request object does not hide a private key in the body that was sent."""
    clean = record_of(b"").request.body()
    assert wire_findings(clean) == []
    leaked = clean.replace(b'"content": "hi"', b'"content": "hi", "_row_id": 1')
    assert wire_findings(leaked) == ["call at effect 1: message 0 carries _row_id"]


def test_wire_checker_reads_the_body_and_its_tools_beside_the_messages() -> None:
    """A bookkeeping field of the request, or a private key in a tool definition, leaves
    the process as surely as one in a message."""
    request = ProviderRequest(model="m", messages=(Message(role=Role.USER, content="hi"),),
                              tools=(TOOLS_BY_NAME["read_file"],), prompt_tokens=1)
    clean = request.body()
    assert wire_findings(clean) == []
    assert wire_findings(clean.replace(b'{"messages"', b'{"purpose": "turn", "messages"')) == [
        "call at effect 1: the body carries purpose"]
    assert wire_findings(clean.replace(b'"name": "read_file"', b'"name": "read_file", "_kind": 1')) \
        == ["call at effect 1: tool 0 (read_file) carries _kind"]


def test_wire_checker_fails_on_a_missing_or_broken_body() -> None:
    """No body, or one that is not a chat-completions object, is a finding, never a pass."""
    assert wire_findings(b"") == ["call at effect 1: its recorded body is not a JSON object "
                                  "(0 bytes)"]
    assert wire_findings(b"[1]") == ["call at effect 1: its recorded body is not a JSON object "
                                     "(3 bytes)"]
    assert wire_findings(b'{"model": "m"}') == [
        "call at effect 1: its recorded body carries no list of message objects"]


def test_simulator_records_the_body_and_sends_nothing_it_cannot_encode(tmp_path: Path) -> None:
    """Each call keeps its request's bytes; a body JSON cannot carry is refused unsent."""
    s = Story(store_kind="memory", workdir=tmp_path)
    s.script(text("Hello."))
    s.turn("hi")
    (call,) = s.world.calls
    assert call.body == call.request.body() and call.sent["messages"][-1]["content"] == "hi"
    s.limits(max_tokens=float("nan"))
    s.script(text("never sent"))
    result = s.turn("again")
    assert result is not None and result.failed and len(s.world.calls) == 1
    assert any("not sent: request body cannot be encoded" in line
               for line in s.world.timeline.lines)


# -- TOOL-1 and TOOL-4 are keyed by session and turn ----------------------------------------
def test_a_call_id_from_an_earlier_turn_never_vouches_for_a_later_run(tmp_path: Path) -> None:
    """Turn 2 runs call_1 before writing it down; turn 1's call_1 row does not mask that."""
    s = Story(store_kind="memory", workdir=tmp_path)
    s.script(tool_calls(("write_file", {"path": "a.txt", "content": "1"})), text("Saved."))
    s.turn("save 1")
    assert s.violations == []
    s.script(tool_calls(("write_file", {"path": "a.txt", "content": "2"})), text("Saved."))
    with SABOTAGES["execute_before_persist"].applied():
        s.turn("save 2")
    assert ids_of(s.violations, "TOOL-1") == [
        "write_file(call_1) ran with row #6 of turn s-1/turn-2 committed later "
        "(committed high-water mark was #5)"]


def test_repeated_call_ids_raise_no_false_segment_alarm(tmp_path: Path) -> None:
    """Turn 1 reads two files at once, turn 2 reads then writes: each batch meets its own row."""
    s = Story(store_kind="memory", workdir=tmp_path)
    s.files({"a.txt": "x", "b.txt": "y"})
    s.script(tool_calls(("read_file", {"path": "a.txt"}), ("read_file", {"path": "b.txt"})),
             text("Read."))
    s.turn("read both")
    s.script(tool_calls(("read_file", {"path": "a.txt"}),
                        ("write_file", {"path": "a.txt", "content": "z"})), text("Done."))
    s.turn("read, then write")
    assert s.world.batches == [("call_1", "call_2"), ("call_1",), ("call_2",)]
    assert s.violations == []


def test_a_racing_batch_of_a_later_turn_is_judged_on_its_own_paths(tmp_path: Path) -> None:
    """Turn 2's read and write of x.txt ran together; turn 1's harmless row with the same
    call ids does not mask it."""
    s = Story(store_kind="memory", workdir=tmp_path)
    s.files({"a.txt": "x", "x.txt": "old"})
    s.script(tool_calls(("read_file", {"path": "a.txt"}),
                        ("write_file", {"path": "b.txt", "content": "1"})), text("Done."))
    s.turn("read a, write b")
    assert s.violations == []
    s.script(tool_calls(("read_file", {"path": "x.txt"}),
                        ("write_file", {"path": "x.txt", "content": "new"})), text("Done."))
    with SABOTAGES["everything_in_parallel"].applied():
        s.turn("read x, write x")
    assert ids_of(s.violations, "TOOL-4") == [
        "turn s-1/turn-2 row #7: read_file x.txt ran alongside write_file x.txt, "
        "and both land on x.txt"]


# -- a body is read as json.loads reads its bytes, however it was put together ---------------
def test_a_built_body_parses_as_its_joined_bytes() -> None:
    """The two-halves parse (messages, then the kept rest) equals a parse of the bytes."""
    tools = tuple(TOOLS_BY_NAME.values())[:3]
    request = ProviderRequest(model="m", messages=(Message(role=Role.SYSTEM, content="s"),
                                                   Message(role=Role.USER, content="hi é")),
                              tools=tools, prompt_tokens=1, max_tokens=9, stream=True)
    body = request.wire_body()
    assert body.parsed() == json.loads(bytes(body))
    assert request.wire_body().parsed()["tools"] == json.loads(request.body())["tools"]


@pytest.mark.parametrize(("parts", "closing"), [
    ((b'{"role": "user"}', b'1], [2'), b'], "model": "m"}'),   # a part that spills out
    ((b'{"role": "user"}',), b'], "model": "m", "messages": []}'),  # the rest names messages
    ((b'{"role": "user"}', b'{"role":'), b'], "model": "m"}'),  # a part that is no JSON
    ((b'{"a": 1}',), b']}'),  # nothing after the array
    ((b'{"a": 1}',), b'], }'),  # an empty rest: a trailing comma in the whole
    ((), b'], }'),
    ((b'{"a": 1}',), b'], "m": 1, }'),  # a trailing comma after the rest's last key
    ((b'{"a": 1}',), b'],\x00"\x00m\x00"\x00:\x001\x00}\x00'),  # a half that reads as UTF-16
    ((b'{"a": "\xff"}',), b'], "m": 1}'),  # bytes that are not UTF-8
    ((b' ',), b'], "m": 1}'),  # a part that is only blank
    ((b'1', b''), b'], "m": 1}'),  # an empty part
])
def test_an_odd_body_parses_exactly_as_its_bytes_do(parts: tuple[bytes, ...],
                                                     closing: bytes) -> None:
    body = WireBody(b'{"messages": [', parts, closing)
    try:
        whole = json.loads(bytes(body))
    except ValueError:
        with pytest.raises(ValueError):
            WireBody(b'{"messages": [', parts, closing).parsed()
        return
    assert body.parsed() == whole
