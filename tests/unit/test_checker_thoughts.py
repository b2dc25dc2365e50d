"""The checkers read a reply's reasoning by their own rule (``sim.checkers.thoughts``); on
the replies the catalog describes it agrees with the engine's reading, so a change to
either one is a finding, never a shared blind spot."""

from __future__ import annotations

import pytest

from hermes_ref import ladder
from hermes_ref.models import ProviderReply
from sim.checkers.thoughts import inline_thought, thought_of

REPLIES = [
    ProviderReply(content=None, reasoning="  structured  "),
    ProviderReply(content="<think>inline</think>"),
    ProviderReply(content="<THINKING>a</THINKING> text <reasoning>b</reasoning>"),
    ProviderReply(content="<think>never closed"),
    ProviderReply(content="<think>ignored</think>", reasoning="structured wins"),
    ProviderReply(content="plain text"),
    ProviderReply(content=None),
]


@pytest.mark.parametrize("reply", REPLIES)
def test_the_checkers_read_reasoning_as_the_engine_does(reply: ProviderReply) -> None:
    assert thought_of(reply) == ladder.reasoning_of(reply)
    assert inline_thought(reply.content) == ladder.inline_reasoning(reply.content)


def test_no_reply_reasoned_nothing() -> None:
    assert thought_of(None) == ""
