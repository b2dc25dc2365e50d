"""Stories at the loop's edges: replies that only narrate a tool call, and requests the
preflight refuses to send."""

from __future__ import annotations

from hermes_ref.models import ProviderReply, Role
from hermes_ref.outcomes import ExitReason
from hermes_ref.scaffolding import DROPPED_TOOLCALL_NUDGE
from sim.harness import Story, scenario
from sim.provider import text, tool_calls

NARRATION = "Let me read a.txt now."


@scenario("A reply that narrates a tool call without making it is re-prompted, not taken "
          "as the answer",
          invariants=("LOOP-7", "SCAF-1", "TOOL-3"), stage="loop")
def narrated_tool_call_is_reprompted(s: Story) -> None:
    s.files({"a.txt": "alpha"})
    s.script(ProviderReply(content=NARRATION, finish_reason="tool_calls"),
             tool_calls(("read_file", {"path": "a.txt"})), text("It says alpha."))
    result = s.turn("What does a.txt say?")
    s.expect(result is not None and result.final_response == "It says alpha.",
             "the answer came after the call was made")
    retry = s.world.calls[1].request.messages if len(s.world.calls) > 1 else ()
    s.expect([m.content for m in retry[-2:]] == [NARRATION, DROPPED_TOOLCALL_NUDGE],
             "the re-prompt replays the narration, then the nudge")
    s.expect(all(m.content != NARRATION for m in s.transcript()), "the narration is not stored")


@scenario("A request the preflight refuses to send costs no budget unit and no API call",
          invariants=("LOOP-2", "LOOP-1", "CMP-7", "FIN-5"), stage="loop")
def refused_request_costs_nothing(s: Story) -> None:
    s.files({"big.txt": "; ".join(["the quarterly figures, in words"] * 20) + "."})  # ~170 tokens
    s.limits(context_window_tokens=200)  # the first request (about 70 tokens) fits
    s.script(tool_calls(("read_file", {"path": "big.txt"})))
    result = s.turn("Summarize big.txt.")
    s.expect(len(s.world.calls) == 1, "only the request that fits was sent")
    s.expect(result is not None and result.exit_reason is ExitReason.COMPRESSION_EXHAUSTED
             and result.exit_detail.startswith("context_overflow"),
             "preflight refused the second: nothing to compact, it fails closed (CMP-7)")
    s.expect(result is not None and (result.api_calls, result.budget_used) == (1, 1),
             "the refused request cost nothing")
    rows = s.transcript()
    s.expect(rows[-1].role is Role.TOOL,
             "the tool result stays; context pressure adds no boundary row (FIN-5)")
