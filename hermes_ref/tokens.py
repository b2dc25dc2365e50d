"""Deterministic token estimates.

The reference engine needs a token count that is the same on every machine and every
run, so it uses a fixed rule instead of a model tokenizer: one token per four characters
of text (rounded up), plus a fixed overhead per message and per tool call. Real providers
report their own counts in ``usage``; the engine prefers those where it has them.
"""

from __future__ import annotations

from typing import Any

MESSAGE_OVERHEAD_TOKENS = 4
TOOL_CALL_OVERHEAD_TOKENS = 3


def count_text(text: str | None) -> int:
    """Tokens of a piece of text: ceil(len / 4)."""
    if not text:
        return 0
    return (len(text) + 3) // 4


def count_message(wire: dict[str, Any]) -> int:
    """Tokens of one wire message."""
    total = MESSAGE_OVERHEAD_TOKENS + count_text(wire.get("content"))
    for call in wire.get("tool_calls") or ():
        fn = call["function"]
        total += TOOL_CALL_OVERHEAD_TOKENS + count_text(fn["name"]) + count_text(fn["arguments"])
    return total


def count_wire_messages(messages: list[dict[str, Any]]) -> int:
    return sum(count_message(m) for m in messages)
