"""The working list's bookkeeping, pinned where mutation testing found it unobserved.

These are plain unit tests of ``Transcript``: which messages it counts as the durable
prefix, how stored rows replace their pending twins, the token total when the last
message is replaced, and the trailing open calls. See docs/mutation.md.
"""

from __future__ import annotations

from hermes_ref.models import Message, Role, ScaffoldFlag, ToolCall
from hermes_ref.transcript import Transcript


def stored(content: str, row_id: int, role: Role = Role.USER) -> Message:
    return Message(role=role, content=content, row_id=row_id)


def pending(content: str, role: Role = Role.ASSISTANT) -> Message:
    return Message(role=role, content=content)


NUDGE = Message(role=Role.USER, content="nudge", scaffold=ScaffoldFlag.EMPTY_RECOVERY)


def test_stored_rows_form_the_durable_prefix() -> None:
    """A list of stored rows has no current-turn messages and nothing pending."""
    t = Transcript([stored("a", 1), stored("b", 2)])
    assert t.current_turn() == [] and t.pending() == ()


def test_a_list_with_unstored_or_scaffold_messages_has_no_durable_prefix() -> None:
    """One pending or scaffold message makes the whole list this turn's own."""
    for odd in (pending("p"), NUDGE):
        t = Transcript([stored("a", 1), odd])
        assert t.current_turn() == [stored("a", 1), odd]
    t = Transcript([pending("p"), stored("a", 1)])
    assert t.pending() == (pending("p"),)
    t = Transcript([NUDGE])
    assert t.drop_scaffolding() == 1 and len(t) == 0


def test_a_stored_row_replaces_its_pending_twin() -> None:
    """Absorbing the stored copy of a pending row puts it in the row's place."""
    t = Transcript([stored("q", 1)])
    t.append(pending("answer"))
    t.absorb((stored("answer", 2, Role.ASSISTANT),))
    assert [m.row_id for m in t] == [1, 2] and t.pending() == ()


def test_scaffolding_is_never_taken_for_a_twin() -> None:
    """A stored row identical to a scaffold message is appended, the scaffold kept."""
    t = Transcript([stored("q", 1)])
    t.append(NUDGE)
    t.absorb((stored("nudge", 2),))
    assert [(m.scaffold, m.row_id) for m in t][1:] == [(ScaffoldFlag.EMPTY_RECOVERY, None),
                                                      (None, 2)]


def test_a_different_row_is_never_taken_for_a_twin() -> None:
    """A stored row whose values differ from the pending one is appended after it."""
    t = Transcript()
    t.append(pending("one"))
    t.absorb((stored("two", 1, Role.ASSISTANT),))
    assert [(m.content, m.row_id) for m in t] == [("one", None), ("two", 1)]


def test_a_row_whose_write_failed_keeps_its_place() -> None:
    """Stored rows match pending twins in order: an earlier unstored twin stays pending."""
    t = Transcript()
    t.extend([pending("b"), pending("a")])
    t.absorb((stored("a", 1, Role.ASSISTANT), stored("b", 2, Role.ASSISTANT)))
    assert [(m.content, m.row_id) for m in t] == [("b", None), ("a", 1), ("b", 2)]


def test_replacing_the_last_message_keeps_the_token_total() -> None:
    """replace_last swaps the last message only, and the total follows it."""
    t = Transcript([stored("q", 1), stored("a first row of a good many words", 2)])
    t.append(pending("short"))
    longer = pending("a much longer answer than before")
    t.replace_last(longer)
    assert list(t)[-1] == longer and list(t)[1].content == "a first row of a good many words"
    assert t.tokens == sum(m.tokens for m in t)


def test_the_tail_of_an_empty_list_is_none() -> None:
    """An empty working list has no tail and no durable tail."""
    assert Transcript().tail() is None and Transcript().durable_tail() is None


