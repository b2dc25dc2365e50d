"""Stories of how a turn is closed: budget fallback, guarded persistence, the exit line."""

from __future__ import annotations

from hermes_ref.finalizer import NO_ANSWER_TEXT
from hermes_ref.models import EventKind, Role, ToolCall
from hermes_ref.outcomes import ExitLine, ExitReason, TurnResult
from sim.harness import Story, scenario
from sim.provider import text, tool_calls


@scenario("When the step budget runs out, one tool-less call summarizes",
          invariants=("LOOP-1", "LOOP-2", "LOOP-3", "FIN-1", "FIN-3", "FIN-7"), stage="finalizer")
def budget_exhaustion_gets_a_grace_summary(s: Story) -> None:
    s.limits(max_iterations=2, iteration_budget=2)
    s.files({"a.txt": "1", "b.txt": "2"})
    s.script(tool_calls(("read_file", {"path": "a.txt"})),
             tool_calls(("read_file", {"path": "b.txt"})),
             text("I read a.txt and b.txt; the comparison is still open."))
    result = s.turn("Compare every file.")
    s.expect(result is not None and result.exit_reason is ExitReason.MAX_ITERATIONS,
             "exit reason max_iterations_reached")
    s.expect(result is not None and result.api_calls == 3, "two budgeted calls and one grace call")
    grace = s.world.calls[-1].request
    s.expect(grace.tools == () and grace.purpose == "grace", "the grace call offers no tools")


def _two_reads_then_a_summary(s: Story) -> TurnResult | None:
    """Two tool rounds, then a text reply: the grace summary once a bound stops the loop."""
    s.files({"a.txt": "1", "b.txt": "2"})
    s.script(tool_calls(("read_file", {"path": "a.txt"})),
             tool_calls(("read_file", {"path": "b.txt"})),
             text("Both files are read; nothing is compared yet."))
    return s.turn("Compare every file.")


@scenario("The iteration cap stops the loop even when budget is left",
          invariants=("LOOP-1", "LOOP-3", "FIN-1"), stage="finalizer")
def iteration_cap_binds_before_the_budget(s: Story) -> None:
    s.limits(max_iterations=2, iteration_budget=5)
    result = _two_reads_then_a_summary(s)
    s.expect(result is not None and result.exit_reason is ExitReason.MAX_ITERATIONS,
             "exit reason max_iterations_reached")
    s.expect(result is not None and result.budget_used == 2, "two of five budget units spent")


@scenario("The iteration budget stops the loop even when the cap is far",
          invariants=("LOOP-1", "LOOP-3", "FIN-1"), stage="finalizer")
def budget_binds_before_the_iteration_cap(s: Story) -> None:
    s.limits(max_iterations=5, iteration_budget=2)
    result = _two_reads_then_a_summary(s)
    s.expect(result is not None and result.exit_reason is ExitReason.BUDGET_EXHAUSTED,
             "exit reason budget_exhausted")
    s.expect(result is not None and result.api_calls == 3, "two budgeted calls and the grace call")


@scenario("A failed write of the final row still delivers the answer, and the tail is closed",
          invariants=("FIN-6", "FIN-3", "LOOP-3", "CTX-2", "DEL-1"), stage="finalizer")
def final_row_write_failure_keeps_the_answer(s: Story) -> None:
    s.faults(fail_writes={"final": 1})
    s.script(text("All done."), text("Nothing else is pending."))
    result = s.turn("Finish up.")
    s.expect(result is not None and result.final_response == "All done.", "the answer is delivered")
    s.expect(result is not None and len(result.cleanup_errors) == 1, "the failure is reported")
    tail = s.transcript()[-1]
    s.expect(tail.role is Role.ASSISTANT and tail.content == "All done.",
             "tail closure wrote the answer after the failed flush")
    s.turn("Anything else?")
    s.expect(len(s.transcript()) == 4, "the next turn starts from the durable record only")


@scenario("A turn that stops on a tool result says so and closes the tail",
          invariants=("FIN-8", "FIN-5", "FIN-7", "FIN-3", "LOOP-3"), stage="finalizer")
