"""Checkers of reply intake: what a provider's reply must become before the engine uses it.

Theory of operation
-------------------
A provider can send what the engine cannot keep as it is: text holding a lone UTF-16
surrogate (``"\\ud83d"`` in JSON, or a pair split across two stream deltas), and tool
calls of one reply that share an id. The engine takes every reply in through one rule
(``hermes_ref.reply_intake``): a surrogate pair written as two halves becomes its one
character, any other surrogate becomes U+FFFD, and a repeated call id becomes
``<id>_d<n>`` (the smallest n from 2 that no id of the reply has).

The checkers judge the engine against the provider's own log (``obs.calls``), so they
must know that rule too. ``taken_in`` states it again here, written independently of the
engine's code: a sabotage that breaks the engine's intake leaves this statement intact,
and the record then disagrees with it. Other checkers compare the record with
``taken_in(reply)``, never with the raw reply (``answer_delivered``,
``calls_keep_their_place``).
"""

from __future__ import annotations

from collections import Counter

from hermes_ref.models import ProviderReply, ToolCall
from sim.checkers.base import Observation, Violation, checker

_HIGH = range(0xD800, 0xDC00)
_LOW = range(0xDC00, 0xE000)
REPLACEMENT = "\ufffd"


def taken_in_text(text: str | None) -> str | None:
    """``text`` as the engine must take it in: halves joined, lone surrogates U+FFFD."""
    if text is None or text.isascii():
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        code = ord(text[i])
        if code in _HIGH and i + 1 < len(text) and ord(text[i + 1]) in _LOW:
            out.append(chr(0x10000 + ((code - 0xD800) << 10) + (ord(text[i + 1]) - 0xDC00)))
            i += 2
            continue
        out.append(REPLACEMENT if code in _HIGH or code in _LOW else text[i])
        i += 1
    return "".join(out)


def taken_in_calls(calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
    """The calls as the engine must record them: clean text, and an id of their own each."""
    clean = [ToolCall(id=taken_in_text(c.id) or "", name=taken_in_text(c.name) or "",
                      arguments=taken_in_text(c.arguments) or "") for c in calls]
    taken = {c.id for c in clean}
    seen: set[str] = set()
    out = []
    for call in clean:
        if call.id in seen:
            n = 2
            while f"{call.id}_d{n}" in taken:
                n += 1
            call = call.model_copy(update={"id": f"{call.id}_d{n}"})
            taken.add(call.id)
        seen.add(call.id)
        out.append(call)
    return tuple(out)


def taken_in(reply: ProviderReply) -> ProviderReply:
    """The whole reply as the engine must take it in (see the module docstring)."""
    return reply.model_copy(update={
        "content": taken_in_text(reply.content), "reasoning": taken_in_text(reply.reasoning),
        "tool_calls": taken_in_calls(reply.tool_calls),
    })


@checker("call_ids_distinct", ("TOOL-3",),
         "every call of a durable call row has an id no other call of the row has, so each "
         "call can have its own result")
def call_ids_distinct(obs: Observation) -> list[Violation]:
    """Two calls of one row under one id cannot each get a result: the record cannot say
    which result answers which call, and one call's effect is in no row. Read turn by turn
    (session and turn), since ids may repeat across rounds and turns."""
    out = []
    for view in obs.turns.values():
        for row in view.rows:
            if len(row.tool_calls) < 2:
                continue  # most rows: no two calls to share an id
            counts = Counter(c.id for c in row.tool_calls)
            for call_id, n in counts.items():
                if n > 1:
                    out.append(Violation("call_ids_distinct", "TOOL-3",
                                         f"turn {view.key}: row #{row.row_id} holds {n} calls "
                                         f"with id {call_id!r}; their results cannot be told apart"))
    return out