def test_messages_returns_the_list_as_a_tuple() -> None:
    """messages() is the working list, in order, as an immutable tuple."""
    rows = [stored("a", 1), stored("b", 2)]
    assert Transcript(rows).messages() == tuple(rows)


def test_a_closed_group_has_no_open_calls() -> None:
    """When every call of the last round has a result there is no owner and nothing open."""
    calls = (ToolCall(id="a", name="read_file"),)
    t = Transcript([Message(role=Role.ASSISTANT, tool_calls=calls, row_id=1),
                    Message(role=Role.TOOL, content="r", tool_call_id="a", row_id=2)])
    assert t.trailing_open_calls() == (None, [])


def test_only_an_assistant_row_owns_calls() -> None:
    """Tool calls on a row of another role are not open calls."""
    calls = (ToolCall(id="a", name="read_file"),)
    t = Transcript([Message(role=Role.USER, content="q", tool_calls=calls, row_id=1)])
    assert t.trailing_open_calls() == (None, [])


def test_a_tool_row_without_a_call_id_answers_no_call() -> None:
    """A result that names no call leaves every call of the round open."""
    calls = (ToolCall(id="c1", name="read_file"), ToolCall(id="XXXX", name="read_file"))
    t = Transcript([Message(role=Role.ASSISTANT, tool_calls=calls, row_id=1),
                    Message(role=Role.TOOL, content="r", row_id=2)])
    owner, missing = t.trailing_open_calls()
    assert owner is not None and missing == ["c1", "XXXX"]


def _hidden(content: str, row_id: int | None = None) -> Message:
    return Message(role=Role.ASSISTANT, content=content, row_id=row_id, hidden=True)


def _shown(t: Transcript) -> list[str]:
    """What a request would carry; checked against the list itself."""
    assert list(t.visible()) == [m for m in t if not m.hidden]
    return [m.content for m in t.visible()]


def _fast(t: Transcript) -> bool:
    """Whether ``visible`` hands out the list itself (no hidden row counted)."""
    return t.visible() is t.visible()


def test_every_change_that_brings_in_a_hidden_row_counts_it() -> None:
    """From a list with no hidden row, each way a hidden one arrives keeps it off the
    request: appended, as a replaced last message, absorbed at the end or by position
    (a stored twin may carry the flag its pending copy did not), and in a copy."""
    t = Transcript([stored("a", 1)])
    t.append(_hidden("h"))
    assert _shown(t) == ["a"]

    t = Transcript([stored("a", 1), pending("p")])
    t.replace_last(_hidden("p"))
    assert _shown(t) == ["a"]
    t.replace_last(pending("p"))
    assert _shown(t) == ["a", "p"] and _fast(t)

    t = Transcript([stored("a", 1)])
    t.append(pending("p"))
    t.absorb((_hidden("p", 2),))  # the stored rows are the list's tail
    assert _shown(t) == ["a"]

    t = Transcript([stored("a", 1)])
    t.append(pending("p"))
    t.append(NUDGE)
    t.absorb((_hidden("p", 2),))  # found by position, before the scaffolding
    assert _shown(t) == ["a", "nudge"]

    t = Transcript([stored("a", 1), _hidden("h", 2)])
    assert _shown(t.copy()) == ["a"]


def test_dropping_hidden_scaffolding_uncounts_it() -> None:
    """A hidden scaffold message that is dropped no longer counts: the list is handed out
    as it is again."""
    t = Transcript([stored("a", 1)])
    t.append(Message(role=Role.USER, content="n", scaffold=ScaffoldFlag.EMPTY_RECOVERY,
                     hidden=True))
    assert _shown(t) == ["a"] and not _fast(t)
    assert t.drop_scaffolding() == 1
    assert _fast(t) and _shown(t) == ["a"]


def test_visible_is_the_list_itself_when_nothing_is_hidden() -> None:
    """The usual case costs no test of each message: the list is handed out as it is."""
    t = Transcript([stored("a", 1), stored("b", 2)])
    assert t.visible() is t.visible() and list(t.visible()) == list(t)
