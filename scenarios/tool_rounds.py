"""Stories of tool rounds: persist before execute, one result per call, errors as results."""

from __future__ import annotations

from hermes_ref.models import Role
from hermes_ref.outcomes import ExitReason
from sim.harness import Story, scenario
from sim.provider import FunctionProvider, text, tool_calls


@scenario("A tool call is written down before the tool runs",
          invariants=("TOOL-1", "TOOL-3", "CTX-2", "CTX-8", "FIN-3", "DEL-1"), stage="tool_round")
def tool_call_is_durable_before_it_runs(s: Story) -> None:
    s.files({"notes.txt": "buy milk"})
    s.script(tool_calls(("read_file", {"path": "notes.txt"})), text("Your note says: buy milk."))
    result = s.turn("What is in my notes?")
    s.expect(result is not None and result.final_response == "Your note says: buy milk.", "answered")
    roles = [r.role for r in s.transcript()]
    s.expect(roles == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT],
             "user, call, result, answer")


@scenario("Parallel reads run as one segment and every call gets one result in call order",
          invariants=("TOOL-1", "TOOL-3", "TOOL-4"), stage="tool_round")
def parallel_reads_share_a_segment(s: Story) -> None:
    s.files({"a.txt": "alpha", "b.txt": "beta", "c.txt": "gamma"})
    s.script(tool_calls(("read_file", {"path": "a.txt"}), ("read_file", {"path": "b.txt"}),
                        ("read_file", {"path": "c.txt"})),
             text("alpha, beta, gamma"))
    s.turn("Read all three files.")
    results = [r.tool_call_id for r in s.transcript() if r.role is Role.TOOL]
    s.expect(results == ["call_1", "call_2", "call_3"], "results in call order")
    elapsed = s.world.clock.now() - s.world.timeline.start_s
    s.expect(abs(elapsed - s.world.tools.cost_s("read_file")) < 1e-6,
             "the reads ran as one parallel segment (the clock moved by one read, not three)")


@scenario("A write never runs alongside a read of the same file, and order is kept",
          invariants=("TOOL-4", "TOOL-3", "TOOL-1"), stage="tool_round")
def writer_waits_for_readers_of_its_path(s: Story) -> None:
    s.files({"a.txt": "old", "b.txt": "beta", "c.txt": "gamma"})
    s.script(tool_calls(("read_file", {"path": "a.txt"}),
                        ("write_file", {"path": "a.txt", "content": "new"}),
                        ("read_file", {"path": "b.txt"}), ("read_file", {"path": "sub/../c.txt"})),
             text("Done."))
    s.turn("Read a.txt, rewrite it, and read b.txt and c.txt.")
    s.expect(s.world.batches == [("call_1",), ("call_2", "call_3", "call_4")],
             "the read of a.txt ran first, then the write with the unrelated reads")
    reads = [r.content for r in s.transcript() if r.role is Role.TOOL]
    s.expect("old" in (reads[0] or ""), "the read saw the file before the write")


@scenario("A failing tool becomes a result the model reads, not a failed turn",
          invariants=("TOOL-6", "TOOL-3"), stage="tool_round")
def failing_tool_is_a_result(s: Story) -> None:
    s.script(tool_calls(("terminal", {"command": "make test"})), text("The tests could not run."))
    s.world.tools.fail_next("terminal", "make: *** No rule to make target 'test'")
    result = s.turn("Run the tests.")
    s.expect(result is not None and not result.failed, "the turn does not fail")
    s.expect(result is not None and result.api_calls == 2, "the model saw the error and answered")


@scenario("A call to a tool that does not exist gets an error result in place",
          invariants=("TOOL-2", "TOOL-3", "TOOL-6"), stage="tool_round")
