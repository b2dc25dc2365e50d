"""The pure compression rules: figures, blocking, the idle predicate, progress, the planner."""

from __future__ import annotations

import dataclasses

import pytest

from hermes_ref import compression as c
from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role, ScaffoldFlag, ToolCall


def _threshold(context: int, max_tokens: int | None = None, configured: float = 0.50) -> int:
    ratio = c.effective_threshold_ratio(context, configured)
    return c.threshold_tokens(context, max_tokens, ratio)


@pytest.mark.parametrize(("context", "max_tokens", "expected"), [
    (200_000, None, 150_000),      # under 512K: raised to 0.75
    (1_000_000, None, 500_000),    # 0.50 as configured
    (64_000, None, 54_400),        # the 64,000 floor reaches the window: 0.85
    (200_000, 65_536, 100_848),    # int(134,464 × 0.75)
])
def test_threshold_figures(context: int, max_tokens: int | None, expected: int) -> None:
    """The derived figures of the source notes (CMP-1)."""
    assert _threshold(context, max_tokens) == expected


def test_small_window_raise_is_raise_only() -> None:
    """A configured ratio above 0.75 is kept under 512K; 0.75 is the floor, not a cap."""
    assert c.effective_threshold_ratio(100_000, 0.9) == 0.9
    assert c.effective_threshold_ratio(100_000, 0.5) == 0.75
    assert c.effective_threshold_ratio(512_000, 0.5) == 0.5


def test_tiny_window_threshold_stays_inside_it() -> None:
    """A window under the 64,000 floor compacts at 85 % of it, and never at the window."""
    assert _threshold(4_000) == 3_400
    assert _threshold(10) == 8


def test_tail_budget_and_clamped_target() -> None:
    """The tail keeps threshold × target ratio tokens; the ratio is clamped to [0.10, 0.80]."""
    figures = c.budget(Limits(context_window_tokens=200_000))
    assert (figures.threshold_tokens, figures.tail_tokens) == (150_000, 30_000)
    assert c.budget(Limits(compression_target_ratio=0.01)).target_ratio == 0.10
    assert c.budget(Limits(compression_target_ratio=0.95)).target_ratio == 0.80


@pytest.mark.parametrize(("before", "after", "progress"), [
    ((220, 288_000), (220, 183_000), True),   # tokens cut by more than 5 %
    ((100, 100_000), (100, 96_000), False),   # 4 %: no progress, the passes stop
    ((100, 100_000), (99, 100_000), True),    # one message fewer
])
def test_progress_rule(before: tuple[int, int], after: tuple[int, int], progress: bool) -> None:
    """CTX-6's derived cases."""
    assert c.made_progress(before, after) is progress


def test_blocking_cooldown_ineffective_and_manual() -> None:
    """CMP-4: a summary failure cools down 600 s; two ineffective passes block; manual runs."""
    limits = Limits()
    state = c.CompressionState()
    assert state.blocked(0.0, limits) is None
    state.summary_failed(100.0, limits)
    assert state.blocked(699.9, limits) is not None
    assert state.blocked(700.0, limits) is None
    assert state.blocked(699.9, limits, manual=True) is None
    state.judge(tokens_after=10, threshold=5)
    state.judge(tokens_after=10, threshold=5)
    assert state.blocked(1_000.0, limits) == "2 ineffective passes in a row"
    state.judge(tokens_after=1, threshold=5)
    assert state.blocked(1_000.0, limits) is None


@pytest.mark.parametrize(("gap", "last", "cooldown", "fires"), [
    (700, 0, False, True),
    (500, 0, False, False),       # not idle long enough
    (700, 40_000, False, False),  # the floor rises to 60k
    (700, 0, True, False),        # in the cooldown
])
def test_idle_predicate(gap: float, last: int, cooldown: bool, fires: bool) -> None:
    """CTX-5's derived cases: after 600 s, 50k tokens, floor 20k."""
    floor = 20_000 + last if last else 20_000
    assert c.should_idle_compact(enabled=True, idle_after_s=600, gap_s=gap, tokens=50_000,
                                 floor_tokens=floor, cooldown_active=cooldown) is fires


def test_idle_predicate_off() -> None:
    """Disabled, or idle_after 0, never fires."""
    kwargs = {"gap_s": 10_000.0, "tokens": 50_000, "floor_tokens": 1, "cooldown_active": False}
    assert not c.should_idle_compact(enabled=False, idle_after_s=600, **kwargs)  # type: ignore[arg-type]
    assert not c.should_idle_compact(enabled=True, idle_after_s=0, **kwargs)  # type: ignore[arg-type]


def _call(call_id: str) -> ToolCall:
    return ToolCall(id=call_id, name="read_file", arguments='{"path": "a.txt"}')


def test_orphan_repair_strips_and_drops() -> None:
    """[assistant(A, B), tool(A)] → B stripped; [tool(C)] without its call → removed."""
    rows = (Message(role=Role.ASSISTANT, tool_calls=(_call("A"), _call("B"))),
            Message(role=Role.TOOL, tool_call_id="A", content="a"),
            Message(role=Role.TOOL, tool_call_id="C", content="c"))
    repaired = c.repair_orphans(rows)
    assert [call.id for call in repaired[0].tool_calls] == ["A"]
    assert [m.tool_call_id for m in repaired[1:]] == ["A"]


