"""The finalizer's decisions, pinned where mutation testing found them unobserved.

Each test puts a turn context where the finalizer meets it (after the loop, or with a
chosen ending), runs ``finalizer.finalize`` or one of its steps on the scripted rig, and
asserts the result, the rows written and what the next turn does. See docs/mutation.md.
"""

from __future__ import annotations

from hermes_ref import effects as fx
from hermes_ref import finalizer, prologue
from hermes_ref.context import SessionCache, TurnContext
from hermes_ref.errors import LeaseLost
from hermes_ref.limits import Limits
from hermes_ref.models import Lease, LeaseGrant, Message, ProviderReply, Role, ToolCall
from hermes_ref.outcomes import ExitReason, TurnResult
from hermes_ref.phases import Phase, PhaseTracker
from hermes_ref.scaffolding import GRACE_SUMMARY_PROMPT
from tests.unit.test_mutants_rig import Rig, context, failing

USER = Message(role=Role.USER, content="Compare the files.", row_id=1, turn_id="t")


def spent(limits: Limits, *messages: Message) -> TurnContext:
    """A context whose loop used every call without an answer."""
    ctx = context((USER, *messages), phase=Phase.MODEL_CALL, limits=limits)
    ctx.state.api_calls = limits.max_iterations
    return ctx


def finalize(rig: Rig, ctx: TurnContext) -> TurnResult:
    return rig.run(finalizer.finalize(ctx))


def test_the_budget_exit_names_the_calls_and_asks_tool_less_for_a_summary() -> None:
    """The exit detail is calls/cap; the grace request ends on the marked summary prompt."""
    rig = Rig([ProviderReply(content="Summary.", finish_reason="length")])
    result = finalize(rig, spent(Limits(max_iterations=2, iteration_budget=2)))
    assert (result.exit_reason, result.exit_detail) == (ExitReason.MAX_ITERATIONS, "2/2")
    (call,) = rig.of(fx.CallProvider)
    prompt = call.request.messages[-1]
    assert (prompt.role, prompt.content, prompt.turn_id) == (Role.USER, GRACE_SUMMARY_PROMPT, "t")
    assert call.request.tools == () and call.request.purpose == "grace"
    final = rig.written()[-1]
    assert (final.content, final.finish_reason) == ("Summary.", "length")


def test_a_grace_call_over_the_window_is_not_sent_and_says_why() -> None:
    """The detail keeps calls/cap and adds why the grace call was not sent."""
    limits = Limits(max_iterations=1, iteration_budget=1, context_window_tokens=30)
    rig = Rig()
    result = finalize(rig, spent(limits, Message(role=Role.USER, content="x" * 60, row_id=2)))
    assert rig.of(fx.CallProvider) == []
    assert result.exit_detail == (
        "1/1; grace call not sent: the request exceeds the context window")


def test_an_empty_grace_summary_is_no_answer() -> None:
    """A grace reply with no text, or only blanks, is not an answer: the turn fails, explained."""
    for content in (None, "  "):
        rig = Rig([ProviderReply(content=content)])
        result = finalize(rig, spent(Limits(max_iterations=1, iteration_budget=1)))
        assert result.failed and not result.completed
        assert result.final_response is not None
        assert result.final_response.startswith("The turn ended without an answer")
        assert all(m.content for m in rig.written() if m.role is Role.ASSISTANT)


def test_a_successful_turn_gets_no_boundary_row_even_when_its_writes_fail() -> None:
    """A delivered answer whose rows could not be stored is not closed as a failure."""
    ctx = context((USER,), phase=Phase.MODEL_CALL)
    ctx.transcript.append(Message(role=Role.ASSISTANT, content="Done.", turn_id="t"))
    ctx.finish(ExitReason.TEXT_RESPONSE, answer="Done.")
    rig = Rig(AppendMessages=failing())
    result = finalize(rig, ctx)
    assert result.completed and result.final_response == "Done."
    assert fx.Site.BOUNDARY not in {e.label for e in rig.of(fx.AppendMessages)}


def test_a_context_pressure_failure_gets_no_boundary_row() -> None:
    """FIN-5 adds no boundary row after a compression timeout."""
    ctx = context((USER,), phase=Phase.MODEL_CALL)
    ctx.finish(ExitReason.COMPRESSION_TIMEOUT, "compaction took too long", failed=True)
    rig = Rig()
    finalize(rig, ctx)
    assert fx.Site.BOUNDARY not in {e.label for e in rig.of(fx.AppendMessages)}


def test_the_footer_lists_every_failed_write_in_path_order() -> None:
    """Two failed writes are listed sorted by path, comma separated."""
    ctx = context((USER,), phase=Phase.FINALIZE)
    ctx.transcript.append(Message(role=Role.ASSISTANT, content="Done.", turn_id="t"))
    ctx.finish(ExitReason.TEXT_RESPONSE, answer="Done.")
    ctx.state.failed_mutations.update({"b.txt": "patch", "a.txt": "write_file"})
    finalizer._mutation_footer(ctx)
    expected = "Done.\n\n[These file changes did not apply: a.txt (write_file), b.txt (patch)]"
    assert ctx.ending.answer == expected
    tail = ctx.transcript.tail()
    assert tail is not None and tail.content == expected


