"""How a pass must split a list, by the spec's own arithmetic (CMP-1, CMP-2), computed apart
from the engine's planner: the protected head, the tail kept by token budget over its
floor, the middle between them, and the old tool outputs pruning would rewrite.

Theory of operation
-------------------
The head is the first ``compression_protect_first`` messages of the conversation, none once
a summary is in the list; its end moves forward past tool results. The tail is kept from
the end while it fits ``threshold × target ratio`` tokens (``compaction_record.tail_tokens``,
the catalog's figures), and never fewer than ``compression_tail_floor_messages`` messages;
its start moves back over tool results to their call. A retry's scaffolding (a nudge, a
prefill) lives in the working list only: it is kept where it lies and costs its tokens, but
counts toward neither the head nor the floor, since it is never stored. A hidden row (a reply
a correction cut, LOOP-4) goes on no wire, so it costs the tail's budget nothing. The turn's
own user message, when it falls in the middle, is lifted out and kept (CTX-7), so it is not
something to summarize; neither is scaffolding nor an earlier summary.

A pass writes something when pruning rewrites a tool output or a middle is left to
summarize (``has_work``). The checkers ask the engine's planner the same question to read
CMP-4's streak as the engine counts it; where the two answers differ, the planner judged a
list empty that the spec says has a middle, and CMP-2's checker reports it.
"""

from __future__ import annotations

from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role
from sim.checkers.compaction_record import PRUNED_PREFIX, is_summary, tail_tokens
from sim.checkers.measure import message_tokens


def _cost(row: Message) -> int:
    """What a row adds to a request: nothing for a hidden one (LOOP-4)."""
    return 0 if row.hidden else message_tokens(row.wire)


def tail_start(rows: tuple[Message, ...], budget: int, floor: int) -> int:
    """Where the tail kept by ``budget`` tokens, over a floor of ``floor`` stored messages,
    starts (before moving back over tool results)."""
    start, spent, kept = len(rows), 0, 0
    while start > 0:
        row = rows[start - 1]
        if kept >= floor and spent + _cost(row) > budget:
            break
        spent += _cost(row)
        kept += row.scaffold is None
        start -= 1
    return start


def head_end(rows: tuple[Message, ...], limits: Limits) -> int:
    """Where the protected head ends: none once a summary is in the list, else after the
    first ``compression_protect_first`` stored messages and the tool results that follow."""
    end = 0
    if not any(is_summary(m) for m in rows):
        kept = 0
        while end < len(rows) and kept < limits.compression_protect_first:
            kept += rows[end].scaffold is None
            end += 1
    while end < len(rows) and rows[end].role is Role.TOOL:
        end += 1
    return end


def split(rows: tuple[Message, ...], limits: Limits) -> tuple[int, int]:
    """The head's end and the tail's start, neither splitting a tool group."""
    head = head_end(rows, limits)
    start = tail_start(rows, tail_tokens(limits), limits.compression_tail_floor_messages)
    while 0 < start < len(rows) and rows[start].role is Role.TOOL:
        start -= 1
    return head, max(start, head)


def placeholder(row: Message) -> str | None:
    """The text pruning gives an old tool output, or None where it keeps it: not a tool
    result, already pruned, or no longer than its placeholder."""
    text = row.content
    if row.role is not Role.TOOL or text is None or text.startswith(PRUNED_PREFIX):
        return None
    short = f"{PRUNED_PREFIX}{len(text)} characters]"
    return short if len(text) > len(short) else None


def prunable(rows: tuple[Message, ...], limits: Limits) -> list[tuple[Message, str]]:
    """The old tool outputs between the head and the tail, each with its placeholder."""
    head, start = split(rows, limits)
    return [(row, text) for row in rows[head:start] if (text := placeholder(row)) is not None]


def own_index(rows: tuple[Message, ...], text: str | None) -> int | None:
    """The turn's own user message (CTX-7): the last user row with its text, else the last
    user row; never scaffolding, never a summary."""
    users = [i for i, m in enumerate(rows)
             if m.role is Role.USER and m.scaffold is None and not is_summary(m)]
    matching = [i for i in users if text is not None and rows[i].content == text]
    found = matching or users
    return found[-1] if found else None


def middle(rows: tuple[Message, ...], limits: Limits, text: str | None) -> list[Message]:
    """What a pass over ``rows`` summarizes: the messages between the head and the tail,
    without scaffolding, an earlier summary, or the turn's own message."""
    head, start = split(rows, limits)
    own = own_index(rows, text)
    return [m for i, m in enumerate(rows) if head <= i < start and i != own
            and m.scaffold is None and not is_summary(m)]


def has_work(rows: tuple[Message, ...], limits: Limits, text: str | None) -> bool:
    """Whether a pass over ``rows`` writes something: an output to prune, a middle to
    summarize (after pruning, which changes no row's place)."""
    return bool(prunable(rows, limits)) or bool(middle(rows, limits, text))