def stop_on_tool_result_is_explained(s: Story) -> None:
    s.limits(max_iterations=1, iteration_budget=1, grace_call_enabled=False)
    s.files({"a.txt": "1"})
    s.script(tool_calls(("read_file", {"path": "a.txt"})))
    result = s.turn("Read a.txt.")
    s.expect(result is not None and result.exit_reason is ExitReason.PENDING_TOOL_RESULT,
             "exit reason pending_tool_result")
    s.expect(s.transcript()[-1].role is Role.ASSISTANT, "an engine boundary row closes the tail")


@scenario("A turn whose budget runs out on a tool result says so too, whatever bound stopped it",
          invariants=("FIN-8", "FIN-5", "LOOP-1", "LOOP-3"), stage="finalizer")
def budget_stop_on_tool_result_is_explained(s: Story) -> None:
    """The iteration budget (1) ends the loop well before ``max_iterations`` (5), with the
    grace call off: the guard names the stop ``pending_tool_result`` here as well, not
    only when the call cap is what stopped the loop."""
    s.limits(max_iterations=5, iteration_budget=1, grace_call_enabled=False)
    s.files({"a.txt": "1"})
    s.script(tool_calls(("read_file", {"path": "a.txt"})))
    result = s.turn("Read a.txt.")
    s.expect(result is not None and result.exit_reason is ExitReason.PENDING_TOOL_RESULT,
             "exit reason pending_tool_result")
    s.expect(len(s.world.calls) == 1, "one model call: the budget, not the cap, stopped it")
    s.expect(s.transcript()[-1].role is Role.ASSISTANT, "an engine boundary row closes the tail")


@scenario("With the grace call on, a summary that comes back empty still ends the turn loudly",
          invariants=("FIN-8", "FIN-1", "FIN-5", "LOOP-3"), stage="finalizer")
def empty_grace_summary_after_tools_is_explained(s: Story) -> None:
    s.limits(max_iterations=1, iteration_budget=1)  # the grace call stays enabled, as by default
    s.files({"a.txt": "1"})
    s.script(tool_calls(("read_file", {"path": "a.txt"})), text(""))
    result = s.turn("Read a.txt.")
    s.expect(result is not None and result.exit_reason is ExitReason.PENDING_TOOL_RESULT,
             "exit reason pending_tool_result")
    s.expect(s.world.calls[-1].request.purpose == "grace", "the grace call was made")
    s.expect(s.transcript()[-1].role is Role.ASSISTANT, "an engine boundary row closes the tail")


@scenario("A turn that runs out of steps with nothing to say fails and tells the user so",
          invariants=("LOOP-3", "FIN-1", "FIN-5"), stage="finalizer")
def out_of_steps_with_no_answer_is_a_failure(s: Story) -> None:
    s.limits(max_iterations=1, iteration_budget=1)
    s.script(text(""), text(""))
    result = s.turn("Say something.")
    s.expect(result is not None and result.exit_reason is ExitReason.MAX_ITERATIONS
             and result.failed, "max_iterations_reached, as a failure")
    s.expect(result is not None and result.final_response == NO_ANSWER_TEXT.format(
        reason="max_iterations_reached"), "the user is told there is no answer")


@scenario("A failed write is reported in its own turn, though the next turn reuses its call id",
          invariants=("TOOL-9", "TOOL-6"), stage="finalizer")
def failed_write_reported_in_its_own_turn(s: Story) -> None:
    s.files({"a.txt": "1"})
    s.world.tools.fail_next("write_file", "disk full")
    write = ToolCall(id="call_0", name="write_file", arguments='{"path": "a.txt", "content": "2"}')
    s.script(tool_calls(write), text("Tried."), tool_calls(write), text("Done now."))
    first = s.turn("Set a.txt to 2.")
    second = s.turn("Try again.")
    s.expect(first is not None and "did not apply: a.txt (write_file)" in (first.final_response or ""),
             "the first turn reports its failed write")
    s.expect(second is not None and second.final_response == "Done now.",
             "the second turn's write succeeded and it reports nothing")
    ids = [c.id for m in s.transcript() for c in m.tool_calls]
    s.expect(len(ids) == 2 and ids[0] == ids[1], "both turns' calls carry the same id")


