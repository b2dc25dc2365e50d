"""Broken streaming and delivery: events handed out before their commit, a replay that
starts at the last number seen, a recovery that answers with an earlier partial,
reasoning shown as text, and a tool round's reply that streams nothing."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import delivery, effects, reply_intake, streaming
from hermes_ref.errors import StreamCut
from hermes_ref.models import Event, EventKind, ProviderReply, StreamDelta
from sim.driver import SimDriver
from sim.sabotage.base import sabotage
from sim.stream_driver import StreamHandlers

# ---- DEL-2: events reach clients when emitted, before any write commits them ------------------


def _deliver_before_commit() -> list[AbstractContextManager[Any]]:
    emit = SimDriver._emit

    def eager(self: SimDriver, effect: effects.Emit) -> None:
        emit(self, effect)
        self.world.hub.publish(self.process.pending_events[-1:])  # "lower latency"

    def committed(self: StreamHandlers, logged: list[Event], kept_back: int) -> None:
        for client in self.world.clients:
            client.settle()
    return [mock.patch.object(SimDriver, "_emit", eager),
            mock.patch.object(StreamHandlers, "_publish", committed)]


sabotage("deliver_before_commit", ("DEL-2",),
         "the driver hands each event to the live subscribers as it is emitted, not once the "
         "write that carries it has committed")(_deliver_before_commit)


# ---- DEL-2: a reconnect replays from the last number seen, not the one after ----------------


def _replay_from_last_seen() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(delivery, "first_to_replay", lambda after_seq: after_seq)]


sabotage("replay_from_last_seen", ("DEL-2",),
         "a reconnecting client's replay starts at its last sequence number instead of the "
         "one after it, so that event is handed out twice")(_replay_from_last_seen)


# ---- FIN-2: the recovered answer is an earlier attempt's partial text ----------------------


def _recover_from_first_partial() -> list[AbstractContextManager[Any]]:
    recover = streaming.recover
    partials: dict[int, str] = {}  # per run of the patched engine: the first cut's text

    def keeps_first(cut: StreamCut) -> ProviderReply | None:
        sent = tuple(d for d in cut.deltas if isinstance(d, StreamDelta))
        partials.setdefault(0, reply_intake.accumulate(sent).streamed_text)
        reply = recover(cut)
        if reply is None or not partials[0]:
            return reply
        partial = partials.pop(0)  # "the accumulator was not reset between attempts"
        return reply.model_copy(update={"content": partial, "streamed_text": partial})
    return [mock.patch.object(streaming, "recover", keeps_first)]


sabotage("recover_from_first_partial", ("FIN-2",),
         "a stream recovered after a retry answers with the partial text of the attempt that "
         "was cut first, not with the stream that delivered the whole answer")(
    _recover_from_first_partial)


# ---- DEL-1: reasoning deltas go out as visible text ----------------------------------------------


def _reasoning_shown_as_text() -> list[AbstractContextManager[Any]]:
    shown = {**streaming._KINDS, "reasoning": EventKind.DELTA_TEXT}  # "it is text, after all"
    return [mock.patch.object(streaming, "_KINDS", shown)]


sabotage("reasoning_shown_as_text", ("DEL-1",),
         "the stream's reasoning deltas are emitted as delta.text events, so a client shows "
         "the model's reasoning as the answer's text")(_reasoning_shown_as_text)


# ---- DEL-1: a reply that calls tools is not streamed to the client ------------------------------


def _tool_round_deltas_dropped() -> list[AbstractContextManager[Any]]:
    publish = streaming.publish

    async def answers_only(session_id: str, turn_id: str, call: int,
                           reply: ProviderReply) -> None:
        if reply.tool_calls:  # "the client only shows answers; the tool round has its events"
            return
        await publish(session_id, turn_id, call, reply)
    return [mock.patch.object(streaming, "publish", answers_only)]


sabotage("tool_round_deltas_dropped", ("DEL-1",),
         "a kept reply that calls tools emits none of its deltas, so a client never sees the "
         "text, reasoning or tool-call deltas the provider streamed before a tool round")(
    _tool_round_deltas_dropped)
