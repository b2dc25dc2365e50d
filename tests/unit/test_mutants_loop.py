"""The main loop's decisions, pinned where mutation testing found them unobserved.

Each test runs ``loop.run_loop`` (or the whole turn) on the scripted rig and asserts what
the turn did: the requests it sent, the sleeps it asked for, the rows it wrote, the way it
ended. See docs/mutation.md.
"""

from __future__ import annotations

from hermes_ref import effects as fx
from hermes_ref import finalizer, loop
from hermes_ref.context import TurnContext
from hermes_ref.errors import (
    ContextOverflow,
    OperatingError,
    ProviderAuthError,
    ProviderRejected,
    ProviderServerError,
)
from hermes_ref.limits import Limits
from hermes_ref.models import Message, ProviderReply, Role, ScaffoldFlag, ToolCall
from hermes_ref.outcomes import ExitReason, TurnResult
from hermes_ref.phases import Phase
from hermes_ref.scaffolding import DROPPED_TOOLCALL_NUDGE, EMPTY_AFTER_TOOLS_NUDGE, EMPTY_SENTINEL
from hermes_ref.tool_specs import REFERENCE_TOOLS
from tests.unit.test_mutants_rig import Rig, context

HISTORY = (Message(role=Role.USER, content="What is in a.txt?", row_id=1, turn_id="t"),)


def text(content: str | None, finish_reason: str = "stop") -> ProviderReply:
    return ProviderReply(content=content, finish_reason=finish_reason)


def calls(*arguments: str, content: str | None = None, finish_reason: str = "tool_calls",
          name: str = "read_file") -> ProviderReply:
    return ProviderReply(content=content, finish_reason=finish_reason, tool_calls=tuple(
        ToolCall(id=f"c{i}", name=name, arguments=a) for i, a in enumerate(arguments)))


READ = '{"path": "a.txt"}'


def run(replies: list[ProviderReply | OperatingError], limits: Limits | None = None
        ) -> tuple[Rig, TurnContext]:
    rig = Rig(replies)
    ctx = context(HISTORY, phase=Phase.PROLOGUE, limits=limits, tools=REFERENCE_TOOLS)
    rig.run(loop.run_loop(ctx))
    return rig, ctx


def turn(replies: list[ProviderReply | OperatingError], limits: Limits | None = None
         ) -> tuple[Rig, TurnResult]:
    rig = Rig(replies)
    ctx = context(HISTORY, phase=Phase.PROLOGUE, limits=limits, tools=REFERENCE_TOOLS)
    rig.run(loop.run_loop(ctx))
    return rig, rig.run(finalizer.finalize(ctx))


def requests(rig: Rig) -> list[fx.ProviderRequest]:
    return [e.request for e in rig.of(fx.CallProvider)]


def sleeps(rig: Rig) -> list[float]:
    return [e.seconds for e in rig.of(fx.Sleep)]


def test_a_request_carries_the_turn_settings_and_its_token_count() -> None:
    """The loop's request has the configured max_tokens, purpose "turn" and an exact count."""
    rig, _ = run([text("It says hi.")], Limits(max_tokens=64))
    (request,) = requests(rig)
    assert request.max_tokens == 64 and request.purpose == "turn"
    assert request.prompt_tokens == sum(m.tokens for m in request.messages)
    assert request.prompt_tokens > request.messages[0].tokens


def test_transient_failures_back_off_exponentially() -> None:
    """Three 5xx replies sleep 1.5, 3 and 6 s (equal jitter on 2, 4, 8 s), then succeed."""
    down = ProviderServerError("down")
    rig, ctx = run([down, down, down, text("ok")])
    assert sleeps(rig) == [1.5, 3.0, 6.0]
    assert ctx.ending.reason is ExitReason.TEXT_RESPONSE


