"""The simulator's auxiliary model: deterministic summaries, updates, failures, routing."""

from __future__ import annotations

import pytest

from hermes_ref import compression
from hermes_ref.compaction import COMPRESSION_PURPOSE, SUMMARIZER_PROMPT
from hermes_ref.errors import ProviderTimeout
from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role
from hermes_ref.wire import ProviderRequest
from sim.provider import ScriptedProvider, text
from sim.provider_http import request_from_wire
from sim.summarizer import Summarizer, summarize


def _request(previous: str | None, users: list[str]) -> ProviderRequest:
    parts = [f"Previous summary:\n{previous}"] if previous is not None else []
    parts.append("Conversation:\n" + "\n".join(f"[user] {u}" for u in users))
    messages = (Message(role=Role.SYSTEM, content=SUMMARIZER_PROMPT),
                Message(role=Role.USER, content="\n\n".join(parts)))
    return ProviderRequest(model="m", messages=messages, tools=(), prompt_tokens=10,
                           purpose=COMPRESSION_PURPOSE)


def test_summary_is_a_function_of_the_request_and_updates_the_previous() -> None:
    """Same request, same text; an update keeps the previous summary and adds to it."""
    first = summarize(_request(None, ["where are the figures", "and the receipts"]))
    assert first == summarize(_request(None, ["where are the figures", "and the receipts"]))
    assert first.startswith("2 earlier messages (2 from the user")
    later = summarize(_request(first, ["one more question"]))
    assert later.startswith(first) and "Then: 1 earlier messages" in later


def test_queued_failures_and_texts_answer_in_order() -> None:
    """fail() and say() answer the next requests; then the summarizer is itself again."""
    summarizer = Summarizer().fail(ProviderTimeout("slow")).say("fixed text")
    request = _request(None, ["hello"])
    with pytest.raises(ProviderTimeout):
        summarizer.complete(request)
    assert summarizer.complete(request).content == "fixed text"
    assert summarizer.complete(request).content == summarize(request)


def test_a_fake_hands_summary_requests_to_its_summarizer_not_its_script() -> None:
    """A compression request consumes no script step and is not among the turn's requests."""
    provider = ScriptedProvider([text("the turn's answer")])
    reply = provider.complete(_request(None, ["hello"]))
    assert reply.content == summarize(_request(None, ["hello"]))
    assert provider.remaining == 1 and provider.requests == []


def test_served_request_with_the_summarizer_prompt_is_a_compression_request() -> None:
    """Over HTTP the purpose is known by compaction's own system prompt."""
    wire = _request(None, ["hello"]).wire()
    assert request_from_wire(wire).purpose == COMPRESSION_PURPOSE
    wire["messages"][0]["content"] = "You are a careful assistant."
    assert request_from_wire(wire).purpose == "turn"


def test_summary_budget_is_small_beside_the_window() -> None:
    """A summary asks for at most 10,000 tokens, 5 % of a large window."""
    assert compression.budget(Limits(context_window_tokens=1_000_000)).summary_tokens == 10_000
    assert compression.budget(Limits(context_window_tokens=128_000)).summary_tokens == 6_400
