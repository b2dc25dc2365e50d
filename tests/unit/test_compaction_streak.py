"""CMP-4's streak as the checkers read it: the engine's own verdicts, pass for pass."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any, cast
from unittest import mock

import pytest

from hermes_ref import compaction
from hermes_ref.compaction import PassOutcome
from hermes_ref.context import TurnContext
from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role
from hermes_ref.ports import DurableRecord, StoredMessage
from hermes_ref.wire import ProviderRequest
from sim.checkers.base import Observation
from sim.checkers.compaction_places import finds_nothing, working_list
from sim.checkers.compaction_streak import verdicts
from sim.explore.plan import generate
from sim.explore.run import run_plan
from sim.world import CallRecord
from tests.unit.observing import judged_observations

# seeds whose engines run every kind of pass the record leaves no row of: an idle pass and
# the threshold pass after it (3, 2966), a turn's first preflight failing closed (0, 262:
# after a compaction), a later one (19), one after a fallback hop at the iteration bound
# (146), an overflow's forced pass (1), lists holding a cut reply's hidden row (201), a
# committed pass judged on a fallback's threshold (3313), a retry's nudge in the tail (4850),
# committed passes whose next request still carried the scaffolding of re-prompts and
# recoveries, sent but never stored, which puts it back over the threshold (8337, 8441), and
# an overflow's forced pass that failed the turn closed with re-prompts in its tail (11105)
SEEDS = (0, 1, 3, 19, 146, 201, 262, 2966, 3313, 4850, 8337, 8441, 11105)


def _engine_and_checker(seed: int) -> tuple[dict[str, list[tuple[bool, bool]]],
                                            dict[str, list[tuple[bool, bool]]]]:
    """Each turn's judged passes as (wrote nothing, ineffective): as the engine ran them,
    and as the checkers read them from the record at the end of the seed."""
    engine: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    run_pass = compaction.run_pass

    async def watched(ctx: TurnContext, now: float, *, target_tokens: int) -> PassOutcome:
        streak = ctx.cache.compression.ineffective
        out = await run_pass(ctx, now, target_tokens=target_tokens)
        if out.failure is None and not out.deferred:  # a judged pass
            engine[ctx.turn_id].append((not out.changed,
                                        ctx.cache.compression.ineffective == streak + 1))
        return out

    with mock.patch.object(compaction, "run_pass", watched), judged_observations() as seen:
        run_plan(generate(seed), trace=False)
    checker: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for verdict in verdicts(seen[-1]):
        if verdict.turn is not None:
            checker[verdict.turn].append((verdict.empty, verdict.ineffective))
    return dict(engine), dict(checker)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_streak_is_the_engines_pass_for_pass(seed: int) -> None:
    """Every pass the engine judged, empty or committed, is a verdict of the record in the
    same turn and order, with the same judgement, and no verdict is one the engine did
    not make: the streak that blocks compaction is read exactly, with nothing invented."""
    engine, checker = _engine_and_checker(seed)
    assert engine, "the seed runs no pass: it proves nothing"
    assert checker == engine


def _message(role: Role, row_id: int | None, text: str = "x", **more: Any) -> Message:
    return Message(role=role, content=text, row_id=row_id, **more)


def test_a_hidden_row_is_in_the_working_list_though_not_on_the_wire() -> None:
    """A reply a correction cut with nothing visible is stored hidden: the engine keeps it
    in its list, counts it and plans with it, but never sends it (LOOP-4)."""
    system = Message(role=Role.SYSTEM, content="prompt")
    sent = (_message(Role.USER, 1), _message(Role.USER, 3, "the correction"))
    hidden = _message(Role.ASSISTANT, 2, "", hidden=True)
    request = ProviderRequest(model="m", messages=(system, *sent), tools=(), prompt_tokens=1)
    call = CallRecord(9, "s-1", "turn-1", request, None, None, 3, 0.0, None, request.wire_body())
    record = DurableRecord(messages=tuple(StoredMessage(session_id="s-1", message=m)
                                          for m in (sent[0], hidden, sent[1])))
    obs = cast(Observation, SimpleNamespace(record=record, memo=None))
    assert working_list(obs, call) == (sent[0], hidden, sent[1])


def test_one_message_between_the_head_and_the_tail_is_something_to_compact() -> None:
    """Three protected messages, one in the middle, the tail's floor of eight: a pass has a
    middle to summarize, though the list is no longer than head, floor and two more."""
    limits = Limits(context_window_tokens=250)
    chat = tuple(_message(Role.USER if k % 2 == 0 else Role.ASSISTANT, k + 1, f"message {k}",
                          turn_id="turn-0") for k in range(11))
    own = _message(Role.USER, 12, "now", turn_id="turn-1")
    assert not finds_nothing((*chat, own), limits, "turn-1")
    assert finds_nothing((*chat[:10], own), limits, "turn-1")
