"""Stable bytes across turns: rewrites drop the sidecar, the prompt is cached, the cache is counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes_ref.context import SessionCache
from hermes_ref.errors import InvariantBroken, MalformedReply, RateLimited
from hermes_ref.models import Message, Role, SessionRecord, ToolSpec
from hermes_ref.prologue import compose_api_content
from hermes_ref.shell.chat_wire import parse_completion
from hermes_ref.tokens import count_text
from hermes_ref.wire import ProviderRequest
from sim.bench import cache_share
from sim.checkers import wire_cache
from sim.checkers.base import Observation
from sim.checkers.wire_cache import CacheShareRun
from sim.harness import Story
from sim.provider import FunctionProvider, ScriptedProvider, text
from sim.provider_http import completion_json
from sim.serve import script as script_file
from sim.serve.server import Simulator
from sim.world import CallRecord, RewriteRun, TurnRun


def test_rewritten_drops_the_sidecar_and_keeps_the_rest() -> None:
    """A rewrite sends the new text, never the bytes stored for the old one (WIRE-2)."""
    sent = compose_api_content("hi", "memory: X")
    m = Message(role=Role.USER, content="hi", api_content=sent, row_id=3, turn_id="t")
    assert m.wire["content"] == sent
    n = m.rewritten("hello", hidden=True)
    assert (n.content, n.api_content, n.row_id, n.turn_id, n.hidden) == ("hello", None, 3, "t", True)
    assert n.wire["content"] == "hello"


def test_rewritten_refuses_to_set_a_sidecar() -> None:
    """A rewrite cannot carry a sidecar along by keyword: the helper drops it itself."""
    m = Message(role=Role.USER, content="hi")
    with pytest.raises(TypeError, match="drops api_content"):
        m.rewritten("x", api_content="x\n\nold")


# ---- the fake provider's prompt cache ---------------------------------------------------------

SYSTEM = Message(role=Role.SYSTEM, content="You are terse.")
Q1 = Message(role=Role.USER, content="first", api_content="first\n\n<context>\nm\n</context>")
A1 = Message(role=Role.ASSISTANT, content="one")
Q2 = Message(role=Role.USER, content="second")


def _request(*messages: Message, tools: tuple[ToolSpec, ...] = ()) -> ProviderRequest:
    return ProviderRequest(model="m", messages=messages, tools=tools,
                           prompt_tokens=sum(m.tokens for m in messages))


def test_cached_tokens_are_the_longest_shared_run_of_leading_messages() -> None:
    """A request is cached up to the first message no earlier request had in that place."""
    provider = FunctionProvider(lambda r: text("ok"))
    first = provider.complete(_request(SYSTEM, Q1)).usage
    second = provider.complete(_request(SYSTEM, Q1, A1, Q2)).usage
    assert first.cached_tokens == 0
    assert second.cached_tokens == SYSTEM.tokens + Q1.tokens
    assert second.prompt_tokens == SYSTEM.tokens + Q1.tokens + A1.tokens + Q2.tokens


def test_changed_bytes_end_the_cached_prefix_there() -> None:
    """The same row sent without its sidecar is new bytes: nothing after the prompt is cached."""
    provider = FunctionProvider(lambda r: text("ok"))
    provider.complete(_request(SYSTEM, Q1, A1, Q2))
    bare = Q1.rewritten(Q1.content)
    assert provider.complete(_request(SYSTEM, bare, A1, Q2)).usage.cached_tokens == SYSTEM.tokens
    other = Message(role=Role.SYSTEM, content="You are terse. Now: 12:00.")
    assert provider.complete(_request(other, Q1, A1, Q2)).usage.cached_tokens == 0


def test_any_earlier_request_counts_not_only_the_last() -> None:
    """A request that returns to an older branch is cached as far as that branch goes."""
    provider = FunctionProvider(lambda r: text("ok"))
    provider.complete(_request(SYSTEM, Q1, A1, Q2))
    provider.complete(_request(SYSTEM, Q2))
    assert provider.complete(_request(SYSTEM, Q1, A1)).usage.cached_tokens == \
        SYSTEM.tokens + Q1.tokens + A1.tokens


def test_other_tools_share_no_prefix_and_failures_cache_nothing() -> None:
    """Tools come before the messages; a failed request leaves nothing behind."""
    tool = ToolSpec(name="read_file", description="read")
    provider = ScriptedProvider([RateLimited("slow"), text("a"), text("b"), text("c")])
    with pytest.raises(RateLimited):
        provider.complete(_request(SYSTEM, Q1))
    assert provider.complete(_request(SYSTEM, Q1)).usage.cached_tokens == 0
    assert provider.complete(_request(SYSTEM, Q1, tools=(tool,))).usage.cached_tokens == 0
    assert provider.complete(_request(SYSTEM, Q1, tools=(tool,))).usage.cached_tokens == \
        SYSTEM.tokens + Q1.tokens


def test_the_http_face_reports_cached_tokens_and_the_client_reads_them() -> None:
    """usage.prompt_tokens_details.cached_tokens goes out over HTTP and is parsed back."""
    provider = FunctionProvider(lambda r: text("ok"))
    provider.complete(_request(SYSTEM, Q1))
    body = completion_json(provider.complete(_request(SYSTEM, Q1, A1, Q2)))
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": SYSTEM.tokens + Q1.tokens}
    assert parse_completion(body).usage.cached_tokens == SYSTEM.tokens + Q1.tokens
    body["usage"]["prompt_tokens_details"] = None
    assert parse_completion(body).usage.cached_tokens == 0
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": -1}
    with pytest.raises(MalformedReply, match="cached_tokens"):
        parse_completion(body)


# ---- CTX-3: one prompt per session --------------------------------------------------------------


def _system_sent(call: CallRecord) -> object:
    return call.sent["messages"][0]


def test_the_prompt_is_built_once_and_replayed_across_time_and_restarts(tmp_path: Path) -> None:
    """Turns an hour apart, and after a restart, send the bytes the session row stored."""
    story = Story(store_kind="memory", workdir=tmp_path, trace=False)
    story.script(text("one"), text("two"), text("three"))
    story.turn("first")
    story.advance(3600.0)
    story.turn("second", platform="telegram")
    story.restart()
    story.advance(3600.0)
    story.turn("third")
    stored = story.world.store.snapshot().sessions[0].system_prompt
    assert "Conversation started: 2026-01-01 00:00:00 UTC." in stored
    assert [_system_sent(c) for c in story.world.calls] == [{"role": "system", "content": stored}] * 3
    assert story.violations == []


def test_replace_system_prompt_takes_a_stored_row_and_nothing_empty() -> None:
    """Compression's one call installs the row's prompt; an empty prompt is an engine bug."""
    cache = SessionCache("s", "old", Message(role=Role.SYSTEM, content="old"))
    record = SessionRecord(id="s", key="k", system_prompt="new", started_at=0.0)
    cache.replace_system_prompt(record)
    assert (cache.system_prompt, cache.system_message.wire) == ("new", {"role": "system", "content": "new"})
    with pytest.raises(InvariantBroken, match="no system prompt"):
        cache.replace_system_prompt(record.model_copy(update={"system_prompt": " "}))


# ---- the bench row ----------------------------------------------------------------------------


def test_the_bench_row_counts_a_lower_share_under_every_sabotage() -> None:
    """The clean share is high, and every sabotage of the stable prefix costs some of it."""
    class Tiny:
        name = "tiny"
    report = cache_share.rows(Tiny(), {})
    clean = report["cache_share_clean"]["median"]
    assert clean > 0.7 and report["cache_share_turns"]["median"] == cache_share.TURNS_SMALL
    for name in cache_share.VARIANTS:
        assert report[f"cache_share_{name}"]["median"] < clean
        assert report[f"cache_share_{name}_over_clean"]["median"] < 1.0
    assert cache_share.lines(report)[0].startswith("prompt-cache share")


# ---- the checkers ------------------------------------------------------------------------------


def _story(tmp_path: Path) -> Story:
    return Story(store_kind="memory", workdir=tmp_path, trace=False)


def test_the_share_checker_fails_on_a_declared_turn_without_calls(tmp_path: Path) -> None:
    """A turn declared for the share that made no call is a finding, not a pass."""
    story = _story(tmp_path)
    story.script(text("one"))
    story.turn("first", injected="memory: x")
    run = story.world.runs[-1]
    story.world.runs.append(CacheShareRun(run.session_id, "ghost", "turn-none", False,
                                          min_share=0.5))
    found = [v for v in story.check() if v.checker == "prompt_cache_share"]
    assert found and "made no call" in found[0].message


def test_the_share_checker_counts_from_the_bodies_as_the_provider_does(tmp_path: Path) -> None:
    """The checker's count of a session equals the fake provider's, call by call."""
    story = _story(tmp_path)
    story.script(text("one"), text("two"), text("three"))
    for n in range(3):
        story.advance(60.0)
        story.turn(f"question {n}", injected=f"memory: note {n}")
    obs_shares = wire_cache.session_shares(_observation(story), "s-1")
    assert not isinstance(obs_shares, str)
    assert [s.cached_tokens for s in obs_shares] == \
        [c.reply.usage.cached_tokens for c in story.world.calls if c.reply is not None]
    assert obs_shares[-1].cached_tokens > 0


def test_a_stale_sidecar_in_the_record_is_a_wire2_finding() -> None:
    """A sidecar that does not hold its row's current content is stale; a composed one is not."""
    fresh = compose_api_content("keep this", "memory: m")
    assert fresh is not None and wire_cache.sidecar_problem("keep this", fresh) is None
    stale = compose_api_content("keep this and the secret", "memory: m")
    assert stale is not None and wire_cache.sidecar_problem("keep this", stale) is not None
    assert wire_cache.sidecar_problem("keep this", "keep this") is not None


