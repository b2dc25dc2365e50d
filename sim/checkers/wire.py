"""Checkers of what crosses the wire: only wire keys, the durable history, sidecar bytes replayed.

Every reading here parses the request body the world recorded (``CallRecord.body``, the
bytes ``ProviderRequest.body`` produced and ``HttpProvider`` would post), never the
engine's request object: a key that leaks anywhere on the way out is in those bytes.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from functools import partial
from itertools import repeat
from operator import le
from typing import Any

from hermes_ref.models import WIRE_MESSAGE_KEYS, Message, Role
from sim.checkers.base import (
    Observation,
    Violation,
    checker,
    remembered,
)
from sim.world import CallRecord, RewriteRun

WireMessage = dict[str, Any]


def sent_messages(call: CallRecord) -> list[WireMessage] | str:
    """The messages the recorded body carries, or what is wrong with the body.

    Read once per record and kept with it (``CallRecord.readings``): a dozen checkers ask
    at every check, and the body never changes. The list is the shared parse of the body
    (``CallRecord.sent``) either way."""
    readings = call.readings
    if "sent messages" not in readings:
        readings["sent messages"] = _sent_messages(call)
    found: list[WireMessage] | str = readings["sent messages"]
    return found


def _sent_messages(call: CallRecord) -> list[WireMessage] | str:
    try:
        sent = call.sent
    except ValueError:
        sent = None
    if not isinstance(sent, dict):
        return f"its recorded body is not a JSON object ({len(call.body)} bytes)"
    messages = sent.get("messages")
    if not isinstance(messages, list) or not all(map(isinstance, messages, repeat(dict))):
        return "its recorded body carries no list of message objects"
    return messages


# ---- the wire ----------------------------------------------------------------------------


@checker("no_private_keys_on_wire", ("WIRE-3",),
         "request bodies carry only wire keys: no _-keys, no sidecar or bookkeeping fields, "
         "in the messages, the body's own keys or its tool definitions")
def no_private_keys_on_wire(obs: Observation) -> list[Violation]:
    out = []
    for call in obs.calls:  # a call's body never changes: its finding is read once
        problem = remembered(obs, "WIRE-3", (call,), partial(_private_keys, call))
        if problem is not None:
            out.append(Violation("no_private_keys_on_wire", "WIRE-3",
                                 f"call at effect {call.seq}: {problem}"))
    return out


# The chat-completions request as the wire knows it, written down here rather than read
# from the engine (whose list is what a leak would edit too): the body's own keys, a tool
# definition's, and its function's. Messages keep to ``WIRE_MESSAGE_KEYS``.
REQUEST_KEYS = frozenset({"model", "messages", "tools", "tool_choice", "max_tokens", "stream",
                          "stream_options", "temperature", "top_p", "stop", "seed"})
TOOL_KEYS = frozenset({"type", "function"})
FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
# The keys no rule below names: a message or definition holding only these is clean.
_PLAIN_MESSAGE_KEYS = frozenset(k for k in WIRE_MESSAGE_KEYS if not k.startswith("_"))
_PLAIN_TOOL_KEYS = frozenset(k for k in TOOL_KEYS if not k.startswith("_"))
_PLAIN_FUNCTION_KEYS = frozenset(k for k in FUNCTION_KEYS if not k.startswith("_"))


def _private_keys(call: CallRecord) -> str | None:
    messages = sent_messages(call)
    if isinstance(messages, str):  # silence is no pass: a body must be there to judge
        return messages
    for index, message in enumerate(messages):
        if message.keys() <= _PLAIN_MESSAGE_KEYS:
            continue  # the common case, decided at once: no key to name
        bad = sorted(k for k in message if k.startswith("_") or k not in WIRE_MESSAGE_KEYS)
        if bad:
            return f"message {index} carries {', '.join(bad)}"
    return _private_outside_messages(call.sent)


def _private_outside_messages(body: dict[str, Any]) -> str | None:
    """The rest of the body: its own keys, then each tool definition (a tool's parameter
    schema is the tool's own and is not read)."""
    bad = sorted(k for k in body if k.startswith("_") or k not in REQUEST_KEYS)
    if bad:
        return f"the body carries {', '.join(bad)}"
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        return "its tools are not a list"
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or not isinstance(function, dict):
            return f"tool {index} is not a function definition"
        if tool.keys() <= _PLAIN_TOOL_KEYS and function.keys() <= _PLAIN_FUNCTION_KEYS:
            continue  # the common case, decided at once: no key to name
        bad = sorted({k for k in tool if k.startswith("_") or k not in TOOL_KEYS}
                     | {k for k in function if k.startswith("_") or k not in FUNCTION_KEYS})
        if bad:
            return f"tool {index} ({function.get('name')}) carries {', '.join(bad)}"
    return None


# A message as alignment compares it: its head (role, tool call id, the ids of the calls it
# makes), which must match, and its content, which must match where content is judged.
Shape = tuple[tuple[Any, Any, tuple[Any, ...]], Any]


def _shape(wire: WireMessage) -> Shape:
    return ((wire.get("role"), wire.get("tool_call_id"),
             tuple(c.get("id") for c in wire.get("tool_calls") or () if isinstance(c, dict))),
            wire.get("content"))


def _sent_shapes(call: CallRecord) -> list[tuple[WireMessage, Shape]] | str:
    """The sent messages but the system prompt, each with its shape, or what is wrong with
    the body (``sent_messages``). Read once per record and kept with it: both alignments
    of a call (CTX-2's by content, WIRE-1's by position) walk the same messages."""
    readings = call.readings
    if "sent shapes" not in readings:
        messages = sent_messages(call)
        system = Role.SYSTEM.value  # read once: an enum's value is a property
        readings["sent shapes"] = messages if isinstance(messages, str) else [
            (m, _shape(m)) for m in messages if m.get("role") != system]
    found: list[tuple[WireMessage, Shape]] | str = readings["sent shapes"]
    return found


@checker("requests_match_record", ("CTX-2",),
         "each request carries the durable transcript in order; extras only after the turn's user row")
def requests_match_record(obs: Observation) -> list[Violation]:
    out = []
    for call in obs.calls:
        problem = aligned(obs, call)[1]
        if problem:
            out.append(Violation("requests_match_record", "CTX-2",
                                 f"call at effect {call.seq}: {problem}"))
    return out


def aligned(obs: Observation, call: CallRecord, by_content: bool = True,
            ) -> tuple[Aligned, str | None]:
    """``align_request`` of ``call`` against the rows durable when it was made.

    The answer depends only on the call, those rows and the rewrites since: kept between
    checks while every one of those rows is the same value (a compaction or a rewrite
    that replaces one makes it read again)."""
    durable, rewritten = _at_the_call(obs, call)
    shapes: RowShapes = obs.reading("row shapes", dict)
    return remembered(obs, "align", (call, *durable),
                      lambda: align_request(call, durable, rewritten, by_content, shapes),
                      extra=(by_content, rewritten))


def _at_the_call(obs: Observation, call: CallRecord) -> tuple[list[Message], frozenset[int]]:
    """``_durable_at`` and ``rewritten_since`` of ``call``, read once per observation: both
    alignments of a call (by content for CTX-2, by position for WIRE-1) ask for them. Kept
    with the call itself, so an id is never taken for another call's."""
    kept: dict[int, tuple[CallRecord, list[Message], frozenset[int]]] = obs.reading(
        "rows at each call", dict)
    hit = kept.get(id(call))
    if hit is None or hit[0] is not call:
        hit = kept[id(call)] = (call, _durable_at(obs, call), rewritten_since(obs, call))
    return hit[1], hit[2]


def _durable_at(obs: Observation, call: CallRecord) -> list[Message]:
    """The session's rows that were committed when ``call`` was made (``lineage.rows_at``)."""
    cuts = [c.first_row_id for c in obs.record.compactions if c.child_id is None
            and c.session_id == call.session_id and c.first_row_id <= call.watermark]
    floor = max(cuts, default=0)  # the last compaction in place by then archived what was before
    ids, rows = _sent_rows(obs).get(call.session_id, ((), ()))
    if ids is None:  # row ids out of order: no slicing by them
        return [m for m in rows if floor <= (m.row_id or 0) <= call.watermark]
    return list(rows[bisect_left(ids, floor):bisect_right(ids, call.watermark)])


SentRows = dict[str, tuple[list[int] | None, list[Message]]]


def _sent_rows(obs: Observation) -> SentRows:
    """Each session's rows that may go out (a hidden row never does, LOOP-4), live or
    archived, in row order, with their ids (None when they are not ascending), read once
    per observation."""
    def read() -> SentRows:
        out: SentRows = {}
        for session_id in {m.session_id for m in obs.record.messages} | {
                m.session_id for m in obs.record.archived}:
            rows = [m for m in obs.written_rows(session_id) if not m.hidden]
            ids = [m.row_id or 0 for m in rows]
            out[session_id] = (ids if all(map(le, ids, ids[1:])) else None, rows)
        return out
    found: SentRows = obs.reading("sent rows", read)
    return found


# Each row's shape by the row's id, with the row (``_row_shape``).
RowShapes = dict[int, tuple[Message, Shape]]


def _row_shape(row: Message, shapes: RowShapes | None) -> Shape:
    """``_shape`` of the row's wire form, made once per row and observation when ``shapes``
    is given: every request of a session carries the same rows, and each alignment
    compares them all. A row is frozen, so its shape never changes; it is kept with the
    row itself, so an id is never taken for another row's."""
    if shapes is None:
        return _shape(row.wire)
    kept = shapes.get(id(row))
    if kept is None or kept[0] is not row:
        kept = shapes[id(row)] = (row, _shape(row.wire))
    return kept[1]


def _same(sent: Shape, row: Message, rewritten: frozenset[int] = frozenset(),
          by_content: bool = True, shapes: RowShapes | None = None) -> bool:
    """Does a sent message of shape ``sent`` stand for ``row``?"""
    b = _row_shape(row, shapes)
    if sent[0] != b[0]:
        return False
    if not by_content or row.row_id in rewritten:  # rewritten since (WIRE-2): the call sent what it said then
        return True
    return sent[1] == b[1] or not str(sent[1] or "").strip()


def rewritten_since(obs: Observation, call: CallRecord) -> frozenset[int]:
    """Rows whose content a rewrite the harness asked for changed after ``call`` was made."""
    rewrites: tuple[RewriteRun, ...] = obs.reading("rewrites", lambda: tuple(
        r for r in obs.runs or () if isinstance(r, RewriteRun)))
    return frozenset(r.row_id for r in rewrites if r.seq >= call.seq)


Aligned = list[tuple[WireMessage, Message]]


def align_request(call: CallRecord, durable: list[Message],
                  rewritten: frozenset[int] = frozenset(),
                  by_content: bool = True, shapes: RowShapes | None = None,
                  ) -> tuple[Aligned, str | None]:
    """Pair the sent messages (parsed from the body) with durable rows, in order.

    Returns the pairs and the problem if the history differs: durable rows must appear in
    order; anything else only after this turn's user row. A body with no messages to
    read aligns nothing and is WIRE-3's finding. With ``by_content`` false a row pairs by
    position, role and tool ids alone, so a row sent with the wrong bytes still pairs and
    WIRE-1 can judge those bytes (CTX-2 judges the content).
    """
    sent = _sent_shapes(call)
    if isinstance(sent, str):
        return [], None
    pairs: Aligned = []
    in_turn = False
    for message, shape in sent:
        matched = len(pairs)
        if matched < len(durable) and _same(shape, durable[matched], rewritten, by_content,
                                            shapes):
            row = durable[matched]
            in_turn = in_turn or (row.role is Role.USER and row.turn_id == call.turn_id)
            pairs.append((message, row))
        elif not in_turn:
            where = durable[matched].row_id if matched < len(durable) else "end"
            return pairs, (f"sends a {message.get('role')} message that is not in the durable "
                           f"history before row #{where}")
    if len(pairs) < len(durable):
        return pairs, f"omits durable row #{durable[len(pairs)].row_id}"
    return pairs, None


@checker("sidecar_bytes_replayed", ("WIRE-1",),
         "a row with an api_content sidecar is sent as exactly those bytes, on every later call; "
         "a user row stores the bare text, a strict prefix of its sidecar")
def sidecar_bytes_replayed(obs: Observation) -> list[Violation]:
    out = []
    for stored in obs.record.messages:
        row = stored.message
        sidecar = row.api_content
        if row.role is Role.USER and sidecar is not None and (
                sidecar == row.content or not sidecar.startswith(row.content or "")):
            out.append(Violation("sidecar_bytes_replayed", "WIRE-1",
                                 f"user row #{row.row_id} of turn {row.turn_id} stores content "
                                 f"{(row.content or '')[:40]!r} that is not the bare text of its "
                                 "sidecar (the injection leaked into the record)"))
    for call in obs.calls:
        # paired without reading content: a row sent without its sidecar must still pair
        pairs, _ = aligned(obs, call, by_content=False)
        for sent, row in pairs:
            if row.api_content is not None and sent.get("content") != row.api_content:
                out.append(Violation("sidecar_bytes_replayed", "WIRE-1",
                                     f"call at effect {call.seq} (turn {call.turn_id}) sent row "
                                     f"#{row.row_id} as {str(sent.get('content') or '')[:40]!r}, "
                                     "not its stored api_content"))
                break
    out.extend(_injection_in_the_record(obs))
    return out


def _injection_in_the_record(obs: Observation) -> list[Violation]:
    """A turn's own user row stores the text the user gave, as the world handed it to the
    turn (``TurnRun.text``): an injection folded into ``content`` itself has no sidecar to
    give it away, so the row is judged against the input, not against its sidecar. A row
    the harness rewrote since (a redaction) holds its new text and is not judged here."""
    runs = obs.runs or ()
    rewritten = {r.row_id for r in runs if isinstance(r, RewriteRun)}
    out = []
    for run in runs:
        if isinstance(run, RewriteRun) or run.turn_id is None:
            continue
        own = next((m for m in obs.rows_of_turn(run.turn_id) if m.role is Role.USER), None)
        if own is None or own.row_id in rewritten or own.content == run.text:
            continue
        out.append(Violation("sidecar_bytes_replayed", "WIRE-1",
                             f"user row #{own.row_id} of turn {run.turn_id} stores "
                             f"{(own.content or '')[:60]!r}, not the text the user gave "
                             f"({run.text[:40]!r}): what went to the API copy went into the "
                             "record"))
    return out
