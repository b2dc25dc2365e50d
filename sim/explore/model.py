"""The explored world's model: it does what each request asks, except where the plan says not.

Each submission's text says what the turn should do ("Read notes-1.txt.", "Write note 3 to
s-1-out-3.txt.", "Say hello 2."), so a plan reads as a story and a shrunk plan still does
what its texts say. The model answers by the last such request in the messages: one tool
round when the request needs a tool, then a text answer that names the request. A side
call (the grace summary, a compaction summary) gets a plain summary.

During the faulty phase the plan's ``replies`` replace the answer to a given world call
(1-based, in world order): an empty reply, a 429 with Retry-After, a 5xx, a dropped tool
call, a read of a file that is not there, a 401, a reply that only reasoned, a narrated
call that was never made, a lone surrogate, two calls under one id, arguments nested past
the parser's limit, ten reads in one round, a round of ``execute_code`` (refunded), a read
of a huge log (spilled; with ``huge_reads_share_id`` every such read under the first
one's call id, as a provider that numbers calls per request sends it), a 400 saying the
context is too long, or an outage (a 503 to the request and to every retry of it, so the
turn falls back). In a world that refuses the check (``sim/explore/gated.py``) each
request that asks the model to verify its work, after the gate held an answer back, gets a
400. An outage may also be aimed at the plan's n-th grace call
(``grace_outages``, counted by grace request, a retry not counted again), the one other
call a turn's budget leaves; no other fault strikes a grace call or a compaction's
summary. A slow reply thinks aloud first (an inline think block), so a correction that cuts it has
something to leave out; a stream cut is the world's (``World.stream_cuts``), not the
model's. The reply shapes of ``sim/explore/shapes.py`` (a cut-off call, malformed arguments
around a round that parses, a think-only reply after tools, a mixed housekeeping round
before an empty reply, 503s around an overflow, a padded answer) begin at their call and
go on with the same turn's next requests (``_Shaping``), kept by the turn's user row. In
the calm phase the model answers every call. The model behind a fallback
route (``for_fallback``) is never faulted.
"""

from __future__ import annotations

import re

from hermes_ref.errors import (
    ContextOverflow,
    ProviderAuthError,
    ProviderRejected,
    ProviderServerError,
    RateLimited,
)
from hermes_ref.models import ProviderReply, Role
from hermes_ref.wire import ProviderRequest
from sim.choices import Chooser
from sim.explore import edges
from sim.explore.plan import BIG_LOG, FaultKind, ReplyFault
from sim.interventions import asks_for_the_check
from sim.provider import LONE_SURROGATE, _FakeBase, calls_sharing_id, text, tool_calls

_READ = re.compile(r"^Read (\S+)\.$")
_READ_TWO = re.compile(r"^Read (\S+) and (\S+)\.$")
_WRITE = re.compile(r"^Write note (\d+) to (\S+)\.$")
_ASKS = re.compile(r"^(Read |Write note |Patch note |Say hello |Go through )")  # the texts the plan writes


# the 503s around an overflow wait for a request this long, whose compaction can relieve it
# (a shorter history seldom has a middle to summarize, and the turn fails closed: CMP-7)
HISTORY_TO_COMPACT = 18


