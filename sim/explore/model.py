"""The explored world's model: it does what each request asks, except where the plan says not.

Each submission's text says what the turn should do ("Read notes-1.txt.", "Write note 3 to
s-1-out-3.txt.", "Say hello 2."), so a plan reads as a story and a shrunk plan still does
what its texts say. The model answers by the last such request in the messages: one tool
round when the request needs a tool, then a text answer that names the request. A side
call (the grace summary, a compaction summary) gets a plain summary.

During the faulty phase the plan's ``replies`` replace the answer to a given world call
(1-based, in world order): an empty reply, a 429 with Retry-After, a 5xx, a dropped tool
call, a read of a file that is not there. In the calm phase the model answers every call.
"""

from __future__ import annotations

import re

from hermes_ref.errors import ProviderServerError, RateLimited
from hermes_ref.models import ProviderReply, Role
from hermes_ref.wire import ProviderRequest
from sim.choices import Chooser
from sim.explore.plan import FaultKind, ReplyFault
from sim.provider import _FakeBase, text, tool_calls

_READ = re.compile(r"^Read (\S+)\.$")
_READ_TWO = re.compile(r"^Read (\S+) and (\S+)\.$")
_WRITE = re.compile(r"^Write note (\d+) to (\S+)\.$")
_ASKS = re.compile(r"^(Read |Write note |Say hello )")  # the texts plan.py writes


class ExploreModel(_FakeBase):
    """A deterministic model: the same requests in the same order give the same replies."""

    def __init__(self, replies: tuple[ReplyFault, ...], ids: Chooser | None = None) -> None:
        super().__init__()
        if ids is not None:  # the explored world's call ids come from its seed
            self.draw_ids_from(ids.stream("ids:call"))
        self._faults = {r.call: r for r in replies}
        self.calls = 0
        self.calm = False
        self.fired: list[ReplyFault] = []

    def _reply(self, request: ProviderRequest) -> ProviderReply:
        self.calls += 1
        if request.purpose != "turn":  # grace or compaction summary: never faulted
            return text("Summary: the work so far is recorded above.")
        fault = None if self.calm else self._faults.get(self.calls)
        if fault is not None and fault.kind is not FaultKind.SLOW_REPLY:
            self.fired.append(fault)
            return _faulty(fault)
        if fault is not None:
            self.fired.append(fault)  # the world delays the reply (see run.py)
        return _answer(request)


def _faulty(fault: ReplyFault) -> ProviderReply:
    kind = fault.kind
    if kind is FaultKind.RATE_LIMIT:
        raise RateLimited(f"429 at call {fault.call}", retry_after_s=fault.seconds)
    if kind is FaultKind.SERVER_ERROR:
        raise ProviderServerError(f"503 at call {fault.call}", status=503)
    if kind is FaultKind.DROPPED_CALL:
        return ProviderReply(content=None, finish_reason="tool_calls")
    if kind is FaultKind.TOOL_ERROR:
        return tool_calls(("read_file", {"path": "missing.txt"}))
    if kind is FaultKind.BAD_ARGUMENTS:  # malformed, not cut off: it ends in a brace
        return tool_calls(("read_file", '{"path" "notes-1.txt"}'))
    if kind is FaultKind.UNKNOWN_TOOL:
        return tool_calls(("launch_rockets", {"count": 3}))
    return ProviderReply(content="", finish_reason="stop")


def _answer(request: ProviderRequest) -> ProviderReply:
    messages = request.messages
    asked_at = next((i for i in range(len(messages) - 1, -1, -1)
                     if messages[i].role is Role.USER and _ASKS.match(messages[i].content or "")),
                    None)
    if asked_at is None:
        return text("Nothing was asked.")
    asked = messages[asked_at].content or ""
    tools_ran = any(m.role is Role.TOOL for m in messages[asked_at + 1:])
    if tools_ran or not request.tools:
        return text(f"Done: {asked}")
    if (both := _READ_TWO.match(asked)) is not None:  # one round, two calls side by side
        return tool_calls(("read_file", {"path": both.group(1)}),
                          ("read_file", {"path": both.group(2)}))
    if (read := _READ.match(asked)) is not None:
        return tool_calls(("read_file", {"path": read.group(1)}))
    if (write := _WRITE.match(asked)) is not None:
        return tool_calls(("write_file", {"path": write.group(2),
                                          "content": f"note {write.group(1)}"}))
    return text(f"Hello back: {asked}")