@scenario("A lease release that fails still leaves the record of how the turn ended",
          invariants=("FIN-6", "FIN-7", "DEL-1", "LOOP-3"), stage="finalizer")
def failed_release_keeps_the_turns_ending(s: Story) -> None:
    s.faults(fail_writes={"release": 1})
    s.script(text("Done."))
    result = s.turn("Finish.")
    s.expect(result is not None and result.final_response == "Done.", "the answer is delivered")
    s.expect(result is not None and any(e.startswith("release:") for e in result.cleanup_errors),
             "the failed release is reported")
    kinds = [e.kind for e in s.world.store.snapshot().events]
    s.expect(kinds[-2:] == [EventKind.TURN_EXIT, EventKind.TURN_COMPLETED],
             "the exit line and the completion are durable")


@scenario("A turn left ending on a tool result is logged as a WARNING",
          invariants=("FIN-7",), stage="finalizer")
def open_tool_tail_logs_a_warning(s: Story) -> None:
    s.limits(max_iterations=1, iteration_budget=1, grace_call_enabled=False)
    s.files({"a.txt": "1"})
    s.faults(fail_writes={"boundary": 1})
    s.script(tool_calls(("read_file", {"path": "a.txt"})))
    s.turn("Read a.txt.")
    exits = [ExitLine.of(e) for e in s.world.stream if e.kind is EventKind.TURN_EXIT]
    s.expect(exits[-1].level == "WARNING" and exits[-1].last_role == "tool",
             "the exit line is a WARNING naming the tool tail")


@scenario("The exit line's answer length counts the answer as delivered, its edges included",
          invariants=("FIN-7", "FIN-3"), stage="finalizer")
def exit_line_counts_the_whole_answer(s: Story) -> None:
    s.script(text("  Indented, and a line break after.\n"))
    result = s.turn("Answer with some space around it.")
    exits = [ExitLine.of(e) for e in s.world.stream if e.kind is EventKind.TURN_EXIT]
    s.expect(result is not None and result.final_response is not None
             and exits[-1].response_len == len(result.final_response),
             "response_len is the length of the answer delivered")


@scenario("An answer says which file writes failed, unless a later write fixed them",
          invariants=("TOOL-9", "TOOL-6", "FIN-3"), stage="finalizer")
def failed_write_is_reported_in_the_answer(s: Story) -> None:
    s.files({"a.txt": "1", "b.txt": "1"})
    s.world.tools.fail_next("write_file", "disk full")
    s.world.tools.fail_next("write_file", "disk full")
    s.script(tool_calls(("write_file", {"path": "a.txt", "content": "2"})),
             tool_calls(("write_file", {"path": "b.txt", "content": "2"})),
             tool_calls(("write_file", {"path": "b.txt", "content": "2"})),
             text("Both files are updated."))
    result = s.turn("Set a.txt and b.txt to 2.")
    final = result.final_response if result is not None else ""
    s.expect("[These file changes did not apply: a.txt (write_file)]" in (final or ""),
             "the failed write to a.txt is reported")
    s.expect("b.txt" not in (final or "").split("did not apply")[-1],
             "b.txt failed once but a later write succeeded")
    s.expect(s.transcript()[-1].content == final, "the stored answer carries the same footer")


@scenario("A write that failed under one spelling of a path and was redone under another is "
          "not reported",
          invariants=("TOOL-9",), stage="finalizer")
def failed_write_redone_by_another_spelling(s: Story) -> None:
    s.files({"docs/b.txt": "1"})
    s.world.tools.fail_next("write_file", "disk full")
    s.script(tool_calls(("write_file", {"path": "./docs/b.txt", "content": "2"})),
             tool_calls(("write_file", {"path": "docs/b.txt", "content": "2"})),
             text("b.txt is updated."))
    result = s.turn("Set docs/b.txt to 2.")
    final = (result.final_response if result is not None else None) or ""
    s.expect("did not apply" not in final, "./docs/b.txt and docs/b.txt are one file, redone")
    s.expect(s.world.tools.snapshot_files()["docs/b.txt"] == "2", "the second write landed")