class ExploreModel(_FakeBase):
    """A deterministic model: the same requests in the same order give the same replies."""

    def __init__(self, replies: tuple[ReplyFault, ...] = (), ids: Chooser | None = None,
                 grace_outages: tuple[int, ...] = (), huge_reads_share_id: bool = False,
                 history_to_compact: int = HISTORY_TO_COMPACT,
                 empty_after_correction: bool = False, refuse_the_check: bool = False) -> None:
        super().__init__()
        self._history_to_compact = history_to_compact  # where the 503s around an overflow wait
        self._huge_id: str | None = None  # the one id of every huge read, when they share it
        self._huge_reads_share_id = huge_reads_share_id
        if ids is not None:  # the explored world's call ids come from its seed
            self.draw_ids_from(ids.stream("ids:call"))
        self._faults = {r.call: r for r in replies}
        self.calls = 0
        self.calm = False
        self.fired: list[ReplyFault] = []
        self._outage: tuple[tuple[tuple[str, str], ...], ReplyFault] | None = None
        self._grace_outages = frozenset(grace_outages)
        self.graces = 0  # grace requests of the faulty phase, a retry not counted again
        self._shaping: dict[str, list[_Shaping]] = {}  # a turn's reply shapes under way
        # the corrections answered with nothing (``sim/explore/corrected.py``), when on
        self._corrections: set[tuple[str, int]] | None = set() if empty_after_correction else None
        self._refuse_the_check = refuse_the_check  # ``sim/explore/gated.py``

    def _reply(self, request: ProviderRequest) -> ProviderReply:
        self.calls += 1
        if request.purpose == "grace" and not self.calm:
            self._grace_outage(request)
        if request.purpose != "turn":  # grace or compaction summary: otherwise never faulted
            return text("Summary: the work so far is recorded above.")
        fault = None if self.calm else self._faults.get(self.calls)
        if fault is not None and fault.kind in _SHAPES:  # a shape goes on with its turn
            turn = "" if fault.kind is FaultKind.ERRORS_AROUND_OVERFLOW else _turn_of(request)
            self._shaping.setdefault(turn, []).append(_Shaping(fault))  # "": the first turn
            fault = None  # with a history a compaction can relieve takes it
        refused = self._outage is not None and not self.calm and self._outage[0] == _asked(request)
        if not refused and not self.calm and (shaped := self._shaped(request, fault)) is not None:
            return shaped  # a shape under way goes on over what the plan holds for the call
        if not refused and not self.calm and self._corrections is not None \
                and (corrected := _corrected_after_tools(request)) is not None \
                and corrected not in self._corrections:
            self._corrections.add(corrected)  # once per correction, then answered as ever
            self.fired.append(ReplyFault(call=self.calls, kind=FaultKind.EMPTY_AFTER_CORRECTION))
            return ProviderReply(content="", finish_reason="stop")
        if not self.calm and self._refuse_the_check and asks_for_the_check(request):
            self.fired.append(ReplyFault(call=self.calls, kind=FaultKind.CHECK_REFUSED))
            raise ProviderRejected(f"400 at call {self.calls}: the check is refused", status=400)
        if refused and self._outage is not None:
            fault = self._outage[1]  # a retry of the request an outage refused: refused again,
            # whatever the plan holds for this call (an outage is one kind of failure)
        elif fault is not None:
            self.fired.append(fault)
        if fault is not None and fault.kind is FaultKind.OUTAGE:
            self._outage = (_asked(request), fault)
            raise ProviderServerError(f"503 at call {self.calls}: outage", status=503)
        if fault is not None and fault.kind is FaultKind.SLOW_REPLY:  # the world delays it
            return _thought_first(_answer(request))
        if fault is None or fault.kind is FaultKind.STREAM_CUT:  # the world cuts it (run.py)
            return _answer(request)
        if fault.kind is FaultKind.LONE_SURROGATE:
            answer = _answer(request)
            return answer.model_copy(update={"content": (answer.content or "") + LONE_SURROGATE})
        if fault.kind is FaultKind.SHARED_CALL_IDS:
            shared = self._next_id()  # one id, drawn like any other, for both calls
            return calls_sharing_id(shared, ("read_file", {"path": "notes-1.txt"}),
                                    ("read_file", {"path": "notes-2.txt"}))
        if fault.kind is FaultKind.HUGE_READ and self._huge_reads_share_id:
            self._huge_id = self._huge_id or self._next_id()  # the first one's, every time
            return calls_sharing_id(self._huge_id, ("read_file", {"path": BIG_LOG}))
        return _faulty(fault)

    def _shaped(self, request: ProviderRequest, planned: ReplyFault | None) -> ProviderReply | None:
        """The next reply of a shape in the request's turn, if one is due now
        (``sim/explore/shapes.py``); its first reply counts it as fired. A shape not begun
        yet leaves a call the plan faults to that fault; one under way goes on over it."""
        waiting = self._shaping.get("", [])
        if waiting and len(request.messages) >= self._history_to_compact:
            self._shaping.setdefault(_turn_of(request), []).append(waiting.pop(0))
        for shaping in self._shaping.get(_turn_of(request), []):
            if planned is not None and shaping.step == 0:
                continue
            reply = shaping.next(request)
            if reply is None:
                continue
            if shaping.step == 1:
                self.fired.append(shaping.fault)
            if shaping.done:
                self._shaping[_turn_of(request)].remove(shaping)
            if isinstance(reply, Exception):
                raise reply
            return reply
        return None

    def _grace_outage(self, request: ProviderRequest) -> None:
        """A 503 to the plan's n-th grace request and to every retry of it, as an outage of
        a turn's call: its retries spent, the grace call goes to the fallback (LOOP-6)."""
        retry = self._outage is not None and self._outage[0] == _asked(request)
        if not retry:
            self.graces += 1
            if self.graces not in self._grace_outages:
                return
            fault = ReplyFault(call=self.calls, kind=FaultKind.OUTAGE)
            self.fired.append(fault)
            self._outage = (_asked(request), fault)
        raise ProviderServerError(f"503 at call {self.calls}: outage (a grace call)", status=503)

    def for_fallback(self) -> ExploreModel:
        """The model behind the fallback route: never faulted, its call ids drawn from the
        same stream as this one's, never one of them (LOOP-6)."""
        other = ExploreModel()
        other._id_stream, other._ids_taken = self._id_stream, self._ids_taken
        return other


