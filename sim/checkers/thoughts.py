"""What a model reply reasoned, read by the checkers' own rule.

Theory of operation
-------------------
The empty-reply ladder (LOOP-8) hands a reply's reasoning back as a prefill, the nudge
after a tool round is skipped for a reply that reasoned in a think block, and no stored
row may hold reasoning (LOOP-4, SCAF-1). A checker that judged those with the engine's
own helpers (``ladder.reasoning_of``, ``ladder.inline_reasoning``, ``ladder.visible_text``)
would share any bug put into them: an engine that stopped reading think blocks as reasoning would expect of
itself exactly what it did, and pass. So the checkers read reasoning here, from the
reply the world's provider returned, by the rule the catalog states: a reply's
structured reasoning, else the text of its inline think blocks (``<think>``,
``<thinking>`` or ``<reasoning>``; an unclosed one runs to the end of the text).
"""

from __future__ import annotations

import re

from hermes_ref.models import ProviderReply

_BLOCK = re.compile(r"<(think|thinking|reasoning)>(.*?)(?:</\1>|\Z)", re.DOTALL | re.IGNORECASE)


def inline_thought(text: str | None) -> str:
    """The text of the think blocks in ``text``, joined; "" when it has none."""
    return "\n".join(m.group(2).strip() for m in _BLOCK.finditer(text or "")).strip()


def visible_text(text: str | None) -> str:
    """``text`` without its think blocks: what a reader of the reply is shown, stripped."""
    return _BLOCK.sub("", text or "").strip()


def as_stored(text: str | None) -> str | None:
    """``text`` as a row may hold it: unchanged, unless it has a think block, which must
    come out (LOOP-4), leaving the visible text."""
    if text is None or _BLOCK.search(text) is None:
        return text
    return visible_text(text)


def thought_of(reply: ProviderReply | None) -> str:
    """What ``reply`` reasoned: its structured reasoning, else its inline think blocks."""
    if reply is None:
        return ""
    return (reply.reasoning or "").strip() or inline_thought(reply.content)
