"""Stories of synthetic retry messages that steer the model but are never stored."""

from __future__ import annotations

from hermes_ref.models import ProviderReply
from hermes_ref.outcomes import ExitReason
from hermes_ref.scaffolding import DROPPED_TOOLCALL_NUDGE
from sim.harness import Story, scenario
from sim.provider import text, tool_calls

DROPPED = ProviderReply(content=None, finish_reason="tool_calls")  # promised calls, sent none


@scenario("A reply that promises a tool call but has none is re-prompted, and the nudge is "
          "never stored",
          invariants=("SCAF-1", "TOOL-3", "LOOP-7"), stage="scaffolding")
def dropped_tool_call_is_reprompted(s: Story) -> None:
    s.files({"a.txt": "alpha"})
    s.script(DROPPED, tool_calls(("read_file", {"path": "a.txt"})), text("It says alpha."))
    result = s.turn("What does a.txt say?")
    s.expect(result is not None and result.final_response == "It says alpha.", "answered")
    nudged = s.world.calls[1].request.messages
    s.expect(any(m.scaffold is not None for m in nudged), "the retry carried the nudge")


@scenario("An empty reply after a tool round gets one nudge that is never stored",
          invariants=("SCAF-1", "LOOP-3"), stage="scaffolding")
def empty_reply_after_tools_is_nudged(s: Story) -> None:
    s.files({"a.txt": "alpha"})
    s.script(tool_calls(("read_file", {"path": "a.txt"})), text(""), text("It says alpha."))
    result = s.turn("What does a.txt say?")
    s.expect(result is not None and result.exit_reason is ExitReason.TEXT_RESPONSE, "answered")


@scenario("Empty replies end in the (empty) sentinel, which is never stored",
          invariants=("SCAF-1", "LOOP-3", "FIN-5", "FIN-7"), stage="scaffolding")
def empty_replies_exhaust_to_sentinel(s: Story) -> None:
    s.limits(empty_retries_max=2)
    s.script(text(""), text(""), text(""))
    result = s.turn("Say something.")
    s.expect(result is not None and result.exit_reason is ExitReason.EMPTY_RESPONSE_EXHAUSTED,
             "exit reason empty_response_exhausted")
    s.expect(result is not None and result.final_response == "(empty)", "the sentinel is returned")


@scenario("Four dropped tool calls in a row get three re-prompts, and a landed tool round starts "
          "the count over",
          invariants=("LOOP-7", "SCAF-1", "TOOL-3"), stage="scaffolding")
def fourth_dropped_call_is_not_reprompted(s: Story) -> None:
    s.files({"a.txt": "alpha"})
    s.script(DROPPED, DROPPED, DROPPED, DROPPED, tool_calls(("read_file", {"path": "a.txt"})),
             DROPPED, text("It says alpha."))
    result = s.turn("What does a.txt say?")
    s.expect(result is not None and result.final_response == "It says alpha.", "answered")
    nudges = [sum(m.content == DROPPED_TOOLCALL_NUDGE for m in c.request.messages)
              for c in s.world.calls]
    s.expect(nudges == [0, 1, 2, 3, 3, 3, 4], "three re-prompts, none for the fourth, one more "
             "after the tool round")
