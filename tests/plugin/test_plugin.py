"""The pytest plugin, as another project would use it, run through pytester."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest


def installed() -> bool:
    """Whether the pytest11 entry point is installed (an editable install made before it
    was declared lacks it; the plugin is then named on the command line)."""
    return any(e.value == "sim.pytest_plugin" for e in entry_points(group="pytest11"))


def run(pytester: pytest.Pytester, source: str) -> pytest.RunResult:
    pytester.makeini("[pytest]\nasyncio_mode = auto\n"
                     "asyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_user=source)
    named = () if installed() else ("-p", "sim.pytest_plugin")
    return pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", *named)


def test_served_sim_answers_over_http_and_journals(pytester: pytest.Pytester) -> None:
    """served_sim serves a script on 127.0.0.1; its journal and report are readable."""
    result = run(pytester, '''
import json, httpx

def test_agent(served_sim):
    """The served fixture answers a real HTTP client and journals the request."""
    sim = served_sim([{"error": "rate_limited", "retry_after_s": 1}, {"text": "hello"}])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    first = httpx.post(sim.url + "/chat/completions", json=body)
    second = httpx.post(sim.url + "/chat/completions", json=body)
    assert (first.status_code, first.headers["retry-after"]) == (429, "1")
    assert second.json()["choices"][0]["message"]["content"] == "hello"
    assert sim.report().exact
    lines = sim.journal_path.read_text().splitlines()
    assert [json.loads(line)["status"] for line in lines] == [429, 200]
''')
    result.assert_outcomes(passed=1)


def test_in_process_and_respx_fixtures_drive_the_engine_client(pytester: pytest.Pytester) -> None:
    """sim_transport and sim_respx answer the engine's own client without a socket."""
    result = run(pytester, '''
import httpx
from hermes_ref.models import Message, Role
from hermes_ref.shell.http_provider import HttpProvider
from hermes_ref.wire import ProviderRequest

REQUEST = ProviderRequest(model="m", messages=(Message(role=Role.USER, content="hi"),),
                          tools=(), prompt_tokens=1, stream=True)

async def test_transport(sim_transport):
    """The in-process transport plays a script."""
    sim = sim_transport([{"text": "in process"}])
    client = httpx.AsyncClient(transport=sim.transport)
    reply = await HttpProvider(sim.url, client=client).complete(REQUEST)
    assert reply.content == "in process"

async def test_respx(sim_respx):
    """The respx mount plays a script."""
    sim = sim_respx([{"text": "via respx"}], "http://agent.test/v1")
    async with HttpProvider("http://agent.test/v1") as provider:
        assert (await provider.complete(REQUEST)).content == "via respx"
    assert sim.report().exact
''')
    result.assert_outcomes(passed=2)


def test_fault_strategies_and_the_audit_helper(pytester: pytest.Pytester) -> None:
    """fault_steps draws valid steps; assert_audit_clean fails with the findings."""
    result = run(pytester, '''
import pytest
from hypothesis import given, settings
from sim.pytest_plugin import assert_audit_clean, fault_steps, scripts
from sim.serve.script import parse, step
from sim.audit.hermes_v22 import HermesDb

@settings(max_examples=50, deadline=None)
@given(fault_steps(slow=True))
def test_every_drawn_step_validates(drawn):
    """Each drawn fault is a valid script step."""
    step(drawn, "drawn")

@settings(max_examples=20, deadline=None)
@given(scripts())
def test_every_drawn_script_validates(drawn):
    """Each drawn script parses and ends with an answer."""
    assert parse(drawn).main.steps[-1].answer.content == "final answer"

def test_audit_helper(tmp_path):
    """A dangling tool row fails the helper, naming the invariant."""
    db = HermesDb(tmp_path / "state.db")
    db.session("s")
    db.message("s", "user", "hi")
    db.message("s", "tool", "r", answers="nobody")
    db.close()
    with pytest.raises(AssertionError, match="TOOL-3"):
        assert_audit_clean(tmp_path / "state.db")
''')
    result.assert_outcomes(passed=3)


def test_the_entry_point_names_the_plugin() -> None:
    """pyproject.toml declares the plugin under pytest11 (what 'pip install' registers)."""
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["entry-points"]["pytest11"]
    assert declared == {"hermes_ref_sim": "sim.pytest_plugin"}
