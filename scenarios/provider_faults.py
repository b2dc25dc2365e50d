"""Stories of provider faults: text that is not Unicode, and calls of one reply that share an id.

A provider is the part of the world that sends what it likes. Each story scripts one fault
from the fake's catalogue (``sim.provider``) and shows that the engine takes the reply in
by one rule (``hermes_ref.reply_intake``): the delivered answer is the recorded answer,
and every call keeps its own identity and its own result.
"""

from __future__ import annotations

from hermes_ref.models import Role, ToolCall
from sim.harness import Story, scenario
from sim.provider import (
    LONE_SURROGATE,
    calls_sharing_id,
    lone_surrogate_text,
    split_pair_text,
    text,
    tool_calls,
)


@scenario("A lone surrogate in an answer becomes U+FFFD, and the answer delivered is the one recorded",
          invariants=("FIN-3", "FIN-6"), stage="provider_fault")
def lone_surrogate_answer_is_recorded_as_delivered(s: Story) -> None:
    s.script(lone_surrogate_text("Nice work ", "!"))
    result = s.turn("How did I do?")
    want = "Nice work \ufffd!"
    s.expect(result is not None and not result.failed and result.final_response == want,
             "the answer arrives with U+FFFD where the lone surrogate was")
    tail = s.transcript()[-1]
    s.expect(tail.role is Role.ASSISTANT and tail.content == want,
             "the durable answer row holds the delivered answer")


@scenario("A grace summary with a lone surrogate is taken in by the same rule as any reply",
          invariants=("FIN-3", "FIN-6", "FIN-1"), stage="provider_fault")
def lone_surrogate_in_the_grace_summary_is_recorded_as_delivered(s: Story) -> None:
    s.limits(max_iterations=1, iteration_budget=1)
    s.files({"a.txt": "1"})
    s.script(tool_calls(("read_file", {"path": "a.txt"})), lone_surrogate_text("Read it ", "."))
    result = s.turn("Read a.txt.")
    want = "Read it \ufffd."
    s.expect(result is not None and result.final_response == want,
             "the summary arrives with U+FFFD where the lone surrogate was")
    tail = s.transcript()[-1]
    s.expect(tail.role is Role.ASSISTANT and tail.content == want,
             "the durable answer row holds the delivered summary")


@scenario("A surrogate pair split in two halves arrives as its one character",
          invariants=("FIN-3", "FIN-6"), stage="provider_fault")
def split_surrogate_pair_is_one_character(s: Story) -> None:
    s.script(split_pair_text("Great job ", "!"))
    result = s.turn("How did I do?")
    want = "Great job \U0001f600!"
    s.expect(result is not None and result.final_response == want, "the halves were joined")
    s.expect(s.transcript()[-1].content == want, "the durable answer row holds the character")


@scenario("A lone surrogate inside tool-call arguments becomes U+FFFD before the call is recorded",
          invariants=("TOOL-1", "TOOL-3"), stage="provider_fault")
def lone_surrogate_in_arguments_is_replaced_before_the_call_is_recorded(s: Story) -> None:
    raw = '{"path": "greeting.txt", "content": "hi ' + LONE_SURROGATE + '"}'
    s.script(tool_calls(("write_file", raw)), text("Saved."))
    result = s.turn("Save a greeting.")
    s.expect(result is not None and result.final_response == "Saved.", "the turn answered")
    call = s.transcript()[1].tool_calls[0]
    s.expect(call.arguments == raw.replace(LONE_SURROGATE, "\ufffd"),
             "the recorded call holds U+FFFD in place of the surrogate")
    s.expect(s.world.tools.snapshot_files().get("greeting.txt") == "hi \ufffd",
             "the tool wrote what was recorded")


@scenario("Two calls of one reply that share an id each run once and keep their own result",
          invariants=("TOOL-3", "TOOL-2", "TOOL-1"), stage="provider_fault")
def calls_sharing_an_id_keep_their_own_results(s: Story) -> None:
    s.files({"a.txt": "alpha", "b.txt": "beta"})
    s.script(calls_sharing_id("call_0", ("read_file", {"path": "a.txt"}),
                              ("read_file", {"path": "b.txt"})),
             text("alpha and beta"))
    s.turn("Read a.txt and b.txt.")
    rows = s.transcript()
    s.expect([c.id for c in rows[1].tool_calls] == ["call_0", "call_0_d2"],
             "the second call was given an id of its own")
    results = [(r.tool_call_id, r.content) for r in rows if r.role is Role.TOOL]
    s.expect(results == [("call_0", "     1|alpha"), ("call_0_d2", "     1|beta")],
             "each call has its own result")
    s.expect([e.call_id for e in s.world.tools.ledger] == ["call_0", "call_0_d2"],
             "each call ran once")



@scenario("A repeated id is renamed to a suffix no other call of the reply has, and a call whose "
          "id was given once keeps it", invariants=("TOOL-3", "TOOL-2"), stage="provider_fault")
def renamed_id_never_takes_another_calls_id(s: Story) -> None:
    s.files({"a.txt": "alpha", "b.txt": "beta"})
    s.script(tool_calls(ToolCall(id="call_0", name="write_file",
                                 arguments='{"path": "a.txt", "content": "one"}'),
                        ToolCall(id="call_0", name="write_file",
                                 arguments='{"path": "b.txt", "content": "two"}'),
                        ToolCall(id="call_0_d2", name="read_file", arguments='{"path": "a.txt"}')),
             text("Both written."))
    s.turn("Write a.txt and b.txt, then read a.txt.")
    rows = s.transcript()
    s.expect([c.id for c in rows[1].tool_calls] == ["call_0", "call_0_d3", "call_0_d2"],
             "the repeat took _d3, since _d2 was another call's own id")
    results = [(r.tool_call_id, r.content) for r in rows if r.role is Role.TOOL]
    s.expect(results[:2] == [("call_0", "wrote 3 bytes to a.txt"), ("call_0_d3", "wrote 3 bytes to b.txt")],
             "the first write's effect is in its own result")
    s.expect(s.world.tools.snapshot_files().get("b.txt") == "two", "both writes ran")