_SHAPES = frozenset({FaultKind.CUT_OFF_ARGUMENTS, FaultKind.TRUNCATED_CALL,
                     FaultKind.MALFORMED_AGAIN, FaultKind.THINK_ONLY,
                     FaultKind.MIXED_HOUSEKEEPING, FaultKind.ERRORS_AROUND_OVERFLOW,
                     FaultKind.PADDED_ANSWER})
_MALFORMED = '{"path" "notes-1.txt"}'  # not JSON, and not cut off: it ends in a brace
_CUT_OFF = '{"path": "notes-1.t'  # cut off mid-value


class _Shaping:
    """One reply shape under way in a turn: the replies it gives, in order, each when the
    request is one it fits (``next``); None leaves the request to the plain answer."""

    def __init__(self, fault: ReplyFault) -> None:
        self.fault = fault
        self.step = 0
        self.done = False

    def next(self, request: ProviderRequest) -> ProviderReply | Exception | None:
        reply = self._reply(request)
        if reply is not None:
            self.step += 1
        return reply

    def _reply(self, request: ProviderRequest) -> ProviderReply | Exception | None:
        kind, step, call = self.fault.kind, self.step, self.fault.call
        offered = {t.name for t in request.tools}
        if kind in (FaultKind.CUT_OFF_ARGUMENTS, FaultKind.TRUNCATED_CALL):
            if "read_file" not in offered:
                return None
            self.done = True
            return tool_calls(("read_file", _CUT_OFF), finish_reason="length"
                              if kind is FaultKind.TRUNCATED_CALL else "tool_calls")
        if kind is FaultKind.MALFORMED_AGAIN:
            if "read_file" not in offered:
                return None
            if step == 1:  # the try after the malformed one: a round whose arguments parse
                return tool_calls(("read_file", {"path": "notes-1.txt"}))
            if step == 2 and not _after_tools(request):
                return None
            self.done = step >= 3
            return tool_calls(("read_file", _MALFORMED))
        if kind is FaultKind.THINK_ONLY:
            if not _after_tools(request):
                return None
            self.done = True  # at an odd call the model never closes the block, which then
            close = "</think>" if call % 2 == 0 else ""  # runs to the end of the reply
            return ProviderReply(content=f"<think>That is what the file says.{close}",
                                 finish_reason="stop")
        if kind is FaultKind.MIXED_HOUSEKEEPING:
            if step == 0:
                if not {"todo", "read_file"} <= offered or _after_tools(request):
                    return None
                return tool_calls(("todo", {"action": "add", "text": "check notes-1.txt"}),
                                  ("read_file", {"path": "notes-1.txt"}),
                                  content="Noted, and reading notes-1.txt.")
            self.done = True
            return ProviderReply(content="", finish_reason="stop")
        if kind is FaultKind.ERRORS_AROUND_OVERFLOW:
            self.done = step >= 4
            if step == 2:
                return ContextOverflow(f"maximum context length exceeded (a shape of call {call})",
                                       status=400)
            return ProviderServerError(f"503 (a shape of call {call}, {step + 1} of 5)", status=503)
        # PADDED_ANSWER: the plain answer, when it is text, with whitespace at its edges
        answer = _answer(request)
        if answer.tool_calls or not answer.content:
            return None
        self.done = True
        return answer.model_copy(update={"content": f"\n  {answer.content}  \n"})


def _turn_of(request: ProviderRequest) -> str:
    """The turn a request belongs to, by its user row (its turn id, else its text)."""
    for message in reversed(request.messages):
        if message.role is Role.USER and message.scaffold is None:
            return message.turn_id or (message.content or "")
    return ""


def _after_tools(request: ProviderRequest) -> bool:
    """Whether a tool round of the turn came after its user row."""
    for message in reversed(request.messages):
        if message.role is Role.TOOL:
            return True
        if message.role is Role.USER and message.scaffold is None:
            return False
    return False