def test_transient_retries_stop_at_their_limit_and_name_the_error() -> None:
    """With one retry allowed, a second 5xx ends the turn naming the error's class."""
    down = ProviderServerError("down")
    rig, ctx = run([down, down, text("never sent")], Limits(transient_retries_max=1))
    assert len(requests(rig)) == 2
    assert (ctx.ending.reason, ctx.ending.detail, ctx.ending.failed) == (
        ExitReason.TERMINAL_PROVIDER_ERROR, "ProviderServerError: down", True)


def test_a_rejected_request_is_terminal_at_once() -> None:
    """A 4xx that is not auth is not retried, and the detail names it."""
    rig, ctx = run([ProviderRejected("bad request"), text("never sent")])
    assert len(requests(rig)) == 1 and sleeps(rig) == []
    assert ctx.ending.detail == "ProviderRejected: bad request"


def test_auth_failures_get_exactly_the_allowed_refreshes() -> None:
    """With two refreshes allowed, the third auth failure in a row ends the turn."""
    auth = ProviderAuthError("expired")
    rig, ctx = run([auth, auth, auth, text("never sent")], Limits(auth_refreshes_max=2))
    assert len(requests(rig)) == 3
    assert ctx.ending.detail == "ProviderAuthError: expired" and ctx.ending.failed


def test_context_overflow_fails_closed_without_a_retry() -> None:
    """A context overflow with nothing to compact fails the turn closed: sent once, never again."""
    rig, ctx = run([ContextOverflow("too long"), text("never sent")])
    assert len(requests(rig)) == 1
    assert (ctx.ending.reason, ctx.ending.failed) == (ExitReason.COMPRESSION_EXHAUSTED, True)
    assert ctx.ending.detail.startswith("context_overflow: too long; compaction could not relieve")


def test_arguments_cut_by_the_length_limit_end_the_turn_unrecorded() -> None:
    """finish_reason=length with unusable arguments ends as truncated, naming every bad call."""
    reply = ProviderReply(finish_reason="length", tool_calls=(
        ToolCall(id="a", name="read_file", arguments="[1]"),
        ToolCall(id="b", name="write_file", arguments="[2]")))
    rig, ctx = run([reply])
    assert ctx.ending.reason is ExitReason.TRUNCATED_TOOL_CALL and ctx.ending.failed
    assert ctx.ending.detail == "arguments of read_file, write_file were cut off"
    assert ctx.ending.answer == loop.TRUNCATED_TEXT
    assert rig.written() == [] and rig.of(fx.ExecuteTools) == []


def test_arguments_that_stop_mid_value_are_truncated() -> None:
    """Arguments that do not end where a JSON value ends are truncated, whatever the letter."""
    for cut in ('{"path": "a', '{"path": "aX'):
        _, ctx = run([calls(cut)])
        assert ctx.ending.reason is ExitReason.TRUNCATED_TOOL_CALL, cut


def test_malformed_but_complete_arguments_are_asked_again() -> None:
    """A JSON array followed by spaces is complete: the call is made again, nothing recorded."""
    rig, ctx = run([calls("[1]  "), text("fine")])
    assert len(requests(rig)) == 2 and rig.written() == []
    assert ctx.ending.reason is ExitReason.TEXT_RESPONSE


def test_a_usable_round_resets_the_malformed_count() -> None:
    """Malformed calls are recorded only on the limit-th malformed reply in a row."""
    bad = calls("[1]")
    rig, _ = run([bad, calls(READ), bad, bad, text("done")], Limits(invalid_json_retries_max=2))
    recorded = [m for m in rig.written() if m.role is Role.ASSISTANT and m.tool_calls]
    assert [m.tool_calls[0].arguments for m in recorded] == [READ, "[1]"]


def test_one_nudge_follows_an_empty_reply_after_tools() -> None:
    """After a tool round an empty reply gets one nudge pair; the next empty reply does not."""
    rig, _ = run([calls(READ), text(""), text(""), text("done")])
    third, fourth = requests(rig)[2], requests(rig)[3]
    assert [m.wire for m in third.messages[-2:]] == [
        {"role": "assistant", "content": EMPTY_SENTINEL},
        {"role": "user", "content": EMPTY_AFTER_TOOLS_NUDGE}]
    assert fourth.messages == third.messages