def test_a_rewrite_no_later_turn_sends_is_silence(tmp_path: Path) -> None:
    """A turn after a rewrite must carry the row; a turn whose requests never do is a finding."""
    story = _story(tmp_path)
    story.script(text("one"))
    story.turn("first", injected="memory: x")
    row = story.transcript()[0]
    story.world.runs.append(RewriteRun("s-1", "first", None, False, row_id=row.row_id or 0,
                                       seq=story.world.effects_performed))
    story.world.runs.append(TurnRun("s-1", "later", "turn-without-calls", False))
    found = [v for v in story.check() if v.checker == "rewrites_drop_the_sidecar"]
    assert found and "sent it in no request" in found[0].message


def _observation(story: Story) -> Observation:
    world = story.world
    return Observation(record=world.store.snapshot(), ledger=(), calls=tuple(world.calls),
                       crash_seqs=(), limits=story.engine.limits, runs=tuple(world.runs))


def test_the_served_simulator_reports_the_prefix_it_has_seen() -> None:
    """The served simulator's usage says how much of a prompt repeats an earlier one."""
    simulator = Simulator(script_file.parse({"seed": 3, "steps": [{"text": "ok", "repeat": "always"}]}))
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    later = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]

    def usage(messages: list[dict[str, str]]) -> dict[str, object]:
        body = json.dumps({"model": "m", "messages": messages}).encode()
        plan, _ = simulator.answer("POST", "/v1/chat/completions", body)
        return json.loads(plan.body)["usage"]  # type: ignore[no-any-return]

    assert usage(first)["prompt_tokens_details"] == {"cached_tokens": 0}
    again = usage(later)
    assert again["prompt_tokens_details"] == {"cached_tokens": count_text(json.dumps(first))}
    assert parse_completion({"choices": [{"message": {"role": "assistant", "content": "ok"},
                                          "finish_reason": "stop"}], "usage": again}
                            ).usage.cached_tokens == count_text(json.dumps(first))


