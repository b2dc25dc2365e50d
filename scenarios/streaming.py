"""Stories of streamed replies: cut streams, a whole answer whose stream then failed,
reasoning that is shown and never replayed, and clients that reconnect."""

from __future__ import annotations

from hermes_ref.models import EventKind, ProviderReply, Role
from hermes_ref.outcomes import ExitReason
from sim.harness import Story, scenario
from sim.provider import LONE_SURROGATE, lone_surrogate_text, stream_deltas, text, tool_calls
from sim.stream_client import SimClient

ANSWER = "The notes say alpha, beta and gamma."
THOUGHT = "The user wants the notes; reading them first is the safe plan."


def _deltas(s: Story, turn_id: str, kind: EventKind) -> list[str]:
    return [str(e.data.get("text")) for e in s.world.store.snapshot().events
            if e.turn_id == turn_id and e.kind is kind]


@scenario("A stream cut midway is asked for again, wherever the cut falls, and only the "
          "kept attempt's deltas are logged",
          invariants=("DEL-1", "LOOP-5", "FIN-3"), stage="streaming")
def cut_streams_are_asked_again(s: Story) -> None:
    s.script(text(ANSWER), text(ANSWER), text(ANSWER))
    s.world.stream_cuts.update({1: 1, 2: 3})  # after the first text delta, then the third
    result = s.turn("What do the notes say?")
    s.expect(result is not None and result.final_response == ANSWER, "the third stream answered")
    s.expect([c.error for c in s.world.calls] == ["StreamCut", "StreamCut", None],
             "two cut streams, then a whole one")
    turn_id = result.turn_id if result is not None else ""
    s.expect("".join(_deltas(s, turn_id, EventKind.DELTA_TEXT)) == ANSWER,
             "the logged text deltas are the kept stream's, once")


@scenario("A final answer streamed whole whose stream then failed is the answer, recovered "
          "from the stream and not asked for again",
          invariants=("FIN-2", "DEL-1", "FIN-3"), stage="streaming")
def whole_streamed_answer_is_recovered(s: Story) -> None:
    reply = text(ANSWER)
    s.script(reply, reply)
    finish_at = len(stream_deltas(reply)) - 1  # the finish delta came, the usage chunk did not
    s.world.stream_cuts.update({1: 2, 2: finish_at})
    result = s.turn("What do the notes say?")
    s.expect(result is not None and result.final_response == ANSWER
             and result.exit_reason is ExitReason.TEXT_RESPONSE, "the streamed answer is kept")
    s.expect(len(s.world.calls) == 2, "the cut stream was retried, the whole one was not")
    rows = s.transcript()
    s.expect(rows[-1].role is Role.ASSISTANT and rows[-1].content == ANSWER,
             "the durable answer row is the streamed text")


@scenario("Reasoning a provider streams is shown as reasoning deltas and never stored or "
          "replayed, in a kept stream and in a recovered one",
          invariants=("DEL-1", "FIN-2", "WIRE-3"), stage="streaming")
def streamed_reasoning_is_never_replayed(s: Story) -> None:
    s.files({"notes.txt": "alpha, beta, gamma"})
    thinking = ProviderReply(content=ANSWER, reasoning=THOUGHT)
    s.script(tool_calls(("read_file", {"path": "notes.txt"})), thinking,
             ProviderReply(content="Still alpha.", reasoning=THOUGHT + " Again."))
    first = s.turn("What do the notes say?")
    s.expect(first is not None and first.final_response == ANSWER, "the answer has no reasoning")
    turn_id = first.turn_id if first is not None else ""
    s.expect("".join(_deltas(s, turn_id, EventKind.DELTA_REASONING)) == THOUGHT,
             "the reasoning was shown as reasoning deltas")
    last = len(stream_deltas(ProviderReply(content="Still alpha.", reasoning=THOUGHT + " Again.")))
    s.world.stream_cuts[len(s.world.calls) + 1] = last  # whole, then the close fails
    second = s.turn("And now?")
    s.expect(second is not None and second.final_response == "Still alpha.",
             "the recovered answer is the visible text only")
    sent = s.world.calls[-1].body.decode("utf-8")
    s.expect(THOUGHT not in sent, "the second turn's request replays no reasoning")
    s.expect(all(THOUGHT not in (m.content or "") for m in s.transcript()), "nothing stores it")


@scenario("A client that drops mid-stream and reconnects with its last number sees every "
          "committed event once and the answer's text exactly once",
          invariants=("DEL-2", "DEL-1"), stage="streaming")
def client_reconnects_mid_stream(s: Story) -> None:
    s.files({"notes.txt": "alpha, beta, gamma"})
    s.script(tool_calls(("read_file", {"path": "notes.txt"}), content="Let me look."),
             text(ANSWER))
    client = SimClient.join(s.world, "s-1", disconnect_after=2, away_for=3)
    SimClient.seeded(s.world, "s-1", name="client-2")
    result = s.turn("What do the notes say?")
    s.expect(result is not None and result.final_response == ANSWER, "the turn answered")
    s.expect(client.connection == 2 and client.connected, "the client came back once")
    s.expect(any(seen.via == "replay" for seen in client.seen), "it replayed what it missed")
    turn_id = result.turn_id if result is not None else ""
    s.expect(client.text(turn_id, 2) == ANSWER, "it was shown the answer once")


@scenario("A client that reconnects after the producing process crashed sees only what was "
          "committed before the crash, then the next turn live",
          invariants=("DEL-2", "DEL-1", "FIN-3"), stage="streaming")
def client_reconnects_across_a_crash(s: Story) -> None:
    s.files({"notes.txt": "alpha, beta, gamma"})
    s.script(tool_calls(("read_file", {"path": "notes.txt"})), text(ANSWER), text(ANSWER))
    client = SimClient.join(s.world, "s-1")
    s.faults(crash="before:final")  # the answer's deltas are emitted, not yet committed
    crashed = s.turn("What do the notes say?")
    s.expect(crashed is None, "the process died before the answer was written")
    client.disconnect()  # its connection died with the process
    s.restart()
    client.reconnect()
    result = s.turn("What do the notes say?")
    s.expect(result is not None and result.final_response == ANSWER, "the next turn answered")
    turn_id = result.turn_id if result is not None else ""
    s.expect(client.text(turn_id, 1) == ANSWER, "the client saw the new answer live, once")


@scenario("A client shown a lone surrogate reads it as U+FFFD, and so does the durable answer",
          invariants=("DEL-2", "FIN-6"), stage="streaming")
def lone_surrogate_shown_as_the_record_keeps_it(s: Story) -> None:
    """The provider streams an answer holding a lone UTF-16 surrogate, and a client watches.
    The deltas reach the client as they were streamed; a UTF-16 reader shows the lone half
    as U+FFFD, so the answer row must hold U+FFFD in its place (DEL-2), and nothing else
    would be the answer the user was shown."""
    client = SimClient.join(s.world, "s-1")
    s.script(lone_surrogate_text("Nice work ", "!"))
    result = s.turn("How did I do?")
    s.expect(result is not None and result.final_response == "Nice work \ufffd!",
             "the answer holds U+FFFD where the lone surrogate was")
    turn_id = result.turn_id if result is not None else ""
    s.expect(client.text(turn_id, 1) == f"Nice work {LONE_SURROGATE}!",
             "the client was handed the text as it was streamed")
