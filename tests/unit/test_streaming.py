"""Streaming and delivery: the fold, the FIN-2 rule, replay bounds, both drivers, the wire."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_ref import delivery, streaming
from hermes_ref.engine import Engine
from hermes_ref.errors import StreamCut
from hermes_ref.models import Event, EventKind, Message, ProviderReply, Role, StreamDelta
from hermes_ref.prologue import TurnInput
from hermes_ref.reply_intake import accumulate
from hermes_ref.shell.driver import AsyncDriver
from hermes_ref.shell.http_provider import HttpProvider
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from hermes_ref.shell.workspace_tools import WorkspaceTools
from hermes_ref.tool_specs import REFERENCE_TOOLS
from hermes_ref.wire import ProviderRequest
from sim.provider import ScriptedProvider, stream_deltas, text, tool_calls
from sim.provider_http import fake_transport
from sim.serve import script as script_file
from sim.serve.server import SimServer, Simulator, start
from sim.sqlite_store import SqliteStore
from sim.store import MemoryStore

D = StreamDelta


def test_the_fold_joins_text_keeps_reasoning_apart_and_groups_calls() -> None:
    """Text and reasoning are joined apart; call fragments group by index; last finish wins."""
    reply = accumulate((D(kind="reasoning", text="plan "), D(kind="text", text="Hel"),
                        D(kind="reasoning", text="more"), D(kind="text", text="lo"),
                        D(kind="tool_call", index=0, call_id="c1", name="read_file", text='{"p"'),
                        D(kind="tool_call", index=0, text=': 1}'), D(kind="finish", text="stop")))
    assert (reply.content, reply.reasoning, reply.streamed_text) == ("Hello", "plan more", "Hello")
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [("c1", "read_file", '{"p": 1}')]
    assert reply.finish_reason == "stop" and len(reply.deltas) == 7


def test_the_fold_joins_a_surrogate_pair_split_across_deltas() -> None:
    """The two halves of one character meet only in the fold, and become that character."""
    assert accumulate((D(kind="text", text="a\ud83d"), D(kind="text", text="\ude00"))).content \
        == "a\U0001f600"


def test_the_simulated_stream_folds_back_to_its_reply() -> None:
    """``stream_deltas`` then ``accumulate`` gives the reply back, tool calls included."""
    for reply in (text("The notes say alpha."), tool_calls(("read_file", {"path": "a"}),
                                                          content="Looking.")):
        reply = reply.model_copy(update={"tool_calls": tuple(
            c.model_copy(update={"id": f"call_{i}"}) for i, c in enumerate(reply.tool_calls))})
        back = accumulate(stream_deltas(reply))
        assert (back.content, back.tool_calls, back.finish_reason) == (
            reply.content, reply.tool_calls, reply.finish_reason)


@pytest.mark.parametrize(("cut", "recovered"), [(0, False), (2, False), (3, False), (4, True),
                                                (5, True)])
def test_only_a_stream_that_said_it_was_done_is_recovered(cut: int, recovered: bool) -> None:
    """FIN-2: cut before the finish delta → retry (None); after it → the streamed answer."""
    deltas = stream_deltas(text("Alpha, beta and gamma."))  # 3 text, finish, usage
    reply = streaming.recover(StreamCut("cut", deltas=deltas[:cut]))
    assert (reply is not None) is recovered
    if reply is not None:
        assert reply.content == "Alpha, beta and gamma." and reply.reasoning is None


def test_a_finished_stream_of_tool_calls_or_reasoning_only_is_not_recovered() -> None:
    """A call that streamed tool calls, or only reasoning, is asked again: no answer in it."""
    calls = tool_calls(("read_file", {"path": "a"})).model_copy(update={"tool_calls": ()})
    thinking = ProviderReply(content=None, reasoning="only thinking")
    for reply in (tool_calls(("read_file", {"path": "a"})), calls, thinking):
        assert streaming.recover(StreamCut("cut", deltas=stream_deltas(reply))) is None


def test_replay_is_strictly_after_the_last_number_seen() -> None:
    """DEL-2: events numbered after ``n``, in turn order; other turns and sessions left out."""
    def ev(turn: str, n: int, session: str = "s") -> Event:
        return Event(session_id=session, turn_id=turn, kind=EventKind.DELTA_TEXT, turn_seq=n)
    events = [ev("t", 3), ev("t", 1), ev("u", 2), ev("t", 2), ev("t", 4, "other")]
    assert [e.turn_seq for e in delivery.replay(events, "s", "t", 1)] == [2, 3]
    assert delivery.replay(events, "s", "t", 3) == ()


def test_turn_numbers_count_per_turn_and_end_with_the_completion() -> None:
    """Each turn counts from 1; the completion retires the counter; a stamped event keeps its."""
    seqs = delivery.TurnSeqs()
    kinds = (EventKind.TURN_STARTED, EventKind.DELTA_TEXT, EventKind.TURN_COMPLETED)
    stamped = [seqs.stamp(Event(session_id="s", turn_id="t", kind=k), 7.0) for k in kinds]
    assert [(e.turn_seq, e.at) for e in stamped] == [(1, 7.0), (2, 7.0), (3, 7.0)]
    other = seqs.stamp(Event(session_id="s", turn_id="u", kind=EventKind.TURN_STARTED), 8.0)
    assert other.turn_seq == 1 and seqs.stamp(stamped[0], 9.0) is stamped[0]


def _two_turns_of_events() -> list[Event]:
    seqs = delivery.TurnSeqs()
    return [seqs.stamp(Event(session_id="s", turn_id=t, kind=EventKind.DELTA_TEXT,
                             data={"text": f"{t}{i}"}), 1.0)
            for t, i in (("t", 0), ("u", 0), ("t", 1), ("t", 2))]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_both_simulated_stores_replay_only_committed_events(kind: str, tmp_path: Path) -> None:
    """``events_after`` reads what was committed, never what is pending, on both stores."""
    store: Any = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "s.db")
    first, *rest = _two_turns_of_events()
    store.log_event(first)
    assert store.events_after("s", "t", 0) == ()  # pending: not handed out
    store.flush_events()
    for event in rest:
        store.log_event(event)
    store.flush_events()
    got = store.events_after("s", "t", 1)
    assert [(e.turn_seq, e.data["text"]) for e in got] == [(2, "t1"), (3, "t2")]
    assert all(e.seq is not None for e in got)
    store.close()


def test_the_hub_hands_each_subscriber_its_own_session_and_turn() -> None:
    """A session subscriber gets every turn's events; a turn subscriber only that turn's."""
    hub = delivery.Hub()
    every: list[Event] = []
    one: list[Event] = []
    hub.subscribe("s", every.append)
    sub = hub.subscribe("s", one.append, turn_id="u")
    hub.publish(_two_turns_of_events())
    assert len(every) == 4 and [e.turn_id for e in one] == ["u"]
    hub.unsubscribe(sub)
    hub.publish(_two_turns_of_events())
    assert len(one) == 1


# ---- the asyncio driver and the httpx client ------------------------------------------------


async def test_the_asyncio_driver_hands_out_events_only_once_committed(tmp_path: Path) -> None:
    """DEL-1, DEL-2: deltas are events, numbered per turn, handed out after their commit."""
    script = ScriptedProvider([text("The notes say alpha.")])
    path = tmp_path / "h.db"
    store = await AsyncSqliteStore.open(path)
    root = tmp_path / "ws"
    root.mkdir()
    reader = sqlite3.connect(path)  # another connection: it sees only what is committed
    handed: list[tuple[Event, bool]] = []

    def live(event: Event) -> None:
        found = reader.execute("SELECT 1 FROM events WHERE turn_id = ? AND turn_seq = ?",
                               (event.turn_id, event.turn_seq)).fetchone()
        handed.append((event, found is not None))
    async with httpx.AsyncClient(transport=fake_transport(script)) as client:
        driver = AsyncDriver(store=store, provider=HttpProvider("http://p.test/v1", client=client),
                             tools=WorkspaceTools(root))
        driver.subscribe("s-1", live)
        result = await driver.run(Engine(tools=REFERENCE_TOOLS).run_turn(
            TurnInput(session_id="s-1", text="What do the notes say?")))
    reader.close()
    durable = (await store.snapshot()).events
    assert result.final_response == "The notes say alpha."
    assert [e.turn_seq for e in durable] == list(range(1, len(durable) + 1))
    assert "".join(str(e.data["text"]) for e in durable if e.kind is EventKind.DELTA_TEXT) \
        == "The notes say alpha."
    assert all(committed for _, committed in handed)
    assert [(e.kind, e.turn_seq, e.data) for e, _ in handed] == [
        (e.kind, e.turn_seq, e.data) for e in durable]
    replay = await driver.events_after("s-1", result.turn_id, 2)
    assert [e.turn_seq for e in replay] == list(range(3, len(durable) + 1))
    await store.close()


@pytest.fixture
def served() -> Iterator[list[SimServer]]:
    servers: list[SimServer] = []
    yield servers
    for server in servers:
        server.stop()


def _request() -> ProviderRequest:
    return ProviderRequest(model="m", messages=(Message(role=Role.USER, content="hi"),),
                           tools=(), prompt_tokens=5, stream=True)


async def test_the_http_client_reports_a_cut_stream_with_its_deltas(
        served: list[SimServer]) -> None:
    """A stream cut after two events is a StreamCut carrying the text that came."""
    server = start(Simulator(script_file.parse([{"text": "a long answer here",
                                                 "cut_after": 3}])))
    served.append(server)
    async with HttpProvider(server.url) as provider:
        with pytest.raises(StreamCut) as cut:
            await provider.complete(_request())
    texts = [d.text for d in cut.value.deltas if d.kind == "text"]
    assert texts and "a long answer here".startswith("".join(texts))
    assert streaming.recover(cut.value) is None  # no finish delta: asked again


async def test_a_stream_that_ends_after_its_finish_without_done_is_recovered(
        served: list[SimServer]) -> None:
    """FIN-2 over the wire: every chunk came, then the connection closed without [DONE]."""
    server = start(Simulator(script_file.parse([{"text": "the whole answer", "cut_after": 99}])))
    served.append(server)
    async with HttpProvider(server.url) as provider:
        with pytest.raises(StreamCut) as cut:
            await provider.complete(_request())
    reply = streaming.recover(cut.value)
    assert reply is not None and reply.content == "the whole answer"


async def test_a_stream_that_just_stops_before_its_finish_is_a_cut() -> None:
    """No finish and no [DONE] after a delta: a cut like a dropped connection, so the engine
    asks again (it holds no whole answer to recover); the simulator's cuts are the same."""
    def handler(request: httpx.Request) -> httpx.Response:
        body = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(StreamCut) as cut:
            await HttpProvider("http://p.test/v1", client=client).complete(_request())
    assert [d.text for d in cut.value.deltas if d.kind == "text"] == ["hi"]
    assert streaming.recover(cut.value) is None  # no finish: nothing whole to keep