def _rotated_rewrite(tmp_path: Path) -> tuple[Observation, RewriteRun]:
    """The shrunk seed 1932: a rewritten row, then a rotation that copies it to a child."""
    from scenarios.explored_rewrites import rewritten_row_followed_into_the_child
    story = _story(tmp_path)
    rewritten_row_followed_into_the_child(story)
    run = next(r for r in story.world.runs if isinstance(r, RewriteRun))
    return _observation(story), run


def _with_copy(obs: Observation, run: RewriteRun, content: str) -> Observation:
    """``obs`` with the rotation's copy of the rewritten row holding ``content`` instead."""
    child = obs.record.compactions[0]
    rows = list(obs.record.messages)
    at = next(i for i, m in enumerate(rows) if m.session_id == child.child_id
              and m.message.created_at is not None and m.message.content == run.text)
    rows[at] = rows[at].model_copy(update={"message": rows[at].message.model_copy(
        update={"content": content})})
    record = obs.record.model_copy(update={"messages": tuple(rows)})
    return Observation(record=record, ledger=(), calls=obs.calls, crash_seqs=(),
                       limits=obs.limits, runs=obs.runs)


def test_a_rewrite_is_followed_into_the_child_a_rotation_copied_it_to(tmp_path: Path) -> None:
    """The turn after a rotation sends the child's copy of the rewritten row: no finding; a
    copy that kept the old text is one."""
    obs, run = _rotated_rewrite(tmp_path)
    assert obs.record.compactions and obs.record.compactions[0].child_id is not None
    assert wire_cache.rewrites_drop_the_sidecar(obs) == []
    stale = _with_copy(obs, run, "Say hello 2. My card is 4417 2210 9932 0071.")
    found = [v.message for v in wire_cache.rewrites_drop_the_sidecar(stale)]
    assert any("the rotation kept what the rewrite replaced" in m for m in found), found
