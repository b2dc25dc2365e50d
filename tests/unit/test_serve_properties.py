"""Properties over the fault catalogue: every drawn fault is a reply or a typed error."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_ref.errors import ProviderError
from hermes_ref.models import Message, Role
from hermes_ref.shell.http_provider import HttpProvider
from hermes_ref.wire import ProviderRequest
from sim.serve import script as script_file
from sim.serve.server import Simulator
from sim.serve.strategies import fault_steps


def complete(step: dict[str, Any], stream: bool) -> object:
    simulator = Simulator(script_file.parse([step]))
    request = ProviderRequest(model="m", messages=(Message(role=Role.USER, content="hi"),),
                              tools=(), prompt_tokens=1, stream=stream)

    async def call() -> object:
        async with httpx.AsyncClient(transport=simulator.transport()) as client:
            try:
                return await HttpProvider("http://sim.test/v1", client=client).complete(request)
            except ProviderError as error:
                return error

    return asyncio.run(call())


@settings(max_examples=150, deadline=None)
@given(fault_steps(slow=True), st.booleans())
def test_the_engine_client_meets_every_fault_with_a_reply_or_a_typed_error(
        step: dict[str, Any], stream: bool) -> None:
    """No drawn fault makes the engine's client raise anything but a ProviderError."""
    outcome = complete(step, stream)
    assert isinstance(outcome, ProviderError) or hasattr(outcome, "tool_calls")


def test_when_exhausted_answers_and_past_the_end_is_a_harness_error() -> None:
    """A route's fallback answers past its end; with none, a 500 counts a harness error."""
    covered = Simulator(script_file.parse({"steps": [{"text": "a"}],
                                           "when_exhausted": {"error": "server_error"}}))
    bare = Simulator(script_file.parse([{"text": "a"}]))
    body = b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}'
    for simulator in (covered, bare):
        assert simulator.answer("POST", "/v1/chat/completions", body)[0].status == 200
        assert simulator.answer("POST", "/v1/chat/completions", body)[0].status == 500
        assert not simulator.cursor.report().exact
    assert covered.harness_errors == [] and len(bare.harness_errors) == 1
    assert covered.cursor.report().overflow == {"main": 1}
