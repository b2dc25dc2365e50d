"""Property: whatever history compaction is given, its plan and repair keep the CMP rules.

Hypothesis generates histories of user turns, each with nested tool rounds (one call or
several in parallel), text answers and multibyte text, sometimes ending on calls still
waiting for their results, under generated windows and tail floors. For each, the planned
and composed compaction (with a fixed summary) must leave no orphan, keep the last user
input and every pending call, keep the tail within its token budget (past the floor, and
whole tool groups), drop the sidecar of every rewritten message, and be the same list
when planned twice.
"""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_ref import compression as c
from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role, ToolCall

MAX_EXAMPLES = int(os.environ.get("HERMES_REF_PROPERTY_EXAMPLES", "200"))

WORDS = st.sampled_from(["plan", "figures", "naïve", "größe", "日本語", "données", "✓ done",
                         "emoji 😀", "receipt", "x" * 40])
TEXT = st.lists(WORDS, min_size=1, max_size=12).map(" ".join)


@st.composite
def histories(draw: st.DrawFn) -> tuple[tuple[Message, ...], str]:
    """A history and the current turn's text (its last user message)."""
    rows: list[Message] = []
    ids = 0
    turns = draw(st.integers(1, 8))
    for turn in range(turns):
        text = draw(TEXT)
        rows.append(Message(role=Role.USER, content=text, turn_id=f"t{turn}"))
        for _ in range(draw(st.integers(0, 4))):
            width = draw(st.integers(1, 3))
            calls = []
            for _ in range(width):
                ids += 1
                calls.append(ToolCall(id=f"c{ids}", name="read_file",
                                      arguments=f'{{"path": "{draw(WORDS)}"}}'))
            narration = draw(st.one_of(st.none(), TEXT))
            rows.append(Message(role=Role.ASSISTANT, content=narration, tool_calls=tuple(calls),
                                turn_id=f"t{turn}"))
            rows.extend(Message(role=Role.TOOL, content=draw(TEXT) * draw(st.integers(1, 6)),
                                tool_call_id=call.id, tool_name="read_file", turn_id=f"t{turn}")
                        for call in calls)
        if turn < turns - 1 or draw(st.booleans()):
            rows.append(Message(role=Role.ASSISTANT, content=draw(TEXT), turn_id=f"t{turn}"))
    if draw(st.booleans()):  # the last round is still waiting for its results
        ids += 1
        rows.append(Message(role=Role.ASSISTANT, turn_id=f"t{turns - 1}",
                            tool_calls=(ToolCall(id=f"c{ids}", name="terminal"),)))
    current = next(m.content for m in reversed(rows) if m.role is Role.USER)
    return tuple(rows), current or ""


LIMITS = st.builds(lambda window, floor, first: Limits(
    context_window_tokens=window, compression_tail_floor_messages=floor,
    compression_protect_first=first),
    st.sampled_from([300, 800, 2_000, 6_000]), st.integers(2, 10), st.integers(0, 4))


def _compact(rows: tuple[Message, ...], limits: Limits, text: str) -> tuple[Message, ...]:
    figures = c.budget(limits)
    pruned = c.prune(rows, figures, limits)
    layout = c.plan(pruned, figures, limits, text)
    return pruned if layout is None else c.compose(layout, "earlier work, in short", None)


def _orphan(rows: tuple[Message, ...], pending: frozenset[str]) -> str | None:
    called: set[str] = set()
    answered = {m.tool_call_id for m in rows if m.role is Role.TOOL}
    for m in rows:
        if m.role is Role.TOOL and m.tool_call_id not in called:
            return f"result {m.tool_call_id} has no call before it"
        for call in m.tool_calls:
            called.add(call.id)
            if call.id not in answered and call.id not in pending:
                return f"call {call.id} has no result"
    return None


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(histories(), LIMITS)
def test_compaction_leaves_no_orphan(history: tuple[tuple[Message, ...], str],
                                     limits: Limits) -> None:
    """No result without its call, no call without its result (pending calls excepted)."""
    rows, text = history
    out = _compact(rows, limits, text)
    assert _orphan(out, c.pending_calls(rows)) is None


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(histories(), LIMITS)
def test_last_user_input_and_pending_calls_survive(history: tuple[tuple[Message, ...], str],
                                                   limits: Limits) -> None:
    """The current user message is kept as it was; every pending call is kept."""
    rows, text = history
    out = _compact(rows, limits, text)
    own = rows[c.relocate_user(rows, text) or 0]
    assert any(m is own or (m.role, m.content, m.turn_id) == (own.role, own.content, own.turn_id)
               for m in out)
    kept = {call.id for m in out for call in m.tool_calls}
    assert c.pending_calls(rows) <= kept


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(histories(), LIMITS)
def test_compaction_is_deterministic_and_rewrites_drop_sidecars(
        history: tuple[tuple[Message, ...], str], limits: Limits) -> None:
    """Planning twice gives the same list; a rewritten message carries no sidecar."""
    rows, text = history
    rows = tuple(m.model_copy(update={"api_content": (m.content or "") + " [ctx]"})
                 if m.role is not Role.TOOL else m for m in rows)
    first, second = _compact(rows, limits, text), _compact(rows, limits, text)
    assert first == second
    originals = {id(m) for m in rows}
    assert all(m.api_content is None for m in first if id(m) not in originals)


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(histories(), LIMITS)
def test_tail_meets_its_budget_and_keeps_groups_whole(history: tuple[tuple[Message, ...], str],
                                                      limits: Limits) -> None:
    """The tail goes past its floor only within the token budget, grows back only over one
    tool group (to its call), and the compaction holds exactly one summary."""
    rows, text = history
    figures = c.budget(limits)
    pruned = c.prune(rows, figures, limits)
    layout = c.plan(pruned, figures, limits, text)
    if layout is None:
        return
    floor = limits.compression_tail_floor_messages
    raw = c._tail_start(pruned, figures.tail_tokens, floor)
    start = len(pruned) - len(layout.tail)
    assert pruned[start:] == layout.tail and start <= raw
    assert all(m.role is Role.TOOL for m in pruned[start + 1:raw])
    assert start == raw or pruned[start].tool_calls
    raw_tail = pruned[raw:]
    assert len(raw_tail) <= floor or c.tokens_of(raw_tail) <= figures.tail_tokens
    out = c.compose(layout, "s", None)
    assert sum(1 for m in out if c.is_summary(m)) == 1
