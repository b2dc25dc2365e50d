"""The token estimate, restated for the checkers.

Theory of operation
-------------------
Every compaction and window rule (CMP-1 to CMP-9, LOOP-6, LOOP-9, CTX-3) is a comparison
of token counts, and the reference engine counts tokens by a fixed, machine-independent
rule instead of a model's tokenizer:

* a piece of text costs one token per four characters, rounded up (empty text costs 0);
* every message costs a fixed 4 tokens on top of its content;
* every tool call a message carries costs a fixed 3 tokens on top of its name and its
  argument text, each counted as text.

A checker that asked the engine's own counter (``hermes_ref.tokens``) whether the engine
counted right would always hear yes: a counter that forgot the per-call overhead would
under-count the request and the checker alike, and a request over the window would look
like one that fits. So the rule is written out again here, from its statement above, and
every checker counts with these functions. The two numbers are data the rule names, and
are spelled here rather than imported for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

MESSAGE_TOKENS = 4  # what one message costs before its content
TOOL_CALL_TOKENS = 3  # what one tool call costs before its name and arguments
CHARS_PER_TOKEN = 4


def text_tokens(text: str | None) -> int:
    """Tokens of one piece of text: its characters divided by four, rounded up."""
    if not text:
        return 0
    whole, part = divmod(len(text), CHARS_PER_TOKEN)
    return whole + (1 if part else 0)


def message_tokens(wire: Mapping[str, Any]) -> int:
    """Tokens of one message in its wire form (``role``, ``content``, ``tool_calls``)."""
    total = MESSAGE_TOKENS + text_tokens(wire.get("content"))
    for call in wire.get("tool_calls") or ():
        function = call["function"]
        total += TOOL_CALL_TOKENS + text_tokens(function["name"]) \
            + text_tokens(function["arguments"])
    return total


def wire_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Tokens of a list of wire messages: the sum of each one's."""
    return sum(message_tokens(m) for m in messages)


def route_window_tokens(context_window_tokens: int, token_ratio: float) -> int:
    """A fallback route's window in this estimate (LOOP-6): the route counts
    ``token_ratio`` of its own tokens per token of the estimate, so its window holds its
    size divided by the ratio, rounded down (a request must fit, not nearly fit)."""
    return int(context_window_tokens / token_ratio)