def unknown_tool_answered_in_place(s: Story) -> None:
    s.files({"a.txt": "alpha"})
    s.script(tool_calls(("read_file", {"path": "a.txt"}), ("teleport", {"to": "mars"})),
             text("I read a.txt; teleport is not a tool."))
    s.turn("Read a.txt and teleport.")
    results = [r for r in s.transcript() if r.role is Role.TOOL]
    s.expect([r.tool_call_id for r in results] == ["call_1", "call_2"], "both calls answered")
    s.expect("does not exist" in (results[1].content or ""), "the unknown call got an error")
    s.expect([e.name for e in s.world.tools.ledger] == ["read_file"], "only the real tool ran")


@scenario("A round that only ran execute_code costs no budget",
          invariants=("LOOP-2", "TOOL-1"), stage="tool_round")
def execute_code_round_is_refunded(s: Story) -> None:
    s.script(tool_calls(("execute_code", {"code": "print(6 * 7)"})), text("42"))
    result = s.turn("Compute 6 * 7 with code.")
    s.expect(result is not None and result.api_calls == 2 and result.budget_used == 1,
             "two calls, one budget unit")


@scenario("A round that only ran execute_code costs no budget, even when its result could not be stored",
          invariants=("LOOP-2", "TOOL-8"), stage="tool_round")
def execute_code_round_is_refunded_when_its_result_is_lost(s: Story) -> None:
    """Seeds 260, 280 and 607 of the explored world: the code ran, its result's write
    failed and the turn ended on the failed write; the round was still one of refundable
    tools only, so it cost no budget unit (LOOP-2 asks nothing of the results' fate)."""
    s.faults(fail_writes={"tool_results": 1})
    s.script(tool_calls(("execute_code", {"code": "print(6 * 7)"})))
    result = s.turn("Compute 6 * 7 with code.")
    s.expect(result is not None and result.exit_reason is ExitReason.PERSISTENCE_FAILED,
             "the turn ended on the failed write")
    s.expect(result is not None and result.api_calls == 1 and result.budget_used == 0,
             "one call, no budget unit: the round ran only execute_code")


@scenario("A round that mixes execute_code with another tool still costs its budget unit",
          invariants=("LOOP-2",), stage="tool_round")
def mixed_round_is_not_refunded(s: Story) -> None:
    s.files({"a.txt": "6"})
    s.script(tool_calls(("execute_code", {"code": "print(6 * 7)"}), ("read_file", {"path": "a.txt"})),
             text("42, and a.txt says 6"))
    result = s.turn("Compute 6 * 7 and read a.txt.")
    s.expect(result is not None and result.api_calls == 2 and result.budget_used == 2,
             "two calls, two budget units: only an all-refundable round is refunded")


@scenario("A tool result the store refuses is never shown to the model, and the tail is still closed",
          invariants=("TOOL-8", "TOOL-3", "FIN-5", "LOOP-3", "DEL-1"), stage="tool_round")
def refused_tool_result_is_not_sent(s: Story) -> None:
    s.files({"notes.txt": "x"})
    s.faults(fail_writes={"tool_results": 1})
    s.script(tool_calls(("write_file", {"path": "notes.txt", "content": "y"})))
    result = s.turn("Overwrite my notes.")
    s.expect(result is not None and result.exit_reason is ExitReason.PERSISTENCE_FAILED,
             "exit reason session_persistence_failed")
    s.expect(len(s.world.calls) == 1, "the model was not called again with the lost result")
    rows = s.transcript()
    s.expect([r.role for r in rows] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT],
             "the call got an 'unknown' result and a boundary row closed the tail")
    s.expect((rows[2].content or "").startswith("unknown:"), "the result is reported unknown")


@scenario("Calls of a round that never started are reported not run, not lost",
          invariants=("TOOL-3", "TOOL-8", "FIN-5", "TOOL-1"), stage="tool_round")
def unstarted_calls_are_reported_not_run(s: Story) -> None:
    s.files({"a.txt": "1"})
    s.faults(fail_writes={"tool_results": 1})
    s.script(tool_calls(("write_file", {"path": "a.txt", "content": "2"}),
                        ("write_file", {"path": "a.txt", "content": "3"})))
    s.turn("Write 2 then 3 into a.txt.")
    results = [r.content or "" for r in s.transcript() if r.role is Role.TOOL]
    s.expect(results[0].startswith("unknown:") and results[1].startswith("not run:"),
             "the first call ran but its result was lost; the second never ran")
    s.expect(s.world.tools.snapshot_files()["a.txt"] == "2", "only the first write happened")


