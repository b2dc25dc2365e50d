"""Real clients against the served simulator: the official openai client and openai-agents."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from sim.serve import script as script_file
from sim.serve.server import SimServer, Simulator, start

openai = pytest.importorskip("openai")


def serve(raw: object) -> SimServer:
    return start(Simulator(script_file.parse(raw)))


@pytest.fixture
def servers() -> Iterator[list[SimServer]]:
    running: list[SimServer] = []
    yield running
    for server in running:
        server.stop()


def test_openai_client_streams_text_and_tool_calls(servers: list[SimServer]) -> None:
    """openai's client assembles a streamed tool call and reads a whole text reply."""
    server = serve([{"tool_calls": [{"name": "terminal", "arguments": {"command": "ls"}}]},
                    {"text": "done", "usage": {"prompt_tokens": 11, "completion_tokens": 7}}])
    servers.append(server)
    client = openai.OpenAI(base_url=server.url, api_key="sk-test-0000", max_retries=0)
    stream = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "list"}], stream=True,
        stream_options={"include_usage": True},
        tools=[{"type": "function", "function": {"name": "terminal", "parameters": {}}}])
    fragments = [c.choices[0].delta.tool_calls[0].function.arguments
                 for c in stream if c.choices and c.choices[0].delta.tool_calls]
    assert json.loads("".join(f or "" for f in fragments)) == {"command": "ls"}
    whole = client.chat.completions.create(
        model="fake-model", messages=[{"role": "developer", "content": "brief"},
                                      {"role": "user", "content": "again"}])
    assert whole.choices[0].message.content == "done"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (11, 7)


def test_openai_client_retries_a_429_and_the_journal_shows_the_gap(
        servers: list[SimServer]) -> None:
    """openai's retry honours Retry-After; the journal records the gap it waited."""
    server = serve([{"error": "rate_limited", "retry_after_s": 0.3}, {"text": "after"}])
    servers.append(server)
    client = openai.OpenAI(base_url=server.url, api_key="sk-test", max_retries=1)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert reply.choices[0].message.content == "after"
    assert server.simulator.settle()
    records = server.simulator.journal.records
    assert [r["status"] for r in sorted(records, key=lambda r: r["seq"])] == [429, 200]
    assert max(r["gap_s"] or 0 for r in records) >= 0.25


def test_openai_client_passes_back_its_own_model_dump(servers: list[SimServer]) -> None:
    """An assistant message passed back as model_dump() (refusal, annotations, …) is accepted."""
    server = serve([{"text": "first"}, {"text": "second"}])
    servers.append(server)
    client = openai.OpenAI(base_url=server.url, api_key="sk-test", max_retries=0)
    history: list[Any] = [{"role": "user", "content": "a"}]
    first = client.chat.completions.create(model="m", messages=history)
    history += [first.choices[0].message.model_dump(), {"role": "user", "content": "b"}]
    second = client.chat.completions.create(model="m", messages=history)
    assert second.choices[0].message.content == "second"
    assert set(history[1]) >= {"refusal", "annotations", "audio", "function_call"}


async def test_openai_agents_runs_a_tool_round(servers: list[SimServer]) -> None:
    """An openai-agents Agent calls its tool and answers, over the served simulator."""
    agents = pytest.importorskip("agents")
    server = serve([{"tool_calls": [{"name": "shout", "arguments": {"text": "hi"}}]},
                    {"text": "It said HI."}])
    servers.append(server)
    agents.set_tracing_disabled(True)
    said: list[str] = []

    @agents.function_tool
    def shout(text: str) -> str:
        """Upper-case a text."""
        said.append(text)
        return text.upper()

    client = openai.AsyncOpenAI(base_url=server.url, api_key="sk-test", max_retries=0)
    model = agents.OpenAIChatCompletionsModel(model="fake-model", openai_client=client)
    agent = agents.Agent(name="tester", instructions="Use tools.", tools=[shout], model=model)
    result = await agents.Runner.run(agent, "shout hi")
    assert result.final_output == "It said HI."
    assert said == ["hi"]
    assert server.simulator.cursor.report().exact