def test_orphan_repair_names_an_emptied_assistant_and_keeps_pending() -> None:
    """An assistant whose every call lost its result says so; a pending call is kept."""
    rows = (Message(role=Role.ASSISTANT, tool_calls=(_call("A"),), api_content="sent"),
            Message(role=Role.USER, content="next"),
            Message(role=Role.ASSISTANT, tool_calls=(_call("P"),)))
    repaired = c.repair_orphans(rows, pending=frozenset({"P"}))
    assert (repaired[0].content, repaired[0].tool_calls, repaired[0].api_content) == (
        c.REMOVED_CALL_TEXT, (), None)
    assert repaired[2].tool_calls == rows[2].tool_calls


def test_relocate_user_prefers_equal_content_and_skips_summaries() -> None:
    """CTX-7: the last user row with this turn's text, else the last user row (not a summary)."""
    rows = (Message(role=Role.USER, content="go on"), Message(role=Role.ASSISTANT, content="ok"),
            Message(role=Role.USER, content="go on"), Message(role=Role.USER, content="todo list"),
            Message(role=Role.USER, content=c.SUMMARY_PREFIX + "earlier"))
    assert c.relocate_user(rows, "go on") == 2
    assert c.relocate_user(rows, "rewritten away") == 3
    assert c.relocate_user((), "x") is None


def _history(rounds: int, chars: int = 400) -> tuple[Message, ...]:
    rows: list[Message] = [Message(role=Role.USER, content="Start reading the files.")]
    for k in range(rounds):
        call = ToolCall(id=f"c{k}", name="read_file", arguments=f'{{"path": "f{k}.txt"}}')
        rows.append(Message(role=Role.ASSISTANT, tool_calls=(call,)))
        rows.append(Message(role=Role.TOOL, tool_call_id=f"c{k}", content="x" * chars))
    rows.append(Message(role=Role.USER, content="Now summarize them."))
    return tuple(rows)


def test_plan_keeps_groups_whole_and_the_tail_floor() -> None:
    """Head of 3 moved past tool results, tail of at least 8 starting at a call, no split."""
    limits = Limits(context_window_tokens=4_000)
    figures = c.budget(limits)
    rows = _history(12)
    layout = c.plan(rows, figures, limits, "Now summarize them.")
    assert layout is not None
    assert len(layout.head) == 3 and layout.head[-1].role is Role.TOOL
    assert len(layout.tail) >= 8 and layout.tail[0].role is not Role.TOOL
    assert layout.tail[-1].content == "Now summarize them."
    compacted = c.compose(layout, "the files were read", None)
    assert c.repair_orphans(compacted) == compacted
    assert sum(1 for m in compacted if c.is_summary(m)) == 1


def test_the_tail_floor_counts_conversation_messages_not_scaffolding() -> None:
    """A retry's nudge at the end of the working list is kept, but the floor of 8 is of
    messages that are stored: the tail still holds the last 8 of the conversation."""
    limits = Limits(context_window_tokens=4_000)
    figures = dataclasses.replace(c.budget(limits), tail_tokens=0)  # the floor alone decides
    nudge = Message(role=Role.USER, content="Please answer.", scaffold=ScaffoldFlag.EMPTY_RECOVERY)
    rows = (*_history(12), nudge)
    layout = c.plan(rows, figures, limits)
    assert layout is not None and layout.tail[-1] is nudge
    stored = [m for m in layout.tail if m.scaffold is None]
    assert len(stored) >= 8 and stored[-8:] == list(rows[-9:-1])


def test_plan_decays_the_head_and_updates_the_previous_summary() -> None:
    """Once a summary exists the head is empty and the old summary text is handed on."""
    limits = Limits(context_window_tokens=4_000)
    figures = c.budget(limits)
    rows = (c.summary_message("first part", None, None), *_history(12)[1:])
    layout = c.plan(rows, figures, limits, "Now summarize them.")
    assert layout is not None and layout.head == ()
    assert layout.previous_summary == "first part"
    assert all(not c.is_summary(m) for m in layout.summarizable)


def test_current_user_message_is_lifted_out_of_the_middle() -> None:
    """A long turn's own user message is kept, after the summary, never summarized (CTX-7)."""
    limits = Limits(context_window_tokens=4_000)
    figures = c.budget(limits)
    rows = (Message(role=Role.USER, content="a"), Message(role=Role.ASSISTANT, content="b"),
            Message(role=Role.USER, content="c"), Message(role=Role.ASSISTANT, content="d"),
            *_history(14)[:-1])
    layout = c.plan(rows, figures, limits, "Start reading the files.")
    assert layout is not None and layout.lifted is not None
    assert layout.lifted.content == "Start reading the files."
    compacted = c.compose(layout, "s", None)
    assert compacted[c.relocate_user(compacted, "Start reading the files.") or 0] is layout.lifted


def test_prune_replaces_old_outputs_only() -> None:
    """Tool outputs before the tail become a placeholder without a sidecar; the tail is kept."""
    limits = Limits(context_window_tokens=4_000)
    figures = c.budget(limits)
    rows = _history(12)
    pruned = c.prune(rows, figures, limits)
    cut = c.shape(rows, figures, limits)
    changed = [i for i, (a, b) in enumerate(zip(rows, pruned, strict=True)) if a != b]
    assert changed and all(cut.head_end <= i < cut.tail_start for i in changed)
    assert all(pruned[i].content == c.PRUNED_TEXT.format(chars=400) for i in changed)
    assert c.prune(pruned, figures, limits) == pruned
