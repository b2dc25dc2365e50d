"""Streaming: a reply's deltas become the turn's ordered events; a failed stream is judged.

Theory of operation
-------------------
A streamed model call comes back from ``CallProvider`` as one ``ProviderReply`` that
carries the ordered deltas the port delivered (``ProviderReply.deltas``); the reply is
their fold (``reply_intake.accumulate``). A stream that fails part-way raises
``StreamCut`` carrying the deltas delivered before the failure. The driver never decides
what a stream means: the core does, here, so the simulator can cut a stream at any delta
and both drivers behave alike.

**Deltas become events (DEL-1).** Once a call's reply is kept, its text, reasoning and
tool-call deltas are emitted as ``delta.text``, ``delta.reasoning`` and ``delta.tool_call``
events, in the order they arrived, each naming the call of the turn it belongs to. Usage
and finish deltas are bookkeeping and are not emitted. Events are pending until the
turn's next write commits them, and a client is handed an event only once it is
committed (``hermes_ref.delivery``), so no extra commit is made for them.

**Only a kept attempt is shown.** Deltas of an attempt that is retried are never
emitted: no client ever saw them (nothing was committed), so a retry cannot show the
user the same text twice, and the retried attempt's deltas are the only ones of the call.

**A stream cut midway is retried; a whole answer is recovered (FIN-2).** A cut before
the stream said it was done (no finish delta) is a transient error like any other
(LOOP-5). A failure after the finish delta (the usage chunk, ``[DONE]`` or the close
failed) of a reply that carries visible text and no tool call lost nothing the model
meant to say: the answer is the fold of what was streamed, and asking again would only
pay for a second, different answer. Reasoning is never part of a recovered answer: the
fold keeps it apart from the content.
"""

from __future__ import annotations

from hermes_ref import reply_intake
from hermes_ref.effects import Emit
from hermes_ref.errors import StreamCut
from hermes_ref.models import Event, EventKind, ProviderReply, StreamDelta

_KINDS = {"text": EventKind.DELTA_TEXT, "reasoning": EventKind.DELTA_REASONING,
          "tool_call": EventKind.DELTA_TOOL_CALL}


def delta_events(session_id: str, turn_id: str, call: int,
                 deltas: tuple[StreamDelta, ...]) -> list[Event]:
    """The events of one kept call's deltas, in arrival order (usage and finish left out)."""
    out: list[Event] = []
    for delta in deltas:
        kind = _KINDS.get(delta.kind)
        if kind is None:
            continue
        data: dict[str, object] = {"call": call, "text": delta.text}
        if delta.kind == "tool_call":
            data.update(index=delta.index, id=delta.call_id, name=delta.name)
        out.append(Event(session_id=session_id, turn_id=turn_id, kind=kind, data=data))
    return out


async def publish(session_id: str, turn_id: str, call: int, reply: ProviderReply) -> None:
    """Emit a kept reply's deltas as the turn's delta events (nothing for a whole reply)."""
    for event in delta_events(session_id, turn_id, call, reply.deltas):
        await Emit(event)


def recover(cut: StreamCut) -> ProviderReply | None:
    """FIN-2: the whole answer a failed stream had already delivered, or None (retry it).

    Whole means the stream's finish delta arrived, the reply calls no tool, and it has
    visible text; anything less is a cut stream, and a cut stream is asked again.
    """
    deltas = tuple(d for d in cut.deltas if isinstance(d, StreamDelta))
    if not reply_intake.finished(deltas):
        return None
    reply = reply_intake.accumulate(deltas)
    if reply.tool_calls or not reply.streamed_text.strip() or reply.finish_reason == "tool_calls":
        return None
    return reply