def test_the_footer_goes_only_into_a_pending_answer_of_a_delivered_turn() -> None:
    """No footer over a stored row, a non-assistant tail, an empty list or a failed turn."""
    stored = Message(role=Role.ASSISTANT, content="Done.", row_id=2, turn_id="t")
    pending = Message(role=Role.ASSISTANT, content="Done.", turn_id="t")
    tool = Message(role=Role.TOOL, content="r", tool_call_id="c", turn_id="t")
    for tail, failed in ((stored, False), (tool, False), (pending, True), (None, False)):
        ctx = context((USER,), phase=Phase.FINALIZE)
        if tail is not None:
            ctx.transcript.append(tail)
        else:
            ctx.transcript = type(ctx.transcript)()
        ctx.finish(ExitReason.TEXT_RESPONSE, answer="Done.", failed=failed)
        ctx.state.failed_mutations["a.txt"] = "write_file"
        finalizer._mutation_footer(ctx)
        assert ctx.ending.answer == "Done.", (tail, failed)


def test_a_failed_turn_result_states_its_failure_and_is_not_completed() -> None:
    """A failed turn with an explanation: failure_reason is reason:detail, not completed."""
    ctx = context((USER,), phase=Phase.MODEL_CALL)
    ctx.finish(ExitReason.INVALID_TOOL_CALLS, "model generated invalid tool calls: nope",
               answer="explained", failed=True)
    result = finalize(Rig(), ctx)
    assert result.failure_reason == "invalid_tool_calls:model generated invalid tool calls: nope"
    assert result.exit_detail == "model generated invalid tool calls: nope"
    assert result.failed and not result.completed


def test_a_successful_turn_result_has_no_failure_reason() -> None:
    """A delivered answer is completed, with no failure reason."""
    ctx = context((USER,), phase=Phase.MODEL_CALL)
    ctx.transcript.append(Message(role=Role.ASSISTANT, content="Hi.", turn_id="t"))
    ctx.finish(ExitReason.TEXT_RESPONSE, "finish_reason=stop", answer="Hi.")
    result = finalize(Rig(), ctx)
    assert result.completed and result.failure_reason is None


def test_a_lost_lease_at_release_is_a_named_cleanup_error() -> None:
    """Releasing a lease that was lost is reported as a cleanup error with its cause."""
    ctx = context((USER,), phase=Phase.MODEL_CALL)
    ctx.transcript.append(Message(role=Role.ASSISTANT, content="Hi.", turn_id="t"))
    ctx.finish(ExitReason.TEXT_RESPONSE, answer="Hi.")

    def lost(effect: object) -> None:
        raise LeaseLost("token 5 is stale")
    result = finalize(Rig(ReleaseLease=lost), ctx)
    assert result.cleanup_errors == ("release: lease_lost: token 5 is stale",)


def _next_turn_loads(cache: SessionCache, token: int) -> bool:
    """Whether the next turn on ``cache`` reloads the history, given its lease token."""
    lease = Lease(session_id="s", holder="h", token=token, acquired_at=0.0, expires_at=1.0)
    rig = Rig(OpenTurn=lambda e: LeaseGrant(session=e.record, created=False, lease=lease),
              AcquireLease=lambda e: lease, LoadMessages=lambda e: ())
    deps = prologue.PrologueDeps(Limits(), (), "h", {"s": cache}, PhaseTracker())
    rig.run(prologue.build_turn_context(prologue.TurnInput("s", "next"), deps))
    return bool(rig.of(fx.LoadMessages))


def test_a_clean_turn_is_trusted_by_the_next_one() -> None:
    """After a fully stored turn, the next lease (token + 1) reuses the cached history."""
    ctx = context((USER,), phase=Phase.MODEL_CALL, token=5)
    ctx.transcript.append(Message(role=Role.ASSISTANT, content="Hi.", turn_id="t"))
    ctx.finish(ExitReason.TEXT_RESPONSE, answer="Hi.")
    finalize(Rig(), ctx)
    assert not _next_turn_loads(ctx.cache, 6)


def test_a_turn_with_a_cleanup_error_makes_the_next_one_reload() -> None:
    """A failed release (no failed write) still makes the next turn reload the record."""
    ctx = context((USER,), phase=Phase.MODEL_CALL, token=5)
    ctx.transcript.append(Message(role=Role.ASSISTANT, content="Hi.", turn_id="t"))
    ctx.finish(ExitReason.TEXT_RESPONSE, answer="Hi.")

    def lost(effect: object) -> None:
        raise LeaseLost("stale")
    finalize(Rig(ReleaseLease=lost), ctx)
    assert _next_turn_loads(ctx.cache, 6)


def test_a_working_list_with_unstored_rows_is_never_cached() -> None:
    """Rows that are not durable make the next turn reload, whatever the flags say."""
    ctx = context((USER,), phase=Phase.FINALIZE, token=5)
    ctx.transcript.append(Message(role=Role.ASSISTANT, content="Hi.", turn_id="t"))
    finalizer._update_cache(ctx)
    assert _next_turn_loads(ctx.cache, 6)


def test_open_calls_of_a_failed_turn_are_closed_with_their_tool_names() -> None:
    """FIN-5's closing results name the tool of each open call."""
    calls = (ToolCall(id="a", name="read_file"), ToolCall(id="b", name="terminal"))
    open_round = Message(role=Role.ASSISTANT, tool_calls=calls, row_id=2, turn_id="t")
    ctx = context((USER, open_round), phase=Phase.MODEL_CALL)
    ctx.finish(ExitReason.TERMINAL_PROVIDER_ERROR, "down", failed=True)
    rig = Rig()
    finalize(rig, ctx)
    closing = [m for m in rig.written() if m.role is Role.TOOL]
    assert [(m.tool_call_id, m.tool_name) for m in closing] == [("a", "read_file"),
                                                                 ("b", "terminal")]
