"""Stories of a process dying at each durable boundary of a tool round, then recovering.

Each story crashes the simulated process at one named point, starts a new process on
the same durable record, and runs another turn. The new process knows only what was
committed: calls without results are reported unknown and never run again, and an open
tail gets an engine boundary row before the new user row.
"""

from __future__ import annotations

from hermes_ref.closure import RECOVERED_BOUNDARY_TEXT, RECOVERED_CALL_TEXT
from hermes_ref.models import ProviderReply, Role
from hermes_ref.outcomes import TurnResult
from sim.harness import Story, scenario
from sim.provider import text, tool_calls


def _next_process_asks(s: Story) -> TurnResult | None:
    """A new process, faults off, and a plain turn that asks whether it is still there:
    its prologue repairs what the crash left before the model answers "I am here." """
    s.restart()
    s.faults()
    s.script(text("I am here."))
    return s.turn("Are you still there?")


def _crash_then_recover(s: Story, point: str) -> None:
    s.files({"notes.txt": "draft"})
    s.faults(crash=point)
    s.script(tool_calls(("write_file", {"path": "notes.txt", "content": "final"})),
             text("Saved."))
    first = s.turn("Save the final version of my notes.")
    s.expect(first is None, f"the process died at {point}")
    after = _next_process_asks(s)
    s.expect(after is not None and after.final_response == "I am here.", "the next turn answers")


@scenario("A crash before the tool-call row commits runs no tool and leaves a closed tail",
          invariants=("TOOL-1", "TOOL-3", "FIN-3", "CTX-8"), stage="crash")
def crash_before_tool_call_row(s: Story) -> None:
    _crash_then_recover(s, "before:tool_calls")
    s.expect(s.world.tools.ledger == [], "no tool ran")
    rows = s.transcript()
    s.expect(rows[1].role is Role.ASSISTANT and rows[1].content == RECOVERED_BOUNDARY_TEXT,
             "recovery closed the orphaned user row with a boundary row")


@scenario("A crash after the tool-call row commits never runs the tool on restart",
          invariants=("TOOL-1", "TOOL-3", "TOOL-10", "CTX-3", "FIN-3"), stage="crash")
def crash_after_tool_call_row(s: Story) -> None:
    _crash_then_recover(s, "after:tool_calls")
    s.expect(s.world.tools.ledger == [], "the recorded call was not executed by recovery")
    unknown = [r for r in s.transcript() if r.role is Role.TOOL]
    s.expect(len(unknown) == 1 and unknown[0].content == RECOVERED_CALL_TEXT,
             "the call is reported unknown")
    s.expect(s.world.tools.snapshot_files()["notes.txt"] == "draft", "the file was not written")


@scenario("A crash after a call row that names a missing tool commits: the row keeps that "
          "call, and recovery reports both calls unknown",
          invariants=("TOOL-2",), stage="crash")
def crash_after_a_call_row_with_a_missing_tool(s: Story) -> None:
    """The reply calls a real tool and one that does not exist, and the process dies as
    soon as the call row is durable, before either call is answered. The row must keep
    both calls as the model made them (TOOL-2): the next process sees only the record,
    and it reports every recorded call without a result as unknown. A row that left the
    missing tool's call out would hide, from the record and from the model, that the
    call was ever made. The crash comes before any result is written, so no orphaned
    result shows the gap (TOOL-3): only the row itself does."""
    s.faults(crash="after:tool_calls")
    s.script(tool_calls(("read_file", {"path": "a.txt"}), ("teleport", {"to": "mars"})))
    first = s.turn("Read a.txt and teleport.")
    s.expect(first is None, "the process died after the call row")
    _next_process_asks(s)
    calls = [c.name for r in s.transcript() for c in r.tool_calls]
    s.expect(calls == ["read_file", "teleport"], f"the call row keeps both calls: {calls}")
    unknown = [r.tool_call_id for r in s.transcript() if r.role is Role.TOOL
               and r.content == RECOVERED_CALL_TEXT]
    s.expect(unknown == ["call_1", "call_2"], f"both reported unknown: {unknown}")
    s.expect(s.world.tools.ledger == [], "neither call ran")


@scenario("A crash after the tool ran but before its result commits reports it unknown, once",
          invariants=("TOOL-1", "TOOL-3", "TOOL-10", "FIN-3"), stage="crash")
def crash_after_tool_ran(s: Story) -> None:
    _crash_then_recover(s, "after:tools")
    s.expect(len(s.world.tools.ledger) == 1, "the tool ran exactly once in total")
    s.expect(s.world.tools.snapshot_files()["notes.txt"] == "final", "its effect stayed")
    unknown = [r for r in s.transcript() if r.role is Role.TOOL]
    s.expect(len(unknown) == 1 and unknown[0].content == RECOVERED_CALL_TEXT,
             "the lost result is reported unknown, not re-run")


@scenario("A crash before the final answer is written leaves a tail the next turn closes",
          invariants=("TOOL-3", "FIN-3", "CTX-2"), stage="crash")