@scenario("A round whose results the store refuses runs no further call, even when the store "
          "would have refused those results too",
          invariants=("TOOL-1",), stage="tool_round")
def refused_results_stop_the_round(s: Story) -> None:
    """Each write is a segment of its own. The store refuses the results of the first, and
    would refuse the next results too. Persist before execute (TOOL-1) is about what runs:
    once one result could not be stored, no later call runs, so only the first write
    happened. Both calls are reported in call order, the first as unknown (it ran), the
    second as never run."""
    s.files({"a.txt": "1"})
    s.faults(fail_writes={"tool_results": 2})
    s.script(tool_calls(("write_file", {"path": "a.txt", "content": "2"}),
                        ("write_file", {"path": "a.txt", "content": "3"})))
    s.turn("Write 2 then 3 into a.txt.")
    s.expect(s.world.tools.snapshot_files()["a.txt"] == "2", "only the first write happened")
    s.expect(len(s.world.tools.ledger) == 1, "the second call never ran")
    results = [r.content or "" for r in s.transcript() if r.role is Role.TOOL]
    s.expect(len(results) == 2 and results[0].startswith("unknown:")
             and results[1].startswith("not run:"), "the first is unknown, the second not run")


@scenario("Malformed tool-call arguments are asked for again, then answered with an error in place",
          invariants=("LOOP-9", "TOOL-2", "TOOL-3"), stage="tool_round")
def malformed_arguments_are_retried_then_answered(s: Story) -> None:
    bad = tool_calls(("read_file", '{"path": notes.txt}'))
    s.script(bad, bad, bad, text("I could not read it."))
    result = s.turn("Read notes.txt.")
    s.expect(result is not None and result.api_calls == 4, "two retries, the recorded try, the answer")
    rows = s.transcript()
    s.expect([r.role for r in rows] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT],
             "only the last malformed try is recorded, with an error result in place")
    s.expect(s.world.tools.ledger == [], "a call with malformed arguments never runs")


@scenario("A tool call cut off by the output limit ends the turn as truncated and never runs",
          invariants=("LOOP-9", "LOOP-3", "FIN-5"), stage="tool_round")
def truncated_tool_call_ends_the_turn(s: Story) -> None:
    s.script(tool_calls(("write_file", '{"path": "a.txt", "content": "the first half of'),
                        finish_reason="length"))
    result = s.turn("Write a long file.")
    s.expect(result is not None and result.exit_reason is ExitReason.TRUNCATED_TOOL_CALL,
             "exit reason truncated_tool_call")
    s.expect(s.world.tools.ledger == [], "the cut-off call never ran")
    s.expect([r.role for r in s.transcript()] == [Role.USER, Role.ASSISTANT],
             "the call was never recorded; a boundary row closes the tail")


@scenario("Arguments cut off mid-value end the turn as truncated even when the provider "
          "reports finish_reason=tool_calls, not length",
          invariants=("LOOP-9", "LOOP-3"), stage="tool_round")
def cut_off_arguments_without_a_length_stop(s: Story) -> None:
    cut = tool_calls(("write_file", '{"path": "a.txt", "content": "the first half of'))
    s.use_provider(FunctionProvider(lambda request: cut))  # asked again, it is cut again
    result = s.turn("Write a long file.")
    s.expect(result is not None and result.exit_reason is ExitReason.TRUNCATED_TOOL_CALL,
             "exit reason truncated_tool_call")
    s.expect(len(s.world.calls) == 1, "the cut-off call is not asked for again")
    s.expect(s.world.tools.ledger == [], "the cut-off call never ran")


@scenario("A round whose arguments all parse starts the count of malformed tries over",
          invariants=("LOOP-9", "TOOL-2", "TOOL-3"), stage="tool_round")
