"""The simulator's side of streaming and delivery: deltas, stream cuts, turn numbers, feeds.

Theory of operation
-------------------
``StreamHandlers`` is the part of ``SimDriver`` that streams and delivers.

* **Streaming (DEL-1, FIN-2).** A request that asks for a stream gets the fake's reply
  with the deltas a server would send for it (``sim.provider.stream_deltas``, whose fold,
  ``reply_intake.accumulate``, is that reply), text as the server sent it: cleaning it is
  the engine's intake, not the world's. ``World.stream_cuts`` places a cut: ``{call: n}`` makes the
  world's ``call``-th provider call (1-based, in world order) fail after delivering ``n``
  deltas, with ``StreamCut`` carrying them; ``n`` at or past the last delta is a stream
  that delivered everything and then failed to close. The world records what it sent
  (``CallRecord.delivered``) whatever the engine makes of it.
* **Turn numbers (DEL-2).** Each emitted event gets its ``turn_seq`` from the world's
  ``delivery.TurnSeqs`` (turn ids are unique in a world, so one counter set serves every
  process).
* **Delivery (DEL-2).** After a store write of this process returns, the events it
  committed (those it took from the process's pending list and did not give back) are
  published to the world's ``delivery.Hub``: a live subscriber is handed an event only
  once it is durable. A write that fails or is refused publishes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes_ref import effects as fx
from hermes_ref.errors import StreamCut
from hermes_ref.models import Event, ProviderReply
from hermes_ref.wire import WireBody
from sim.provider import stream_deltas
from sim.world import CallRecord

if TYPE_CHECKING:
    from sim.scheduler import Actor
    from sim.world import SimProcess, World


class StreamHandlers:
    """Mixed into ``SimDriver``; relies on its ``world``, ``process`` and ``current``."""

    world: World
    process: SimProcess
    current: Actor | None

    def _streamed(self, effect: fx.CallProvider, reply: ProviderReply, watermark: int,
                  at: float, body: WireBody, label: str) -> ProviderReply:
        """The fake's reply as a stream: its deltas folded, or ``StreamCut`` where planned."""
        world = self.world
        deltas = stream_deltas(reply)
        cut = world.stream_cuts.get(len(world.calls) + 1)
        if cut is None:  # the fake's reply is its deltas' fold, text as the server sent it
            return reply.model_copy(update={"deltas": deltas, "streamed_text": reply.content or ""})
        sent = deltas[:max(0, cut)]
        where = ("after its last delta" if cut >= len(deltas)
                 else f"after delta {len(sent)} of {len(deltas)}")
        error = StreamCut(f"stream cut {where}", deltas=sent)
        world.calls.append(CallRecord(world.effects_performed, effect.session_id, effect.turn_id,
                                      effect.request, None, type(error).__name__, watermark,
                                      at, None, body, delivered=sent))
        texts = sum(1 for d in sent if d.kind == "text")
        world.timeline.add("call", f"{label} -> StreamCut {where} ({texts} text deltas)")
        raise error

    def _stamp(self, event: Event) -> Event:
        """The event with its clock time and its place in its turn."""
        return self.world.turn_seqs.stamp(event, self.world.clock.now())

    def _publish(self, logged: list[Event], kept_back: int) -> None:
        """A write returned: hand what it committed (all but the ``kept_back`` last)."""
        committed = logged[:len(logged) - kept_back] if kept_back else logged
        if committed:
            self.world.hub.publish(committed)
            for client in self.world.clients:  # a reconnect falls between commits
                client.settle()