def crash_before_final_row(s: Story) -> None:
    _crash_then_recover(s, "before:final")
    rows = s.transcript()
    roles = [r.role for r in rows]
    s.expect(roles[:4] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT],
             "the tool round survived and recovery closed its tail")
    s.expect(rows[3].content == RECOVERED_BOUNDARY_TEXT, "the closing row is the boundary row")
    s.expect(len(s.world.tools.ledger) == 1, "the tool ran once")


@scenario("After a crash mid-turn, the next turn replays none of the crashed turn's scaffolding",
          invariants=("SCAF-2", "SCAF-1", "TOOL-3"), stage="crash")
def crash_after_a_nudge_replays_no_scaffolding(s: Story) -> None:
    s.files({"notes.txt": "draft"})
    s.faults(crash="after:tool_calls")
    s.script(ProviderReply(content=None, finish_reason="tool_calls"),
             tool_calls(("read_file", {"path": "notes.txt"})))
    first = s.turn("What do my notes say?")
    s.expect(first is None, "the process died after the tool-call row")
    nudged = s.world.calls[-1].request.messages
    s.expect(any(m.scaffold is not None for m in nudged), "the crashed turn had sent a nudge")
    s.restart()
    s.faults()
    s.script(text("Ask me again and I will read them."))
    s.turn("Are you there?")
    replayed = [m for m in s.world.calls[-1].request.messages if m.scaffold is not None]
    s.expect(replayed == [], "the new turn's request carries no scaffolding")


@scenario("If repairing a crashed turn fails, its open call is still reported unknown, not 'not run'",
          invariants=("TOOL-10", "TOOL-3", "FIN-5"), stage="crash")
def failed_repair_still_reports_the_call_unknown(s: Story) -> None:
    s.files({"notes.txt": "draft"})
    s.faults(crash="after:tools")
    s.script(tool_calls(("write_file", {"path": "notes.txt", "content": "final"})))
    s.turn("Save the final version of my notes.")
    s.restart()
    s.faults(fail_writes={"recovery": 1})
    s.script()
    refused = s.turn("Are you there?")
    s.expect(refused is not None and refused.failed, "the repair write failed, so the turn failed")
    results = [r.content or "" for r in s.transcript() if r.role is Role.TOOL]
    s.expect(results == [RECOVERED_CALL_TEXT], "the call that ran before the crash is reported unknown")
    s.expect(len(s.world.tools.ledger) == 1, "and it was not run again")


@scenario("A crash between the segments of a round reports the calls left without a result "
          "unknown, though the round's first results are recorded",
          invariants=("TOOL-10", "TOOL-3"), stage="crash")
def crash_between_segments(s: Story) -> None:
    s.files({"notes.txt": "draft"})
    s.faults(crash="after:tool_results")
    s.script(tool_calls(("read_file", {"path": "notes.txt"}),
                        ("write_file", {"path": "notes.txt", "content": "final"})),
             text("Saved."))
    first = s.turn("Read my notes, then save the final version.")
    s.expect(first is None, "the process died after the read's result was recorded")
    _next_process_asks(s)
    results = [r.content or "" for r in s.transcript() if r.role is Role.TOOL]
    s.expect(len(results) == 2 and "draft" in results[0] and results[1] == RECOVERED_CALL_TEXT,
             "the read kept its result; the write, never run, is reported unknown")
    s.expect([e.name for e in s.world.tools.ledger] == ["read_file"], "the write never ran")


@scenario("Recovery closes the cut-off segment of a crashed round in the next turn's "
          "prologue, before anything else: a second crash right after leaves it closed",
          invariants=("TOOL-3",), stage="crash")
def cut_off_segment_is_closed_before_the_next_user_row(s: Story) -> None:
    """The process dies between the segments of a round: the read's result is durable, the
    write never started. The next process repairs the tail in its turn's prologue, before
    it writes its own user row, so the write gets its unknown result there (TOOL-3: every
    call exactly one result). A call row with some results is not a finished round: the
    calls of its later segments are as open as any. The second process dies too, right
    after its user row and before any model call, so the record alone shows the repair:
    no request ever carried the gap. (A first, plain turn ends as turns do, so the story
    also has an ending to report.)"""
    s.files({"notes.txt": "draft"})
    s.script(text("Ready."), tool_calls(("read_file", {"path": "notes.txt"}),
                                        ("write_file", {"path": "notes.txt", "content": "final"})))
    s.turn("Are you ready?")
    s.faults(crash="after:tool_results")
    s.expect(s.turn("Read my notes, then save the final version.") is None,
             "the process died after the read's result was recorded")
    s.restart()
    s.faults(crash="after:user")
    s.expect(s.turn("Are you still there?") is None, "the second process died after its user row")
    s.expect(len(s.world.calls) == 2, "no model call after the first crash")
    results = [r.content or "" for r in s.transcript() if r.role is Role.TOOL]
    s.expect(len(results) == 2 and "draft" in results[0] and results[1] == RECOVERED_CALL_TEXT,
             "the read kept its result; the write, never run, is reported unknown")
