"""Property: whatever the provider says and wherever the process dies, recovery leaves a sound record.

Hypothesis generates a provider script (tool rounds with one to three calls, plain
text, empty replies, dropped tool calls, malformed and cut-off arguments, rate limits,
server errors) and a crash before
any effect of the first turn. The process restarts and runs a second turn. After that,
every checker must pass on the durable record, in particular persist-before-execute
(TOOL-1), one result per call (TOOL-3) and tail closure (FIN-3), and the session must
end on an assistant row. A failure shrinks to a minimal script and crash point, and the
printed example (with ``print_blob``) replays it exactly: the world is seeded and has
no other source of nondeterminism.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hermes_ref.errors import ProviderServerError, RateLimited
from hermes_ref.models import ProviderReply, Role, ToolCall
from hermes_ref.wire import ProviderRequest
from sim.harness import Story
from sim.provider import FunctionProvider, text, tool_calls

MAX_EXAMPLES = int(os.environ.get("HERMES_REF_PROPERTY_EXAMPLES", "60"))

TOOL_CALLS = {
    "read_file": {"path": "notes.txt"},
    "write_file": {"path": "notes.txt", "content": "changed"},
    "execute_code": {"code": "print(1)"},
    "terminal": {"command": "echo hi"},
    "teleport": {"to": "mars"},  # not a tool: answered in place
}

step_strategy = st.one_of(
    st.lists(st.sampled_from(sorted(TOOL_CALLS)), min_size=1, max_size=3).map(
        lambda names: ("tools", tuple(names))),
    st.just(("text", ())),
    st.just(("empty", ())),
    st.just(("dropped", ())),
    st.just(("rate_limited", ())),
    st.just(("server_error", ())),
    st.just(("malformed", ())),
    st.just(("truncated", ())),
)


def _reply(step: tuple[str, tuple[str, ...]], index: int) -> ProviderReply | Exception:
    kind, names = step
    if kind == "tools":
        return tool_calls(*[ToolCall(id=f"c{index}-{i}", name=n, arguments=_args(n))
                            for i, n in enumerate(names)])
    if kind == "text":
        return text(f"answer {index}")
    if kind == "empty":
        return text("")
    if kind == "dropped":
        return ProviderReply(content=None, finish_reason="tool_calls")
    if kind == "malformed":
        return tool_calls(ToolCall(id=f"c{index}-m", name="read_file", arguments='{"path": x}'))
    if kind == "truncated":
        return tool_calls(ToolCall(id=f"c{index}-t", name="write_file",
                                   arguments='{"path": "notes.txt", "content": "cut'),
                          finish_reason="length")
    if kind == "rate_limited":
        return RateLimited("slow down", retry_after_s=1.0)
    return ProviderServerError("upstream", status=503)


def _args(name: str) -> str:
    import json

    return json.dumps(TOOL_CALLS[name])


def scripted_then_text(steps: list[tuple[str, tuple[str, ...]]]) -> FunctionProvider:
    """Play the generated steps, then answer in text forever (so every turn can end)."""
    state = {"i": 0}

    def reply(request: ProviderRequest) -> ProviderReply:
        i = state["i"]
        state["i"] += 1
        if i < len(steps):
            out = _reply(steps[i], i)
            if isinstance(out, Exception):
                raise out
            return out
        return text(f"final {i}")

    return FunctionProvider(reply)


def _run(steps: list[Any], crash_at: int | None, store_kind: str, seed: int) -> Story:
    with tempfile.TemporaryDirectory() as tmp:
        story = Story(store_kind=store_kind, workdir=Path(tmp), seed=seed, trace=False)
        story.files({"notes.txt": "original"})
        story.limits(max_iterations=5, iteration_budget=5)
        story.use_provider(scripted_then_text(steps))
        story.faults(crash_at_effect=crash_at)
        story.turn("do the thing")
        story.restart()
        story.faults()
        second = story.turn("and now?")
        assert second is not None, "the second turn must not crash"
        rows = story.transcript()
        assert rows and rows[-1].role is Role.ASSISTANT, [r.role for r in rows]
        assert not story.violations, [str(v) for v in story.violations]
        story.world.store.close()
        return story


@settings(max_examples=MAX_EXAMPLES, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step_strategy, min_size=1, max_size=6),
       crash_at=st.one_of(st.none(), st.integers(min_value=1, max_value=60)),
       seed=st.integers(min_value=0, max_value=2**16))
# found by this property: the fifth call (the bound) answers empty, so the grace call
# comes instead of the ladder's nudge; LOOP-8's checker once called that unexplained
@example(steps=[("empty", ()), ("tools", ("execute_code",)), ("empty", ()),
                ("tools", ("execute_code",)), ("empty", ()), ("empty", ())],
         crash_at=None, seed=0)
def test_recovery_keeps_the_record_sound_in_memory(
    steps: list[Any], crash_at: int | None, seed: int
) -> None:
    """Any script, any crash point, then restart: every checker holds (memory store)."""
    _run(steps, crash_at, "memory", seed)


@settings(max_examples=max(10, MAX_EXAMPLES // 4), deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step_strategy, min_size=1, max_size=5),
       crash_at=st.one_of(st.none(), st.integers(min_value=1, max_value=50)))
def test_recovery_keeps_the_record_sound_on_sqlite(steps: list[Any], crash_at: int | None) -> None:
    """The same property on the SQLite store, where a crash closes the connection."""
    _run(steps, crash_at, "sqlite", 0)


def test_property_catches_a_broken_engine() -> None:
    """Under the execute-before-persist sabotage, a crash after a tool call breaks the record."""
    from sim.sabotage import SABOTAGES

    steps = [("tools", ("write_file",)), ("text", ())]
    with SABOTAGES["execute_before_persist"].applied(), pytest.raises(AssertionError):
        _run(steps, None, "memory", 0)


SWEEP_EXAMPLES = int(os.environ.get("HERMES_REF_SWEEP_EXAMPLES", "2000"))


@pytest.mark.slow
@settings(max_examples=SWEEP_EXAMPLES, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step_strategy, min_size=1, max_size=12),
       crashes=st.lists(st.integers(min_value=1, max_value=120), min_size=1, max_size=3),
       seed=st.integers(min_value=0, max_value=2**16))
def test_sweep_repeated_crashes_and_recoveries(steps: list[Any], crashes: list[int], seed: int) -> None:
    """Long sweep: up to three crashes in a row, each followed by a restart; the record stays sound."""
    with tempfile.TemporaryDirectory() as tmp:
        story = Story(store_kind="memory", workdir=Path(tmp), seed=seed, trace=False)
        story.files({"notes.txt": "original"})
        story.limits(max_iterations=6, iteration_budget=6)
        story.use_provider(scripted_then_text(steps))
        for crash_at in crashes:
            story.faults(crash_at_effect=crash_at)
            story.turn("do the thing")
            story.restart()
        story.faults()
        final = story.turn("and now?")
        assert final is not None
        rows = story.transcript()
        assert rows and rows[-1].role is Role.ASSISTANT, [r.role for r in rows]
        assert not story.violations, [str(v) for v in story.violations]