def test_empty_replies_end_with_the_sentinel() -> None:
    """Past the retries, the sentinel is the answer, the reason is exhausted, no detail."""
    _, ctx = run([text(""), text(" ")], Limits(empty_retries_max=1))
    assert (ctx.ending.reason, ctx.ending.detail, ctx.ending.answer, ctx.ending.failed) == (
        ExitReason.EMPTY_RESPONSE_EXHAUSTED, "", EMPTY_SENTINEL, True)
    tail = ctx.transcript.tail()
    assert tail is not None and tail.wire == {"role": "assistant", "content": EMPTY_SENTINEL}


def test_a_dropped_tool_call_is_re_prompted_with_an_empty_assistant_text() -> None:
    """The re-prompt sends an assistant row with empty text, then the marked nudge."""
    rig, _ = run([text(None, finish_reason="tool_calls"), text("done")])
    assert [m.wire for m in requests(rig)[1].messages[-2:]] == [
        {"role": "assistant", "content": ""},
        {"role": "user", "content": DROPPED_TOOLCALL_NUDGE}]


def test_every_message_the_turn_adds_carries_its_turn_id() -> None:
    """Nudges, re-prompts, the sentinel and recorded rows are all tagged with the turn id."""
    dropped = text(None, finish_reason="tool_calls")
    rig, ctx = run([dropped, calls(READ), text(""), text(""), text(""), text(""), text("")])
    assert ctx.ending.reason is ExitReason.EMPTY_RESPONSE_EXHAUSTED
    added = [m for r in requests(rig) for m in r.messages[1 + len(HISTORY):]]
    added += list(ctx.transcript)[len(HISTORY):]
    assert {m.scaffold for m in added if m.scaffold is not None} == {
        ScaffoldFlag.DROPPED_TOOLCALL_NUDGE, ScaffoldFlag.EMPTY_RECOVERY,
        ScaffoldFlag.EMPTY_TERMINAL_SENTINEL}
    assert {m.turn_id for m in added} == {"t"}


def test_a_tool_call_row_keeps_the_reply_text_and_finish_reason() -> None:
    """The recorded assistant row of a round is the reply as the model sent it."""
    rig, _ = run([calls(READ, content="Let me look."), text("done")])
    row = rig.written()[0]
    assert (row.content, row.finish_reason, row.turn_id) == ("Let me look.", "tool_calls", "t")


def test_the_final_answer_keeps_its_finish_reason() -> None:
    """The answer row carries the reply's finish reason, and the exit detail names it."""
    rig, result = turn([text("It says hi.", finish_reason="stop")])
    assert result.exit_detail == "finish_reason=stop"
    final = rig.written()[-1]
    assert (final.content, final.finish_reason) == ("It says hi.", "stop")


def test_a_request_preflight_refuses_costs_no_budget_and_no_call() -> None:
    """A request over the window is never sent: no call counted, the budget unit given back."""
    rig, ctx = run([text("never sent")], Limits(context_window_tokens=5))
    assert rig.of(fx.CallProvider) == []
    assert (ctx.state.api_calls, ctx.state.budget.used) == (0, 0)
    assert ctx.ending.reason is ExitReason.COMPRESSION_EXHAUSTED


def test_a_dropped_call_that_narrates_is_re_prompted_with_its_narration() -> None:
    """The narration is sent back as the model's own text, then the nudge."""
    rig, _ = run([text("Let me read a.txt now.", finish_reason="tool_calls"), text("done")])
    assert [m.wire["content"] for m in requests(rig)[1].messages[-2:]] == [
        "Let me read a.txt now.", DROPPED_TOOLCALL_NUDGE]