def parsed_round_restarts_the_malformed_count(s: Story) -> None:
    s.files({"notes.txt": "x"})
    bad = tool_calls(("read_file", '{"path": notes.txt}'))
    s.script(bad, tool_calls(("read_file", {"path": "notes.txt"})), bad, bad, bad,
             text("The notes say x."))
    result = s.turn("Read notes.txt.")
    s.expect(result is not None and result.final_response == "The notes say x.", "answered")
    rows = s.transcript()
    s.expect([r.role for r in rows] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT,
                                        Role.TOOL, Role.ASSISTANT],
             "the parsed round, then only the third malformed try after it, are recorded")


@scenario("If the tool-call row cannot be written, no tool runs and the turn ends "
          "session_persistence_failed",
          invariants=("TOOL-1", "LOOP-3", "FIN-5", "FIN-7"), stage="tool_round")
def tool_call_row_write_fails(s: Story) -> None:
    s.files({"notes.txt": "x"})
    s.faults(fail_writes={"tool_calls": 1})
    s.script(tool_calls(("write_file", {"path": "notes.txt", "content": "y"})))
    result = s.turn("Overwrite my notes.")
    s.expect(result is not None and result.exit_reason is ExitReason.PERSISTENCE_FAILED,
             "exit reason session_persistence_failed")
    s.expect(s.world.tools.ledger == [], "no tool ran")
    s.expect(s.world.tools.snapshot_files()["notes.txt"] == "x", "the file is untouched")


@scenario("A model that only ever calls a missing tool is called three times, not a fourth",
          invariants=("TOOL-2",), stage="tool_round")
def missing_tool_forever_ends_at_the_third_round(s: Story) -> None:
    """The model asks for the same missing tool however often it is asked. Each round is
    answered in place with an error result, and the third all-invalid round in a row ends
    the turn (TOOL-2): three model calls, and none after the limit. A provider that answers
    every request alike lets the story count the calls whatever the engine does."""
    s.use_provider(FunctionProvider(lambda request: tool_calls(("teleport", {"to": "mars"}))))
    result = s.turn("Go to Mars.")
    s.expect(result is not None and result.exit_reason is ExitReason.INVALID_TOOL_CALLS,
             "ended as invalid_tool_calls")
    s.expect(len(s.world.calls) == 3, f"three model calls, not {len(s.world.calls)}")


@scenario("Calls to missing tools are answered in place, and only three all-invalid rounds in a "
          "row end the turn",
          invariants=("TOOL-2", "TOOL-3", "FIN-5", "LOOP-3", "FIN-7"), stage="tool_round")
def three_invalid_rounds_end_the_turn(s: Story) -> None:
    s.files({"a.txt": "alpha"})
    s.script(tool_calls(("teleport", {"to": "mars"})), tool_calls(("fly", {"to": "venus"})),
             tool_calls(("read_file", {"path": "a.txt"})), tool_calls(("teleport", {"to": "pluto"})),
             text("I read a.txt; the other tools do not exist."),
             tool_calls(("teleport", {"to": "mars"})), tool_calls(("fly", {"to": "venus"})),
             tool_calls(("warp", {"to": "pluto"}), ("jump", {"to": "io"})))
    first = s.turn("Read a.txt and go to space.")
    s.expect(first is not None and first.exit_reason is ExitReason.TEXT_RESPONSE,
             "a valid round between invalid ones resets the count")
    second = s.turn("Go to space.")
    s.expect(second is not None and second.exit_reason is ExitReason.INVALID_TOOL_CALLS
             and second.failed, "the third all-invalid round in a row ends the turn as failed")
    rows = [r for r in s.transcript() if r.turn_id == (second.turn_id if second else None)]
    s.expect([len(r.tool_calls) for r in rows if r.role is Role.ASSISTANT] == [1, 1, 2, 0],
             "every stored call row keeps all its calls, and a boundary row closes the turn")
    s.expect([e.name for e in s.world.tools.ledger] == ["read_file"], "no missing tool was dispatched")
