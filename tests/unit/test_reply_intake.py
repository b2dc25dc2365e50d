"""Reply intake: text the store can keep, and an id of its own for every call of a reply."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hermes_ref.models import ProviderReply, ToolCall
from hermes_ref.reply_intake import admit_reply, clean_reply, clean_text, unique_call_ids
from sim.checkers.intake import taken_in, taken_in_text

HIGH, LOW, SMILE = "\ud83d", "\ude00", "\U0001f600"

# Any code points at all, lone surrogates included (st.text() leaves them out).
ANY_TEXT = st.lists(st.integers(0, 0x10FFFF), max_size=12).map(lambda cs: "".join(map(chr, cs)))
SURROGATE_HEAVY = st.lists(st.sampled_from(["a", "é", HIGH, LOW, "\udbff", "\udc00", SMILE]),
                           max_size=10).map("".join)


@pytest.mark.parametrize(("raw", "clean"), [
    (HIGH, "\ufffd"),
    (LOW, "\ufffd"),
    (f"Nice {HIGH}!", "Nice \ufffd!"),
    (HIGH + LOW, SMILE),
    (f"a{HIGH}{HIGH}{LOW}b", f"a\ufffd{SMILE}b"),
    (LOW + HIGH, "\ufffd\ufffd"),
    (f"é{SMILE}", f"é{SMILE}"),
])
def test_clean_text_joins_halves_and_replaces_lone_surrogates(raw: str, clean: str) -> None:
    """A high half followed by a low half is its character; any other surrogate is U+FFFD."""
    assert clean_text(raw) == clean


@pytest.mark.parametrize("text", ["plain ascii", "ünïcödé and \U0001f600"])
def test_clean_text_returns_valid_text_itself(text: str) -> None:
    """Text with no surrogate comes back as the very same object, not a copy."""
    assert clean_text(text) is text


@given(ANY_TEXT)
def test_cleaned_text_always_encodes_and_is_stable(text: str) -> None:
    """Whatever came in, the cleaned text encodes as UTF-8 and a second cleaning changes nothing."""
    cleaned = clean_text(text)
    cleaned.encode("utf-8")
    assert clean_text(cleaned) == cleaned


@given(st.one_of(ANY_TEXT, SURROGATE_HEAVY))
def test_the_checkers_statement_of_the_rule_agrees_with_the_engine(text: str) -> None:
    """sim.checkers.intake states the text rule on its own; both statements give the same text."""
    assert taken_in_text(text) == clean_text(text)


def test_clean_reply_cleans_every_string_and_keeps_a_clean_reply() -> None:
    """Content, reasoning, model and each call's id, name and arguments are cleaned; a clean
    reply is returned as is."""
    dirty = ProviderReply(content=f"hi {HIGH}", reasoning=HIGH + LOW, model=f"m{LOW}",
                          tool_calls=(ToolCall(id=f"c{HIGH}", name=f"f{LOW}",
                                               arguments=f'{{"a": "{HIGH}"}}'),))
    clean = clean_reply(dirty)
    assert (clean.content, clean.reasoning, clean.model) == ("hi \ufffd", SMILE, "m\ufffd")
    assert clean.tool_calls == (ToolCall(id="c\ufffd", name="f\ufffd", arguments='{"a": "\ufffd"}'),)
    fine = ProviderReply(content="hi", tool_calls=(ToolCall(id="c", name="f"),))
    assert clean_reply(fine) is fine


def _calls(*ids: str) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(id=i, name="read_file", arguments=f'{{"path": "{n}.txt"}}')
                 for n, i in enumerate(ids))


@pytest.mark.parametrize(("ids", "renamed"), [
    (("c", "c"), ["c", "c_d2"]),
    (("c", "c", "c"), ["c", "c_d2", "c_d3"]),
    (("c", "c", "c_d2"), ["c", "c_d3", "c_d2"]),
    (("a", "b", "a", "b"), ["a", "b", "a_d2", "b_d2"]),
])
def test_repeated_ids_get_a_suffix_no_other_call_has(ids: tuple[str, ...], renamed: list[str]) -> None:
    """The first call keeps the id, a repeat becomes <id>_d<n>, and an id given once is kept."""
    calls = unique_call_ids(_calls(*ids))
    assert [c.id for c in calls] == renamed
    assert [c.arguments for c in calls] == [c.arguments for c in _calls(*ids)]


def test_distinct_ids_are_kept_as_the_same_tuple() -> None:
    """A reply whose ids are already distinct is not copied."""
    calls = _calls("a", "b")
    assert unique_call_ids(calls) is calls


def test_admit_reply_makes_ids_distinct_after_cleaning_them() -> None:
    """Two ids that differ only in their lone surrogates are equal once cleaned, so one is renamed."""
    reply = ProviderReply(tool_calls=_calls("a\ud800", "a\ud801"), finish_reason="tool_calls")
    assert [c.id for c in admit_reply(reply).tool_calls] == ["a\ufffd", "a\ufffd_d2"]


@given(st.lists(st.sampled_from(["c", "c_d2", "c_d3", f"c{HIGH}", f"c{LOW}", "d"]), max_size=6))
def test_admitted_ids_are_distinct_and_match_the_checkers_rule(ids: list[str]) -> None:
    """After intake every id is distinct and valid text, exactly as the checkers expect."""
    reply = ProviderReply(tool_calls=_calls(*ids), finish_reason="tool_calls")
    admitted = admit_reply(reply)
    got = [c.id for c in admitted.tool_calls]
    assert len(set(got)) == len(got)
    assert admitted.tool_calls == taken_in(reply).tool_calls


def test_admit_reply_returns_a_clean_reply_itself() -> None:
    """The common case costs no copy: a clean reply with distinct ids is the same object."""
    reply = ProviderReply(content="Done.", tool_calls=_calls("a", "b"))
    assert admit_reply(reply) is reply