def _corrected_after_tools(request: ProviderRequest) -> tuple[str, int] | None:
    """When the request ends on a correction its turn took in after a tool round (a user
    row of the turn after its first, a tool row between them), the turn and how many user
    rows it has: the correction's key. Else None."""
    messages = request.messages
    last = messages[-1] if messages else None
    if last is None or last.role is not Role.USER or last.scaffold is not None \
            or last.turn_id is None:
        return None
    rows = [i for i, m in enumerate(messages)
            if m.role is Role.USER and m.scaffold is None and m.turn_id == last.turn_id]
    if len(rows) < 2 or not any(m.role is Role.TOOL for m in messages[rows[0]:rows[-1]]):
        return None
    return last.turn_id, len(rows)


def _asked(request: ProviderRequest) -> tuple[tuple[str, str], ...]:
    """What a request says, message by message: a retry says the same."""
    return tuple((m.role.value, m.content or "") for m in request.messages)


def _thought_first(answer: ProviderReply) -> ProviderReply:
    """A slow answer thinks aloud first, in an inline think block: a correction that cuts
    it must keep only what was visible (LOOP-4)."""
    return answer.model_copy(update={"content": "<think>Let me look at this.</think>"
                                                + (answer.content or "")})


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
    if kind is FaultKind.OVERFLOW:
        raise ContextOverflow(f"maximum context length exceeded at call {fault.call}", status=400)
    if kind is FaultKind.AUTH_ERROR:
        raise ProviderAuthError(f"401 at call {fault.call}", status=401)
    if kind is FaultKind.REASONING_ONLY:
        return ProviderReply(content=None, reasoning="Thinking it over.")
    if kind is FaultKind.NARRATED_CALL:
        return ProviderReply(content="Let me read notes-1.txt now.", finish_reason="tool_calls")
    if kind is FaultKind.DEEP_ARGUMENTS:  # the same every time: a local bug, not bad JSON
        return tool_calls(("read_file", "[" * 50_000 + "]" * 50_000))
    if kind is FaultKind.RUN_CODE:
        return tool_calls(("execute_code", {"code": "print(6 * 7)"}))
    if kind is FaultKind.HUGE_READ:
        return tool_calls(("read_file", {"path": BIG_LOG}))
    if kind is FaultKind.REFUSED_WRITE:
        return tool_calls(edges.refused_write())
    if kind is FaultKind.WIDE_BATCH:
        return tool_calls(*(("read_file", {"path": f"notes-{1 + n % 2}.txt"}) for n in range(10)))
    return ProviderReply(content="", finish_reason="stop")


def _answer(request: ProviderRequest) -> ProviderReply:
    messages = request.messages
    if request.tools and (check := edges.check_round(messages)) is not None:
        return tool_calls(check)  # asked to check its work: it reads what it wrote
    asked_at = next((i for i in range(len(messages) - 1, -1, -1)
                     if messages[i].role is Role.USER and _ASKS.match(messages[i].content or "")),
                    None)
    if asked_at is None:
        return text("Nothing was asked.")
    asked = (messages[asked_at].content or "").split("\n\n<context>\n", 1)[0]  # sans its notes
    if request.tools and (retry := edges.retry_round(asked, messages[asked_at + 1:])) is not None:
        return tool_calls(retry)  # a patch that fails, then the write that redoes it
    if request.tools and (chore := edges.chore_round(asked, messages[asked_at + 1:])) is not None:
        return tool_calls(chore)  # a long chore: one read a round
    tools_ran = any(m.role is Role.TOOL for m in messages[asked_at + 1:])
    if tools_ran or not request.tools:
        return text(f"Done: {asked}")
    if (rewrite := edges.rewrite_round(asked)) is not None:  # a read and a write, one file
        return tool_calls(*rewrite)
    if (folder := edges.folder_round(asked)) is not None:  # a write inside, a search of, one folder
        return tool_calls(*folder)
    if (both := _READ_TWO.match(asked)) is not None:  # one round, two calls side by side
        return tool_calls(("read_file", {"path": both.group(1)}),
                          ("read_file", {"path": both.group(2)}))
    if (read := _READ.match(asked)) is not None:
        return tool_calls(("read_file", {"path": read.group(1)}))
    if (write := _WRITE.match(asked)) is not None:
        return tool_calls(("write_file", {"path": write.group(2),
                                          "content": f"note {write.group(1)}"}))
    return text(f"Hello back: {asked}")
